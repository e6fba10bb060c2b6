"""What differs per async driver: the claim statement each one sends, and transient errors
each one reports, which the async inbox retries with the blocking inbox's backoff."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, event, insert, text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from support.aio import (
    ASYNC_DRIVERS,
    SERVER_DRIVERS,
    AsyncDatabase,
    fresh_async_database,
    record_effect,
    run,
)
from support.databases import effects
from support.effects import order

from inbox import Message, Outcome
from inbox.aio import AsyncInbox


@pytest.fixture(params=list(ASYNC_DRIVERS))
def adb(
    request: pytest.FixtureRequest, admin_engines: dict[str, Engine], tmp_path: Path
) -> Iterator[AsyncDatabase]:
    """A fresh database reached through each async driver in turn."""
    yield from fresh_async_database(request.param, admin_engines, tmp_path)


@pytest.fixture(params=SERVER_DRIVERS)
def server_adb(
    request: pytest.FixtureRequest, admin_engines: dict[str, Engine], tmp_path: Path
) -> Iterator[AsyncDatabase]:
    """A fresh database on the real servers, through their async drivers."""
    yield from fresh_async_database(request.param, admin_engines, tmp_path)


def test_each_driver_sends_the_claim_it_was_built_for(adb: AsyncDatabase) -> None:
    """psycopg (async too) takes the pre-rendered pyformat claim through exec_driver_sql;
    asyncpg's paramstyle is numeric_dollar, so it gets the compiled statement instead of
    SQL rendered for another paramstyle; SQLite and MariaDB compile theirs as always."""
    seen: list[tuple[str, bool]] = []

    def before_execute(
        conn: Any, cursor: Any, statement: str, params: Any, context: Any, *_: Any
    ) -> None:
        if " ".join(statement.split()).lower().startswith("insert into inbox_message"):
            seen.append((statement, context.compiled is not None))

    async def main() -> None:
        async with adb.engine() as engine:
            event.listen(engine.sync_engine, "before_cursor_execute", before_execute)
            inbox = AsyncInbox(async_sessionmaker(engine))

            @inbox.handler(name="writer")
            async def writer(message: Message, session: AsyncSession) -> None:
                await record_effect(message, session, "writer")

            message = order(1)
            assert (await inbox.process(message)).outcome is Outcome.PROCESSED
            assert (await inbox.process(message)).outcome is Outcome.DUPLICATE

    run(main())
    assert len(seen) == 2
    statement, compiled = seen[0]
    if adb.driver == "psycopg":
        assert compiled  # statement listeners see the claim: it goes through SQLAlchemy
    elif adb.driver == "asyncpg":
        assert (compiled, "$1" in statement) == (True, True)
    else:
        assert compiled
    assert adb.db.effect_counts() == {("1", "writer"): 1}


def test_a_lock_timeout_is_retried_until_the_lock_is_released(server_adb: AsyncDatabase) -> None:
    """Another transaction holds a row the handler updates past the lock timeout
    (PostgreSQL 55P03, MariaDB 1205): the inbox re-runs the transaction after a backoff
    (awaited, so the holder's task runs meanwhile) until it succeeds, once."""
    with server_adb.db.engine.begin() as connection:
        connection.execute(insert(effects).values(id=1000, ref="seed", handler="seed"))
    postgres = server_adb.db.backend == "postgresql"
    attempts: list[float] = []

    async def main() -> None:
        async with server_adb.engine() as engine:
            inbox = AsyncInbox(async_sessionmaker(engine), transient_retries=8)

            @inbox.handler("order.created", name="billing.charge")
            async def charge(message: Message, session: AsyncSession) -> None:
                attempts.append(asyncio.get_running_loop().time())
                if postgres:
                    await session.execute(text("SET LOCAL lock_timeout = '200ms'"))
                else:
                    await session.execute(text("SET SESSION innodb_lock_wait_timeout = 1"))
                charged = "UPDATE effects SET handler = 'charged' WHERE id = 1000"
                await session.execute(text(charged))
                await record_effect(message, session, "billing.charge")

            async with engine.connect() as holder:
                await holder.begin()
                await holder.execute(text("UPDATE effects SET ref = 'held' WHERE id = 1000"))
                task = asyncio.create_task(inbox.process(order(1)))
                while len(attempts) < 2:  # the first attempt timed out and was re-run
                    await asyncio.sleep(0.05)
                    assert not task.done(), task.result()
                await holder.rollback()
            assert (await task).outcome is Outcome.PROCESSED

    run(main())
    assert len(attempts) >= 2
    assert server_adb.db.effect_counts()[("1", "billing.charge")] == 1
