"""The asyncpg backend (``inbox/_backends/postgresql/_asyncpg.py``): the claim's transaction
known to be open from what asyncpg keeps of the server's reports, so no claim-row read
before the COMMIT; and every way a handler can end or abort that transaction behind the
inbox, through the raw asyncpg connection too, still caught before anything commits."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, event, select
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from support.aio import AsyncDatabase, checked_out, fresh_async_database, record_effect, run
from support.effects import order

from inbox import HandlerFailed, Message, Outcome, TransactionControlError
from inbox._backends import backend_for
from inbox._backends.postgresql._asyncpg import AsyncpgBackend
from inbox.aio import AsyncInbox
from inbox.schema import inbox_message


@pytest.fixture
def adb(admin_engines: dict[str, Engine], tmp_path: Path) -> Iterator[AsyncDatabase]:
    yield from fresh_async_database("asyncpg", admin_engines, tmp_path)


def claims(adb: AsyncDatabase) -> int:
    with adb.db.engine.connect() as connection:
        return len(connection.execute(select(inbox_message.c.message_id)).all())


async def raw(session: AsyncSession) -> Any:
    """The asyncpg connection under the session's transaction."""
    connection = await session.connection()
    return (await connection.get_raw_connection()).driver_connection


def test_asyncpg_has_a_backend_of_its_own(adb: AsyncDatabase) -> None:
    async def main() -> None:
        async with adb.engine() as engine:
            assert isinstance(backend_for(engine.dialect), AsyncpgBackend)

    run(main())


def test_a_first_delivery_sends_no_claim_row_read_before_its_commit(adb: AsyncDatabase) -> None:
    """The generic backend read the claim row back before every COMMIT on asyncpg (one
    round trip per message); the marker says the transaction is the claim's own."""
    statements: list[str] = []

    def before(conn: Any, cursor: Any, statement: str, *_: Any) -> None:
        statements.append(" ".join(statement.split()).lower())

    async def main() -> None:
        async with adb.engine() as engine:
            event.listen(engine.sync_engine, "before_cursor_execute", before)
            inbox = AsyncInbox(async_sessionmaker(engine))

            @inbox.handler("order.created", name="writer")
            async def writer(message: Message, session: AsyncSession) -> None:
                await record_effect(message, session, "writer")

            for ref in range(3):
                assert (await inbox.process(order(ref))).outcome is Outcome.PROCESSED

    run(main())
    reads = [s for s in statements if s.startswith("select") and "inbox_message" in s]
    assert reads == []
    assert sum(s.startswith("insert into inbox_message") for s in statements) == 3
    assert claims(adb) == 3
    assert adb.db.effect_counts() == {(str(ref), "writer"): 1 for ref in range(3)}


@pytest.mark.parametrize(
    "how",
    [
        "rollback",  # raw ROLLBACK: later writes would commit one by one
        "rollback-and-begin",  # a new transaction, whose marker was never set
        "swallowed-error",  # a failed statement aborted it; asyncpg still says "in one"
        "commit",  # raw COMMIT: the claim and the first write are in early
    ],
)
def test_a_handler_ending_the_transaction_on_the_raw_connection_commits_nothing_more(
    adb: AsyncDatabase, how: str
) -> None:
    async def main() -> None:
        async with adb.engine() as engine:
            inbox = AsyncInbox(async_sessionmaker(engine))

            @inbox.handler("order.created", name="sneaky")
            async def sneaky(message: Message, session: AsyncSession) -> None:
                driver = await raw(session)
                if how == "swallowed-error":
                    with contextlib.suppress(Exception):
                        await driver.execute("SELECT 1/0")
                elif how == "rollback-and-begin":
                    await driver.execute("ROLLBACK; BEGIN")
                else:
                    await driver.execute(how.upper())

            with pytest.raises(HandlerFailed) as failed:
                await inbox.process(order(1))
            error = failed.value.failures["sneaky"]
            assert isinstance(error, TransactionControlError | DBAPIError), error
            assert checked_out(engine) == 0

    run(main())
    assert claims(adb) == (1 if how == "commit" else 0)
    assert adb.db.effect_counts() == {}
