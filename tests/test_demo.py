"""The demo (the README's main job) proves its ledger on SQLite and on the real servers."""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import Database, Rabbit

from inbox.demo import run_demo


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
