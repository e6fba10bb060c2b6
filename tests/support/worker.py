"""Running workers in tests: until idle, in a thread, as ``inbox-worker`` subprocesses, and
removing their queues; publishing to and counting the queues they use.

These were hooks on :class:`inbox.broker.Worker` (``run(idle_timeout=...)``,
``delete_queues()``); they live here (and, for the demo, in ``inbox.broker._idle``) so that
the production API is only what a production worker needs.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import pytest

from inbox.broker import Publisher, Worker
from inbox.broker._idle import delete_queues, run_until_idle
from support.databases import Database
from support.rabbit import Rabbit

__all__ = [
    "STATS_LINE",
    "TESTS_DIR",
    "TIMEOUT",
    "WorkerProcess",
    "declare",
    "delete_queues",
    "effects_by_ref",
    "publish",
    "queue_counts",
    "run_in_thread",
    "run_until_idle",
    "wait_until",
    "worker_command",
]

TESTS_DIR: Final = Path(__file__).resolve().parent.parent
TIMEOUT: Final = 60.0  # seconds any one wait may take before the test fails (a loaded CI box)
STATS_LINE: Final = re.compile(
    r"worker stopped: deliveries=(?P<deliveries>\d+) acked=(?P<acked>\d+) "
    r"failed_tries=(?P<failed_tries>\d+) retried=(?P<retried>\d+) "
    r"dead_lettered=(?P<dead_lettered>\d+).* requeued=(?P<requeued>\d+); "
    r"handler runs: processed=(?P<processed>\d+) duplicates=(?P<duplicates>\d+)"
)


def run_in_thread(worker: Worker, idle_timeout: float | None = None) -> threading.Thread:
    """Start ``worker`` in a daemon thread (until idle, when ``idle_timeout`` is given)."""

    def target() -> None:
        if idle_timeout is None:
            worker.run()
        else:
            run_until_idle(worker, idle_timeout)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread


def wait_until(condition: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    """Poll ``condition`` until it holds; fail the test naming ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(0.02)


# --- inbox-worker subprocesses --------------------------------------------------------------


def worker_command() -> list[str]:
    """The ``inbox-worker`` console script next to this Python, else the same via ``-c``."""
    script = Path(sys.executable).with_name("inbox-worker")
    if script.exists():
        return [str(script)]
    return [
        sys.executable,
        "-c",
        "import sys; from inbox.broker.cli import worker_main; sys.exit(worker_main())",
    ]


@dataclass
class WorkerProcess:
    """One ``inbox-worker`` subprocess; its stderr (the log) goes to ``log_path``."""

    name: str
    process: subprocess.Popen[bytes]
    log_path: Path

    @property
    def pid(self) -> int:
        return self.process.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait(self, timeout: float = TIMEOUT) -> int:
        """The exit code once the process ended (negative: killed by that signal)."""
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"{self.name} still running after {timeout} s\n{self.tail()}")

    def terminate(self, timeout: float = TIMEOUT) -> int:
        """SIGTERM, then the exit code."""
        self.process.send_signal(signal.SIGTERM)
        return self.wait(timeout)

    def stats(self) -> dict[str, int]:
        """The counters of the worker's final ``worker stopped:`` line."""
        found = STATS_LINE.search(self.log())
        assert found is not None, f"{self.name} logged no final stats\n{self.tail()}"
        return {key: int(value) for key, value in found.groupdict().items()}

    def count_in_log(self, text: str) -> int:
        return self.log().count(text)

    def tail(self, lines: int = 30) -> str:
        return f"--- {self.name} log (last {lines} lines) ---\n" + "\n".join(
            self.log().splitlines()[-lines:]
        )


def declare(rabbit: Rabbit, queue: str) -> None:
    """Declare the consumed queue as the worker does, so messages can be published first."""
    with rabbit.connection() as connection, connection.channel() as channel:
        channel.queue_declare(queue=queue, durable=True, auto_delete=False)


def publish(rabbit: Rabbit, queue: str, refs: Sequence[str]) -> dict[str, uuid.UUID]:
    """Publish one ``op`` message per ref, in order; ref -> message id."""
    with Publisher(rabbit.url, routing_key=queue) as publisher:
        return {ref: publisher.publish("op", {"ref": ref}) for ref in refs}


def queue_counts(rabbit: Rabbit) -> dict[str, tuple[int, int]]:
    """Every queue of this test: name -> (ready, unacked), as the broker counts them."""
    listed = subprocess.run(
        [
            "rabbitmqctl",
            "list_queues",
            "--quiet",
            "--no-table-headers",
            "name",
            "messages_ready",
            "messages_unacknowledged",
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    )
    counts: dict[str, tuple[int, int]] = {}
    for line in listed.stdout.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0].startswith(rabbit.prefix):
            counts[parts[0]] = (int(parts[1]), int(parts[2]))
    return counts


def effects_by_ref(db: Database, handler: str = "ops.apply") -> dict[str, int]:
    """ref -> committed effects, all of them by ``handler``."""
    counts = db.effect_counts()
    assert {handler for _, handler in counts} <= {handler}
    return {ref: n for (ref, _), n in counts.items()}
