"""``assert_idempotent_async`` as a user's tests use it (pytester): an ``AsyncInbox`` on the
throwaway database (aiosqlite, or psycopg's async side on PostgreSQL), a good handler that
passes and sloppy ones that fail the user's run with the row diff, the simulated crash
included (it must not escape the event loop)."""

from __future__ import annotations

import pytest
from sqlalchemy import text
from support.databases import POSTGRES_URL, admin_engine, unreachable

pytest_plugins = ["pytester"]

USER_TESTS = """
import asyncio
import time

import pytest
from sqlalchemy import Column, Integer, MetaData, String, Table, insert, update
from sqlalchemy.ext.asyncio import async_sessionmaker, create_async_engine

from inbox import Message
from inbox.aio import AsyncInbox
from inbox.testing import assert_idempotent_async

metadata = MetaData()
orders = Table(
    "orders", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("ref", String(40), nullable=False),
)
counters = Table(
    "counters", metadata,
    Column("name", String(20), primary_key=True),
    Column("value", Integer, nullable=False),
)


@pytest.fixture
def inbox_app_metadata():
    return metadata


def check(inbox_database, register, tables):
    async def main():
        url = inbox_database.url.replace("sqlite:///", "sqlite+aiosqlite:///")
        engine = create_async_engine(url)
        try:
            async with engine.begin() as connection:
                await connection.execute(insert(counters).values(name="orders", value=0))
            inbox = AsyncInbox(async_sessionmaker(engine))
            register(inbox, engine)
            message = Message.new("order.created", {"ref": "o-1"})
            await assert_idempotent_async(inbox, message, tables=tables)
        finally:
            await engine.dispose()

    asyncio.run(main())


def record(inbox, engine):
    @inbox.handler("order.created", name="shop.record")
    async def record_order(message, session):
        await session.execute(insert(orders).values(ref=message.body["ref"]))


def test_record(inbox_database):
    check(inbox_database, record, ["orders"])


def test_clock_keyed_counter(inbox_database):
    def register(inbox, engine):
        @inbox.handler("order.created", name="shop.count", key=lambda m: str(time.time_ns()))
        async def count(message, session):
            await session.execute(update(counters).values(value=counters.c.value + 1))

    check(inbox_database, register, ["counters"])


def test_counter_outside_the_transaction(inbox_database):
    def register(inbox, engine):
        record(inbox, engine)

        @inbox.handler("order.created", name="shop.count")
        async def count(message, session):
            async with engine.begin() as connection:  # its own connection
                await connection.execute(update(counters).values(value=counters.c.value + 1))

    check(inbox_database, register, ["orders", "counters"])
"""

CLOCK_KEYED = [
    "E           *NotIdempotent: message * is not handled idempotently: 1 redelivery scenario(s)*",
    "E           ",
    "E           delivered twice:",
    "E             the second delivery ran shop.count again (its claim key changed between "
    "deliveries: is its key= function a function of the message alone?)",
    "E             table counters: 1 row(s) after the clean run, 1 after this one",
    "E               - {'name': 'orders', 'value': 1}",
    "E               + {'name': 'orders', 'value': 2}",
]
OUTSIDE = [
    "E           *NotIdempotent: message * is not handled idempotently: 2 redelivery scenario(s)*",
    "E           ",
    "E           redelivered after shop.count failed once it had run (its transaction rolled "
    "back):",
    "E             table counters: 1 row(s) after the clean run, 1 after this one",
    "E               - {'name': 'orders', 'value': 1}",
    "E               + {'name': 'orders', 'value': 2}",
    "E           redelivered after a crash before shop.count committed:",
    "E             table counters: 1 row(s) after the clean run, 1 after this one",
    "E               - {'name': 'orders', 'value': 1}",
    "E               + {'name': 'orders', 'value': 2}",
    "E           ",
    "E           compared: orders, counters; ignored columns: none",
]


@pytest.fixture
def project(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    monkeypatch.delenv("INBOX_TESTING_DATABASE_URL", raising=False)
    pytester.makepyfile(test_async_shop=USER_TESTS)
    return pytester


def test_on_aiosqlite_the_good_handler_passes_and_the_clock_keyed_one_fails(
    project: pytest.Pytester,
) -> None:
    result = project.runpytest("-p", "no:cacheprovider", "-k", "not outside")

    result.assert_outcomes(passed=1, failed=1, deselected=1)
    result.stdout.fnmatch_lines(["FAILED test_async_shop.py::test_clock_keyed_counter*"])
    result.stdout.fnmatch_lines(CLOCK_KEYED, consecutive=True)


def test_on_postgresql_the_own_connection_handler_fails_after_a_failure_and_a_crash(
    project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    admin = admin_engine("postgresql")
    try:
        with admin.connect() as connection:
            connection.execute(text("SELECT 1"))
    except Exception as exc:
        unreachable("postgresql", exc)
    finally:
        admin.dispose()
    monkeypatch.setenv("INBOX_TESTING_DATABASE_URL", POSTGRES_URL)

    result = project.runpytest("-p", "no:cacheprovider")

    result.assert_outcomes(passed=1, failed=2)
    result.stdout.fnmatch_lines(CLOCK_KEYED, consecutive=True)
    result.stdout.fnmatch_lines(OUTSIDE, consecutive=True)
    assert "injected by assert_idempotent" not in result.stdout.str()


def test_each_assertion_refuses_the_other_kind_of_inbox(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_kinds="""
        import asyncio
        import pytest
        from sqlalchemy import create_engine
        from sqlalchemy.ext.asyncio import async_sessionmaker, create_async_engine
        from sqlalchemy.orm import sessionmaker
        from inbox import Inbox, Message
        from inbox.aio import AsyncInbox
        from inbox.testing import assert_idempotent, assert_idempotent_async

        def test_kinds():
            async_inbox = AsyncInbox(async_sessionmaker(create_async_engine("sqlite+aiosqlite://")))
            inbox = Inbox(sessionmaker(create_engine("sqlite://")))
            message = Message.new("t", {})
            with pytest.raises(TypeError, match="await assert_idempotent_async"):
                assert_idempotent(async_inbox, message, tables=["t"])
            with pytest.raises(TypeError, match="for an Inbox: assert_idempotent"):
                asyncio.run(assert_idempotent_async(inbox, message, tables=["t"]))
        """
    )
    pytester.runpytest("-p", "no:cacheprovider").assert_outcomes(passed=1)
