"""A database error in a handler, through a real ``inbox-worker``: every log record is one
line, and neither the log nor the ``x-inbox-error`` header shows the SQL or a bound
parameter (a customer's name and address)."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

from admin_app import AUDIT, CUSTOMER, HANDLER
from support.databases import Database
from support.rabbit import Rabbit
from support.worker import TESTS_DIR, WorkerProcess, declare, publish, wait_until, worker_command

from inbox.delivery import headers as h

RECORD = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (DEBUG|INFO|WARNING|ERROR|CRITICAL) ")


def start_worker(
    db: Database, rabbit: Rabbit, queue: str, log_path: Path, *extra: str
) -> WorkerProcess:
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [
                *worker_command(),
                "admin_app:make_inbox",
                "--broker",
                rabbit.url,
                "--queue",
                queue,
                "--max-tries",
                "3",
                "--retry-delays",
                "0.05",
                "--stats-interval",
                "3600",
                *extra,
            ],
            cwd=TESTS_DIR,
            env={**os.environ, "ADMIN_APP_DATABASE_URL": db.url},
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
        )
    return WorkerProcess("worker", process, log_path)


def test_a_database_error_is_one_line_without_sql_or_row_data(
    db: Database, rabbit: Rabbit, tmp_path: Path
) -> None:
    queue = rabbit.queue()
    declare(rabbit, queue)
    publish(rabbit, queue, ["sql-1"])
    worker = start_worker(db, rabbit, queue, tmp_path / "worker.log")
    try:
        wait_until(lambda: rabbit.depth(f"{queue}.dlq") == 1, "the dead letter")
    finally:
        assert worker.terminate() == 0, worker.tail()

    log = worker.log()
    lines = log.splitlines()
    assert all(RECORD.match(line) for line in lines), worker.tail()
    assert CUSTOMER not in log
    assert "Zelda" not in log
    assert "INSERT" not in log.upper().replace("INBOX", "")
    failed = [line for line in lines if "failed (ops.apply: " in line]
    assert len(failed) == 2, worker.tail()  # tries 1 and 2 of 3 retried, the third dead-letters
    assert [line for line in lines if "dead-lettered to" in line], worker.tail()

    [dead] = rabbit.take_all(f"{queue}.dlq")
    error = dead.headers[h.ERROR]
    assert error.startswith(f"{HANDLER}: ")
    assert "Error: " in error  # the SQLAlchemy class: DataError or IntegrityError
    assert "\n" not in error
    assert len(error) < 200
    assert "Zelda" not in error
    assert "INSERT" not in error
    assert all("Zelda" not in str(value) for value in dead.headers.values())
    assert db.effect_counts() == {("sql-1", AUDIT): 1}  # the other handler committed once


def test_json_log_records_are_one_object_per_line(
    pg_db: Database, rabbit: Rabbit, tmp_path: Path
) -> None:
    queue = rabbit.queue()
    declare(rabbit, queue)
    publish(rabbit, queue, ["sql-1", "ok-1"])
    log_path = tmp_path / "worker.log"
    worker = start_worker(pg_db, rabbit, queue, log_path, "--log-format", "json")
    try:
        wait_until(lambda: rabbit.depth(f"{queue}.dlq") == 1, "the dead letter")
    finally:
        assert worker.terminate() == 0, worker.tail()

    records = [json.loads(line) for line in worker.log().splitlines()]
    assert all(set(r) == {"time", "level", "logger", "message"} for r in records)
    assert "Zelda" not in worker.log()
    dead = [r for r in records if "dead-lettered to" in r["message"]]
    assert [r["level"] for r in dead] == ["ERROR"]
    assert dead[0]["logger"] == "inbox.worker"
    assert any(r["message"].startswith("worker stopped: ") for r in records)
