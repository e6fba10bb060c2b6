"""Every examples/*.py runs as its docstring says, on its embedded defaults (SQLite, the
in-memory brokers), with one command: exit 0 and its last line saying everything happened
exactly once. An example added without its last line here fails, so none can rot unseen."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from support.databases import Database
from support.rabbit import Rabbit
from support.worker import TESTS_DIR

EXAMPLES = TESTS_DIR.parent / "examples"

LAST_LINES: dict[str, str | None] = {
    "async_orders.py": "every order invoiced exactly once",
    # Celery's worker is a process of its own: RabbitMQ and PostgreSQL, tested below.
    "celery_orders.py": None,
    "demo.py": None,  # the demo and the SMS demo have tests of their own (test_demo*.py)
    "demo_sms.py": None,
    "outbox_orders.py": "every order confirmed and announced exactly once",
    "payments.py": "every order charged exactly once",
    "tenants.py": "every tenant holds exactly its own orders",
}


def test_every_example_is_listed() -> None:
    assert sorted(path.name for path in EXAMPLES.glob("*.py")) == sorted(LAST_LINES)


@pytest.mark.parametrize("name", sorted(n for n, last in LAST_LINES.items() if last))
def test_the_example_runs_with_its_one_command(name: str, tmp_path: Path) -> None:
    example = EXAMPLES / name
    command = f"python examples/{name}"
    assert command in example.read_text(), f"{name} must say how to run it: {command}"
    done = subprocess.run(
        [sys.executable, str(example)],
        capture_output=True,
        text=True,
        check=False,
        timeout=180,
        cwd=tmp_path,  # nothing it writes may land in the source tree
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.rstrip().splitlines()[-1] == LAST_LINES[name], done.stdout
    assert list(tmp_path.iterdir()) == []


def run_example(name: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(EXAMPLES / name), *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=180,
    )


def test_the_payments_example_on_a_server_and_rabbitmq(server_db: Database, rabbit: Rabbit) -> None:
    done = run_example(
        "payments.py",
        *("--database-url", server_db.url, "--broker", rabbit.url, "--prefix", rabbit.prefix),
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "payment rows=3 cards charged=3 provider requests=4" in done.stdout
    assert done.stdout.rstrip().splitlines()[-1] == LAST_LINES["payments.py"]


def test_the_tenants_example_with_rabbitmq(rabbit: Rabbit) -> None:
    done = run_example("tenants.py", "--broker", rabbit.url, "--prefix", rabbit.prefix)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "tenant acme: orders ['a-1', 'a-2', 'acme-shared'], 3 claims" in done.stdout
    assert done.stdout.rstrip().splitlines()[-1] == LAST_LINES["tenants.py"]


def test_the_celery_example_on_rabbitmq_and_postgresql(pg_db: Database, rabbit: Rabbit) -> None:
    queue = rabbit.queue("celery_orders")
    done = run_example(
        "celery_orders.py", "--database-url", pg_db.url, "--broker", rabbit.url, "--queue", queue
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "orders placed: 3" in done.stdout
    # It waited for every delivery, the two duplicate charges included, before counting.
    assert "charge deliveries=5 receipt deliveries=3 (the duplicates were skipped)" in done.stdout
    assert "payments=3 provider requests=3 receipts=3" in done.stdout
    assert done.stdout.rstrip().splitlines()[-1] == "every order charged and receipted exactly once"
