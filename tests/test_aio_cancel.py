"""AsyncInbox under cancellation, on every async driver: a task cancelled at any await point
(the claim, a handler's statement, an await inside the handler, the claim check, the commit)
or timed out by ``asyncio.timeout`` rolls back, raises the cancellation as itself, leaves no
connection checked out and no transaction holding the claim, and a redelivery then commits
the message exactly once."""

from __future__ import annotations

import asyncio
import sqlite3
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, event, make_url, select, text
from sqlalchemy.ext.asyncio import AsyncSession
from support.aio import (
    ASYNC_DRIVERS,
    AsyncDatabase,
    KeptSessions,
    checked_out,
    fresh_async_database,
    record_effect,
    run,
)
from support.effects import order

from inbox import Message, Outcome
from inbox.aio import AsyncInbox
from inbox.schema import inbox_message

# Where the cancellation lands: the SQL statement (or event) at which the task is cancelled.
POINTS = ("claim", "handler-first-statement", "handler-second-statement", "claim-check", "commit")
BOTH_EFFECTS = {("1", "first"): 1, ("1", "second"): 1}


@pytest.fixture(params=list(ASYNC_DRIVERS))
def adb(
    request: pytest.FixtureRequest, admin_engines: dict[str, Engine], tmp_path: Path
) -> Iterator[AsyncDatabase]:
    """A fresh database reached through each async driver in turn."""
    yield from fresh_async_database(request.param, admin_engines, tmp_path)


def claims(adb: AsyncDatabase) -> list[tuple[uuid.UUID, str]]:
    with adb.db.engine.connect() as connection:
        rows = connection.execute(select(inbox_message.c.message_id, inbox_message.c.handler))
        return [(m, h) for m, h in rows]


def two_statement_inbox(sessions: KeptSessions) -> AsyncInbox:
    inbox = AsyncInbox(sessions)

    @inbox.handler("order.created", name="writer")
    async def writer(message: Message, session: AsyncSession) -> None:
        await record_effect(message, session, "first")
        await record_effect(message, session, "second")

    return inbox


def is_point(point: str, statement: str) -> bool:
    sql = " ".join(statement.split()).lower()
    if point == "claim":
        return sql.startswith("insert into inbox_message")
    if point in ("handler-first-statement", "handler-second-statement"):
        return sql.startswith("insert into effects")
    checks = sql.startswith("select count(*)")
    return point == "claim-check" and checks and "inbox_message" in sql


FIXED_ID = uuid.UUID("01890a5d-ac96-774b-bcce-b302099a8057")


def assert_no_lock_held(adb: AsyncDatabase) -> None:
    """On SQLite, nothing holds a lock on the database file: a connection that waits not at
    all takes an exclusive transaction. (A cancelled statement left pending on a closed
    connection keeps its transaction's locks until garbage collection: every writer waits.)
    On the servers the redelivery below shows the claim's lock is gone."""
    if adb.db.backend != "sqlite":
        return
    path = make_url(adb.db.url).database
    assert path
    probe = sqlite3.connect(path, timeout=0, isolation_level=None)
    try:
        probe.execute("BEGIN EXCLUSIVE")
        probe.execute("ROLLBACK")
    finally:
        probe.close()


def fixed(ref: object) -> Message:
    return Message(id=FIXED_ID, type="order.created", body={"ref": ref})


@pytest.mark.parametrize("point", POINTS)
def test_a_task_cancelled_at_any_await_point_rolls_back_and_raises_cancelled_error(
    adb: AsyncDatabase, point: str
) -> None:
    async def main() -> None:
        async with adb.engine() as engine:
            sessions = KeptSessions(engine)
            inbox = two_statement_inbox(sessions)
            cancelled_at: list[str] = []
            task: asyncio.Task[Any] | None = None
            inserts = [0]

            def cancel_here(what: str) -> None:
                assert task is not None
                if not cancelled_at:
                    cancelled_at.append(what)
                    task.cancel()

            def before_execute(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
                if not is_point(point, statement):
                    return
                if point.startswith("handler-"):
                    inserts[0] += 1
                    wanted = 1 if point == "handler-first-statement" else 2
                    if inserts[0] != wanted:
                        return
                cancel_here(statement)

            def on_commit(conn: Any) -> None:
                if point == "commit":
                    cancel_here("COMMIT")

            sync_engine = engine.sync_engine
            event.listen(sync_engine, "before_cursor_execute", before_execute)
            event.listen(sync_engine, "commit", on_commit)
            try:
                task = asyncio.create_task(inbox.process(fixed(1)))
                if point == "claim-check" and adb.driver in ("psycopg", "asyncpg"):
                    # No claim check on psycopg or asyncpg: the server's reported marker says
                    # the transaction is the claim's (inbox/_backends/postgresql/_psycopg.py,
                    # _asyncpg.py).
                    assert (await task).outcome is Outcome.PROCESSED
                    assert cancelled_at == []
                    assert adb.db.effect_counts() == BOTH_EFFECTS
                    return
                with pytest.raises(asyncio.CancelledError):
                    await task
            finally:
                event.remove(sync_engine, "before_cursor_execute", before_execute)
                event.remove(sync_engine, "commit", on_commit)
            assert cancelled_at, f"the {point} was never reached"
            assert task.cancelled()  # the CancelledError itself, not a wrapper
            assert checked_out(engine) == 0
            assert sessions.left_open() == []
            assert_no_lock_held(adb)
            effects, held = adb.db.effect_counts(), claims(adb)
            commit_sent = point == "commit"
            if commit_sent:
                # The COMMIT may have reached the server before the cancellation: then the
                # claim and every effect landed together, never one without the other.
                assert (effects, held) in (({}, []), (BOTH_EFFECTS, [(FIXED_ID, "writer")]))
            else:
                assert (effects, held) == ({}, [])

            async with asyncio.timeout(20):  # an open transaction holding the claim blocks it
                result = await inbox.process(fixed(1))
            assert result.outcome is (
                Outcome.DUPLICATE if held and commit_sent else Outcome.PROCESSED
            )
            assert checked_out(engine) == 0
            assert sessions.left_open() == []
        assert adb.db.effect_counts() == BOTH_EFFECTS
        assert claims(adb) == [(FIXED_ID, "writer")]

    run(main())


@pytest.mark.parametrize("where", ["an await in the handler", "a slow statement"])
def test_a_timeout_around_process_rolls_back_and_raises_timeout_error(
    adb: AsyncDatabase, where: str
) -> None:
    async def main() -> None:
        async with adb.engine() as engine:
            sessions = KeptSessions(engine)
            inbox = AsyncInbox(sessions)
            slow = [True]

            @inbox.handler("order.created", name="writer")
            async def writer(message: Message, session: AsyncSession) -> None:
                await record_effect(message, session, "first")
                if slow[0]:
                    if where == "a slow statement" and adb.db.backend != "sqlite":
                        sleep = "pg_sleep" if adb.db.backend == "postgresql" else "SLEEP"
                        await session.execute(text(f"SELECT {sleep}(30)"))
                    else:
                        await asyncio.sleep(30)
                await record_effect(message, session, "second")

            started = time.monotonic()
            with pytest.raises(TimeoutError):
                async with asyncio.timeout(0.5):
                    await inbox.process(fixed(1))
            assert time.monotonic() - started < 15
            assert checked_out(engine) == 0
            assert sessions.left_open() == []
            assert adb.db.effect_counts() == {}
            assert claims(adb) == []

            slow[0] = False
            async with asyncio.timeout(20):
                assert (await inbox.process(fixed(1))).outcome is Outcome.PROCESSED
        assert adb.db.effect_counts() == BOTH_EFFECTS
        assert claims(adb) == [(FIXED_ID, "writer")]

    run(main())


def test_a_cancelled_batch_rolls_back_every_message_and_a_redelivery_commits_each_once(
    adb: AsyncDatabase,
) -> None:
    async def main() -> None:
        async with adb.engine() as engine:
            sessions = KeptSessions(engine)
            inbox = AsyncInbox(sessions)
            gate = asyncio.Event()

            @inbox.handler("order.created", name="writer")
            async def writer(message: Message, session: AsyncSession) -> None:
                await record_effect(message, session, "first")
                if message.body["ref"] == 3 and not gate.is_set():
                    await asyncio.sleep(30)

            batch = [order(n) for n in range(5)]
            with pytest.raises(TimeoutError):
                async with asyncio.timeout(0.5):
                    await inbox.process_batch(batch)
            assert checked_out(engine) == 0
            assert sessions.left_open() == []
            assert adb.db.effect_counts() == {}
            assert claims(adb) == []

            gate.set()
            async with asyncio.timeout(20):
                results = await inbox.process_batch(batch)
            assert [getattr(r, "outcome", r) for r in results] == [Outcome.PROCESSED] * 5
        assert adb.db.effect_counts() == {(str(n), "first"): 1 for n in range(5)}

    run(main())


def test_a_second_cancellation_during_the_rollback_does_not_cut_the_cleanup_short(
    adb: AsyncDatabase,
) -> None:
    """Cancelled while the handler awaits, then again while the inbox rolls back: the
    rollback still completes on the server, so the connection goes back to the pool intact
    (not invalidated halfway), and nothing is left open."""

    async def main() -> None:
        async with adb.engine() as engine:
            sessions = KeptSessions(engine)
            inbox = AsyncInbox(sessions)
            written = asyncio.Event()
            slow = [True]

            @inbox.handler("order.created", name="writer")
            async def writer(message: Message, session: AsyncSession) -> None:
                await record_effect(message, session, "first")
                written.set()
                if slow[0]:
                    await asyncio.sleep(30)
                await record_effect(message, session, "second")

            task = asyncio.create_task(inbox.process(fixed(1)))
            cancels: list[str] = []

            def on_rollback(conn: Any) -> None:
                if cancels == ["in the handler"]:
                    cancels.append("during the rollback")
                    task.cancel()

            connects = [0]

            def on_connect(dbapi_connection: Any, record: Any) -> None:
                connects[0] += 1

            sync_engine = engine.sync_engine
            event.listen(sync_engine, "connect", on_connect)
            event.listen(sync_engine, "rollback", on_rollback)
            try:
                await written.wait()
                cancels.append("in the handler")
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
            finally:
                event.remove(sync_engine, "rollback", on_rollback)
            assert cancels == ["in the handler", "during the rollback"]
            assert checked_out(engine) == 0
            assert sessions.left_open() == []
            assert (adb.db.effect_counts(), claims(adb)) == ({}, [])
            slow[0] = False
            async with asyncio.timeout(20):
                assert (await inbox.process(fixed(1))).outcome is Outcome.PROCESSED
            assert connects == [1]  # reused: rolled back whole, not invalidated halfway
        assert adb.db.effect_counts() == BOTH_EFFECTS

    run(main())
