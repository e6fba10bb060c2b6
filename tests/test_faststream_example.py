"""examples/async_orders.py runs as a user runs it: a request writing through the outbox, the
FastStream consumer behind an AsyncInbox, every order invoiced exactly once."""

from __future__ import annotations

import subprocess
import sys

from support.aio import async_url
from support.databases import Database
from support.worker import TESTS_DIR

EXAMPLE = TESTS_DIR.parent / "examples" / "async_orders.py"


def run_example(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(EXAMPLE), *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )


def test_the_async_example_invoices_every_order_once_on_sqlite_by_default() -> None:
    done = run_example()
    assert done.returncode == 0, done.stderr
    assert "orders=3 invoices=3 outbox rows left=0" in done.stdout
    # The first outbox row was sent twice: its second delivery was a duplicate.
    assert "processed=3 duplicates=1 acked=4" in done.stdout
    assert done.stdout.rstrip().endswith("every order invoiced exactly once")


def test_the_async_example_runs_on_postgresql(pg_db: Database) -> None:
    url, _ = async_url(pg_db.url, "psycopg")
    done = run_example("--database-url", url)
    assert done.returncode == 0, done.stderr
    assert "orders=3 invoices=3 outbox rows left=0" in done.stdout
