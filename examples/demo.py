"""The demo: a stream full of duplicates and failures, and a ledger that proves exactly-once.

    python examples/demo.py [--broker amqp://...] [--database-url URL]

(or ``python -m inbox.demo`` from a checkout). SQLite in a temporary directory and kombu's
in-memory broker by default; ``--broker amqp://...`` and ``--database-url ...`` run the same
scenario on RabbitMQ and PostgreSQL (or MariaDB). A producer publishes one ``order.paid``
message per order, sends some of them again under the same id (as a producer retry or a
broker redelivery would) and re-sends others with a fresh id but the same
``idempotency-key``. The worker consumes the queue; two handlers take each message:
``payments.capture`` fails on its first attempt for every 7th order, and ``loyalty.award``
never fails. Failed deliveries go through the worker's delayed-retry path. At the end the
ledger counts rows per order in the business tables: every order must have exactly one
payment and one loyalty award and nothing may be dead-lettered, or the demo exits 1.

On PostgreSQL the demo works in a schema of its own (``inbox_demo_<random>``), on
MySQL/MariaDB in a database of its own (which needs the CREATE privilege), and drops it at
the end: nothing of the database it was pointed at is read, changed or left behind. On
SQLite it drops its ``demo_`` tables at the end.
"""

from __future__ import annotations

import argparse
import logging
import random
import sys
import tempfile
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import (
    Column,
    Engine,
    Integer,
    MetaData,
    String,
    Table,
    create_engine,
    func,
    insert,
    make_url,
    select,
)
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.schema import CreateSchema, DropSchema

from inbox.broker import Publisher, RetryPolicy, Worker
from inbox.broker._idle import delete_queues, run_until_idle
from inbox.core import Inbox
from inbox.message import IDEMPOTENCY_KEY_HEADER, Message
from inbox.schema import inbox_table

__all__ = ["Ledger", "main", "run_demo"]

business = MetaData()
payments = Table(
    "demo_payment",
    business,
    Column("id", Integer, primary_key=True, autoincrement=True),
    # Deliberately not unique: a doubled effect must show up in the ledger, not as an error.
    Column("order_id", Integer, nullable=False, index=True),
    Column("amount", String(20), nullable=False),
)
# The demo's own inbox table, so that pointing the demo at a real database touches only
# tables whose names start with demo_.
demo_inbox = inbox_table(business, "demo_inbox_message")
loyalty = Table(
    "demo_loyalty",
    business,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("order_id", Integer, nullable=False, index=True),
    Column("points", Integer, nullable=False),
)


@dataclass
class Ledger:
    """What the demo delivered and what the database holds at the end."""

    orders: int = 0
    deliveries: int = 0
    redelivered_same_id: int = 0
    resent_fresh_id: int = 0
    handler_runs_committed: int = 0
    duplicates_skipped: int = 0
    failures_retried: int = 0
    dead_lettered: int = 0
    payments_committed: int = 0
    loyalty_committed: int = 0
    orders_paid_exactly_once: int = 0
    orders_awarded_exactly_once: int = 0

    @property
    def exact(self) -> bool:
        """True when every order has exactly one payment and exactly one loyalty award."""
        return (
            self.dead_lettered == 0
            and self.orders_paid_exactly_once == self.orders
            and self.orders_awarded_exactly_once == self.orders
            and self.payments_committed == self.orders
            and self.loyalty_committed == self.orders
        )


def build_inbox(session_factory: sessionmaker[Session], fail_first: set[int]) -> Inbox:
    """The demo's inbox: a payment handler that fails once for some orders, and loyalty."""
    inbox = Inbox(session_factory, table=demo_inbox)

    @inbox.handler("order.paid", name="payments.capture")
    def capture(message: Message, session: Session) -> None:
        order_id = message.body["order_id"]
        session.execute(insert(payments).values(order_id=order_id, amount=message.body["total"]))
        if order_id in fail_first:
            fail_first.discard(order_id)
            raise ConnectionError(f"payment gateway timed out for order {order_id}")

    @inbox.handler("order.paid", name="loyalty.award")
    def award(message: Message, session: Session) -> None:
        points = int(float(message.body["total"]))
        session.execute(insert(loyalty).values(order_id=message.body["order_id"], points=points))

    return inbox


def delivery_stream(orders: int, rng: random.Random) -> tuple[list[Message], int, int]:
    """One message per order, plus redeliveries (same id) and producer re-sends (fresh id)."""
    stream: list[Message] = []
    redelivered = resent = 0
    for order_id in range(1, orders + 1):
        body = {"order_id": order_id, "total": f"{rng.randint(5, 500)}.{rng.randint(0, 99):02}"}
        headers = {IDEMPOTENCY_KEY_HEADER: f"order-paid-{order_id}"}
        original = Message.new("order.paid", body, headers)
        stream.append(original)
        for _ in range(rng.choice((0, 0, 1, 2))):
            stream.append(original)
            redelivered += 1
        if rng.random() < 0.25:
            stream.append(Message.new("order.paid", body, headers))
            resent += 1
    rng.shuffle(stream)
    return stream, redelivered, resent


DEMO_RETRY = RetryPolicy((0.05, 0.1), max_tries=4)


@contextmanager
def _own_database(database_url: str) -> Iterator[Engine]:
    """An engine on a namespace of the demo's own in ``database_url``, removed on exit: a new
    schema on PostgreSQL, a new database on MySQL/MariaDB; on SQLite the database itself,
    with the demo's tables dropped on exit."""
    url = make_url(database_url)
    name = f"inbox_demo_{uuid.uuid4().hex[:12]}"
    admin = create_engine(url, isolation_level="AUTOCOMMIT")
    backend = admin.dialect.name
    own = backend in ("postgresql", "mysql", "mariadb")
    try:
        if own:
            with admin.connect() as connection:
                connection.execute(CreateSchema(name))  # CREATE DATABASE, in MySQL's words
        if backend == "postgresql":
            # Every table without a schema (the demo's) is put into the demo's own.
            translate = {"schema_translate_map": {None: name}}
            engine = create_engine(url, execution_options=translate)
        else:
            engine = create_engine(url.set(database=name) if own else url)
            business.drop_all(engine)
        try:
            yield engine
        finally:
            if own:
                engine.dispose()
                with admin.connect() as connection:
                    connection.execute(DropSchema(name, cascade=backend == "postgresql"))
            else:
                business.drop_all(engine)
                engine.dispose()
    finally:
        admin.dispose()


def run_demo(
    database_url: str, *, broker: str = "memory://", orders: int = 200, seed: int = 7
) -> Ledger:
    """Publish the scenario to ``broker``, consume it with the worker into a namespace of
    its own in ``database_url`` (see :func:`_own_database`), and return the ledger read back
    from the database."""
    with _own_database(database_url) as engine:
        return _run(engine, broker, orders, seed)


def _run(engine: Engine, broker: str, orders: int, seed: int) -> Ledger:
    rng = random.Random(seed)
    # A queue of its own per run; the demo deletes it, its retry queues and dead letters.
    worker = None
    queue = f"inbox-demo-{uuid.uuid4().hex[:8]}"
    try:
        business.create_all(engine)
        fail_first = {order_id for order_id in range(1, orders + 1) if order_id % 7 == 0}
        inbox = build_inbox(sessionmaker(engine), fail_first)
        stream, redelivered, resent = delivery_stream(orders, rng)
        ledger = Ledger(orders=orders, redelivered_same_id=redelivered, resent_fresh_id=resent)
        worker = Worker(inbox, broker, [queue], prefetch=50, retry=DEMO_RETRY, stats_interval=None)
        worker.prepare()
        with Publisher(broker, routing_key=queue) as publisher:
            for message in stream:
                publisher.publish_message(message)
        run_until_idle(worker, 1.0)
        stats = worker.stats
        ledger.deliveries = stats.deliveries
        ledger.handler_runs_committed = stats.processed
        ledger.duplicates_skipped = stats.duplicates
        ledger.failures_retried = stats.retried
        ledger.dead_lettered = stats.dead_lettered
        with engine.connect() as connection:
            for table, total, exact in (
                (payments, "payments_committed", "orders_paid_exactly_once"),
                (loyalty, "loyalty_committed", "orders_awarded_exactly_once"),
            ):
                per_order = (
                    select(table.c.order_id, func.count().label("n"))
                    .group_by(table.c.order_id)
                    .subquery()
                )
                rows = connection.execute(select(per_order.c.n)).scalars().all()
                setattr(ledger, total, sum(rows))
                setattr(ledger, exact, sum(1 for n in rows if n == 1))
        return ledger
    finally:
        if worker is not None:
            delete_queues(worker)


def _print_ledger(ledger: Ledger, database: str, broker: str) -> None:
    rows = [
        ("orders (business operations)", ledger.orders),
        ("deliveries", ledger.deliveries),
        ("  redelivered with the same id", ledger.redelivered_same_id),
        ("  re-sent with a fresh id, same idempotency-key", ledger.resent_fresh_id),
        ("  retried after a handler failure", ledger.failures_retried),
        ("dead-lettered", ledger.dead_lettered),
        ("handler runs committed", ledger.handler_runs_committed),
        ("duplicates skipped", ledger.duplicates_skipped),
        ("payments committed", ledger.payments_committed),
        ("orders paid exactly once", ledger.orders_paid_exactly_once),
        ("loyalty awards committed", ledger.loyalty_committed),
        ("orders awarded exactly once", ledger.orders_awarded_exactly_once),
    ]
    print(f"inbox demo: {broker} -> worker -> {database}")
    for label, value in rows:
        print(f"  {label:<48} {value:>6}")
    verdict = "EXACTLY ONCE: every effect committed once" if ledger.exact else "MISMATCH"
    print(verdict)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the demo from the command line; exit 0 when the ledger is exact, else 1."""
    parser = argparse.ArgumentParser(
        allow_abbrev=False, prog="examples/demo.py", description=__doc__
    )
    parser.add_argument("--database-url", help="default: SQLite in a fresh temporary directory")
    parser.add_argument(
        "--broker", default="memory://", help="kombu broker URL (default: memory://, in-process)"
    )
    parser.add_argument("--orders", type=int, default=200, help="business operations to send")
    parser.add_argument("--seed", type=int, default=7, help="seed for the delivery shuffle")
    parser.add_argument("-v", "--verbose", action="store_true", help="show the inbox's log")
    args = parser.parse_args(argv)
    if args.orders < 1:
        parser.error("--orders must be at least 1")
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.ERROR,
        format="%(levelname)s %(name)s: %(message)s",
    )
    with tempfile.TemporaryDirectory(prefix="inbox-demo-") as tmp:
        url = args.database_url or f"sqlite:///{Path(tmp) / 'demo.db'}"
        ledger = run_demo(url, broker=args.broker, orders=args.orders, seed=args.seed)
        shown = "SQLite (temporary file)" if args.database_url is None else "the given database"
        broker = "in-memory broker" if args.broker == "memory://" else "the given broker"
        _print_ledger(ledger, shown, broker)
    return 0 if ledger.exact else 1


if __name__ == "__main__":
    sys.exit(main())
