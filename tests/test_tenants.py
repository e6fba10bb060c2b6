"""One inbox, many tenants (``sessions_for=``): three tenant schemas on PostgreSQL (one
engine, ``schema_translate_map``) and two tenant databases on MariaDB (an engine each). No
claim, write or effect record ever lands in another tenant's tables; the same message id is
each tenant's own; ``inbox-cleanup`` cleans every tenant."""

from __future__ import annotations

import datetime as dt
import io
import json
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, create_engine, insert, select, text, update
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker, create_async_engine
from sqlalchemy.orm import Session, sessionmaker
from support.aio import run
from support.databases import MARIADB_URL, POSTGRES_URL, effects, effects_metadata, unreachable
from support.ledger import Provider

from inbox import KEY_NAMESPACE, HandlerFailed, Inbox, Message, Outcome, ProcessResult
from inbox.admin import admin_main
from inbox.aio import AsyncInbox
from inbox.retention.cli import cleanup_main
from inbox.schema import inbox_effect, inbox_message
from inbox.schema import metadata as inbox_metadata

PG_TENANTS = ("tenant_a", "tenant_b", "tenant_c")


@dataclass
class Tenants:
    """Tenant name -> the engine its sessions use (translated to its schema, or its own)."""

    url: str
    engines: dict[str, Engine]
    urls: dict[str, str]

    def sessions(self) -> dict[str, sessionmaker[Session]]:
        return {name: sessionmaker(engine) for name, engine in self.engines.items()}

    def claims(self, tenant: str) -> set[uuid.UUID]:
        with self.engines[tenant].connect() as connection:
            rows = connection.execute(select(inbox_message.c.message_id)).scalars()
            return {k if isinstance(k, uuid.UUID) else uuid.UUID(bytes=bytes(k)) for k in rows}

    def writes(self, tenant: str) -> list[str]:
        with self.engines[tenant].connect() as connection:
            return sorted(connection.execute(select(effects.c.ref)).scalars())

    def effect_steps(self, tenant: str) -> int:
        with self.engines[tenant].connect() as connection:
            return len(connection.execute(select(inbox_effect.c.step)).all())

    def age_claims(self, tenant: str, days: int) -> None:
        with self.engines[tenant].begin() as connection:
            connection.execute(
                update(inbox_message).values(
                    processed_at=dt.datetime.now(dt.UTC) - dt.timedelta(days=days)
                )
            )


@pytest.fixture
def pg_tenants(admin_engines: dict[str, Engine]) -> Iterator[Tenants]:
    """A PostgreSQL database of its own (so --all-schemas sees only these tenants) with three
    tenant schemas, all reached through ONE engine, each tenant's sessions translating the
    unqualified tables to its schema."""
    name = f"t_{uuid.uuid4().hex[:16]}"
    try:
        with admin_engines["postgresql"].connect() as connection:
            connection.execute(text(f"CREATE DATABASE {name}"))
    except Exception as exc:
        unreachable("postgresql", exc)
    url = make_url(POSTGRES_URL).set(database=name).render_as_string(hide_password=False)
    engine = create_engine(url)
    try:
        engines = {}
        for tenant in PG_TENANTS:
            with engine.begin() as connection:
                connection.execute(text(f"CREATE SCHEMA {tenant}"))
            engines[tenant] = engine.execution_options(schema_translate_map={None: tenant})
            inbox_metadata.create_all(engines[tenant])
            effects_metadata.create_all(engines[tenant])
        yield Tenants(url, engines, dict.fromkeys(PG_TENANTS, url))
    finally:
        engine.dispose()
        with admin_engines["postgresql"].connect() as connection:
            connection.execute(text(f"DROP DATABASE {name} WITH (FORCE)"))


@pytest.fixture
def mariadb_tenants(admin_engines: dict[str, Engine]) -> Iterator[Tenants]:
    """Two MariaDB databases, one per tenant, each with an engine of its own."""
    prefix = f"t_{uuid.uuid4().hex[:12]}"
    names = {"tenant_a": f"{prefix}_a", "tenant_b": f"{prefix}_b"}
    try:
        with admin_engines["mariadb"].connect() as connection:
            for database in names.values():
                connection.execute(text(f"CREATE DATABASE {database}"))
    except Exception as exc:
        unreachable("mariadb", exc)
    urls = {
        tenant: make_url(MARIADB_URL).set(database=db).render_as_string(hide_password=False)
        for tenant, db in names.items()
    }
    engines = {tenant: create_engine(url) for tenant, url in urls.items()}
    try:
        for engine in engines.values():
            inbox_metadata.create_all(engine)
            effects_metadata.create_all(engine)
        yield Tenants(MARIADB_URL, engines, urls)
    finally:
        for engine in engines.values():
            engine.dispose()
        with admin_engines["mariadb"].connect() as connection:
            for database in names.values():
                connection.execute(text(f"DROP DATABASE {database}"))


def tenant_inbox(tenants: Tenants) -> Inbox:
    sessions = tenants.sessions()
    inbox = Inbox(sessions_for=lambda message: sessions[message.headers["tenant"]]())

    @inbox.handler("order.created", name="orders")
    def record(message: Message, session: Session) -> None:
        inbox.effect("notify", str)
        session.execute(insert(effects).values(ref=message.body["ref"], handler="orders"))

    return inbox


def deliveries(tenants: Tenants) -> tuple[dict[str, list[Message]], uuid.UUID]:
    """Two orders per tenant, and one message id every tenant receives (its own order)."""
    shared = uuid.uuid4()
    sent: dict[str, list[Message]] = {}
    for tenant in tenants.engines:
        sent[tenant] = [
            Message.new("order.created", {"ref": f"{tenant}-{n}"}, headers={"tenant": tenant})
            for n in (1, 2)
        ]
        sent[tenant].append(
            Message(shared, "order.created", {"ref": f"{tenant}-shared"}, {"tenant": tenant})
        )
    return sent, shared


def check_isolated(tenants: Tenants, sent: dict[str, list[Message]]) -> None:
    for tenant, messages in sent.items():
        assert tenants.claims(tenant) == {m.id for m in messages}, tenant
        assert tenants.writes(tenant) == sorted(m.body["ref"] for m in messages), tenant
        assert tenants.effect_steps(tenant) == len(messages), tenant


@pytest.mark.parametrize("backend", ["postgresql", "mariadb"])
def test_no_claim_lands_in_another_tenants_table(
    backend: str, request: pytest.FixtureRequest
) -> None:
    tenants: Tenants = request.getfixturevalue(f"{backend}_tenants".replace("postgresql", "pg"))
    inbox = tenant_inbox(tenants)
    sent, _ = deliveries(tenants)
    interleaved = [m for batch in zip(*sent.values(), strict=True) for m in batch]
    assert {inbox.process(m).outcome for m in interleaved} == {Outcome.PROCESSED}
    # Redelivered, each tenant's copy is a duplicate in its own table only.
    assert {inbox.process(m).outcome for m in interleaved} == {Outcome.DUPLICATE}
    check_isolated(tenants, sent)


def test_batches_across_tenants_and_an_unknown_tenant(pg_tenants: Tenants) -> None:
    inbox = tenant_inbox(pg_tenants)
    sent, _ = deliveries(pg_tenants)
    stranger = Message.new("order.created", {"ref": "x"}, headers={"tenant": "tenant_z"})
    mixed = [*sent["tenant_a"], stranger, *sent["tenant_c"]]
    results = inbox.process_batch(mixed)
    failed = results[3]
    assert isinstance(failed, HandlerFailed)
    assert isinstance(failed.failures["orders"], KeyError)
    assert all(isinstance(r, ProcessResult) for i, r in enumerate(results) if i != 3)
    check_isolated(
        pg_tenants, {"tenant_a": sent["tenant_a"], "tenant_b": [], **{"tenant_c": sent["tenant_c"]}}
    )


def test_async_inbox_routes_each_delivery_to_its_tenant(pg_tenants: Tenants) -> None:
    sent, _ = deliveries(pg_tenants)

    async def main() -> None:
        url = make_url(pg_tenants.url).set(drivername="postgresql+psycopg")
        engine = create_async_engine(url)
        sessions = {
            tenant: async_sessionmaker(
                engine.execution_options(schema_translate_map={None: tenant})
            )
            for tenant in PG_TENANTS
        }
        inbox = AsyncInbox(sessions_for=lambda message: sessions[message.headers["tenant"]]())

        @inbox.handler("order.created", name="orders")
        async def record(message: Message, session: AsyncSession) -> None:
            async def notify(key: uuid.UUID) -> str:
                return str(key)

            await inbox.effect("notify", notify)
            await session.execute(insert(effects).values(ref=message.body["ref"], handler="o"))

        try:
            for messages in sent.values():
                results = await inbox.process_batch(messages + messages)
                outcomes = [r.outcome for r in results if isinstance(r, ProcessResult)]
                assert outcomes == [Outcome.PROCESSED] * 3 + [Outcome.DUPLICATE] * 3
        finally:
            await engine.dispose()

    run(main())
    check_isolated(pg_tenants, sent)


def test_cleanup_over_every_tenant_schema(pg_tenants: Tenants) -> None:
    inbox = tenant_inbox(pg_tenants)
    sent, _ = deliveries(pg_tenants)
    for messages in sent.values():
        for message in messages:
            inbox.process(message)
    pg_tenants.age_claims("tenant_a", 40)
    pg_tenants.age_claims("tenant_c", 40)
    out, err = io.StringIO(), io.StringIO()
    args = ["--days", "30", "--database-url", pg_tenants.url, "--all-schemas"]
    assert cleanup_main(args, stdout=out, stderr=err) == 0, err.getvalue()
    lines = out.getvalue().splitlines()
    assert [line.split(" from ")[1].split(" ")[0] for line in lines] == [
        f"{tenant}.inbox_message" for tenant in PG_TENANTS
    ]
    assert [line.split(" ")[2] for line in lines] == ["3", "0", "3"]
    assert "and 3 effect records" in lines[0]
    assert [len(pg_tenants.claims(t)) for t in PG_TENANTS] == [0, 3, 0]
    assert [pg_tenants.effect_steps(t) for t in PG_TENANTS] == [0, 3, 0]
    # --schema names tenants one by one; a SCHEMA.NAME --table with it is a usage error.
    pg_tenants.age_claims("tenant_b", 40)
    args = ["--days", "30", "--database-url", pg_tenants.url, "--schema", "tenant_b"]
    assert cleanup_main(args, stdout=out, stderr=err) == 0
    assert pg_tenants.claims("tenant_b") == set()
    args = [*args, "--table", "tenant_b.inbox_message"]
    assert cleanup_main(args, stdout=out, stderr=err) == 2
    assert "--table as a NAME" in err.getvalue()


def test_cleanup_over_several_tenant_databases(mariadb_tenants: Tenants) -> None:
    inbox = tenant_inbox(mariadb_tenants)
    sent, _ = deliveries(mariadb_tenants)
    for messages in sent.values():
        for message in messages:
            inbox.process(message)
    mariadb_tenants.age_claims("tenant_b", 40)
    out, err = io.StringIO(), io.StringIO()
    urls = [part for url in mariadb_tenants.urls.values() for part in ("--database-url", url)]
    assert cleanup_main(["--days", "30", *urls], stdout=out, stderr=err) == 0, err.getvalue()
    lines = out.getvalue().splitlines()
    assert [line.split(" ")[2] for line in lines] == ["0", "3"]
    assert all(" on mysql+pymysql://" in line for line in lines)
    assert [len(mariadb_tenants.claims(t)) for t in ("tenant_a", "tenant_b")] == [3, 0]
    # A database that cannot be reached fails its line and the exit code, not the others.
    bad = make_url(MARIADB_URL).set(database="no_such_database_here").render_as_string()
    args = ["--days", "30", "--database-url", bad, *urls]
    assert cleanup_main(args, stdout=out, stderr=err) == 1
    assert "no_such_database_here" in err.getvalue()


def test_exactly_one_way_of_making_sessions() -> None:
    with pytest.raises(TypeError, match="exactly one of session_factory"):
        Inbox()
    with pytest.raises(TypeError, match="exactly one of session_factory"):
        Inbox(sessionmaker(), sessions_for=lambda message: Session())
    with pytest.raises(TypeError, match="sessions_for must be callable"):
        Inbox(sessions_for="tenant_a")  # type: ignore[arg-type]


def test_status_per_tenant_schema(pg_tenants: Tenants) -> None:
    inbox = tenant_inbox(pg_tenants)
    sent, _ = deliveries(pg_tenants)
    for message in sent["tenant_b"]:
        inbox.process(message)
    out, err = io.StringIO(), io.StringIO()
    args = ["status", "--database-url", pg_tenants.url, "--all-schemas"]
    assert admin_main(args, stdout=out, stderr=err) == 0, err.getvalue()
    lines = out.getvalue().splitlines()
    claims = [line.split(",")[0] for line in lines if line.startswith("claims in")]
    assert claims == [
        "claims in tenant_a.inbox_message: 0",
        "claims in tenant_b.inbox_message: 3",
        "claims in tenant_c.inbox_message: 0",
    ]
    out = io.StringIO()
    args = ["status", "--database-url", pg_tenants.url, "--schema", "tenant_b", "--json"]
    assert admin_main(args, stdout=out, stderr=err) == 0, err.getvalue()
    (report,) = json.loads(out.getvalue())
    assert report["table"] == "tenant_b.inbox_message"
    assert [c["count"] for c in report["claims"]] == [3]
    args = [*args, "--table", "tenant_b.inbox_message"]
    assert admin_main(args, stdout=out, stderr=err) == 2
    assert "table names are NAME" in err.getvalue()


def test_concurrent_deliveries_across_tenants_stay_apart(pg_tenants: Tenants) -> None:
    inbox = tenant_inbox(pg_tenants)
    sent: dict[str, list[Message]] = {tenant: [] for tenant in PG_TENANTS}
    for n in range(10):
        shared = uuid.uuid4()
        for tenant in PG_TENANTS:
            body = {"ref": f"{tenant}-{n}"}
            sent[tenant].append(Message(shared, "order.created", body, {"tenant": tenant}))
    every = [m for batch in zip(*sent.values(), strict=True) for m in batch]
    outcomes: list[Outcome] = []

    def deliver(messages: list[Message]) -> None:
        outcomes.extend(inbox.process(m).outcome for m in messages)

    # Three workers get every delivery, each in its own order: concurrent duplicates of the
    # same id in the same tenant, and the same id at once in the other tenants.
    orders = [every, every[::-1], every[len(every) // 2 :] + every[: len(every) // 2]]
    threads = [threading.Thread(target=deliver, args=(order,)) for order in orders]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert len(outcomes) == 3 * len(every)
    assert outcomes.count(Outcome.PROCESSED) == len(every)
    check_isolated(pg_tenants, sent)


def sms_inbox(sessions_for: Any, **options: Any) -> tuple[Inbox, Provider, dict[str, Any]]:
    """An inbox whose handler sends one SMS per message through ``inbox.effect``: the
    provider, and the result each tenant's handler got."""
    inbox = Inbox(sessions_for=sessions_for, **options)
    provider = Provider()
    got: dict[str, Any] = {}

    @inbox.handler("sms.requested", name="sms.send")
    def send(message: Message, session: Session) -> None:
        got[message.headers["tenant"]] = inbox.effect("provider.send", provider.send)

    return inbox, provider, got


def to_both(inbox: Inbox, tenants: tuple[str, ...] = ("tenant_a", "tenant_b")) -> None:
    """The same message (one id) delivered to each of ``tenants``, each processed."""
    shared = uuid.uuid4()
    for tenant in tenants:
        message = Message(shared, "sms.requested", {}, {"tenant": tenant})
        assert inbox.process(message).outcome is Outcome.PROCESSED


@pytest.mark.parametrize("backend", ["postgresql", "mariadb"])
def test_the_same_message_in_two_tenants_is_two_effects_under_two_keys(
    backend: str, request: pytest.FixtureRequest
) -> None:
    """Regression: nothing of the tenant was in the effect key, so both tenants' calls went
    out under one idempotency key: a provider deduplicating by it dropped tenant B's SMS."""
    tenants: Tenants = request.getfixturevalue(f"{backend}_tenants".replace("postgresql", "pg"))
    sessions = tenants.sessions()
    inbox, provider, got = sms_inbox(lambda m: sessions[m.headers["tenant"]]())
    to_both(inbox)
    assert len(provider.calls) == 2
    assert len(set(provider.calls)) == 2
    assert got["tenant_a"] != got["tenant_b"]
    for tenant in ("tenant_a", "tenant_b"):
        assert tenants.effect_steps(tenant) == 1


def test_one_effect_store_shared_by_every_tenant_keeps_their_effects_apart(
    tmp_path: Path,
) -> None:
    """Regression: with one ``effect_store`` for every tenant (the only way on SQLite), tenant
    B's call was never made and B's handler was handed tenant A's stored result."""
    engines = {t: create_engine(f"sqlite:///{tmp_path / t}.db") for t in ("tenant_a", "tenant_b")}
    store = create_engine(f"sqlite:///{tmp_path / 'effects.db'}")
    try:
        inbox_effect.create(store)
        for engine in engines.values():
            inbox_metadata.create_all(engine)
        sessions = {tenant: sessionmaker(engine) for tenant, engine in engines.items()}
        inbox, provider, got = sms_inbox(
            lambda m: sessions[m.headers["tenant"]](), effect_store=store
        )
        to_both(inbox)
        assert len(set(provider.calls)) == 2
        assert got["tenant_a"]["key"] != got["tenant_b"]["key"]
        assert [got[t]["key"] for t in ("tenant_a", "tenant_b")] == [str(k) for k in provider.calls]
        with store.connect() as connection:
            assert len(connection.execute(select(inbox_effect)).all()) == 2
    finally:
        store.dispose()
        for engine in engines.values():
            engine.dispose()


def test_a_tenant_named_with_inbox_tenant_keys_its_effects_by_that_name(
    pg_tenants: Tenants,
) -> None:
    """The ``inbox_tenant`` execution option names the tenant: its effect keys follow the
    documented formula with that name, whatever engine or schema reaches it."""
    sessions = {
        tenant: sessionmaker(engine.execution_options(inbox_tenant=f"shop-{tenant}"))
        for tenant, engine in pg_tenants.engines.items()
    }
    inbox, provider, _ = sms_inbox(lambda m: sessions[m.headers["tenant"]]())
    message = Message(uuid.uuid4(), "sms.requested", {}, {"tenant": "tenant_a"})
    inbox.process(message)
    fields = (message.id.bytes.hex(), "shop-tenant_a", "sms.send", "provider.send")
    name = "v2" + "".join(f":{len(f.encode())}:{f}" for f in fields)
    assert provider.calls == [uuid.uuid5(KEY_NAMESPACE, name)]
