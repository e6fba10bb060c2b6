"""The effect ledger's engines beside the claim's: kept by the claim pool and the execution
options' values, never by the claim engine object, and bounded. A tenant bind made per
message (``engine.execution_options(schema_translate_map=..., inbox_tenant=...)``) is a new
engine object every time; kept by it, every message that made an effect left two engines
behind for ever (issue 32, item 4)."""

from __future__ import annotations

import gc
import uuid
from collections.abc import Callable

import pytest
from sqlalchemy import Engine
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession
from sqlalchemy.orm import Session
from support.aio import async_engine, run
from support.databases import Database

from inbox import Inbox, Message, Outcome
from inbox.aio import AsyncInbox
from inbox.core.effects._blocking import ledger_engine
from inbox.core.effects._pool import OPTION_SETS_KEPT, LedgerEngines

TENANTS = ("acme", "globex", "initech")


def engines_alive() -> int:
    gc.collect()
    return sum(isinstance(o, Engine | AsyncEngine) for o in gc.get_objects())


def own_schema(db: Database) -> str:
    return str(make_url(db.url).query["options"]).removeprefix("-csearch_path=")


def per_message_bind(engine: Engine, schema: str, tenant: str) -> Engine:
    """What an application does per message: a bind of its own for the tenant."""
    return engine.execution_options(schema_translate_map={None: schema}, inbox_tenant=tenant)


def test_ten_thousand_per_message_binds_keep_one_ledger_engine_per_tenant(
    pg_db: Database,
) -> None:
    ledgers = LedgerEngines()
    schema = own_schema(pg_db)
    made = {
        tenant: ledger_engine(ledgers, None, per_message_bind(pg_db.engine, schema, tenant))
        for tenant in TENANTS
    }
    before = engines_alive()
    for n in range(10_000):
        tenant = TENANTS[n % len(TENANTS)]
        bind = per_message_bind(pg_db.engine, schema, tenant)
        assert ledger_engine(ledgers, None, bind) is made[tenant]
    del bind
    assert engines_alive() == before
    assert made["acme"].get_execution_options()["schema_translate_map"] == {None: schema}
    assert made["acme"].pool is made["globex"].pool is not pg_db.engine.pool


def test_option_sets_past_the_bound_let_the_oldest_go(pg_db: Database) -> None:
    ledgers = LedgerEngines()
    ledger_engine(ledgers, None, per_message_bind(pg_db.engine, "s0", "t0"))
    before = engines_alive()
    for n in range(10_000):
        ledger_engine(ledgers, None, per_message_bind(pg_db.engine, f"s{n}", f"t{n}"))
    assert engines_alive() - before <= OPTION_SETS_KEPT
    newest = per_message_bind(pg_db.engine, "s9999", "t9999")
    assert ledger_engine(ledgers, None, newest).get_execution_options()["inbox_tenant"] == "t9999"


def test_a_disposed_claim_pool_gets_a_new_ledger_pool(pg_db: Database) -> None:
    ledgers = LedgerEngines()
    bind = per_message_bind(pg_db.engine, own_schema(pg_db), "acme")
    first = ledger_engine(ledgers, None, bind)
    pg_db.engine.dispose()
    again = ledger_engine(ledgers, None, per_message_bind(pg_db.engine, own_schema(pg_db), "acme"))
    assert again.pool is not first.pool


def effect_inbox(sessions_for: Callable[[Message], Session]) -> Inbox:
    inbox = Inbox(sessions_for=sessions_for)

    @inbox.handler("sms.requested", name="sms.send")
    def send(message: Message, session: Session) -> None:
        inbox.effect("provider.send", str)

    return inbox


MESSAGES = 300


def test_an_inbox_binding_per_message_keeps_no_engine_per_message(pg_db: Database) -> None:
    schema = own_schema(pg_db)

    def sessions_for(message: Message) -> Session:
        return Session(bind=per_message_bind(pg_db.engine, schema, message.headers["tenant"]))

    inbox = effect_inbox(sessions_for)

    def deliver(n: int) -> None:
        tenant = TENANTS[n % len(TENANTS)]
        message = Message(uuid.uuid4(), "sms.requested", {}, {"tenant": tenant})
        assert inbox.process(message).outcome is Outcome.PROCESSED

    for n in range(len(TENANTS)):
        deliver(n)
    before = engines_alive()
    for n in range(MESSAGES):
        deliver(n)
    assert engines_alive() == before  # two per message before the fix: +600


@pytest.mark.parametrize("driver", ["psycopg", "asyncpg"])
def test_an_async_inbox_binding_per_message_keeps_no_engine_per_message(
    pg_db: Database, driver: str
) -> None:
    schema = own_schema(pg_db)

    async def main() -> int:
        async with async_engine(pg_db, driver) as engine:
            inbox = AsyncInbox(
                sessions_for=lambda message: AsyncSession(
                    bind=engine.execution_options(
                        schema_translate_map={None: schema},
                        inbox_tenant=message.headers["tenant"],
                    )
                )
            )

            @inbox.handler("sms.requested", name="sms.send")
            async def send(message: Message, session: AsyncSession) -> None:
                await inbox.effect("provider.send", str)

            async def deliver(n: int) -> None:
                tenant = TENANTS[n % len(TENANTS)]
                message = Message(uuid.uuid4(), "sms.requested", {}, {"tenant": tenant})
                assert (await inbox.process(message)).outcome is Outcome.PROCESSED

            for n in range(len(TENANTS)):
                await deliver(n)
            before = engines_alive()
            for n in range(MESSAGES):
                await deliver(n)
            return engines_alive() - before

    assert run(main()) == 0
