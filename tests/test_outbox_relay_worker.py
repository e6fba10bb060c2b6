"""``inbox-worker --relay``: one process consumes its queue and relays the outbox of the
same database, and SIGTERM stops both cleanly."""

from __future__ import annotations

import io
import os
import subprocess
from pathlib import Path

import pytest
from support.databases import Database
from support.rabbit import Rabbit
from support.relay import add_rows, op_row, outbox_ids
from support.worker import TESTS_DIR, WorkerProcess, wait_until, worker_command

from inbox.broker.cli import worker_main

TIMEOUT = 60.0


def test_a_worker_with_relay_sends_the_outbox_and_consumes_what_it_sent_once_each(
    pg_db: Database, rabbit: Rabbit, tmp_path: Path
) -> None:
    queue = rabbit.queue("orders")
    rows = [op_row(queue, f"w{i}") for i in range(200)]
    add_rows(pg_db.engine, rows)  # waiting before the worker starts: the relay sends them
    log_path = tmp_path / "worker.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [
                *worker_command(),
                "broker_app:inbox",
                "--broker",
                rabbit.url,
                "--queue",
                queue,
                "--relay",
            ],
            cwd=TESTS_DIR,
            env={**os.environ, "BROKER_APP_DATABASE_URL": pg_db.url},
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
        )
    worker = WorkerProcess("worker", process, log_path)
    try:
        wait_until(lambda: len(pg_db.effect_counts()) == 200, "every effect", TIMEOUT)
        more = [op_row(queue, f"later{i}") for i in range(20)]
        add_rows(pg_db.engine, more)  # committed while both run
        wait_until(lambda: len(pg_db.effect_counts()) == 220, "the later effects", TIMEOUT)
        assert worker.terminate() == 0, worker.tail()
    finally:
        if process.poll() is None:
            process.kill()
    assert set(pg_db.effect_counts().values()) == {1}
    assert outbox_ids(pg_db.engine) == []
    assert "relay stopped: " in worker.log()
    assert worker.stats()["processed"] == 220


def test_relay_needs_a_usable_table_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BROKER_APP_DATABASE_URL", f"sqlite:///{tmp_path / 'app.db'}")
    err = io.StringIO()
    code = worker_main(
        [
            "broker_app:inbox",
            "--broker",
            "amqp://localhost//",
            "--queue",
            "q",
            "--relay",
            "--relay-table",
            "bad-name",
        ],
        stderr=err,
    )
    assert code == 2
    assert "outbox table name must be a plain identifier" in err.getvalue()
