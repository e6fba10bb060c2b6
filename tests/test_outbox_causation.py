"""Messages sent from a handler (``Outbox.publish`` in its transaction) name the message that
caused them (``x-inbox-causation-id``) and carry their conversation's correlation id
(``x-inbox-conversation-id``) unchanged down the chain; a message published anywhere else
gets neither, and headers the caller gives win. Checked on every database, and through the
async inbox on PostgreSQL."""

from __future__ import annotations

import asyncio
from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from sqlalchemy.orm import Session, sessionmaker
from support.aio import async_engine
from support.databases import Database

from inbox import Inbox, Message, Outbox
from inbox.aio import AsyncInbox
from inbox.delivery.headers import CAUSATION_ID, CONVERSATION_ID
from inbox.outbox import headers_from_json
from inbox.schema import outbox_message


def sent(db: Database) -> dict[str, dict[str, Any]]:
    """Each outbox row's headers, by its message type."""
    with db.engine.connect() as connection:
        rows = connection.execute(select(outbox_message.c.type, outbox_message.c.headers))
        return {type_: headers_from_json(headers) for type_, headers in rows}


def test_a_chain_of_handlers_carries_causation_and_one_conversation(db: Database) -> None:
    outbox = Outbox()
    inbox = Inbox(sessionmaker(db.engine))

    @inbox.handler("order.placed", name="orders.place")
    def place(message: Message, session: Session) -> None:
        outbox.publish(session, "order.billed", {"n": 1}, routing_key="billing")

    @inbox.handler("order.billed", name="billing.bill")
    def bill(message: Message, session: Session) -> None:
        outbox.publish(session, "order.shipped", {"n": 2}, routing_key="shipping")

    root = Message.new("order.placed", {"n": 0})
    inbox.process(root)
    billed = sent(db)["order.billed"]
    assert billed[CAUSATION_ID] == str(root.id)
    assert billed[CONVERSATION_ID] == str(root.id)  # the root began the conversation

    with db.engine.connect() as connection:
        billed_id = connection.execute(
            select(outbox_message.c.id).where(outbox_message.c.type == "order.billed")
        ).scalar_one()
    inbox.process(Message(id=billed_id, type="order.billed", body={"n": 1}, headers=billed))
    shipped = sent(db)["order.shipped"]
    assert shipped[CAUSATION_ID] == str(billed_id)
    assert shipped[CONVERSATION_ID] == str(root.id)  # unchanged down the chain


def test_outside_a_handler_nothing_is_added_and_given_headers_win(db: Database) -> None:
    outbox = Outbox()
    with Session(db.engine) as session, session.begin():
        outbox.publish(session, "plain", {}, routing_key="q")
    assert CAUSATION_ID not in sent(db)["plain"]
    assert CONVERSATION_ID not in sent(db)["plain"]

    inbox = Inbox(sessionmaker(db.engine))

    @inbox.handler("in", name="relay.forward")
    def forward(message: Message, session: Session) -> None:
        outbox.publish(
            session, "out", {}, routing_key="q", headers={CONVERSATION_ID: "chosen-by-app"}
        )

    incoming = Message.new("in", {}, headers={CONVERSATION_ID: 7})  # not a text: ignored
    inbox.process(incoming)
    assert sent(db)["out"][CONVERSATION_ID] == "chosen-by-app"
    assert sent(db)["out"][CAUSATION_ID] == str(incoming.id)


def test_the_async_inbox_adds_them_too(pg_db: Database) -> None:
    outbox = Outbox()

    async def run() -> Message:
        async with async_engine(pg_db, "asyncpg") as engine:
            inbox = AsyncInbox(async_sessionmaker(engine))

            @inbox.handler("in", name="async.forward")
            async def forward(message: Message, session: AsyncSession) -> None:
                outbox.publish(session, "out", {}, routing_key="q")

            incoming = Message.new("in", {}, headers={CONVERSATION_ID: "conversation-1"})
            await inbox.process(incoming)
            return incoming

    incoming = asyncio.run(run())
    assert sent(pg_db)["out"][CAUSATION_ID] == str(incoming.id)
    assert sent(pg_db)["out"][CONVERSATION_ID] == "conversation-1"
