"""An order/payment consumer: each order is charged exactly once, although the payment
provider times out after taking the money and the broker delivers an order twice. SQLite
and kombu's in-memory broker by default, so it runs with no servers:

    python examples/payments.py [--database-url URL] [--broker amqp://...]

1. Three ``order.placed`` messages are published; the first is published again under its
   own id (a producer that retried after a lost confirm).
2. ``payments.charge`` charges the card through ``inbox.effect("charge", ...)``: the call
   gets a key that is the same on every attempt of this handler for this order, which the
   provider takes as its idempotency key, and its result is recorded. Then it writes the
   payment row in the handler's transaction.
3. For the second order the provider charges the card and then times out (the money is
   taken, the answer lost): the effect is recorded as failed, the transaction rolls back,
   and the worker retries the delivery. The retry charges again WITH THE SAME KEY, so the
   provider returns the first charge instead of taking the money twice.
4. The duplicate delivery of the first order is skipped by its claim: no second charge, no
   second payment row.
5. The handlers run behind the shipped middleware: ``log_context`` + ``LogContextFilter``
   stamp every log line with the message id, type and handler, ``Timing`` logs each
   handler's duration.

SQLite keeps the effect records in a second file (``effect_store``): the record of a call
must commit while the handler's transaction holds the claim database's write lock.
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kombu import Connection
from sqlalchemy import Column, Integer, MetaData, String, Table, create_engine, func, insert, select
from sqlalchemy.orm import Session, sessionmaker

from inbox import Inbox, Message
from inbox.broker import Publisher, RetryPolicy, Worker
from inbox.middleware import LogContextFilter, Timing, log_context
from inbox.schema import inbox_effect
from inbox.schema import metadata as inbox_metadata

shop = MetaData()
payments = Table(
    "example_payment",
    shop,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("order_id", String(40), nullable=False, unique=True),
    Column("amount", Integer, nullable=False),
    Column("charge_id", String(40), nullable=False),
)


@dataclass
class PaymentProvider:
    """A card processor that honours idempotency keys (as Stripe, Adyen and most do): a
    second request with a key it has seen returns the first charge. ``time_out_once`` lists
    orders whose first charge succeeds but whose answer is lost."""

    time_out_once: set[str] = field(default_factory=set)
    requests: int = 0
    charges: dict[uuid.UUID, dict[str, Any]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def charge(self, key: uuid.UUID, order_id: str, amount: int) -> dict[str, Any]:
        with self.lock:
            self.requests += 1
            if key not in self.charges:
                self.charges[key] = {"charge_id": f"ch_{len(self.charges) + 1}", "amount": amount}
            if order_id in self.time_out_once:
                self.time_out_once.discard(order_id)
                raise TimeoutError(f"no answer from the provider for order {order_id}")
            return self.charges[key]

    def cards_charged(self) -> int:
        return len(self.charges)


def payment_inbox(
    sessions: sessionmaker[Session], effect_store: Any, provider: PaymentProvider
) -> Inbox:
    """The consumer: one handler behind the shipped logging context and timing."""
    inbox = Inbox(
        sessions,
        effect_store=effect_store,
        middleware=[Timing()],
        around_delivery=[log_context],
    )

    @inbox.handler("order.placed", name="payments.charge")
    def charge(message: Message, session: Session) -> None:
        order_id, amount = message.body["order_id"], message.body["amount"]
        result = inbox.effect("charge", lambda key: provider.charge(key, order_id, amount))
        logging.getLogger("payments").info("order %s charged: %s", order_id, result["charge_id"])
        session.execute(
            insert(payments).values(order_id=order_id, amount=amount, charge_id=result["charge_id"])
        )

    return inbox


def show_log_context() -> None:
    """Log lines to stdout, each stamped with the message and handler it belongs to."""
    handler = logging.StreamHandler(sys.stdout)
    handler.addFilter(LogContextFilter())
    handler.setFormatter(
        logging.Formatter(
            "  log %(name)s: %(message)s [message=%(inbox_message_id)s handler=%(inbox_handler)s]"
        )
    )
    for name in ("payments", "inbox.timing"):
        logger = logging.getLogger(name)
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)


def wait_for(worker: Worker, processed: int, duplicates: int, timeout: float = 60.0) -> None:
    """Run ``worker`` until its handlers committed ``processed`` runs and skipped
    ``duplicates``; then stop it."""
    worker.prepare()
    thread = threading.Thread(target=worker.run, name="worker")
    thread.start()
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline and (
            worker.stats.processed < processed or worker.stats.duplicates < duplicates
        ):
            time.sleep(0.05)
    finally:
        worker.stop()
        thread.join(timeout)


def run(database_url: str, effects_url: str, broker: str, prefix: str = "example") -> int:
    """The whole scenario; 0 when every order was charged and recorded exactly once."""
    queue = f"{prefix}.payments"
    engine = create_engine(database_url)
    inbox_metadata.create_all(engine)
    shop.create_all(engine)
    store = None
    if engine.dialect.name == "sqlite":
        store = create_engine(effects_url)
        inbox_effect.create(store, checkfirst=True)
    provider = PaymentProvider(time_out_once={"order-2"})
    inbox = payment_inbox(sessionmaker(engine), store, provider)
    worker = Worker(
        inbox, broker, [queue], retry=RetryPolicy(delays=(0.2,), max_tries=3), stats_interval=None
    )
    show_log_context()
    try:
        worker.prepare()
        with Publisher(broker) as publisher:
            first = uuid.uuid4()
            for n, amount in ((1, 120), (2, 80), (3, 45)):
                body = {"order_id": f"order-{n}", "amount": amount}
                message_id = first if n == 1 else None
                publisher.publish("order.placed", body, routing_key=queue, message_id=message_id)
            publisher.publish(
                "order.placed",
                {"order_id": "order-1", "amount": 120},
                routing_key=queue,
                message_id=first,
            )
        print("published 3 orders, and order-1 a second time under its own id")
        wait_for(worker, processed=3, duplicates=1)
        print(f"consumer: {worker.stats.summary()}")
        with engine.connect() as connection:
            rows = connection.execute(select(func.count()).select_from(payments)).scalar_one()
        print(
            f"payment rows={rows} cards charged={provider.cards_charged()} "
            f"provider requests={provider.requests}"
        )
        ok = rows == 3 and provider.cards_charged() == 3 and worker.stats.failed_tries == 1
        print("every order charged exactly once" if ok else "MISMATCH")
        return 0 if ok else 1
    finally:
        with Connection(broker) as connection, connection.channel() as channel:
            for topology in worker.topologies:
                for declared in topology.queues():
                    channel.queue_delete(queue=declared.name)
        worker.connection.release()
        engine.dispose()
        if store is not None:
            store.dispose()


def main(argv: Sequence[str] | None = None) -> int:
    """Run the example; exit 0 when every order was charged exactly once."""
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    parser.add_argument("--database-url", help="default: SQLite in a temporary directory")
    parser.add_argument("--broker", default="memory://", help="default: memory:// (in-process)")
    parser.add_argument("--prefix", default="example", help="queue name prefix")
    options = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as scratch:
        url = options.database_url or f"sqlite:///{Path(scratch) / 'shop.db'}"
        effects_url = f"sqlite:///{Path(scratch) / 'effects.db'}"
        return run(url, effects_url, options.broker, options.prefix)


if __name__ == "__main__":
    sys.exit(main())
