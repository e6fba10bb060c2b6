"""examples/outbox_orders.py runs as a user runs it: orders written with their messages
through the outbox, a failed request sending nothing, a consumer confirming each order once
and announcing it once through the outbox; on the defaults (SQLite, the in-memory broker)
and on PostgreSQL and MariaDB with RabbitMQ and the real relay."""

from __future__ import annotations

import subprocess
import sys

from support.databases import Database
from support.rabbit import Rabbit
from support.worker import TESTS_DIR

EXAMPLE = TESTS_DIR.parent / "examples" / "outbox_orders.py"


def run_example(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(EXAMPLE), *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )


def check(done: subprocess.CompletedProcess[str]) -> None:
    assert done.returncode == 0, done.stdout + done.stderr
    assert "POST /orders mallory: failed" in done.stdout
    assert "relay: 3 order.created message(s) sent" in done.stdout
    # The first order was delivered twice: the second delivery was a duplicate.
    assert "handler runs: processed=3 duplicates=1" in done.stdout
    assert "relay: 3 order.confirmed message(s) sent" in done.stdout
    assert "orders=3 confirmations=3 order.confirmed sent=3" in done.stdout
    assert done.stdout.rstrip().endswith("every order confirmed and announced exactly once")


def test_the_outbox_example_runs_on_its_defaults() -> None:
    check(run_example())


def test_the_outbox_example_runs_with_rabbitmq_and_the_relay(
    server_db: Database, rabbit: Rabbit
) -> None:
    check(
        run_example(
            "--database-url", server_db.url, "--broker", rabbit.url, "--prefix", rabbit.prefix
        )
    )
