"""An inbox task whose database is unusable: never lost, never looping, loudly visible.
Celery's real prefork worker (a subprocess) on RabbitMQ and Redis, PostgreSQL.

At start, a worker whose inbox tables are missing refuses to start (one line). At run time
(the claim table dropped under a running worker), the task is sent again with a doubling
countdown instead of coming straight back, logs one line per wait naming the task, the
error and the fix, and runs once when the table is back."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text
from support.databases import Database
from test_celery_worker import TESTS, DeadLetters, broker, sender, until, worker

from inbox.celery._outage import LONGEST_WAIT, database_unusable
from inbox.core._startup import SchemaNotReady
from inbox.errors import HandlerFailed
from inbox.result import ProcessResult
from inbox.schema import metadata as inbox_metadata

__all__ = ["broker"]  # the fixture, imported for pytest

WAIT_LINE = "its database is unusable"


def drop_claims(db: Database) -> None:
    with db.engine.begin() as connection:
        connection.execute(text("DROP TABLE inbox_message"))


def test_a_task_whose_database_is_unusable_waits_with_a_growing_countdown_then_runs_once(
    pg_db: Database,
    broker: tuple[str, str, DeadLetters],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    broker_url, queue, dead_letters = broker
    log = tmp_path / "worker.log"
    with (
        sender(broker_url, queue, pg_db, monkeypatch) as app,
        worker(broker_url, queue, pg_db, tmp_path, log=log),
    ):
        app.record.delay("before")  # the worker is up (its start check passed)
        until(lambda: pg_db.effect_counts() == {("before", "ct.record"): 1}, "a first run")
        drop_claims(pg_db)
        started = time.monotonic()
        app.record.delay("waits")
        until(lambda: log.read_text().count(WAIT_LINE) >= 2, "the task to come back")
        time.sleep(max(0.0, 8.0 - (time.monotonic() - started)))
        waits = log.read_text().count(WAIT_LINE)
        elapsed = time.monotonic() - started
        assert pg_db.effect_counts() == {("before", "ct.record"): 1}
        inbox_metadata.create_all(pg_db.engine)  # the migration is run
        until(lambda: ("waits", "ct.record") in pg_db.effect_counts(), "the task to run")
        time.sleep(2)  # room for a second run to show
    # Delivered at 0, 1, 3, 7 s...: a hot loop would have come back hundreds of times.
    assert 2 <= waits <= 5, f"{waits} deliveries in {elapsed:.1f} s"
    assert pg_db.effect_counts() == {("before", "ct.record"): 1, ("waits", "ct.record"): 1}
    assert dead_letters(f"{queue}.dlq") == [], "nothing was dead-lettered"
    lines = [line for line in log.read_text().splitlines() if WAIT_LINE in line]
    first = lines[0]
    assert "inbox task 'ct.record'" in first
    assert 'relation "inbox_message" does not exist' in first
    assert "sent again in 1 s (wait 1)" in first
    assert "fix: run the inbox migrations (`inbox migrate`" in first
    assert "sent again in 2 s (wait 2)" in lines[1], "the countdown doubles"


def test_a_worker_whose_inbox_tables_are_missing_refuses_to_start(
    pg_db: Database, tmp_path: Path
) -> None:
    drop_claims(pg_db)
    env = {
        **os.environ,
        "INBOX_CELERY_BROKER": "memory://",
        "INBOX_CELERY_DATABASE": pg_db.url,
        "PYTHONPATH": os.pathsep.join([str(TESTS), str(TESTS.parent)]),
    }
    command = [sys.executable, "-m", "celery", "-A", "celery_app", "worker", "-c", "1"]
    done = subprocess.run(
        command, cwd=TESTS, env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 1
    lines = [line for line in done.stderr.splitlines() if line.startswith("inbox.celery")]
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(
        "inbox.celery refuses to start the worker: the inbox's database is not ready: "
        "table inbox_message does not exist: run the inbox migrations (`inbox migrate`"
    )


def test_what_counts_as_an_unusable_database() -> None:
    unreachable = create_engine("postgresql+psycopg://postgres@127.0.0.1:1/test")
    try:
        with unreachable.connect():
            pass
    except Exception as exc:
        refused: BaseException = exc
    assert database_unusable(refused) == "check the database URL and that the database server is up"
    failed = HandlerFailed(uuid.uuid4(), {"t": refused}, ProcessResult(uuid.uuid4(), {}))  # type: ignore[arg-type]
    assert database_unusable(failed) is not None
    fix = database_unusable(SchemaNotReady("the database is at inbox revision x: run it"))
    assert fix == "the database is at inbox revision x: run it"
    assert database_unusable(RuntimeError("the task's own failure")) is None
    assert database_unusable(ValueError(uuid.uuid4().hex)) is None
    assert LONGEST_WAIT == 300.0
