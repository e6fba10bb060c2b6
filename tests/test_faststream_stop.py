"""SIGTERM to a FastStream app behind an AsyncInbox while deliveries are in flight: the app
finishes them, acks them, and stops; the next app takes the rest. Nothing is lost, nothing
is committed twice (``faststream_app.py`` subprocesses, the real RabbitMQ and PostgreSQL)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from support.databases import Database
from support.rabbit import Rabbit
from support.worker import TESTS_DIR, effects_by_ref, publish, queue_counts, wait_until

REFS = [f"s{i}" for i in range(200)]


def start_app(
    db: Database, rabbit: Rabbit, queue: str, started: Path, log: Path
) -> subprocess.Popen[bytes]:
    environment = {
        **os.environ,
        "PYTHONPATH": str(TESTS_DIR),
        "FS_APP_DATABASE_URL": db.url,
        "FS_APP_AMQP_URL": rabbit.url,
        "FS_APP_QUEUE": queue,
        "FS_APP_STARTED_FILE": str(started),
        "FS_APP_SLOW": "0.03",
    }
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, str(TESTS_DIR / "faststream_app.py")],
            env=environment,
            stdout=out,
            stderr=out,
        )


def consumers(queue: str) -> int:
    """The consumers RabbitMQ counts on ``queue`` (0 when it does not exist yet)."""
    listed = subprocess.run(
        ["rabbitmqctl", "list_queues", "--quiet", "--no-table-headers", "name", "consumers"],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    )
    for line in listed.stdout.splitlines():
        name, _, count = line.rpartition("\t")
        if name == queue:
            return int(count)
    return 0


def lines(path: Path) -> list[str]:
    return path.read_text().split() if path.exists() else []


def test_sigterm_with_deliveries_in_flight_loses_and_doubles_nothing(
    pg_db: Database, rabbit: Rabbit, tmp_path: Path
) -> None:
    queue = rabbit.queue("stop")
    started, log = tmp_path / "started", tmp_path / "app.log"
    first = start_app(pg_db, rabbit, queue, started, log)
    try:
        wait_until(lambda: consumers(queue) == 1, "the first app consuming")
        publish(rabbit, queue, REFS)
        wait_until(lambda: len(lines(started)) >= 40, "40 handlers started")
        first.send_signal(signal.SIGTERM)
        assert first.wait(timeout=30) == 0, log.read_text()[-3000:]
    finally:
        first.kill()
    after_first = effects_by_ref(pg_db)
    in_flight = set(lines(started)) - set(after_first)
    # Every handler the first app started was finished and committed before it stopped.
    assert not in_flight, (
        f"started but not committed: {sorted(in_flight)}\n{log.read_text()[-3000:]}"
    )
    assert len(after_first) < len(REFS), "the first app took everything: nothing was in flight"

    second = start_app(pg_db, rabbit, queue, started, log)
    try:
        wait_until(
            lambda: len(effects_by_ref(pg_db)) == len(REFS), "every ref committed", timeout=60
        )
        wait_until(lambda: rabbit.depth(queue) == 0, "the queue drained")
        second.send_signal(signal.SIGTERM)
        assert second.wait(timeout=30) == 0, log.read_text()[-3000:]
    finally:
        second.kill()

    assert effects_by_ref(pg_db) == dict.fromkeys(REFS, 1)
    counts = queue_counts(rabbit)
    assert counts[queue] == (0, 0), counts
    assert counts.get(f"{queue}.dlq", (0, 0)) == (0, 0), counts
