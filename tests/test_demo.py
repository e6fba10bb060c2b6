"""The demo (the README's main job) proves its ledger on SQLite and on the real servers."""

from __future__ import annotations

import re
import runpy
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import (
    Column,
    Connection,
    Engine,
    Integer,
    MetaData,
    Table,
    create_engine,
    event,
    inspect,
    select,
    text,
)
from support.databases import Database
from support.rabbit import Rabbit

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "demo.py"
run_demo = runpy.run_path(str(EXAMPLE))["run_demo"]


def test_demo_command_runs_on_the_embedded_default_and_reports_exactly_once() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "inbox.demo", "--orders", "120"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "EXACTLY ONCE" in done.stdout
    assert "in-memory broker -> worker -> SQLite" in done.stdout
    assert "orders paid exactly once                            120" in done.stdout


@pytest.mark.parametrize("orders", [150])
def test_demo_ledger_is_exact_on_every_backend(db: Database, orders: int) -> None:
    ledger = run_demo(db.url, orders=orders, seed=3)

    assert ledger.exact
    assert ledger.payments_committed == ledger.loyalty_committed == orders
    assert ledger.failures_retried == orders // 7
    duplicates_expected = ledger.redelivered_same_id + ledger.resent_fresh_id
    # Two handlers per delivery: every redelivery and re-send is skipped by both, and each
    # retry after a payment failure is a duplicate for the loyalty handler.
    assert ledger.duplicates_skipped == 2 * duplicates_expected + ledger.failures_retried
    assert ledger.deliveries == orders + duplicates_expected + ledger.failures_retried


def test_demo_runs_the_same_scenario_through_rabbitmq_into_postgresql(
    pg_db: Database, rabbit: Rabbit
) -> None:
    ledger = run_demo(pg_db.url, broker=rabbit.url, orders=100, seed=5)

    assert ledger.exact
    assert ledger.dead_lettered == 0
    assert ledger.failures_retried == 100 // 7
    assert ledger.deliveries == (
        100 + ledger.redelivered_same_id + ledger.resent_fresh_id + ledger.failures_retried
    )


def namespaces(db: Database) -> set[str]:
    """The schemas (PostgreSQL) or databases (MariaDB) on the server."""
    query = (
        "SELECT nspname FROM pg_namespace"
        if db.backend == "postgresql"
        else "SELECT schema_name FROM information_schema.schemata"
    )
    with db.engine.connect() as connection:
        return set(connection.execute(text(query)).scalars())


# Regression (issue 10): pointed at a real database, the demo dropped and created its tables
# there (a table of the user's named demo_payment included) and left them behind.
def test_the_demo_works_in_a_namespace_of_its_own_and_leaves_nothing_behind(
    server_db: Database,
) -> None:
    users = MetaData()
    own = Table("demo_payment", users, Column("id", Integer, primary_key=True))
    users.create_all(server_db.engine)
    with server_db.engine.begin() as connection:
        connection.execute(own.insert().values(id=42))
    before = set(inspect(server_db.engine).get_table_names())
    created: list[str] = []

    def spy(conn: Connection, cursor: Any, statement: str, *args: Any) -> None:
        found = re.match(r"CREATE (?:SCHEMA|DATABASE) (inbox_demo_\w+)", statement)
        if found:
            created.append(found[1])

    event.listen(Engine, "before_cursor_execute", spy)
    try:
        ledger = run_demo(server_db.url, orders=30, seed=2)
    finally:
        event.remove(Engine, "before_cursor_execute", spy)

    assert ledger.exact
    [namespace] = created  # the demo's own, gone again
    assert namespace not in namespaces(server_db)
    engine = create_engine(server_db.url)  # a fresh look: no cached reflection
    try:
        assert set(inspect(engine).get_table_names()) == before
        with engine.connect() as connection:
            assert connection.execute(select(own.c.id)).scalars().all() == [42]
    finally:
        engine.dispose()


def test_the_demo_drops_its_tables_from_a_given_sqlite_file(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'demo.db'}"
    assert run_demo(url, orders=20, seed=1).exact
    engine = create_engine(url)
    try:
        assert inspect(engine).get_table_names() == []
    finally:
        engine.dispose()
