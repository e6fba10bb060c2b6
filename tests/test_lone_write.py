"""The effect ledger's records written on psycopg 3's libpq connection, each a transaction
of its own (inbox/_backends/postgresql/_alone.py): one round trip, committed, the values
bound as the columns' types bind them; and everything it does not know goes through
SQLAlchemy instead (None), which then raises what SQLAlchemy raises."""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Iterator

import pytest
from sqlalchemy import Connection, Engine, create_engine, event, select, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError
from support.databases import Database

from inbox import Inbox, Message
from inbox._backends.postgresql._alone import write_alone
from inbox.core.effects._ledger import Ledger
from inbox.schema import inbox_effect
from inbox.testing.round_trips import RoundTripCounter


@pytest.fixture
def counter(pg_db: Database) -> Iterator[RoundTripCounter]:
    url = make_url(pg_db.url)
    with RoundTripCounter(url.host or "127.0.0.1", url.port or 5432) as proxy:
        yield proxy


def started(key: uuid.UUID, at: dt.datetime, handler: str = "h") -> dict[str, object]:
    return {
        "effect_key": key,
        "claim_key": uuid.uuid4().bytes,
        "handler": handler,
        "step": "s",
        "status": "started",
        "attempts": 1,
        "started_at": at,
        "updated_at": at,
    }


def insert_statement(connection: Connection) -> object:
    from inbox._backends import families

    return Ledger(inbox_effect)._insert_statement(families[type(connection.dialect)])


def test_a_lone_write_commits_in_one_round_trip_with_the_values_the_columns_bind(
    pg_db: Database, counter: RoundTripCounter
) -> None:
    engine = create_engine(counter.url(pg_db.url))
    key, at = uuid.uuid4(), dt.datetime.now(dt.timezone(dt.timedelta(hours=2)))
    row = started(key, at, handler="hé")
    try:
        with engine.connect() as connection:
            statement = insert_statement(connection)
            connection.exec_driver_sql("SELECT 1")  # connected; the proxy counts from here
            connection.rollback()
            counter.reset()
            assert write_alone(connection, statement, row) == 1  # type: ignore[arg-type]
            assert counter.count == 1
            assert write_alone(connection, statement, row) == 0  # type: ignore[arg-type]
    finally:
        engine.dispose()
    with pg_db.engine.connect() as other:  # committed: another connection reads it
        found = other.execute(select(inbox_effect).where(inbox_effect.c.effect_key == key)).one()
    assert found.claim_key == uuid.UUID(bytes=row["claim_key"])  # type: ignore[arg-type]
    assert found.handler == "hé"
    assert found.attempts == 1
    assert found.started_at == at
    assert found.result is None


def test_what_it_does_not_know_goes_the_ordinary_way(pg_db: Database) -> None:
    engine = pg_db.engine
    row = started(uuid.uuid4(), dt.datetime.now(dt.UTC))
    with engine.connect() as connection:
        statement = insert_statement(connection)
        connection.exec_driver_sql("SELECT 1")  # in a transaction now
        assert write_alone(connection, statement, row) is None  # type: ignore[arg-type]
        connection.rollback()
        naive = {**row, "started_at": dt.datetime.now()}
        assert write_alone(connection, statement, naive) is None  # type: ignore[arg-type]
        assert write_alone(connection, statement, {**row, "attempts": 1.0}) is None  # type: ignore[arg-type]
    off = engine.execution_options(inbox_share_round_trips=False)
    with off.connect() as connection:
        assert write_alone(connection, statement, row) is None  # type: ignore[arg-type]
    seen: list[str] = []
    listened = create_engine(pg_db.url)
    event.listen(listened, "before_cursor_execute", lambda *args: seen.append(args[2]))
    try:
        with listened.connect() as connection:
            assert write_alone(connection, statement, row) is None  # type: ignore[arg-type]
    finally:
        listened.dispose()
    with engine.connect() as connection:
        assert connection.scalar(select(inbox_effect.c.effect_key)) is None  # nothing written


def test_an_error_answer_commits_nothing_and_sqlalchemy_then_says_why(pg_db: Database) -> None:
    row = started(uuid.uuid4(), dt.datetime.now(dt.UTC), handler="x" * 1000)  # too long
    with pg_db.engine.connect() as connection:
        statement = insert_statement(connection)
        assert write_alone(connection, statement, row) is None  # type: ignore[arg-type]
        assert connection.scalar(text("SELECT 1")) == 1  # the connection is still usable
        connection.rollback()
        with pytest.raises(DBAPIError, match="too long"), connection.begin():
            connection.execute(statement, row)  # type: ignore[call-overload]


def test_a_tenants_schema_translate_map_writes_in_the_tenants_schema(pg_db: Database) -> None:
    tenant = f"tenant_{uuid.uuid4().hex[:8]}"
    with pg_db.engine.begin() as connection:
        connection.execute(text(f"CREATE SCHEMA {tenant}"))
    mapped = pg_db.engine.execution_options(schema_translate_map={None: tenant})
    inbox_effect.create(mapped)
    row = started(uuid.uuid4(), dt.datetime.now(dt.UTC))
    with mapped.connect() as connection:
        assert write_alone(connection, insert_statement(connection), row) == 1  # type: ignore[arg-type]
    with pg_db.engine.connect() as connection:
        assert connection.scalar(text(f"SELECT count(*) FROM {tenant}.inbox_effect")) == 1
        assert connection.scalar(select(inbox_effect.c.effect_key)) is None


def test_an_effect_records_its_start_and_end_in_two_round_trips_on_psycopg(
    pg_db: Database, counter: RoundTripCounter
) -> None:
    engine: Engine = create_engine(counter.url(pg_db.url))
    from sqlalchemy.orm import sessionmaker

    inbox = Inbox(sessionmaker(engine))
    calls: list[uuid.UUID] = []

    @inbox.handler("e", name="effects")
    def handler(message: Message, session: object) -> None:
        assert inbox.effect("call", lambda key: calls.append(key) or {"n": len(calls)}) == {
            "n": len(calls)
        }

    def one_message() -> None:
        inbox.process(Message.new("e", {}))

    try:
        for _ in range(3):
            one_message()  # warm: pools and prepared claims
        counter.reset()
        one_message()
        with_them = counter.count
    finally:
        engine.dispose()
    with pg_db.engine.connect() as connection:
        rows = connection.execute(select(inbox_effect.c.status, inbox_effect.c.result)).all()
    assert {tuple(r) for r in rows} == {("done", f'{{"n": {n}}}') for n in range(1, 5)}
    # The claim's transaction (BEGIN+claim, the COMMIT), then the started and done records,
    # one round trip each (the ledger's pool is warm after the first messages).
    assert with_them == 4, with_them


def test_a_lost_connection_is_invalidated_and_raised_as_a_transient_error(
    pg_db: Database,
) -> None:
    # A pooled connection the server dropped while idle (a restart, a failover, an idle
    # timeout): the lone write is the first to touch it. It must raise what SQLAlchemy
    # raises for a lost connection (invalidated, transient), which the ledger's callers
    # retry on a new connection; a raw driver error would leave an effect's record
    # "started" after the call was made.
    from inbox.core._retry import is_transient

    engine = create_engine(pg_db.url)
    row = started(uuid.uuid4(), dt.datetime.now(dt.UTC))
    try:
        with engine.connect() as connection:
            statement = insert_statement(connection)
            pid = connection.exec_driver_sql("SELECT pg_backend_pid()").scalar_one()
            connection.rollback()
            with pg_db.engine.connect() as other:
                other.execute(text("SELECT pg_terminate_backend(:p)"), {"p": pid})
            with pytest.raises(DBAPIError) as raised:
                write_alone(connection, statement, row)  # type: ignore[arg-type]
            assert raised.value.connection_invalidated
            assert is_transient(raised.value)
            assert connection.invalidated
            assert write_alone(connection, statement, row) == 1  # type: ignore[arg-type]
    finally:
        engine.dispose()
