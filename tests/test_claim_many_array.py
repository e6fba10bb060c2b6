"""The PostgreSQL batch claim: ONE ``INSERT ... SELECT FROM unnest(:keys)`` with one bytea[]
parameter, on every PostgreSQL driver the inbox supports; the keys it returns are the keys
won; concurrent batches sharing keys never deadlock and win each key once; it follows
``schema_translate_map``; a returned key it was not given is refused."""

from __future__ import annotations

import datetime as dt
import random
import threading
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from sqlalchemy import Connection, Engine, MetaData, create_engine, event, select, text
from sqlalchemy.engine import make_url
from support.aio import async_engine, run
from support.databases import Database

from inbox import InboxError
from inbox._backends import Claims
from inbox.message import uuid7
from inbox.schema import inbox_message, inbox_table
from inbox.schema import metadata as inbox_metadata

BLOCKING_DRIVERS = ("psycopg", "psycopg2", "pg8000")
HANDLER = "ledger.post"


def new_keys(count: int) -> list[bytes]:
    """``count`` fresh 16-byte keys, sorted (the order callers claim them in)."""
    return sorted(uuid7().bytes for _ in range(count))


def stored(connection: Connection, handler: str = HANDLER) -> set[bytes]:
    """The keys claimed for ``handler`` that ``connection`` sees."""
    query = select(inbox_message.c.message_id).where(inbox_message.c.handler == handler)
    return {key.bytes for key in connection.execute(query).scalars()}


class Statements:
    """The SQL statements an engine sends to its cursors (the claims only)."""

    def __init__(self, engine: Engine) -> None:
        self.sent: list[tuple[str, Any, bool]] = []
        event.listen(engine, "before_cursor_execute", self._record)

    def _record(
        self, _conn: Any, _cursor: Any, statement: str, params: Any, _ctx: Any, many: bool
    ) -> None:
        if "inbox_message" in statement and statement.lstrip().upper().startswith("INSERT"):
            self.sent.append((statement, params, many))


@pytest.fixture(params=BLOCKING_DRIVERS)
def engine(request: pytest.FixtureRequest, pg_db: Database) -> Iterator[Engine]:
    """An engine on the test's schema through one blocking driver (search_path set on each
    connection: not every driver takes libpq's ``options``)."""
    url = make_url(pg_db.url)
    schema = str(url.query["options"]).removeprefix("-csearch_path=")
    driver_url = url.set(drivername=f"postgresql+{request.param}").difference_update_query(
        ["options"]
    )
    made = create_engine(driver_url, pool_size=2, max_overflow=0)

    @event.listens_for(made, "connect")
    def use_schema(dbapi_connection: Any, _record: object) -> None:
        cursor = dbapi_connection.cursor()
        cursor.execute(f'SET search_path TO "{schema}"')
        cursor.close()
        dbapi_connection.commit()

    assert made.dialect.driver == request.param
    yield made
    made.dispose()


def test_one_array_statement_returns_the_keys_won_and_skips_the_taken(engine: Engine) -> None:
    claims = Claims(inbox_message)
    at = dt.datetime.now(dt.UTC)
    taken = new_keys(30)
    with engine.begin() as connection:
        assert set(claims.claim_many(connection, taken, HANDLER, at)) == set(taken)
    fresh = new_keys(20)
    mixed = sorted([*taken[::3], *fresh])
    statements = Statements(engine)
    with engine.begin() as connection:
        won = claims.claim_many(connection, mixed, HANDLER, at)
        # The same keys for another handler are other claims: all won.
        assert set(claims.claim_many(connection, mixed, "audit.log", at)) == set(mixed)
    assert set(won) == set(fresh)
    # One statement per claim_many, one parameter set, the keys as one array.
    assert len(statements.sent) == 2, statements.sent
    for statement, params, many in statements.sent:
        assert "unnest" in statement
        assert not many
        keys = (
            params["keys"]
            if isinstance(params, dict)
            else next(p for p in params if isinstance(p, list))
        )
        # psycopg and psycopg2 get each key wrapped in their Binary adapter.
        assert [bytes(getattr(k, "obj", getattr(k, "adapted", k))) for k in keys] == mixed
    with engine.connect() as connection:
        assert stored(connection) == set(taken) | set(fresh)
        assert stored(connection, "audit.log") == set(mixed)
    # Everything taken now: nothing won, nothing inserted; no keys, no statement.
    with engine.begin() as connection:
        assert set(claims.claim_many(connection, mixed, HANDLER, at)) == set()
        assert claims.claim_many(connection, [], HANDLER, at) == frozenset()
    assert len(statements.sent) == 3


def test_a_rolled_back_batch_claim_releases_its_keys(engine: Engine) -> None:
    claims = Claims(inbox_message)
    keys = new_keys(10)
    with engine.connect() as connection:
        with connection.begin() as transaction:
            claims.claim_many(connection, keys, HANDLER, dt.datetime.now(dt.UTC))
            transaction.rollback()
        with connection.begin():
            won = claims.claim_many(connection, keys, HANDLER, dt.datetime.now(dt.UTC))
    assert set(won) == set(keys)


def test_asyncpg_binds_the_key_array_too(pg_db: Database) -> None:
    claims = Claims(inbox_message)
    taken, fresh = new_keys(5), new_keys(5)
    with pg_db.engine.begin() as connection:
        claims.claim_many(connection, taken, HANDLER, dt.datetime.now(dt.UTC))

    async def claim() -> tuple[set[bytes], list[str]]:
        async with async_engine(pg_db, "asyncpg") as engine:
            statements = Statements(engine.sync_engine)
            async with engine.begin() as connection:
                won = await connection.run_sync(
                    claims.claim_many, sorted(taken + fresh), HANDLER, dt.datetime.now(dt.UTC)
                )
            return set(won), [s for s, _, _ in statements.sent]

    won, sent = run(claim())
    assert won == set(fresh)
    assert len(sent) == 1
    assert "unnest" in sent[0]
    with pg_db.engine.connect() as connection:
        assert stored(connection) == set(taken) | set(fresh)


def test_concurrent_batches_sharing_keys_never_deadlock_and_win_each_key_once(
    engine: Engine,
) -> None:
    # The keys go in shuffled, differently in each thread: the statement's ORDER BY still
    # takes the row locks in one order. (Without it, two such batches deadlock within a few
    # rounds: each waits for a key the other inserted first.)
    claims = Claims(inbox_message)
    rounds, shared_count = 30, 60
    start = threading.Barrier(2)

    def batch(seed: int, keys: list[bytes]) -> set[bytes]:
        mine = list(keys)
        random.Random(seed).shuffle(mine)
        with engine.begin() as connection:
            start.wait(30)
            return set(claims.claim_many(connection, mine, HANDLER, dt.datetime.now(dt.UTC)))

    every: list[bytes] = []
    with ThreadPoolExecutor(2) as pool:
        for round_number in range(rounds):
            shared = new_keys(shared_count)
            own = [new_keys(10), new_keys(10)]
            every += shared + own[0] + own[1]
            futures = [
                pool.submit(batch, round_number * 2 + side, shared + own[side]) for side in (0, 1)
            ]
            first, second = (f.result(timeout=60) for f in futures)
            assert first & second == set()
            assert first | second == set(shared) | set(own[0]) | set(own[1])
            assert own[0]
            assert set(own[0]) <= first
            assert set(own[1]) <= second
    with engine.connect() as connection:
        assert stored(connection) == set(every)


@pytest.fixture
def translated_schema(pg_db: Database, admin_engines: dict[str, Engine]) -> Iterator[str]:
    """A second schema with its own inbox table, outside the search path."""
    schema = f"alt_{uuid.uuid4().hex[:12]}"
    with admin_engines["postgresql"].connect() as connection:
        connection.execute(text(f"CREATE SCHEMA {schema}"))
    translated = pg_db.engine.execution_options(schema_translate_map={None: schema})
    inbox_metadata.create_all(translated, tables=[inbox_message])
    try:
        yield schema
    finally:
        with admin_engines["postgresql"].connect() as connection:
            connection.execute(text(f"DROP SCHEMA {schema} CASCADE"))


def test_the_array_claim_follows_schema_translate_map(
    pg_db: Database, translated_schema: str
) -> None:
    claims = Claims(inbox_message)
    keys = new_keys(8)
    translated = pg_db.engine.execution_options(schema_translate_map={None: translated_schema})
    statements = Statements(pg_db.engine)
    with translated.begin() as connection:
        assert set(claims.claim_many(connection, keys, HANDLER, dt.datetime.now(dt.UTC))) == set(
            keys
        )
    assert len(statements.sent) == 1
    assert translated_schema in statements.sent[0][0]
    with pg_db.engine.connect() as connection:
        assert stored(connection) == set()  # nothing in the schema on the search path
        alt = inbox_table(MetaData(), schema=translated_schema)
        query = select(alt.c.message_id).where(alt.c.handler == HANDLER)
        assert {k.bytes for k in connection.execute(query).scalars()} == set(keys)
    # And the same keys in the untranslated table are still free.
    with pg_db.engine.begin() as connection:
        won = claims.claim_many(connection, keys, HANDLER, dt.datetime.now(dt.UTC))
    assert set(won) == set(keys)


def test_a_returned_key_that_was_not_given_is_refused(pg_db: Database) -> None:
    # A trigger that rewrites the key: the insert returns a key the batch never asked for,
    # which must not be read as a won claim (nor its given key as a duplicate).
    with pg_db.engine.begin() as connection:
        connection.execute(
            text(
                "CREATE FUNCTION rewrite_key() RETURNS trigger LANGUAGE plpgsql AS "
                "$$ BEGIN NEW.message_id := decode(md5(NEW.message_id::text), 'hex'); "
                "RETURN NEW; END $$"
            )
        )
        connection.execute(
            text(
                "CREATE TRIGGER rewrite_key BEFORE INSERT ON inbox_message "
                "FOR EACH ROW EXECUTE FUNCTION rewrite_key()"
            )
        )
    claims = Claims(inbox_message)
    with (
        pg_db.engine.begin() as connection,
        pytest.raises(InboxError, match="returned a key it was not given"),
    ):
        claims.claim_many(connection, new_keys(3), HANDLER, dt.datetime.now(dt.UTC))
