"""Crashes, stops and connection drops of real ``inbox-worker`` processes (RabbitMQ, PostgreSQL).

Each test runs worker subprocesses on ``broker_app`` and checks the end state: every business
operation's effect committed exactly once, the queue drained (nothing ready, nothing
unacked), nothing dead-lettered. A worker that acked before its commit loses a message (an
effect missing); one that did not deduplicate doubles an effect; one that never acked a
duplicate or requeued for ever leaves the queue undrained.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import pytest
from sqlalchemy.orm import Session
from support.databases import Database, cannot_run
from support.effects import record_effect
from support.rabbit import Rabbit
from support.worker import (
    TESTS_DIR,
    TIMEOUT,
    WorkerProcess,
    declare,
    effects_by_ref,
    publish,
    queue_counts,
    worker_command,
)

from inbox import Inbox, Message
from inbox.broker import Publisher, RetryPolicy, Worker
from inbox.delivery.headers import TRIES
from inbox.delivery.topology import QueueTopology
from inbox.message import uuid7

pytestmark = pytest.mark.slow

HANDLER: Final = "ops.apply"
RETRY_DELAYS: Final = "0.2,0.5"
MAX_TRIES: Final = "5"
_APP_ENV: Final = (
    "BROKER_APP_SLOW",
    "BROKER_APP_STARTED_FILE",
    "BROKER_APP_KILL_IN_HANDLER",
    "BROKER_APP_KILL_AFTER_COMMIT",
    "BROKER_APP_MARKER",
)


@dataclass
class Workers:
    """Starts ``inbox-worker broker_app:inbox`` processes; kills any left at teardown."""

    db: Database
    rabbit: Rabbit
    tmp_path: Path
    started: list[WorkerProcess] = field(default_factory=list)

    def start(
        self,
        queue: str,
        *,
        prefetch: int = 10,
        env: dict[str, str] | None = None,
        log_level: str = "INFO",
    ) -> WorkerProcess:
        name = f"worker-{len(self.started) + 1}"
        log_path = self.tmp_path / f"{name}.log"
        base = {k: v for k, v in os.environ.items() if k not in _APP_ENV}
        with log_path.open("wb") as log:
            process = subprocess.Popen(
                [
                    *worker_command(),
                    "broker_app:inbox",
                    "--broker",
                    self.rabbit.url,
                    "--queue",
                    queue,
                    "--prefetch",
                    str(prefetch),
                    "--retry-delays",
                    RETRY_DELAYS,
                    "--max-tries",
                    MAX_TRIES,
                    "--log-level",
                    log_level,
                ],
                cwd=TESTS_DIR,
                env={**base, "BROKER_APP_DATABASE_URL": self.db.url, **(env or {})},
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
            )
        worker = WorkerProcess(name, process, log_path)
        self.started.append(worker)
        return worker

    def logs(self) -> str:
        return "\n".join(worker.tail() for worker in self.started)

    def kill_all(self) -> None:
        for worker in self.started:
            if worker.process.poll() is None:
                worker.process.kill()
                worker.process.wait(10)


@pytest.fixture(autouse=True)
def _tools() -> None:
    """rabbitmqctl counts unacked messages and closes connections; ss finds a process's."""
    missing = [tool for tool in ("rabbitmqctl", "ss") if shutil.which(tool) is None]
    if missing:
        cannot_run(f"needs {', '.join(missing)} on PATH")


@pytest.fixture
def workers(pg_db: Database, rabbit: Rabbit, tmp_path: Path) -> Iterator[Workers]:
    started = Workers(pg_db, rabbit, tmp_path)
    try:
        yield started
    finally:
        started.kill_all()


def wait_for(
    condition: Callable[[], bool], what: str, workers: Workers, timeout: float = TIMEOUT
) -> None:
    """Poll ``condition`` until it holds; fail with the workers' logs after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what}\n{workers.logs()}")
        time.sleep(0.05)


def publish_after_declare(rabbit: Rabbit, queue: str, refs: Sequence[str]) -> dict[str, uuid.UUID]:
    declare(rabbit, queue)
    return publish(rabbit, queue, refs)


def settled(rabbit: Rabbit) -> bool:
    """No message ready or unacked in any queue of the test (retry and dead letters too)."""
    return all(count == (0, 0) for count in queue_counts(rabbit).values())


def wait_drained(db: Database, rabbit: Rabbit, queue: str, refs: set[str], pool: Workers) -> None:
    """Wait until every ref has its effect and nothing is ready or unacked anywhere.

    The cheap checks (effects, ready count) gate the broker's full count, which also sees
    deliveries still unacked in a worker: stopping a worker before it acked those would
    requeue them, so the final checks would then (rightly) fail.
    """

    def drained() -> bool:
        done = refs <= set(effects_by_ref(db))
        return done and rabbit.depth(queue) == 0 and settled(rabbit)

    wait_for(drained, f"every effect and an empty {queue}", pool)


def assert_final_state(
    db: Database, rabbit: Rabbit, queue: str, refs: set[str], pool: Workers
) -> None:
    """Every ref exactly once, no other effect; every queue empty; the DLQ declared and empty."""
    assert effects_by_ref(db) == dict.fromkeys(refs, 1), pool.logs()
    counts = queue_counts(rabbit)
    dlq = QueueTopology(queue).dead_letter_queue
    assert dlq in counts, f"{dlq} was never declared: {counts}"
    assert counts == dict.fromkeys(counts, (0, 0)), f"queues not empty: {counts}\n{pool.logs()}"


def wait_consuming(worker: WorkerProcess, times: int, pool: Workers) -> None:
    wait_for(lambda: worker.count_in_log("consuming ") >= times, f"{worker.name} consuming", pool)


# --- 1. killed between the commit and the ack ----------------------------------------------


def test_crash_between_commit_and_ack_redelivers_and_skips_the_duplicate(
    pg_db: Database, rabbit: Rabbit, workers: Workers, tmp_path: Path
) -> None:
    queue = rabbit.queue("commit-ack")
    refs = ["r0", "r1", "a", "r2", "r3"]
    declare(rabbit, queue)
    ids = publish(rabbit, queue, refs)

    first = workers.start(
        queue,
        env={"BROKER_APP_KILL_AFTER_COMMIT": "a", "BROKER_APP_MARKER": str(tmp_path / "killed")},
    )
    assert first.wait() == -signal.SIGKILL, first.tail()
    assert "SIGKILL after the commit of a, before the ack" in first.log()
    # "a" committed, and nothing after it ran: the process died inside that delivery.
    assert effects_by_ref(pg_db) == {"r0": 1, "r1": 1, "a": 1}
    # The broker gives back "a" (never acked) and the two prefetched after it; r0 and r1 were
    # acked. A worker that acked "a" before its commit would leave 2 here.
    wait_for(lambda: rabbit.depth(queue) == 3, f"3 messages back in {queue}", workers)

    second = workers.start(queue, log_level="DEBUG")  # DEBUG: the inbox's per-handler lines
    wait_drained(pg_db, rabbit, queue, set(refs), workers)
    assert second.terminate() == 0, second.tail()

    assert_final_state(pg_db, rabbit, queue, set(refs), workers)
    # The redelivered "a" is the one the inbox skipped.
    assert f"duplicate skipped: message {ids['a']} " in second.log(), second.tail()
    stats = second.stats()
    assert (stats["deliveries"], stats["acked"]) == (3, 3), stats
    assert (stats["processed"], stats["duplicates"]) == (2, 1), stats


# --- 2. killed inside the handler, before the commit -----------------------------------------


def test_crash_inside_the_handler_rolls_back_and_the_redelivery_runs_once(
    pg_db: Database, rabbit: Rabbit, workers: Workers, tmp_path: Path
) -> None:
    queue = rabbit.queue("in-handler")
    refs = ["r0", "a", "r1"]
    declare(rabbit, queue)
    publish(rabbit, queue, refs)

    first = workers.start(
        queue,
        env={"BROKER_APP_KILL_IN_HANDLER": "a", "BROKER_APP_MARKER": str(tmp_path / "killed")},
    )
    assert first.wait() == -signal.SIGKILL, first.tail()
    assert "SIGKILL in the handler of a, before the commit" in first.log()
    # The effect of "a" was written but never committed, and neither was its claim.
    assert effects_by_ref(pg_db) == {"r0": 1}
    # "r0" committed, but its ack was held back while "a" was at hand (one delivery at a
    # time, the worker acks committed deliveries together): it comes back too.
    wait_for(lambda: rabbit.depth(queue) == 3, f"3 messages back in {queue}", workers)

    second = workers.start(queue)
    wait_drained(pg_db, rabbit, queue, set(refs), workers)
    assert second.terminate() == 0, second.tail()

    assert_final_state(pg_db, rabbit, queue, set(refs), workers)
    stats = second.stats()
    # "a" is processed by the second worker, not skipped: the crash left no claim behind;
    # "r0" is a duplicate, skipped: its claim committed.
    assert (stats["deliveries"], stats["acked"]) == (3, 3), stats
    assert (stats["processed"], stats["duplicates"]) == (2, 1), stats


# --- 3. SIGTERM while a slow handler runs ----------------------------------------------------


def test_sigterm_finishes_and_acks_the_in_flight_message(
    pg_db: Database, rabbit: Rabbit, workers: Workers, tmp_path: Path
) -> None:
    queue = rabbit.queue("sigterm")
    refs = ["s0", "s1", "s2"]
    declare(rabbit, queue)
    publish(rabbit, queue, refs)
    started_file = tmp_path / "started"

    slow = workers.start(
        queue, env={"BROKER_APP_SLOW": "2", "BROKER_APP_STARTED_FILE": str(started_file)}
    )
    wait_for(started_file.exists, "the slow handler to start", workers)
    assert effects_by_ref(pg_db) == {}  # still in flight: nothing committed yet
    stopped_at = time.monotonic()
    assert slow.terminate(timeout=10) == 0, slow.tail()
    elapsed = time.monotonic() - stopped_at

    # The in-flight handler finished (it sleeps 2 s after SIGTERM) and only it ran.
    assert started_file.read_text().split() == ["s0"]
    assert effects_by_ref(pg_db) == {"s0": 1}
    assert elapsed > 1.0, "the worker did not wait for the in-flight handler"
    stats = slow.stats()
    assert (stats["processed"], stats["acked"]) == (1, 1), stats
    # s0 was acked: only s1 and s2 are back, ready, and nothing is unacked after the exit.
    counts = queue_counts(rabbit)
    assert counts[queue] == (2, 0), counts

    # A second worker gets the other two, never s0 again.
    second = workers.start(queue)
    wait_drained(pg_db, rabbit, queue, set(refs), workers)
    assert second.terminate() == 0, second.tail()
    assert_final_state(pg_db, rabbit, queue, set(refs), workers)
    stats = second.stats()
    assert (stats["deliveries"], stats["processed"], stats["duplicates"]) == (2, 2, 0), stats


def test_a_second_sigterm_stops_at_once_and_the_in_flight_message_is_redelivered(
    pg_db: Database, rabbit: Rabbit, workers: Workers, tmp_path: Path
) -> None:
    queue = rabbit.queue("sigterm2")
    declare(rabbit, queue)
    publish(rabbit, queue, ["h0"])
    started_file = tmp_path / "started"
    slow = workers.start(
        queue, env={"BROKER_APP_SLOW": "5", "BROKER_APP_STARTED_FILE": str(started_file)}
    )
    wait_for(started_file.exists, "the slow handler to start", workers)
    slow.process.send_signal(signal.SIGTERM)
    time.sleep(0.5)
    stopped_at = time.monotonic()
    slow.process.send_signal(signal.SIGTERM)

    assert slow.wait(timeout=10) == 1, slow.tail()
    assert time.monotonic() - stopped_at < 4.0, "the second signal did not stop at once"
    assert "stopped at once" in slow.log()
    assert effects_by_ref(pg_db) == {}  # rolled back: nothing committed
    assert queue_counts(rabbit)[queue] == (1, 0)  # back in the queue, not lost

    second = workers.start(queue)
    wait_drained(pg_db, rabbit, queue, {"h0"}, workers)
    assert second.terminate() == 0, second.tail()
    assert effects_by_ref(pg_db) == {"h0": 1}


# --- 4. competing workers, duplicates published concurrently ---------------------------------


def test_competing_workers_with_concurrent_duplicates_apply_each_effect_once(
    pg_db: Database, rabbit: Rabbit, workers: Workers
) -> None:
    queue = rabbit.queue("competing")
    declare(rabbit, queue)
    pool = [workers.start(queue, prefetch=5) for _ in range(4)]
    for worker in pool:
        wait_consuming(worker, 1, workers)

    # Two publishers send the same 300 message ids, and 50 operations twice each under one
    # idempotency key with fresh ids: 4 copies of each key. Same order in both publishers, so
    # the copies of one message sit side by side and go to different workers at once.
    by_id = [(f"m{i}", uuid7()) for i in range(300)]
    by_key = [f"k{i}" for i in range(50)]
    errors: list[BaseException] = []
    start = threading.Barrier(2)

    def publisher() -> None:
        try:
            with Publisher(rabbit.url, routing_key=queue) as out:
                start.wait(10)
                for i, (ref, message_id) in enumerate(by_id):
                    out.publish("op", {"ref": ref}, message_id=message_id)
                    if i % 6 == 0:
                        key = by_key[i // 6]
                        out.publish("op", {"ref": key}, idempotency_key=f"key-{key}")
                        out.publish("op", {"ref": key}, idempotency_key=f"key-{key}")
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=publisher) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(TIMEOUT)
    assert not errors, errors
    assert not any(thread.is_alive() for thread in threads)

    refs = {ref for ref, _ in by_id} | set(by_key)
    wait_drained(pg_db, rabbit, queue, refs, workers)
    for worker in pool:
        worker.process.send_signal(signal.SIGTERM)
    assert [worker.wait() for worker in pool] == [0, 0, 0, 0], workers.logs()

    assert_final_state(pg_db, rabbit, queue, refs, workers)
    stats = [worker.stats() for worker in pool]
    total = {key: sum(s[key] for s in stats) for key in stats[0]}
    published = 2 * len(by_id) + 4 * len(by_key)
    assert total["processed"] == len(refs), total
    assert total["duplicates"] == published - len(refs), total
    assert total["dead_lettered"] == 0, total
    # Every published copy delivered once (plus any retry of a failed try), each acked.
    assert total["deliveries"] == published + total["retried"], total
    assert total["acked"] == total["deliveries"], total
    assert sum(s["processed"] > 0 for s in stats) >= 2, f"the workers did not compete: {stats}"


# --- 5. the broker drops the worker's connection mid-stream ----------------------------------


def worker_connections(pid: int) -> list[str]:
    """The broker's ids of the AMQP connections that process ``pid`` holds open."""
    sockets = subprocess.run(
        ["ss", "-tnpH", "state", "established", "( dport = :5672 )"],
        capture_output=True,
        text=True,
        check=True,
        timeout=10,
    )
    ports = {
        line.split()[2].rsplit(":", 1)[1]
        for line in sockets.stdout.splitlines()
        if f"pid={pid}," in line
    }
    listed = subprocess.run(
        ["rabbitmqctl", "list_connections", "--quiet", "--no-table-headers", "pid", "peer_port"],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    )
    return [
        parts[0]
        for parts in (line.split() for line in listed.stdout.splitlines())
        if len(parts) == 2 and parts[1] in ports
    ]


def drop_connections(pid: int, pool: Workers) -> None:
    """Have the broker close the connections of process ``pid`` (only those: other tests may
    use the same broker)."""
    found: list[str] = []

    def connected() -> bool:
        found[:] = worker_connections(pid)
        return bool(found)

    wait_for(connected, f"a broker connection of process {pid}", pool)
    for connection in found:
        subprocess.run(
            ["rabbitmqctl", "close_connection", connection, "test: dropped on purpose"],
            capture_output=True,
            check=True,
            timeout=30,
        )


def at_least(db: Database, n: int) -> Callable[[], bool]:
    return lambda: len(effects_by_ref(db)) >= n


def test_worker_reconnects_after_the_broker_drops_its_connection(
    pg_db: Database, rabbit: Rabbit, workers: Workers
) -> None:
    queue = rabbit.queue("drop")
    refs = [f"d{i}" for i in range(400)]
    declare(rabbit, queue)
    publish(rabbit, queue, refs)

    worker = workers.start(queue, env={"BROKER_APP_SLOW": "0.005"})
    for drop, after_effects in enumerate((100, 250), start=1):
        wait_consuming(worker, drop, workers)
        wait_for(at_least(pg_db, after_effects), f"{after_effects} effects", workers)
        drop_connections(worker.pid, workers)
    wait_consuming(worker, 3, workers)  # reconnected after each drop

    wait_drained(pg_db, rabbit, queue, set(refs), workers)
    assert worker.terminate() == 0, worker.tail()
    assert_final_state(pg_db, rabbit, queue, set(refs), workers)
    # Two real drops: kombu logged each lost connection, the worker consumed again after each.
    assert worker.count_in_log("Connection to broker lost") >= 2, worker.tail()
    assert worker.count_in_log("consuming ") >= 3, worker.tail()
    stats = worker.stats()
    assert stats["processed"] == len(refs), stats
    assert stats["dead_lettered"] == 0, stats
    # Each delivery was processed or skipped; a drop gives back the unacked ones.
    assert stats["processed"] + stats["duplicates"] == stats["deliveries"], stats


# --- 6. a connection lost while deliveries wait inside the worker ----------------------------


def test_a_connection_lost_with_deliveries_queued_in_the_worker_does_not_livelock(
    pg_db: Database, rabbit: Rabbit
) -> None:
    """Regression: while the worker waits for the confirm of a retry publish, py-amqp hands
    it the other prefetched deliveries, which it queues. If the connection is lost then,
    those deliveries belong to a dead channel: running them after the reconnect fails on
    their ack, which drops the new connection too, and so on for ever (a reconnect a
    second, never a message finished, copies piling up in the queue)."""
    queue = rabbit.queue("stale")
    ids = set(publish_after_declare(rabbit, queue, [f"f{i}" for i in range(20)]).values())
    inbox = Inbox(pg_db.sessions)
    calls: list[str] = []

    @inbox.handler("op", name=HANDLER)
    def fail(message: Message, session: Session) -> None:
        record_effect(message, session, HANDLER)  # rolled back with the failure
        calls.append(str(message.id))
        if len(calls) == 2:  # the first delivery queued during the first retry's confirm
            for connection in worker_connections(os.getpid()):
                subprocess.run(
                    ["rabbitmqctl", "close_connection", connection, "test: dropped"],
                    capture_output=True,
                    check=True,
                    timeout=30,
                )
        raise RuntimeError("fails on purpose")

    worker = Worker(inbox, rabbit.url, [queue], prefetch=10, retry=RetryPolicy((0.2,), max_tries=2))
    worker.prepare()
    raised: list[BaseException] = []

    def run() -> None:
        try:
            worker.run()
        except BaseException as exc:
            raised.append(exc)

    # Polled through rabbitmqctl, not AMQP: the handler closes every AMQP connection this
    # process holds, and it must close only the worker's.
    dlq = QueueTopology(queue).dead_letter_queue
    runner = threading.Thread(target=run, daemon=True)
    runner.start()
    deadline = time.monotonic() + TIMEOUT
    while (counts := queue_counts(rabbit)).get(dlq) != (len(ids), 0) or any(
        count != (0, 0) for name, count in counts.items() if name != dlq
    ):
        if time.monotonic() > deadline or not runner.is_alive():
            break
        time.sleep(0.2)
    worker.stop()
    runner.join(TIMEOUT)
    assert not runner.is_alive(), "the worker did not stop"
    assert not raised, f"the worker failed: {raised!r}"
    assert counts.get(dlq) == (len(ids), 0), f"{counts}: {worker.stats.summary()}"

    assert pg_db.effect_counts() == {}
    dead = rabbit.take_all(dlq)
    assert {m.properties["message_id"] for m in dead} == {str(i) for i in ids}
    assert {m.headers[TRIES] for m in dead} == {2}
    assert worker.stats.dead_lettered == len(dead), worker.stats.summary()
    counts = queue_counts(rabbit)
    assert counts == dict.fromkeys(counts, (0, 0)), counts
