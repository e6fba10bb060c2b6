"""Outbox.publish from an AsyncSession on every async driver: no await needed, the row
exists if and only if the transaction commits, inside AsyncInbox handlers it commits with
the claim, and sessions in autocommit are refused."""

from __future__ import annotations

from asyncio import current_task
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, insert, select
from sqlalchemy.ext.asyncio import AsyncSession, async_scoped_session, async_sessionmaker
from support.aio import ASYNC_DRIVERS, AsyncDatabase, fresh_async_database, record_effect, run
from support.databases import effects
from support.effects import order

from inbox import HandlerFailed, Message, Outbox, Outcome, SessionConfigurationError
from inbox.aio import AsyncInbox
from inbox.outbox._row import row_from_mapping
from inbox.schema import outbox_message


@pytest.fixture(params=list(ASYNC_DRIVERS))
def adb(
    request: pytest.FixtureRequest, admin_engines: dict[str, Engine], tmp_path: Path
) -> Iterator[AsyncDatabase]:
    """A fresh database reached through each async driver in turn."""
    yield from fresh_async_database(request.param, admin_engines, tmp_path)


def stored(adb: AsyncDatabase) -> list[Any]:
    with adb.db.engine.connect() as connection:
        rows = connection.execute(select(outbox_message).order_by(outbox_message.c.id))
        return [row_from_mapping(r._mapping) for r in rows]


def test_publish_from_an_async_session_commits_or_rolls_back_with_it(adb: AsyncDatabase) -> None:
    outbox = Outbox()

    async def main() -> Any:
        async with adb.engine() as engine:
            sessions = async_sessionmaker(engine)
            async with sessions() as session, session.begin():
                await session.execute(insert(effects).values(ref="1", handler="web"))
                kept = outbox.publish(
                    session,
                    "order.created",
                    {"order_id": 1},
                    routing_key="orders",
                    headers={"raw": b"\x01"},
                )
            async with sessions() as session:
                outbox.publish(session, "order.created", {"order_id": 2}, routing_key="orders")
                await session.flush()
                await session.rollback()
            async with sessions() as session, session.begin():
                survivor = outbox.publish(session, "kept.too", {}, routing_key="q")
                savepoint = await session.begin_nested()
                outbox.publish(session, "dropped", {}, routing_key="q")
                await session.flush()
                await savepoint.rollback()
            return kept, survivor

    kept, survivor = run(main())
    rows = stored(adb)
    assert [r.id for r in rows] == [kept, survivor]
    assert (rows[0].body, rows[0].headers) == (b'{"order_id":1}', {"raw": b"\x01"})


def test_inside_an_async_handler_the_row_commits_with_the_claim(adb: AsyncDatabase) -> None:
    outbox = Outbox()
    failures = [1]

    async def main() -> list[Any]:
        async with adb.engine() as engine:
            inbox = AsyncInbox(async_sessionmaker(engine))

            @inbox.handler("order.created", name="orders.confirm")
            async def confirm(message: Message, session: AsyncSession) -> None:
                await record_effect(message, session, "orders.confirm")
                outbox.publish(
                    session, "order.confirmed", {"ref": message.body["ref"]}, routing_key="c"
                )
                if failures[0]:
                    failures[0] -= 1
                    raise RuntimeError("the handler failed after publishing")

            message = order(7)
            outcomes: list[Any] = []
            with pytest.raises(HandlerFailed):
                await inbox.process(message)
            outcomes.append(stored(adb))
            outcomes.append((await inbox.process(message)).outcome)
            outcomes.append((await inbox.process(message)).outcome)
            return outcomes

    left_by_failure, first, again = run(main())
    assert left_by_failure == []
    assert (first, again) == (Outcome.PROCESSED, Outcome.DUPLICATE)
    [row] = stored(adb)
    assert (row.type, row.body) == ("order.confirmed", b'{"ref":7}')
    assert adb.db.count(outbox_message) == 1
    assert adb.db.effect_counts() == {("7", "orders.confirm"): 1}


def test_an_async_engine_in_autocommit_is_refused_at_the_call(adb: AsyncDatabase) -> None:
    outbox = Outbox()

    async def main() -> None:
        async with (
            adb.engine(isolation_level="AUTOCOMMIT") as engine,
            AsyncSession(engine) as session,
        ):
            with pytest.raises(SessionConfigurationError, match="AUTOCOMMIT"):
                outbox.publish(session, "t", {}, routing_key="q")
            assert not session.new
        async with (
            adb.engine() as engine,
            AsyncSession(engine.execution_options(isolation_level="AUTOCOMMIT")) as session,
        ):
            with pytest.raises(SessionConfigurationError, match="AUTOCOMMIT"):
                outbox.publish(session, "t", {}, routing_key="q")

    run(main())
    assert stored(adb) == []


def test_autocommit_set_on_the_connection_is_refused_before_the_flush_writes(
    adb: AsyncDatabase,
) -> None:
    outbox = Outbox()

    async def main() -> None:
        async with adb.engine() as engine, AsyncSession(engine) as session:
            outbox.publish(session, "t", {}, routing_key="q")
            await session.connection(execution_options={"isolation_level": "AUTOCOMMIT"})
            with pytest.raises(SessionConfigurationError, match="AUTOCOMMIT"):
                await session.flush()

    run(main())
    assert stored(adb) == []


def test_an_async_session_that_may_not_autobegin_must_be_in_a_transaction(
    adb: AsyncDatabase,
) -> None:
    outbox = Outbox()

    async def main() -> None:
        async with adb.engine() as engine, AsyncSession(engine, autobegin=False) as session:
            with pytest.raises(SessionConfigurationError, match="never begins a transaction"):
                outbox.publish(session, "t", {}, routing_key="q")
            async with session.begin():
                outbox.publish(session, "t", {}, routing_key="q")

    run(main())
    assert len(stored(adb)) == 1


def test_an_async_scoped_session_works(adb: AsyncDatabase) -> None:
    outbox = Outbox()

    async def main() -> None:
        async with adb.engine() as engine:
            scoped = async_scoped_session(async_sessionmaker(engine), scopefunc=current_task)
            async with scoped.begin():
                outbox.publish(scoped, "scoped", {}, routing_key="q")
            await scoped.remove()

    run(main())
    assert [row.type for row in stored(adb)] == ["scoped"]
