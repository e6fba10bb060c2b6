"""Orders as Celery tasks, exactly once: a real ``celery worker`` (prefork) charges each
order once through a payment effect and sends the receipt task through the outbox. Needs
RabbitMQ and PostgreSQL (the services of docs/development.md):

    python examples/celery_orders.py [--database-url URL] [--broker amqp://...]

1. ``place_order`` is a web request: it writes the order and, in the same transaction,
   the ``celery_orders.charge`` task through ``Outbox.send_task``. One request fails after
   sending (a declined form): its order and its task roll back together, no worker sees it.
2. The relay (``inbox-relay`` in production; :class:`inbox.broker.Relay` here) publishes
   the committed tasks with publisher confirms; the first one twice, under the same task
   id, as a relay that crashed between the broker's confirm and its delete would.
3. ``celery -A celery_orders worker`` runs ``charge``, an inbox task keyed by the order:
   it calls the payment provider through ``inbox.effect`` (one call per order, whatever
   Celery redelivers), writes the payment, and sends ``celery_orders.send_receipt`` through
   the outbox in the same transaction: the follow-up task exists if and only if the
   payment committed. A client's retried ``charge.delay(order)`` (a new task id, the same
   order) is skipped by its key.
4. The run waits until the worker has finished every delivery, the two duplicates
   included (a ``task_postrun`` signal counts them in a table; in production the
   ``inbox.duplicates`` metric does), then counts payments, provider requests and receipts.

Run the worker yourself with ``CELERY_ORDERS_BROKER`` and ``CELERY_ORDERS_DATABASE`` set:
``celery -A celery_orders worker`` from this folder.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from celery import Celery, Task
from celery.signals import task_postrun
from sqlalchemy import Column, Integer, MetaData, String, Table, create_engine, func, select
from sqlalchemy.orm import Session, sessionmaker

from inbox import Inbox, Outbox
from inbox.broker import Relay
from inbox.celery import InboxTasks
from inbox.schema import metadata as inbox_metadata

BROKER = os.environ.get("CELERY_ORDERS_BROKER", "amqp://guest:guest@127.0.0.1:5672//")
DATABASE = os.environ.get(
    "CELERY_ORDERS_DATABASE", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)
QUEUE = os.environ.get("CELERY_ORDERS_QUEUE", "celery_orders")

shop = MetaData()
orders = Table(
    "example_celery_order",
    shop,
    Column("id", Integer, primary_key=True),
    Column("customer", String(100), nullable=False),
)
payments = Table(
    "example_celery_payment",
    shop,
    Column("order_id", Integer, primary_key=True),
    Column("provider_ref", String(64), nullable=False),
)
receipts = Table("example_celery_receipt", shop, Column("order_id", Integer, primary_key=True))
task_runs = Table(  # each delivery the worker finished, duplicates included
    "example_celery_task_run",
    shop,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("task", String(100), nullable=False),
)
provider_calls = Table(  # the payment provider's own books: one row per request it took
    "example_celery_provider_call",
    shop,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("idempotency_key", String(64), nullable=False),
    Column("order_id", Integer, nullable=False),
)

app = Celery("celery_orders", broker=BROKER)
app.conf.update(task_default_queue=QUEUE, worker_prefetch_multiplier=1)
engine = create_engine(DATABASE)
sessions = sessionmaker(engine)
inbox = Inbox(sessions)
tasks = InboxTasks(app, inbox, sessions)
outbox = Outbox()


def charge_card(key: Any, order_id: int) -> str:
    """The payment provider (an HTTP call in real life): it records each request it takes."""
    with engine.begin() as connection:
        connection.execute(
            provider_calls.insert().values(idempotency_key=str(key), order_id=order_id)
        )
    return f"pay-{str(key)[:8]}"


@tasks.task(name="celery_orders.charge", key=lambda order_id: f"charge-{order_id}")
def charge(session: Session, order_id: int) -> str:
    """Charge the order once; send its receipt task if and only if the payment commits."""
    ref: str = inbox.effect("charge", lambda key: charge_card(key, order_id))
    session.execute(payments.insert().values(order_id=order_id, provider_ref=ref))
    outbox.send_task(session, "celery_orders.send_receipt", args=(order_id,), queue=QUEUE)
    return ref


@tasks.task(name="celery_orders.send_receipt")
def send_receipt(session: Session, order_id: int) -> None:
    """The follow-up task: one receipt per order."""
    session.execute(receipts.insert().values(order_id=order_id))


@task_postrun.connect
def count_task_run(sender: Task | None = None, **_: Any) -> None:
    """Record a delivery the worker has finished (run, or skipped as a duplicate)."""
    if sender is not None:
        with engine.begin() as connection:
            connection.execute(task_runs.insert().values(task=sender.name))


class Declined(Exception):
    """The request fails after it wrote its order and sent its task."""


def place_order(order_id: int, customer: str, *, declined: bool = False) -> str | None:
    """The web request: the order and its charge task commit together, or neither."""
    try:
        with Session(engine) as session, session.begin():
            session.execute(orders.insert().values(id=order_id, customer=customer))
            task_id = outbox.send_task(
                session, "celery_orders.charge", args=(order_id,), queue=QUEUE
            )
            if declined:
                raise Declined
    except Declined:
        return None
    return task_id


def count(table: Table) -> int:
    with engine.connect() as connection:
        return int(connection.execute(select(func.count()).select_from(table)).scalar_one())


def runs_of(task: str) -> int:
    query = select(func.count()).where(task_runs.c.task == task)
    with engine.connect() as connection:
        return int(connection.execute(query).scalar_one())


def until(done: Callable[[], bool], relay: Relay, seconds: float = 60.0) -> None:
    deadline = time.monotonic() + seconds
    while not done():
        if time.monotonic() > deadline:
            raise SystemExit("timed out waiting for the worker")
        relay.run_until_empty(timeout=30)  # the receipts the worker sent through the outbox
        time.sleep(0.2)


def start_worker() -> subprocess.Popen[bytes]:
    command = [sys.executable, "-m", "celery", "-A", "celery_orders", "worker"]
    command += [
        "--pool=prefork",
        "-c",
        "2",
        "-Q",
        QUEUE,
        "-l",
        "warning",
        "-n",
        f"orders{os.getpid()}@%h",
    ]
    command += ["--without-mingle", "--without-gossip", "--without-heartbeat"]
    return subprocess.Popen(command, cwd=Path(__file__).parent, start_new_session=True)


def run() -> int:
    shop.drop_all(engine)
    shop.create_all(engine)
    inbox_metadata.create_all(engine)  # in production: inbox migrate
    sent = [place_order(n, f"customer-{n}") for n in (1, 2, 3)]
    place_order(4, "customer-4", declined=True)
    print(f"orders placed: {count(orders)} (the declined one rolled back with its task)")
    relay = Relay(engine, BROKER, listen=False, stats_interval=None)
    worker = start_worker()
    try:
        relay.run_until_empty(timeout=30)
        with Session(engine) as session, session.begin():  # as a relay crash sends it again
            outbox.send_task(
                session, "celery_orders.charge", args=(1,), queue=QUEUE, task_id=sent[0]
            )
        relay.run_until_empty(timeout=30)
        charge.delay(2)  # a client retrying after a timeout: a new task id, the same order
        # Five charge deliveries (three orders, the relay's resend, the client's retry) and
        # three receipts: once all are finished, nothing is left to arrive.
        until(lambda: runs_of(charge.name) >= 5 and runs_of(send_receipt.name) >= 3, relay)
    finally:
        relay.stop()
        worker.send_signal(signal.SIGTERM)
        worker.wait(timeout=30)
    print(
        f"charge deliveries={runs_of(charge.name)} receipt deliveries="
        f"{runs_of(send_receipt.name)} (the duplicates were skipped)"
    )
    counts = [count(t) for t in (payments, provider_calls, receipts)]
    print(f"payments={counts[0]} provider requests={counts[1]} receipts={counts[2]}")
    if counts != [3, 3, 3] or count(orders) != 3:
        print("something happened twice or never")
        return 1
    print("every order charged and receipted exactly once")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--database-url", default=DATABASE)
    parser.add_argument("--broker", default=BROKER)
    parser.add_argument("--queue", default=QUEUE, help="the Celery queue (default: celery_orders)")
    options = parser.parse_args(argv)
    os.environ.update(
        CELERY_ORDERS_BROKER=options.broker,
        CELERY_ORDERS_DATABASE=options.database_url,
        CELERY_ORDERS_QUEUE=options.queue,
    )
    # The worker imports this file as celery_orders: run the example under that name too, so
    # the settings above are the module's and the tasks are the worker's.
    sys.path.insert(0, str(Path(__file__).parent))
    import celery_orders

    return celery_orders.run()


if __name__ == "__main__":
    sys.exit(main())
