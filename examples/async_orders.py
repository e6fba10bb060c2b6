"""An async service end to end: a request writes through the outbox, a FastStream consumer
behind an AsyncInbox applies it exactly once. SQLite and FastStream's in-memory broker by
default, so it runs with no servers:

    pip install -e '.[aio,faststream]'
    python examples/async_orders.py [--database-url sqlite+aiosqlite:///orders.db]

1. ``create_order`` is a FastAPI-style request handler (a plain async function here, so the
   example needs no web framework): it writes the order and, in the same ``AsyncSession``
   transaction, an ``order.created`` message through :class:`inbox.Outbox`. The message
   exists if and only if the order does.
2. ``forward_outbox`` does the relay's job in-process, because the in-memory broker lives in
   this process. In production the relay (``inbox-relay``) sends the committed rows to
   RabbitMQ, and a FastStream app in another process consumes them.
3. ``subscribe_rabbit`` runs the FastStream subscriber on ``orders`` through the AsyncInbox:
   ``billing.invoice`` writes one invoice per order, and the copy the broker delivers again
   (sent twice here on purpose, as a relay that crashed before deleting its row would) is
   acked as a duplicate without a second invoice.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from faststream.rabbit import RabbitBroker
from faststream.rabbit.testing import TestRabbitBroker
from sqlalchemy import Column, Integer, MetaData, String, Table, delete, func, insert, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker, create_async_engine

from inbox import Message, Outbox
from inbox.aio import AsyncInbox
from inbox.broker import RetryPolicy
from inbox.faststream import subscribe_rabbit
from inbox.outbox import headers_from_json
from inbox.schema import metadata as inbox_metadata
from inbox.schema import outbox_message

shop = MetaData()
orders = Table(
    "shop_order",
    shop,
    Column("id", Integer, primary_key=True),
    Column("customer", String(100), nullable=False),
    Column("amount", Integer, nullable=False),
)
invoices = Table(
    "shop_invoice",
    shop,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("order_id", Integer, nullable=False),
    Column("amount", Integer, nullable=False),
)

outbox = Outbox()


async def create_order(
    sessions: async_sessionmaker[AsyncSession], request: dict[str, Any]
) -> dict[str, Any]:
    """``POST /orders``: the order and its ``order.created`` message in one transaction."""
    async with sessions() as session, session.begin():
        values = {"customer": request["customer"], "amount": request["amount"]}
        created = await session.execute(insert(orders).values(values).returning(orders.c.id))
        order_id = created.scalar_one()
        message_id = outbox.publish(
            session,
            "order.created",
            {"order_id": order_id, "amount": request["amount"]},
            routing_key="orders",
        )
    return {"order_id": order_id, "message_id": str(message_id)}


async def forward_outbox(
    sessions: async_sessionmaker[AsyncSession], broker: RabbitBroker, *, twice: bool
) -> int:
    """Send every committed outbox row to ``broker`` under its own id, then delete it (the
    relay's job; ``twice`` sends the first row again, as a crashed relay would)."""
    async with sessions() as session:
        rows = (await session.execute(select(outbox_message))).all()
    for index, row in enumerate(rows):
        for _ in range(2 if twice and index == 0 else 1):
            await broker.publish(
                row.body,
                queue=row.routing_key,
                message_id=str(row.id),  # the row's id: a downstream inbox dedups on it
                message_type=row.type,
                headers=headers_from_json(row.headers),
                content_type=row.content_type,
                persist=True,
            )
        async with sessions() as session, session.begin():
            await session.execute(delete(outbox_message).where(outbox_message.c.id == row.id))
    return len(rows)


def billing(sessions: async_sessionmaker[AsyncSession]) -> AsyncInbox:
    """The consumer's inbox: one invoice per ``order.created``."""
    inbox = AsyncInbox(sessions)

    @inbox.handler("order.created", name="billing.invoice")
    async def invoice(message: Message, session: AsyncSession) -> None:
        body = message.body
        await session.execute(
            insert(invoices).values(order_id=body["order_id"], amount=body["amount"])
        )

    return inbox


async def run(database_url: str) -> dict[str, int]:
    """The whole scenario; the counts it ends with."""
    engine = create_async_engine(database_url)
    try:
        async with engine.begin() as connection:
            await connection.run_sync(inbox_metadata.create_all)
            await connection.run_sync(shop.create_all)
        sessions = async_sessionmaker(engine, expire_on_commit=False)
        broker = RabbitBroker()
        consumer = subscribe_rabbit(
            broker, billing(sessions), "orders", retry=RetryPolicy(delays=(0.01,), max_tries=3)
        )
        async with TestRabbitBroker(broker) as test_broker:
            for customer, amount in (("ada", 120), ("grace", 80), ("edsger", 45)):
                created = await create_order(sessions, {"customer": customer, "amount": amount})
                order_id, message_id = created["order_id"], created["message_id"]
                print(f"POST /orders {customer}: order {order_id}, message {message_id}")
            sent = await forward_outbox(sessions, test_broker, twice=True)
        async with sessions() as session:
            counts = {
                "orders": await _count(session, orders),
                "invoices": await _count(session, invoices),
                "outbox_rows": await _count(session, outbox_message),
                "sent": sent,
                "processed": consumer.stats.processed,
                "duplicates": consumer.stats.duplicates,
                "acked": consumer.stats.acked,
            }
    finally:
        await engine.dispose()
    return counts


async def _count(session: AsyncSession, table: Table) -> int:
    return int((await session.execute(select(func.count()).select_from(table))).scalar_one())


def main(argv: Sequence[str] | None = None) -> int:
    """Run the example; exit 0 when every order has exactly one invoice."""
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    parser.add_argument("--database-url", help="default: SQLite in a fresh temporary directory")
    options = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as scratch:
        url = options.database_url or f"sqlite+aiosqlite:///{Path(scratch) / 'orders.db'}"
        counts = asyncio.run(run(url))
    print(
        f"orders={counts['orders']} invoices={counts['invoices']} "
        f"outbox rows left={counts['outbox_rows']}; consumer: processed={counts['processed']} "
        f"duplicates={counts['duplicates']} acked={counts['acked']}"
    )
    ok = counts["invoices"] == counts["orders"] and counts["outbox_rows"] == 0
    print("every order invoiced exactly once" if ok else "MISMATCH")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
