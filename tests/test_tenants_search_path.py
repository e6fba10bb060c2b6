"""Tenants told apart only by their connections' ``search_path`` (an engine per tenant with
``options=-csearch_path=acme``, no schema map, no ``inbox_tenant``): each gets effect keys of
its own, named by the database and the schema the claim went to, read once per pooled
connection (issue 32, item 5). A tenant whose claims are in the default schema keeps the
keys it had before."""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from sqlalchemy import Engine, create_engine, event, insert, select, text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker, create_async_engine
from sqlalchemy.orm import Session, sessionmaker
from support.aio import async_url, run
from support.databases import POSTGRES_URL, unreachable
from support.ledger import Provider

from inbox import Inbox, Message, Outcome
from inbox.aio import AsyncInbox
from inbox.core.effects._identity import effect_key
from inbox.schema import inbox_effect
from inbox.schema import metadata as inbox_metadata

SCHEMAS = ("acme", "globex", "public")


@dataclass
class SearchPathTenants:
    """A database of its own; per tenant (a schema holding the inbox's tables) the URL
    whose connect options put that schema on the search path, and an engine on it."""

    database: str
    urls: dict[str, str]
    engines: dict[str, Engine]


@pytest.fixture
def tenants(admin_engines: dict[str, Engine]) -> Iterator[SearchPathTenants]:
    database = f"t_{uuid.uuid4().hex[:16]}"
    try:
        with admin_engines["postgresql"].connect() as connection:
            connection.execute(text(f"CREATE DATABASE {database}"))
    except Exception as exc:
        unreachable("postgresql", exc)
    base = make_url(POSTGRES_URL).set(database=database)
    urls = {
        schema: base.update_query_dict({"options": f"-csearch_path={schema}"}).render_as_string(
            hide_password=False
        )
        for schema in SCHEMAS
    }
    engines = {schema: create_engine(url) for schema, url in urls.items()}
    try:
        for schema, engine in engines.items():
            with engine.begin() as connection:
                connection.execute(text(f"CREATE SCHEMA IF NOT EXISTS {schema}"))
            inbox_metadata.create_all(engine)
        yield SearchPathTenants(database, urls, engines)
    finally:
        for engine in engines.values():
            engine.dispose()
        with admin_engines["postgresql"].connect() as connection:
            connection.execute(text(f"DROP DATABASE {database} WITH (FORCE)"))


def sms_inbox(sessions: dict[str, sessionmaker[Session]]) -> tuple[Inbox, Provider]:
    inbox = Inbox(sessions_for=lambda message: sessions[message.headers["tenant"]]())
    provider = Provider()

    @inbox.handler("sms.requested", name="sms.send")
    def send(message: Message, session: Session) -> None:
        inbox.effect("provider.send", provider.send)

    return inbox, provider


def expected(message_id: uuid.UUID, tenant: str | None) -> uuid.UUID:
    return effect_key(message_id.bytes, "sms.send", "provider.send", tenant)


def test_each_schema_is_a_tenant_of_its_own_named_by_database_and_schema(
    tenants: SearchPathTenants,
) -> None:
    inbox, provider = sms_inbox({s: sessionmaker(e) for s, e in tenants.engines.items()})
    shared = uuid.uuid4()
    for schema in SCHEMAS:
        message = Message(shared, "sms.requested", {}, {"tenant": schema})
        assert inbox.process(message).outcome is Outcome.PROCESSED
    assert provider.calls == [
        expected(shared, f"{tenants.database}@acme"),
        expected(shared, f"{tenants.database}@globex"),
        expected(shared, tenants.database),  # the default schema: the key it always had
    ]


def test_the_schema_is_read_once_per_pooled_connection(tenants: SearchPathTenants) -> None:
    engine = create_engine(tenants.urls["acme"], pool_size=1, max_overflow=0)
    reads: list[str] = []

    @event.listens_for(engine, "before_cursor_execute")
    def count(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if "to_regclass" in statement:
            reads.append(statement)

    try:
        inbox, provider = sms_inbox({"acme": sessionmaker(engine)})
        for _ in range(5):
            message = Message(uuid.uuid4(), "sms.requested", {}, {"tenant": "acme"})
            assert inbox.process(message).outcome is Outcome.PROCESSED
        assert len(provider.calls) == 5
        assert len(reads) == 2  # the claim table's schema and the effect table's, once
    finally:
        engine.dispose()


@pytest.mark.parametrize("driver", ["psycopg", "asyncpg"])
def test_an_async_inbox_keys_search_path_tenants_apart(
    tenants: SearchPathTenants, driver: str
) -> None:
    async def main() -> list[uuid.UUID]:
        engines = []
        for schema in ("acme", "globex"):
            url, connect_args = async_url(tenants.urls[schema], driver)
            engines.append(create_async_engine(url, connect_args=connect_args))
        sessions = dict(zip(("acme", "globex"), map(async_sessionmaker, engines), strict=True))
        inbox = AsyncInbox(sessions_for=lambda message: sessions[message.headers["tenant"]]())
        provider = Provider()

        @inbox.handler("sms.requested", name="sms.send")
        async def send(message: Message, session: AsyncSession) -> None:
            await inbox.effect("provider.send", provider.send)

        try:
            shared = uuid.uuid4()
            for schema in ("acme", "globex", "acme"):
                message = Message(shared, "sms.requested", {}, {"tenant": schema})
                await inbox.process(message)
            return [*provider.calls, shared]
        finally:
            for engine in engines:
                await engine.dispose()

    *calls, shared = run(main())
    assert calls == [
        expected(shared, f"{tenants.database}@acme"),
        expected(shared, f"{tenants.database}@globex"),
    ]


def record_before_upgrade(
    engine: Engine, message_id: uuid.UUID, key: uuid.UUID, status: str, result: str | None
) -> None:
    """A record of ``sms.send``'s effect as an earlier version wrote it, under ``key``, in
    the effect table ``engine``'s search path finds."""
    at = dt.datetime.now(dt.UTC)
    with engine.begin() as connection:
        connection.execute(
            insert(inbox_effect),
            {
                "effect_key": key,
                "claim_key": message_id,
                "handler": "sms.send",
                "step": "provider.send",
                "status": status,
                "attempts": 1,
                "result": result,
                "started_at": at,
                "updated_at": at,
            },
        )


def statuses(engine: Engine) -> dict[uuid.UUID, tuple[str, int]]:
    with engine.connect() as connection:
        rows = connection.execute(
            select(inbox_effect.c.effect_key, inbox_effect.c.status, inbox_effect.c.attempts)
        )
        return {key: (status, attempts) for key, status, attempts in rows}


def test_an_effect_started_before_the_upgrade_is_called_again_under_its_old_key(
    tenants: SearchPathTenants,
) -> None:
    """Finding 3: the record an earlier version left 'started' under the key without the
    schema is taken over (same look-up as the version-1 one), not called under a new key."""
    inbox, provider = sms_inbox({s: sessionmaker(e) for s, e in tenants.engines.items()})
    message_id = uuid.uuid4()
    old = expected(message_id, tenants.database)
    record_before_upgrade(tenants.engines["acme"], message_id, old, "started", None)
    message = Message(message_id, "sms.requested", {}, {"tenant": "acme"})
    assert inbox.process(message).outcome is Outcome.PROCESSED
    assert provider.calls == [old]
    assert statuses(tenants.engines["acme"]) == {old: ("done", 2)}


def test_an_effect_done_before_the_upgrade_returns_its_stored_result(
    tenants: SearchPathTenants,
) -> None:
    inbox = Inbox(sessions_for=lambda message: sessionmaker(tenants.engines["acme"])())
    provider = Provider()
    results: list[object] = []

    @inbox.handler("sms.requested", name="sms.send")
    def send(message: Message, session: Session) -> None:
        results.append(inbox.effect("provider.send", provider.send))

    message_id = uuid.uuid4()
    old = expected(message_id, tenants.database)
    record_before_upgrade(tenants.engines["acme"], message_id, old, "done", '{"id": "sms-0"}')
    assert inbox.process(Message(message_id, "sms.requested", {}, {})).outcome is Outcome.PROCESSED
    assert (provider.calls, results) == ([], [{"id": "sms-0"}])


def test_a_record_of_a_shared_effect_table_is_not_taken_for_this_tenants(
    tenants: SearchPathTenants,
) -> None:
    """An effect table every schema's tenant shares (qualified with ``public``): a record
    under the old key may be another tenant's (they shared it), so it is not taken over."""
    sessions = {s: sessionmaker(e) for s, e in tenants.engines.items()}
    inbox = Inbox(
        sessions_for=lambda message: sessions[message.headers["tenant"]](),
        effect_table="public.inbox_effect",
    )
    provider = Provider()

    @inbox.handler("sms.requested", name="sms.send")
    def send(message: Message, session: Session) -> None:
        inbox.effect("provider.send", provider.send)

    message_id = uuid.uuid4()
    old = expected(message_id, tenants.database)
    record_before_upgrade(tenants.engines["public"], message_id, old, "done", '"globex"')
    message = Message(message_id, "sms.requested", {}, {"tenant": "acme"})
    assert inbox.process(message).outcome is Outcome.PROCESSED
    assert provider.calls == [expected(message_id, f"{tenants.database}@acme")]


def test_naming_the_tenant_by_its_old_identity_keeps_its_keys_with_an_effect_store(
    tenants: SearchPathTenants,
) -> None:
    """The upgrade procedure where no record can be taken over (an ``effect_store`` for
    every tenant): ``inbox_tenant`` set to the identity the tenant had (its database name)
    keeps the key, so the effect started before the upgrade is called again with it."""
    pinned = tenants.engines["acme"].execution_options(inbox_tenant=tenants.database)
    store = tenants.engines["public"]
    inbox = Inbox(sessions_for=lambda message: sessionmaker(pinned)(), effect_store=store)
    provider = Provider()

    @inbox.handler("sms.requested", name="sms.send")
    def send(message: Message, session: Session) -> None:
        inbox.effect("provider.send", provider.send)

    message_id = uuid.uuid4()
    old = expected(message_id, tenants.database)
    record_before_upgrade(store, message_id, old, "started", None)
    assert inbox.process(Message(message_id, "sms.requested", {}, {})).outcome is Outcome.PROCESSED
    assert provider.calls == [old]
    assert statuses(store) == {old: ("done", 2)}


def test_a_search_path_set_in_the_pools_connect_event_keys_tenants_apart(
    tenants: SearchPathTenants,
) -> None:
    """Finding 4: the ``connect``-event recipe of SQLAlchemy's PostgreSQL docs (one URL, an
    engine per tenant) is seen, as connect options are: the schema is read after it ran."""
    url = make_url(POSTGRES_URL).set(database=tenants.database)
    engines = {}
    for schema in ("acme", "globex"):
        engine = engines[schema] = create_engine(url)

        @event.listens_for(engine, "connect", insert=True)
        def set_search_path(dbapi_connection: Any, record: Any, schema: str = schema) -> None:
            autocommit = dbapi_connection.autocommit
            dbapi_connection.autocommit = True
            cursor = dbapi_connection.cursor()
            cursor.execute(f"SET SESSION search_path = {schema}")
            cursor.close()
            dbapi_connection.autocommit = autocommit

    try:
        inbox, provider = sms_inbox({s: sessionmaker(e) for s, e in engines.items()})
        shared = uuid.uuid4()
        for schema in ("acme", "globex", "acme"):
            message = Message(shared, "sms.requested", {}, {"tenant": schema})
            inbox.process(message)
        assert provider.calls == [
            expected(shared, f"{tenants.database}@acme"),
            expected(shared, f"{tenants.database}@globex"),
        ]
    finally:
        for engine in engines.values():
            engine.dispose()
