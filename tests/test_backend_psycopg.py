"""PostgreSQL through psycopg 3 (inbox/_backends/postgresql/_psycopg.py): BEGIN and the
prepared claim in one round trip, no claim check (the server's reported marker tells the
transaction's end), counted on the wire by a proxy, semantics unchanged: the connection's
transaction settings, every prepare_threshold, a lost claim committing nothing, psycopg
managing the transaction as usual afterwards, a statement deallocated under the inbox, a
cancellation mid-pipeline."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from sqlalchemy import Engine, create_engine, event, func, insert, select, text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker, create_async_engine
from sqlalchemy.orm import Session, sessionmaker
from support.databases import Database, effects

from inbox import (
    ClaimCommittedEarly,
    HandlerFailed,
    Inbox,
    Message,
    Outcome,
    TransactionControlError,
)
from inbox.aio import AsyncInbox
from inbox.schema import inbox_message
from inbox.schema import metadata as inbox_metadata
from inbox.testing.round_trips import RoundTripCounter

WARM_UP = 8  # psycopg prepares a statement on its 5th execution: one extra round trip once
MESSAGES = 10


@pytest.fixture
def counter(pg_db: Database) -> Iterator[RoundTripCounter]:
    url = make_url(pg_db.url)
    with RoundTripCounter(url.host or "127.0.0.1", url.port or 5432) as proxy:
        yield proxy


def write(statements: int) -> Callable[[Message, Session], None]:
    def handler(message: Message, session: Session) -> None:
        for n in range(statements):
            session.execute(insert(effects).values(ref=f"{message.id}", handler=f"h{n}"))

    return handler


def per_message(counter: RoundTripCounter, step: Callable[[], object]) -> float:
    for _ in range(WARM_UP):
        step()
    counter.reset()
    for _ in range(MESSAGES):
        step()
    return counter.count / MESSAGES


def inbox_on(engine: Engine, statements: int) -> Inbox:
    inbox = Inbox(sessionmaker(engine))
    inbox.handler("order.created", name=f"writer{statements}")(write(statements))
    return inbox


@pytest.mark.parametrize("statements", [1, 3])
def test_the_inbox_costs_the_round_trips_of_the_handlers_own_transaction(
    pg_db: Database, counter: RoundTripCounter, statements: int
) -> None:
    engine = create_engine(counter.url(pg_db.url))
    sessions = sessionmaker(engine)
    handler = write(statements)

    def plain() -> None:
        with sessions() as session, session.begin():
            handler(Message.new("order.created", {}), session)

    shared = inbox_on(engine, statements)
    serial = inbox_on(engine.execution_options(inbox_share_round_trips=False), statements)
    repeated = Message.new("order.created", {})
    shared.process(repeated)

    def duplicate() -> None:
        assert shared.process(repeated).outcome is Outcome.DUPLICATE

    try:
        baseline = per_message(counter, plain)
        assert baseline == statements + 2  # BEGIN, the statements, COMMIT
        assert (
            per_message(counter, lambda: shared.process(Message.new("order.created", {})))
            == baseline
        )
        # Off: the claim costs a round trip of its own (psycopg's BEGIN goes alone).
        assert (
            per_message(counter, lambda: serial.process(Message.new("order.created", {})))
            == baseline + 1
        )
        assert per_message(counter, duplicate) == 2  # BEGIN + claim, ROLLBACK
    finally:
        engine.dispose()


def test_the_async_inbox_on_psycopg_shares_them_too(
    pg_db: Database, counter: RoundTripCounter
) -> None:
    url = make_url(counter.url(pg_db.url)).set(drivername="postgresql+psycopg")

    async def main() -> tuple[float, float, list[int]]:
        engine = create_async_engine(url)
        sessions = async_sessionmaker(engine)
        inbox = AsyncInbox(sessions)
        done: list[int] = []

        @inbox.handler("order.created", name="writer")
        async def writer(message: Message, session: AsyncSession) -> None:
            await session.execute(insert(effects).values(ref=f"{message.id}", handler="a"))
            done.append(1)

        async def plain() -> None:
            async with sessions() as session, session.begin():
                await session.execute(insert(effects).values(ref="plain", handler="p"))

        async def count(step: Callable[[], Any]) -> float:
            for _ in range(WARM_UP):
                await step()
            counter.reset()
            for _ in range(MESSAGES):
                await step()
            return counter.count / MESSAGES

        try:
            baseline = await count(plain)
            through = await count(lambda: inbox.process(Message.new("order.created", {})))
        finally:
            await engine.dispose()
        return baseline, through, done

    baseline, through, done = asyncio.run(main())
    assert baseline == 3
    assert through == baseline
    assert len(done) == WARM_UP + MESSAGES
    assert pg_db.count(effects) == 2 * (WARM_UP + MESSAGES)


@pytest.mark.parametrize("level", ["REPEATABLE READ", "SERIALIZABLE"])
def test_the_connections_isolation_level_still_begins_the_transaction(
    pg_db: Database, level: str
) -> None:
    engine = create_engine(pg_db.url, isolation_level=level)
    inbox = Inbox(sessionmaker(engine))
    seen: list[str] = []

    @inbox.handler("order.created", name="reader")
    def reader(message: Message, session: Session) -> None:
        seen.append(session.execute(text("SHOW transaction_isolation")).scalar_one())

    try:
        for _ in range(3):
            assert inbox.process(Message.new("order.created", {})).outcome is Outcome.PROCESSED
    finally:
        engine.dispose()
    assert seen == [level.lower()] * 3


def test_psycopg_manages_the_transaction_as_usual_after_the_pipelined_begin(
    pg_db: Database,
) -> None:
    """After BEGIN and the claim went out on the libpq connection, psycopg sees the open
    transaction as if it had begun it: not in autocommit, in a transaction, and it begins the
    next one itself."""
    engine = create_engine(pg_db.url, pool_size=1, max_overflow=0)
    inbox = Inbox(sessionmaker(engine))
    states: list[tuple[bool, int]] = []

    @inbox.handler("order.created", name="inspector")
    def inspector(message: Message, session: Session) -> None:
        driver: Any = session.connection().connection.dbapi_connection
        states.append((driver.autocommit, driver.info.transaction_status))

    try:
        inbox.process(Message.new("order.created", {}))
        with engine.connect() as connection:
            driver: Any = connection.connection.dbapi_connection
            assert driver.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
            connection.execute(text("SELECT 1"))  # psycopg begins a transaction itself
            assert driver.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
            connection.rollback()
    finally:
        engine.dispose()
    assert states == [(False, psycopg.pq.TransactionStatus.INTRANS)]


@pytest.mark.parametrize("how", ["driver rollback()", "sql ROLLBACK", "sql COMMIT"])
def test_a_handler_that_ends_the_transaction_is_caught_without_a_claim_check(
    pg_db: Database, counter: RoundTripCounter, how: str
) -> None:
    """The marker the server reported back tells the transaction ended under the handler;
    a healthy message sends nothing but BEGIN + claim, the handler's statement and COMMIT."""
    engine = create_engine(counter.url(pg_db.url))
    inbox = Inbox(sessionmaker(engine))
    rogue_on = [True]

    @inbox.handler("order.created", name="rogue")
    def rogue(message: Message, session: Session) -> None:
        if rogue_on[0]:
            if how == "driver rollback()":
                session.connection().connection.dbapi_connection.rollback()  # type: ignore[union-attr]
            else:
                session.execute(text(how.removeprefix("sql ")))
        session.execute(insert(effects).values(ref=str(message.id), handler="rogue"))
        if rogue_on[0] and how == "sql COMMIT":
            raise RuntimeError("after the early commit")

    try:
        with pytest.raises(HandlerFailed) as failed:
            inbox.process(Message.new("order.created", {}))
        rogue_on[0] = False
        assert per_message(counter, lambda: inbox.process(Message.new("order.created", {}))) == 3
    finally:
        engine.dispose()
    error = failed.value.failures["rogue"]
    if how == "sql COMMIT":
        # Committed early, then failed: for reconciliation, never retried into a silent
        # duplicate. The write after the COMMIT was rolled back with the failure.
        assert isinstance(error, ClaimCommittedEarly)
    else:
        assert isinstance(error, TransactionControlError)
        assert "claim is gone" in str(error)
    assert pg_db.count(effects) == WARM_UP + MESSAGES


def test_a_before_commit_listener_still_writes_in_the_claims_transaction(
    pg_db: Database,
) -> None:
    engine = create_engine(pg_db.url)
    sessions = sessionmaker(engine)

    @event.listens_for(sessions, "before_commit")
    def audit(session: Session) -> None:
        session.execute(insert(effects).values(ref="audit", handler="before_commit"))

    inbox = Inbox(sessions)
    inbox.handler("order.created", name="writer")(write(1))
    try:
        assert inbox.process(Message.new("order.created", {})).outcome is Outcome.PROCESSED
    finally:
        engine.dispose()
    assert pg_db.count(effects) == 2


def test_a_tenants_schema_translate_map_keeps_the_shared_round_trips(
    pg_db: Database, counter: RoundTripCounter
) -> None:
    """Under a schema_translate_map the claim and the check are rendered for the tenant's
    schema once, and still ride the BEGIN's and the COMMIT's round trips."""
    tenant = f"{pg_db.url.rsplit('search_path%3D', 1)[-1]}_tenant"
    with pg_db.engine.begin() as connection:
        connection.execute(text(f"CREATE SCHEMA {tenant}"))
    engine = create_engine(counter.url(pg_db.url)).execution_options(
        schema_translate_map={None: tenant}
    )
    try:
        inbox_metadata.create_all(engine)
        effects.metadata.create_all(engine)
        sessions = sessionmaker(engine)
        handler = write(1)

        def plain() -> None:
            with sessions() as session, session.begin():
                handler(Message.new("order.created", {}), session)

        inbox = inbox_on(engine, 1)
        assert per_message(counter, lambda: inbox.process(Message.new("order.created", {}))) == (
            per_message(counter, plain)
        )
        with engine.connect() as connection:
            claimed = connection.execute(select(func.count()).select_from(inbox.table)).scalar()
        assert claimed == WARM_UP + MESSAGES
        assert pg_db.count(inbox.table) == 0  # nothing in the default schema
    finally:
        engine.dispose()
        with pg_db.engine.begin() as connection:
            connection.execute(text(f"DROP SCHEMA IF EXISTS {tenant} CASCADE"))


@pytest.mark.parametrize("threshold", [0, None, 5, 1000])
def test_every_prepare_threshold_processes_messages_in_the_same_round_trips(
    pg_db: Database, counter: RoundTripCounter, threshold: int | None
) -> None:
    """psycopg's documented settings: 0 prepares every statement, None none (PgBouncer in
    transaction mode). The claim goes in BEGIN's round trip either way: prepared under its
    own name, or unnamed when the application turned preparing off."""
    engine = create_engine(counter.url(pg_db.url), connect_args={"prepare_threshold": threshold})
    inbox = inbox_on(engine, 1)
    repeated = Message.new("order.created", {})
    try:
        assert inbox.process(repeated).outcome is Outcome.PROCESSED
        through = per_message(counter, lambda: inbox.process(Message.new("order.created", {})))
        duplicates = per_message(counter, lambda: inbox.process(repeated))
        with engine.connect() as connection:
            names = (
                connection.execute(
                    text("SELECT name FROM pg_prepared_statements WHERE name LIKE '_inbox_claim_%'")
                )
                .scalars()
                .all()
            )
    finally:
        engine.dispose()
    assert (through, duplicates) == (3, 2)
    assert len(names) == (0 if threshold is None else 1)
    assert pg_db.count(effects) == 1 + WARM_UP + MESSAGES


@pytest.mark.parametrize("how", ["a failed handler", "DEALLOCATE ALL"])
def test_a_claim_deallocated_under_the_inbox_is_prepared_again(
    pg_db: Database, counter: RoundTripCounter, how: str
) -> None:
    """psycopg's rollback() deallocates every prepared statement once it prepared one of
    its own (a failed handler), and an application may DEALLOCATE ALL itself: the next
    claim on that connection still goes through, and the one after in one round trip."""
    engine = create_engine(counter.url(pg_db.url), pool_size=1, max_overflow=0)
    inbox = Inbox(sessionmaker(engine))
    fail = [False]

    @inbox.handler("order.created", name="writer")
    def writer(message: Message, session: Session) -> None:
        # A text of its own per message: psycopg never prepares it, so what is deallocated
        # is only the inbox's claim (psycopg before 3.2.x loses track of its own statements
        # after an application's DEALLOCATE ALL).
        session.execute(
            text(f"INSERT INTO effects (ref, handler) VALUES (:ref, 'w') -- {message.id}"),
            {"ref": str(message.id)},
        )
        if fail[0]:
            raise RuntimeError("rolled back")

    try:
        per_message(counter, lambda: inbox.process(Message.new("order.created", {})))
        if how == "a failed handler":
            fail[0] = True
            with pytest.raises(HandlerFailed):
                inbox.process(Message.new("order.created", {}))
            fail[0] = False
        else:
            with engine.connect() as connection:
                connection.exec_driver_sql("DEALLOCATE ALL")
                connection.commit()
        assert inbox.process(Message.new("order.created", {})).outcome is Outcome.PROCESSED
        assert per_message(counter, lambda: inbox.process(Message.new("order.created", {}))) == 3
    finally:
        engine.dispose()
    assert pg_db.count(effects) == 2 * (WARM_UP + MESSAGES) + 1


def test_duplicates_keep_every_prepared_statement_of_the_connection(pg_db: Database) -> None:
    """A duplicate ends with a ROLLBACK on the libpq connection: psycopg's rollback() would
    deallocate the application's prepared statements too (it does after any rollback once
    it prepared one), and every later message would prepare them again."""
    engine = create_engine(pg_db.url, pool_size=1, max_overflow=0)
    inbox = inbox_on(engine, 1)
    repeated = Message.new("order.created", {})

    def prepared() -> set[str]:
        # Read on the pool's one connection and COMMIT: the pool's reset then has nothing
        # to roll back (a rollback through psycopg is what deallocates).
        pooled = engine.raw_connection()
        try:
            cursor = pooled.cursor()
            cursor.execute("SELECT statement FROM pg_prepared_statements")
            rows = cursor.fetchall()
            pooled.commit()
        finally:
            pooled.close()
        return {" ".join(statement.split()) for (statement,) in rows}

    try:
        for _ in range(WARM_UP):  # the handler's INSERT reaches psycopg's threshold
            inbox.process(Message.new("order.created", {}))
        inbox.process(repeated)
        before = prepared()
        for _ in range(5):
            assert inbox.process(repeated).outcome is Outcome.DUPLICATE
        after = prepared()
    finally:
        engine.dispose()
    assert any(s.startswith("INSERT INTO effects") for s in before), before
    assert any(s.startswith("INSERT INTO inbox_message") for s in before), before
    assert after == before


def test_a_session_whose_default_is_read_only_still_catches_a_rollback_in_a_handler(
    pg_db: Database,
) -> None:
    """With default_transaction_read_only on for the session (and BEGIN READ WRITE), the
    marker cannot show the transaction's end: the claim row is read before the COMMIT."""
    url = make_url(pg_db.url)
    options = f"{url.query['options']} -c default_transaction_read_only=on"
    engine = create_engine(
        url.difference_update_query(["options"]), connect_args={"options": options}
    ).execution_options(postgresql_readonly=False)
    inbox = Inbox(sessionmaker(engine))

    @inbox.handler("order.created", name="rogue")
    def rogue(message: Message, session: Session) -> None:
        session.execute(text("ROLLBACK"))
        session.execute(text("SET TRANSACTION READ WRITE"))
        session.execute(insert(effects).values(ref=str(message.id), handler="rogue"))

    try:
        with pytest.raises(HandlerFailed) as failed:
            inbox.process(Message.new("order.created", {}))
    finally:
        engine.dispose()
    assert "claim is gone" in str(failed.value.failures["rogue"])
    assert pg_db.count(effects) == 0


def test_a_handler_name_is_claimed_exactly_in_the_connections_encoding(pg_db: Database) -> None:
    engine = create_engine(pg_db.url, connect_args={"client_encoding": "LATIN1"})
    inbox = Inbox(sessionmaker(engine))
    name = "billing.facturé"
    inbox.handler("order.created", name=name)(write(1))
    message = Message.new("order.created", {})
    try:
        assert inbox.process(message).outcome is Outcome.PROCESSED
        assert inbox.process(message).outcome is Outcome.DUPLICATE
    finally:
        engine.dispose()
    with pg_db.engine.connect() as connection:
        stored = connection.execute(select(inbox_message.c.handler)).scalars().all()
    assert stored == [name]


def test_a_task_cancelled_while_its_claim_waits_leaves_no_connection_mid_pipeline(
    pg_db: Database,
) -> None:
    """The claim waits on a concurrent delivery's uncommitted claim row; the task is
    cancelled meanwhile. The connection, with an answer nobody will read, is discarded;
    the pool serves a healthy one and the message is processed once later."""
    url = make_url(pg_db.url).set(drivername="postgresql+psycopg")
    message = Message.new("order.created", {})

    async def main() -> tuple[Outcome, int]:
        engine = create_async_engine(url, pool_size=1, max_overflow=0)
        inbox = AsyncInbox(async_sessionmaker(engine))

        @inbox.handler("order.created", name="writer")
        async def writer(message: Message, session: AsyncSession) -> None:
            await session.execute(insert(effects).values(ref=str(message.id), handler="w"))

        try:
            with pg_db.engine.connect() as other:
                other.execute(
                    insert(inbox_message).values(
                        message_id=message.id.bytes, handler="writer", processed_at=func.now()
                    )
                )  # uncommitted: the inbox's claim blocks on it
                task = asyncio.create_task(inbox.process(message))
                await asyncio.sleep(0.5)
                assert not task.done()
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
                other.rollback()
            outcome = (await inbox.process(message)).outcome
            checked_out = engine.sync_engine.pool.checkedout()  # type: ignore[attr-defined]
        finally:
            await engine.dispose()
        return outcome, checked_out

    outcome, checked_out = asyncio.run(main())
    assert (outcome, checked_out) == (Outcome.PROCESSED, 0)
    assert pg_db.count(effects) == 1


def test_the_counter_refuses_a_negative_latency() -> None:
    with pytest.raises(ValueError, match="latency must be >= 0 seconds"):
        RoundTripCounter("127.0.0.1", 5432, latency=-0.001)
