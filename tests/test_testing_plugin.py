"""The pytest plugin as a user meets it: pytest run (pytester) on a sample order-consumer
project whose tests use the ``inbox_*`` fixtures and ``assert_idempotent``.

Two of the sample's handlers are deliberately not idempotent, and the user's run must FAIL
for them with a readable diff: one keyed on the clock (caught by a second delivery, on every
backend), one writing through a connection of its own (caught by the redeliveries after a
failure and after a crash; on PostgreSQL and MariaDB, since SQLite lets one writer in at a
time and that one holds the claim).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from support.databases import MARIADB_URL, POSTGRES_URL, unreachable

pytest_plugins = ["pytester"]

SHOP = '''
"""A user's project: an order consumer with one good handler and two sloppy ones."""
import time

from sqlalchemy import Column, Integer, MetaData, String, Table, create_engine, insert, update

from inbox import Inbox

metadata = MetaData()
orders = Table(
    "orders", metadata,
    Column("order_id", String(40), primary_key=True),
    Column("total", Integer, nullable=False),
)
ledger = Table(
    "ledger", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("order_id", String(40), nullable=False),
    Column("amount", Integer, nullable=False),
)
audit = Table(
    "audit", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("order_id", String(40), nullable=False),
)
counters = Table(
    "counters", metadata,
    Column("name", String(40), primary_key=True),
    Column("value", Integer, nullable=False),
)


def make_inbox(sessions):
    inbox = Inbox(sessions)

    @inbox.handler("order.created", name="shop.record_order")
    def record_order(message, session):
        body = message.body
        session.execute(insert(orders).values(order_id=body["order_id"], total=body["total"]))
        session.execute(
            insert(ledger).values(order_id=body["order_id"], amount=body["total"])
        )

    return inbox


def add_clock_keyed_counter(inbox):
    # Keyed on the clock: every delivery is a new business operation to the inbox.
    @inbox.handler(
        "order.created",
        name="shop.count_orders",
        key=lambda m: f"{m.body['order_id']}:{time.time_ns()}",
    )
    def count_orders(message, session):
        session.execute(update(counters).values(value=counters.c.value + 1))


def add_audit_outside_the_transaction(inbox, url):
    engine = create_engine(url)

    @inbox.handler("order.created", name="shop.audit")
    def audit_order(message, session):
        # Its own connection: committed whatever becomes of the inbox's transaction.
        with engine.begin() as connection:
            connection.execute(insert(audit).values(order_id=message.body["order_id"]))
'''

USER_TESTS = """
import pytest
from sqlalchemy import func, insert, select

import shop
from inbox import Message
from inbox.testing import assert_idempotent


@pytest.fixture
def inbox_app_metadata():
    return shop.metadata


def order():
    return Message.new("order.created", {"order_id": "o-1", "total": 42})


def test_record_order(inbox_sessions, inbox_engine):
    inbox = shop.make_inbox(inbox_sessions)
    assert_idempotent(inbox, order(), tables=["orders", "ledger"])
    with inbox_engine.connect() as connection:  # left as one clean run leaves it
        assert connection.execute(select(shop.ledger)).all() == [(1, "o-1", 42)]


def test_clock_keyed_counter(inbox_sessions, inbox_engine):
    with inbox_engine.begin() as connection:
        connection.execute(insert(shop.counters).values(name="orders", value=0))
    inbox = shop.make_inbox(inbox_sessions)
    shop.add_clock_keyed_counter(inbox)
    assert_idempotent(inbox, order(), tables=["orders", "counters"])


def test_audit_outside_the_transaction(inbox_sessions, inbox_database):
    inbox = shop.make_inbox(inbox_sessions)
    shop.add_audit_outside_the_transaction(inbox, inbox_database.url)
    with open("database-url.txt", "w") as out:
        out.write(inbox_database.url)
    assert_idempotent(inbox, order(), tables=["orders", "ledger", "audit"])
"""


@pytest.fixture
def shop(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    monkeypatch.delenv("INBOX_TESTING_DATABASE_URL", raising=False)  # SQLite unless a test says
    pytester.makepyfile(shop=SHOP, test_orders=USER_TESTS)
    pytester.syspathinsert()
    return pytester


def server(url: str) -> str:
    backend = make_url(url).get_backend_name()
    engine = create_engine(url)
    try:
        with engine.connect() as connection:
            connection.execute(text("SELECT 1"))
    except Exception as exc:
        unreachable(backend, exc)
    finally:
        engine.dispose()
    return url


BLANK = "E       "  # the empty lines of the report, as pytest prints them
CLOCK_KEYED_FAILURE = [
    "FAILED test_orders.py::test_clock_keyed_counter - inbox.testing.asserts.NotId*",
]
CLOCK_KEYED_REPORT = [
    "E       *NotIdempotent: message * (type 'order.created') is not handled idempotently: 2 "
    "redelivery scenario(s) left the database different from one clean run ('-' only after "
    "the clean run, '+' only after the redelivery)",
    BLANK,
    "E       delivered twice:",
    "E         the second delivery ran shop.count_orders again (its claim key changed "
    "between deliveries: is its key= function a function of the message alone?)",
    "E         table counters: 1 row(s) after the clean run, 1 after this one",
    "E           - {'name': 'orders', 'value': 1}",
    "E           + {'name': 'orders', 'value': 2}",
    # The counter ran in the failed delivery too, under a key the redelivery does not have.
    "E       redelivered after shop.record_order failed once it had run (its transaction "
    "rolled back):",
    "E         table counters: 1 row(s) after the clean run, 1 after this one",
    "E           - {'name': 'orders', 'value': 1}",
    "E           + {'name': 'orders', 'value': 2}",
    BLANK,
    "E       compared: orders, counters; ignored columns: none",
]
AUDIT_FAILURE = ["FAILED test_orders.py::test_audit_outside_the_transaction - inbox.testing*"]
# Only where shop.audit itself ran and its delivery then failed does its write stay behind:
# after record_order failed, audit's claim committed with it (a duplicate on redelivery);
# after a crash before record_order committed, audit had not run yet.
AUDIT_REPORT = [  # after a header like the one above (2 scenarios) and a blank line
    "E       redelivered after shop.audit failed once it had run (its transaction rolled back):",
    "E         table audit: 1 row(s) after the clean run, 2 after this one",
    "E           + {'id': 2, 'order_id': 'o-1'}",
    "E       redelivered after a crash before shop.audit committed:",
    "E         table audit: 1 row(s) after the clean run, 2 after this one",
    "E           + {'id': 2, 'order_id': 'o-1'}",
    BLANK,
    "E       compared: orders, ledger, audit; ignored columns: none",
]


def test_on_sqlite_the_clock_keyed_handler_fails_the_users_run_and_the_good_one_passes(
    shop: pytest.Pytester,
) -> None:
    result = shop.runpytest("-p", "no:cacheprovider", "-k", "not outside")

    result.assert_outcomes(passed=1, failed=1, deselected=1)
    result.stdout.fnmatch_lines(CLOCK_KEYED_FAILURE)
    result.stdout.fnmatch_lines(CLOCK_KEYED_REPORT, consecutive=True)
    assert "injected by assert_idempotent" not in result.stdout.str()  # no log noise
    assert not (shop.path / "database-url.txt").exists()


def schema_or_database(url: str) -> str:
    parsed = make_url(url)
    options = parsed.query.get("options")
    if isinstance(options, str):
        found = re.fullmatch(r"-csearch_path=(\w+)", options)
        assert found is not None
        return found.group(1)
    assert parsed.database is not None
    return parsed.database


def test_on_postgresql_from_the_environment_both_sloppy_handlers_fail_the_run(
    shop: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("INBOX_TESTING_DATABASE_URL", server(POSTGRES_URL))

    result = shop.runpytest("-p", "no:cacheprovider")

    result.assert_outcomes(passed=1, failed=2)
    result.stdout.fnmatch_lines(CLOCK_KEYED_REPORT, consecutive=True)
    result.stdout.fnmatch_lines(AUDIT_REPORT, consecutive=True)
    result.stdout.fnmatch_lines(CLOCK_KEYED_FAILURE + AUDIT_FAILURE)
    schema = schema_or_database((shop.path / "database-url.txt").read_text())
    assert schema.startswith("inbox_test_")
    engine = create_engine(POSTGRES_URL)
    with engine.connect() as connection:  # the throwaway schema was dropped
        left = connection.scalar(
            text("SELECT count(*) FROM pg_namespace WHERE nspname = :name"), {"name": schema}
        )
    engine.dispose()
    assert left == 0


def test_on_mariadb_from_the_command_line_option_both_sloppy_handlers_fail_the_run(
    shop: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("INBOX_TESTING_DATABASE_URL", raising=False)

    result = shop.runpytest("-p", "no:cacheprovider", "--inbox-database-url", server(MARIADB_URL))

    result.assert_outcomes(passed=1, failed=2)
    result.stdout.fnmatch_lines(CLOCK_KEYED_REPORT, consecutive=True)
    result.stdout.fnmatch_lines(AUDIT_REPORT, consecutive=True)
    result.stdout.fnmatch_lines(CLOCK_KEYED_FAILURE + AUDIT_FAILURE)
    database = schema_or_database((shop.path / "database-url.txt").read_text())
    engine = create_engine(MARIADB_URL)
    with engine.connect() as connection:
        left = connection.scalar(
            text("SELECT count(*) FROM information_schema.schemata WHERE schema_name = :name"),
            {"name": database},
        )
    engine.dispose()
    assert left == 0


def test_the_plugin_comes_from_the_entry_point_and_stays_inert_until_asked(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(
        test_plain="""
        import sys

        def test_nothing_of_the_inbox_was_set_up(request):
            assert request.config.pluginmanager.has_plugin("inbox")
            assert "inbox.testing.asserts" not in sys.modules
            assert "kombu" not in sys.modules
            assert not [f for f in request.fixturenames if f.startswith("inbox_")]
        """
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)

    listed = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--fixtures")
    listed.stdout.fnmatch_lines(
        [
            "*inbox_database*",
            "*A fresh database for this test with the inbox tables and your tables created*",
        ],
        consecutive=False,
    )
    helped = pytester.runpytest_subprocess("--help")
    helped.stdout.fnmatch_lines(["*--inbox-database-url*"])


def test_a_url_the_fixtures_cannot_use_is_a_clear_error(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_db="def test_db(inbox_database):\n    pass\n")

    result = pytester.runpytest("-p", "no:cacheprovider", "--inbox-database-url", "sqlite:///x")

    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(
        [
            "*ConfigurationError: INBOX_TESTING_DATABASE_URL: the fixtures create databases on "
            "postgresql, mysql, mariadb servers (SQLite is the default without a URL), got "
            "'sqlite'"
        ]
    )


def test_a_server_that_cannot_be_reached_is_an_error_naming_it_without_its_password(
    pytester: pytest.Pytester, tmp_path: Path
) -> None:
    pytester.makepyfile(test_db="def test_db(inbox_database):\n    pass\n")
    url = "postgresql+psycopg://someone:s3cret@127.0.0.1:1/nowhere"

    result = pytester.runpytest("-p", "no:cacheprovider", "--inbox-database-url", url)

    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(
        ["*RuntimeError: cannot create a throwaway database on postgresql+psycopg://someone:***@*"]
    )
    assert "s3cret" not in result.stdout.str()
