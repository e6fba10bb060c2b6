"""PostgreSQL through psycopg: the claim rides the BEGIN's round trip and the claim check the
COMMIT's (inbox/_shared_round_trips.py), counted on the wire by a proxy, semantics unchanged:
the connection's transaction settings, a lost claim committing nothing, and psycopg managing
the transaction as usual afterwards (the canary for the private flag the module sets)."""

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

from inbox import HandlerFailed, Inbox, Message, Outcome, TransactionControlError
from inbox.aio import AsyncInbox
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
        # Off: the claim and its check each cost a round trip of their own.
        assert (
            per_message(counter, lambda: serial.process(Message.new("order.created", {})))
            == baseline + 2
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


def test_psycopg_manages_the_transaction_as_usual_after_the_shared_begin(
    pg_db: Database,
) -> None:
    """The canary: after BEGIN and the claim went out in autocommit mode, the private flag
    set back leaves psycopg exactly as if it had begun the transaction itself."""
    engine = create_engine(pg_db.url)
    inbox = Inbox(sessionmaker(engine))
    states: list[tuple[bool, int]] = []

    @inbox.handler("order.created", name="inspector")
    def inspector(message: Message, session: Session) -> None:
        driver: Any = session.connection().connection.dbapi_connection
        states.append((driver.autocommit, driver.info.transaction_status))

    try:
        inbox.process(Message.new("order.created", {}))
    finally:
        engine.dispose()
    assert states == [(False, psycopg.pq.TransactionStatus.INTRANS)]

    with psycopg.connect(
        make_url(pg_db.url).set(drivername="postgresql").render_as_string(hide_password=False)
    ) as connection:
        connection.autocommit = True
        connection.execute("BEGIN; SELECT 1")
        connection._autocommit = False
        assert connection.autocommit is False
        connection.rollback()
        connection.execute("SELECT 1")  # psycopg begins a transaction itself again
        assert connection.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
        connection.rollback()


def test_a_handler_that_ends_the_transaction_commits_nothing_through_the_shared_check(
    pg_db: Database,
) -> None:
    engine = create_engine(pg_db.url)
    inbox = Inbox(sessionmaker(engine))
    checks: list[str] = []

    @event.listens_for(engine, "before_cursor_execute")
    def seen(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if "/ count(*)" in statement:
            checks.append(statement)

    @inbox.handler("order.created", name="rogue")
    def rogue(message: Message, session: Session) -> None:
        session.connection().connection.dbapi_connection.rollback()  # type: ignore[union-attr]
        session.execute(insert(effects).values(ref=str(message.id), handler="rogue"))

    try:
        with pytest.raises(HandlerFailed) as failed:
            inbox.process(Message.new("order.created", {}))
    finally:
        engine.dispose()
    assert isinstance(failed.value.failures["rogue"], TransactionControlError)
    assert checks, "the check sent with the COMMIT never ran"
    assert pg_db.count(effects) == 0


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


def test_the_counter_refuses_a_negative_latency() -> None:
    with pytest.raises(ValueError, match="latency must be >= 0 seconds"):
        RoundTripCounter("127.0.0.1", 5432, latency=-0.001)
