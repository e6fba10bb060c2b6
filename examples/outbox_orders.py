"""Orders through the outbox, end to end: every committed publish has its effect exactly
once, and a failed request sends nothing. SQLite and kombu's in-memory broker by default, so
it runs with no servers:

    python examples/outbox_orders.py [--database-url URL] [--broker amqp://...]

1. ``create_order`` is a web request: it writes the order and, in the same transaction, an
   ``order.created`` message through :class:`inbox.Outbox`. One request fails after
   publishing (a declined card): its order and its message roll back together.
2. ``relay`` sends the committed outbox rows to the broker under their own ids, then deletes
   them. With ``--broker amqp://...`` that is :class:`inbox.broker.Relay` (what
   ``inbox-relay`` runs in production: batched publisher confirms, then the delete). The
   relay needs publisher confirms, which the in-memory broker lacks, so by default the
   example forwards the rows itself with :class:`inbox.broker.Publisher` (the row's
   message id, type, content type, headers and body as stored).
3. The consumer is an inbox worker: ``orders.confirm`` writes a confirmation and, in the
   handler's transaction, publishes ``order.confirmed`` through the outbox. The first order
   is delivered twice (as a relay that crashed between the broker's confirm and its delete
   would send it): the inbox skips the copy, so no second confirmation and no second
   ``order.confirmed`` exist.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from kombu import Connection
from sqlalchemy import (
    Column,
    Engine,
    Integer,
    MetaData,
    String,
    Table,
    create_engine,
    delete,
    func,
    insert,
    select,
)
from sqlalchemy.orm import Session, sessionmaker

from inbox import Inbox, Message, Outbox
from inbox.broker import Publisher, Relay, Worker
from inbox.outbox import row_from_mapping
from inbox.schema import metadata as inbox_metadata
from inbox.schema import outbox_message

shop = MetaData()
orders = Table(
    "example_order",
    shop,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("customer", String(100), nullable=False),
    Column("amount", Integer, nullable=False),
)
confirmations = Table(
    "example_confirmation",
    shop,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("order_id", Integer, nullable=False),  # not unique: a doubled effect must show
)

outbox = Outbox()


class CardDeclined(Exception):
    """The request fails after it wrote the order and published its message."""


def create_order(
    sessions: sessionmaker[Session], customer: str, amount: int, *, queue: str
) -> Message:
    """``POST /orders``: the order and its ``order.created`` message (to ``queue``), in one
    transaction; returns the message as published."""
    with sessions() as session, session.begin():
        order_id = session.execute(
            insert(orders).values(customer=customer, amount=amount)
        ).inserted_primary_key[0]
        body = {"order_id": order_id, "amount": amount}
        key = f"order-created-{order_id}"
        message_id = outbox.publish(
            session, "order.created", body, routing_key=queue, idempotency_key=key
        )
        if amount > 1000:
            raise CardDeclined(f"card declined for order {order_id}")
    return Message(message_id, "order.created", body, {"idempotency-key": key})


def confirming_inbox(sessions: sessionmaker[Session], *, announce_to: str) -> Inbox:
    """The consumer: confirm each order, and announce it (to ``announce_to``) through the
    outbox."""
    inbox = Inbox(sessions)

    @inbox.handler("order.created", name="orders.confirm")
    def confirm(message: Message, session: Session) -> None:
        order_id = message.body["order_id"]
        session.execute(insert(confirmations).values(order_id=order_id))
        outbox.publish(  # commits with the confirmation and the claim, or not at all
            session,
            "order.confirmed",
            {"order_id": order_id},
            routing_key=announce_to,
            idempotency_key=f"order-confirmed-{order_id}",
        )

    return inbox


def relay(engine: Engine, broker: str) -> int:
    """Send every committed outbox row, then delete it; how many were sent."""
    if Connection(broker).transport.driver_type == "amqp":
        with Relay(engine, broker, stats_interval=None) as amqp_relay:
            return amqp_relay.drain()
    with engine.connect() as connection:
        rows = [row_from_mapping(r._mapping) for r in connection.execute(select(outbox_message))]
    with Publisher(broker) as publisher:
        for row in rows:
            publisher.publish(
                row.type,
                row.body,
                routing_key=row.routing_key,
                exchange=row.exchange,
                headers=row.headers,
                message_id=row.id,  # the row's id: a consumer's inbox deduplicates on it
                content_type=row.content_type,
            )
            with engine.begin() as connection:
                connection.execute(delete(outbox_message).where(outbox_message.c.id == row.id))
    return len(rows)


def consume(worker: Worker, deliveries: int, timeout: float = 60.0) -> None:
    """Run ``worker`` until it has acked ``deliveries``."""
    worker.prepare()
    thread = threading.Thread(target=worker.run, name="worker")
    thread.start()
    deadline = time.monotonic() + timeout
    try:
        while worker.stats.acked < deliveries and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        worker.stop()
        thread.join(timeout)


def count(engine: Engine, table: Table) -> int:
    with engine.connect() as connection:
        return int(connection.execute(select(func.count()).select_from(table)).scalar_one())


def run(database_url: str, broker: str, prefix: str = "example") -> int:
    """The whole scenario, on queues named ``<prefix>.orders`` and
    ``<prefix>.order-confirmed``; 0 when every effect happened exactly once."""
    orders_queue, confirmed_queue = f"{prefix}.orders", f"{prefix}.order-confirmed"
    engine = create_engine(database_url)
    inbox_metadata.create_all(engine)
    shop.create_all(engine)
    sessions = sessionmaker(engine)
    inbox = confirming_inbox(sessions, announce_to=confirmed_queue)
    worker = Worker(inbox, broker, [orders_queue], stats_interval=None)
    with Connection(broker) as connection, connection.channel() as channel:
        channel.queue_declare(queue=confirmed_queue, durable=True, auto_delete=False)
    worker.prepare()  # declares the orders queue (and its retry and dead-letter queues)
    try:
        published = []
        for customer, amount in (("ada", 120), ("grace", 80), ("mallory", 5000), ("edsger", 45)):
            try:
                published.append(create_order(sessions, customer, amount, queue=orders_queue))
                print(f"POST /orders {customer}: order {published[-1].body['order_id']} created")
            except CardDeclined as exc:
                print(f"POST /orders {customer}: failed ({exc}); nothing was sent")
        created = relay(engine, broker)
        print(f"relay: {created} order.created message(s) sent")
        with Publisher(broker) as publisher:  # the first one again, under its own id
            publisher.publish_message(published[0], routing_key=orders_queue)
        consume(worker, deliveries=created + 1)
        print(f"consumer: {worker.stats.summary()}")
        confirmed = relay(engine, broker)
        print(f"relay: {confirmed} order.confirmed message(s) sent")
        announced = take_all(broker, confirmed_queue)
        totals = (count(engine, orders), count(engine, confirmations), len(announced))
        print(f"orders={totals[0]} confirmations={totals[1]} order.confirmed sent={totals[2]}")
        ok = totals == (3, 3, 3) and count(engine, outbox_message) == 0
        print("every order confirmed and announced exactly once" if ok else "MISMATCH")
        return 0 if ok else 1
    finally:
        with Connection(broker) as connection, connection.channel() as channel:
            channel.queue_delete(queue=confirmed_queue)
            for topology in worker.topologies:
                for queue in topology.queues():
                    channel.queue_delete(queue=queue.name)
        worker.connection.release()
        engine.dispose()


def take_all(broker: str, queue: str) -> list[object]:
    """Take (and ack) every message in ``queue``; their bodies."""
    bodies: list[object] = []
    with Connection(broker) as connection, connection.SimpleQueue(queue) as simple:
        while True:
            try:
                message = simple.get_nowait()
            except simple.Empty:
                return bodies
            bodies.append(message.payload)
            message.ack()


def main(argv: Sequence[str] | None = None) -> int:
    """Run the example from the command line."""
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    parser.add_argument("--database-url", help="default: SQLite in a fresh temporary directory")
    parser.add_argument("--broker", default="memory://", help="default: memory:// (in-process)")
    parser.add_argument("--prefix", default="example", help="queue names start with it")
    options = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="outbox-orders-") as scratch:
        url = options.database_url or f"sqlite:///{Path(scratch) / 'orders.db'}"
        return run(url, options.broker, options.prefix)


if __name__ == "__main__":
    sys.exit(main())
