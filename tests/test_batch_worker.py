"""The worker in batch mode (``Worker(..., batch_size=N)``, ``inbox-worker --batch-size N``).

On the in-memory transport with SQLite: partial batches go at once, invalid deliveries are
dead-lettered out of the middle of a batch, a pending batch is requeued on stop. On the real
RabbitMQ and PostgreSQL: duplicates, poison messages and retries through the broker, and a
worker process killed between a batch's commit and its acks.
"""

from __future__ import annotations

import io
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from kombu import Connection
from sqlalchemy.orm import Session
from support.databases import Database, cannot_run, fresh_database
from support.effects import record_effect
from support.rabbit import Rabbit
from support.worker import (
    TESTS_DIR,
    WorkerProcess,
    declare,
    effects_by_ref,
    publish,
    queue_counts,
    run_in_thread,
    run_until_idle,
    worker_command,
)

from inbox import Inbox, Message
from inbox._amqp.connections import BROKER_URL_ENV
from inbox.broker import Publisher, RetryPolicy, Worker
from inbox.broker import cli as worker_cli
from inbox.broker.cli import worker_main
from inbox.delivery import headers as h

HANDLER = "ops.apply"
QUICK = RetryPolicy((0.2, 0.4), max_tries=3)
IDLE = 1.5  # longer than the longest retry delay, so idle means done
TIMEOUT = 30.0


def ref_of(message: Message) -> str:
    assert isinstance(message.body, dict)
    return str(message.body["ref"])


def make_inbox(db: Database, on_call: Callable[[Message], None] | None = None) -> Inbox:
    """One handler, ``ops.apply`` for type ``op``: an effect row, then ``on_call`` (which may
    raise: the effect rolls back with it)."""
    inbox = Inbox(db.sessions)

    @inbox.handler("op", name=HANDLER)
    def apply(message: Message, session: Session) -> None:
        record_effect(message, session, HANDLER)
        if on_call is not None:
            on_call(message)

    return inbox


class Calls:
    """Records what the worker hands the inbox: the refs of each process_batch() call, and
    any process() call (batch mode must not make one)."""

    def __init__(self, inbox: Inbox) -> None:
        self.batches: list[list[str]] = []
        self.singles: list[str] = []
        batch, single = inbox.process_batch, inbox.process

        def process_batch(messages: Any) -> Any:
            self.batches.append([ref_of(m) for m in messages])
            return batch(messages)

        def process(message: Message) -> Any:
            self.singles.append(ref_of(message))
            return single(message)

        inbox.process_batch = process_batch  # type: ignore[method-assign]
        inbox.process = process  # type: ignore[method-assign]


def effects_once(db: Database, refs: list[str]) -> bool:
    return db.effect_counts() == {(ref, HANDLER): 1 for ref in refs}


def wait_until(condition: Callable[[], bool], what: str, timeout: float = TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out after {timeout} s waiting for {what}"
        time.sleep(0.02)


def publish_raw(url: str, queue: str, body: bytes, **properties: Any) -> None:
    with Connection(url) as connection:
        connection.Producer().publish(body, routing_key=queue, **properties)


JSON_PROPERTIES = {"content_type": "application/json", "content_encoding": "utf-8", "type": "op"}


def publish_invalid(url: str, queue: str) -> None:
    """Two deliveries the worker must dead-letter: no message_id, and one that is no UUID."""
    body = json.dumps({"ref": "invalid"}).encode()
    publish_raw(url, queue, body, **JSON_PROPERTIES)
    publish_raw(url, queue, body, **JSON_PROPERTIES, message_id="not-a-uuid")


@pytest.fixture
def sqlite_db(tmp_path: Path) -> Iterator[Database]:
    yield from fresh_database("sqlite", {}, tmp_path)


def memory_queue() -> str:
    return f"mem-batch-{uuid.uuid4().hex[:8]}"


def take_memory(queue: str, count: int) -> list[Any]:
    taken = []
    with Connection("memory://") as connection:
        simple = connection.SimpleQueue(queue)
        for _ in range(count):
            message = simple.get(timeout=1)
            message.ack()
            taken.append(message)
    return taken


# --- the constructor ----------------------------------------------------------------------


@pytest.mark.parametrize("batch_size", [0, -1, 65536, True, 2.0, "10"])
def test_a_batch_size_that_is_not_a_whole_number_in_range_is_refused(batch_size: object) -> None:
    inbox = Inbox(lambda: None)  # type: ignore[arg-type,return-value]  # never called
    with pytest.raises(ValueError, match="batch_size must be an int"):
        Worker(inbox, "memory://", ["q"], prefetch=100, batch_size=batch_size)  # type: ignore[arg-type]


def test_a_batch_larger_than_the_prefetch_is_refused() -> None:
    inbox = Inbox(lambda: None)  # type: ignore[arg-type,return-value]  # never called
    with pytest.raises(ValueError, match=r"batch_size \(11\) must not exceed prefetch \(10\)"):
        Worker(inbox, "memory://", ["q"], prefetch=10, batch_size=11)
    assert Worker(inbox, "memory://", ["q"], prefetch=10, batch_size=10).batch_size == 10
    assert Worker(inbox, "memory://", ["q"]).batch_size == 1


# --- the in-memory transport with SQLite --------------------------------------------------


def test_a_partial_batch_is_processed_at_once_not_when_it_would_fill(
    sqlite_db: Database, caplog: pytest.LogCaptureFixture
) -> None:
    queue = memory_queue()
    inbox = make_inbox(sqlite_db)
    calls = Calls(inbox)
    worker = Worker(
        inbox, "memory://", [queue], prefetch=50, batch_size=50, retry=QUICK, stats_interval=None
    )
    worker.prepare()
    caplog.set_level(logging.INFO, logger="inbox.worker")
    runner = run_in_thread(worker)
    try:
        wait_until(lambda: "consuming" in caplog.text, "the worker to consume")
        refs = ["p0", "p1", "p2"]
        with Publisher("memory://", routing_key=queue) as publisher:
            for ref in refs:
                publisher.publish("op", {"ref": ref})
        # 3 of 50: processed as soon as they are at hand (a worker waiting for 47 more
        # would never get there).
        wait_until(lambda: effects_once(sqlite_db, refs), "3 effects", timeout=2.0)
    finally:
        worker.stop()
        runner.join(TIMEOUT)
    assert not runner.is_alive()
    assert sorted(ref for batch in calls.batches for ref in batch) == refs
    assert calls.singles == []
    assert worker.stats.acked == 3
    assert worker.stats.requeued == 0


def test_deliveries_at_hand_form_one_batch_and_invalid_ones_in_it_are_dead_lettered(
    sqlite_db: Database,
) -> None:
    queue = memory_queue()
    inbox = make_inbox(sqlite_db)
    calls = Calls(inbox)
    worker = Worker(inbox, "memory://", [queue], prefetch=10, batch_size=10, retry=QUICK)
    worker.prepare()
    refs = [f"g{i}" for i in range(8)]
    with Publisher("memory://", routing_key=queue) as publisher:
        for ref in refs[:4]:
            publisher.publish("op", {"ref": ref})
        publish_invalid("memory://", queue)
        for ref in refs[4:]:
            publisher.publish("op", {"ref": ref})

    run_until_idle(worker, 0.5)

    # The ten deliveries were at hand: one batch, the two invalid ones taken out of it.
    assert calls.batches == [refs]
    assert effects_once(sqlite_db, refs)
    dead = take_memory(f"{queue}.dlq", 2)
    assert sorted(m.headers[h.REASON] for m in dead) == ["invalid-message-id", "missing-message-id"]
    stats = worker.stats
    # Every delivery left the queue acked: eight after their commit, two after their dead letter.
    assert (stats.deliveries, stats.acked, stats.processed, stats.dead_lettered) == (10, 10, 8, 2)


def test_stop_finishes_the_batch_in_flight_and_requeues_the_pending_one(
    sqlite_db: Database,
) -> None:
    queue = memory_queue()
    refs = [f"s{i}" for i in range(8)]
    first: list[Worker] = []

    def stop_the_first_worker(message: Message) -> None:
        if first:
            first[0].stop()  # from inside the first batch: it must still finish and be acked

    inbox = make_inbox(sqlite_db, stop_the_first_worker)
    calls = Calls(inbox)
    worker = Worker(inbox, "memory://", [queue], prefetch=10, batch_size=5, retry=QUICK)
    first.append(worker)
    worker.prepare()
    with Publisher("memory://", routing_key=queue) as publisher:
        for ref in refs:
            publisher.publish("op", {"ref": ref})

    worker.run()

    # s0..s4 filled the first batch, processed and acked although stop() came during it;
    # s5 was the next delivery, already in a new batch: requeued, never processed.
    assert calls.batches == [refs[:5]]
    assert effects_once(sqlite_db, refs[:5])
    stats = worker.stats
    assert (stats.acked, stats.processed, stats.requeued) == (5, 5, 1), stats.summary()

    first.clear()
    second = Worker(inbox, "memory://", [queue], prefetch=10, batch_size=5, retry=QUICK)
    run_until_idle(second, 0.5)

    assert effects_once(sqlite_db, refs)
    # The requeued s5 was not processed before: the second worker runs it, no duplicate.
    assert (second.stats.processed, second.stats.duplicates) == (3, 0), second.stats.summary()


# --- RabbitMQ and PostgreSQL ----------------------------------------------------------------


def test_duplicates_poison_and_retries_in_batches_on_rabbitmq(
    pg_db: Database, rabbit: Rabbit
) -> None:
    if shutil.which("rabbitmqctl") is None:
        cannot_run("needs rabbitmqctl on PATH (it counts unacked messages)")
    queue = rabbit.queue()
    flaky_tries: list[int] = []

    def behave(message: Message) -> None:
        ref = ref_of(message)
        if ref.startswith("poison"):
            raise ValueError(f"{ref} is poison")
        if ref == "flaky":
            tries = message.headers.get(h.TRIES) or 0
            flaky_tries.append(tries)
            if tries < 2:  # fails on the first two deliveries, succeeds on the third
                raise RuntimeError(f"flaky on try {tries + 1}")

    inbox = make_inbox(pg_db, behave)
    calls = Calls(inbox)
    worker = Worker(
        inbox, rabbit.url, [queue], prefetch=20, batch_size=10, retry=QUICK, stats_interval=None
    )
    worker.prepare()
    refs = [str(i) for i in range(300)]
    odd_copies = []
    with Publisher(rabbit.url, routing_key=queue) as publisher:
        for i, ref in enumerate(refs):
            message_id = publisher.publish("op", {"ref": ref})
            if i % 2 == 0:  # the copy right behind: most likely in the same batch
                publisher.publish("op", {"ref": ref}, message_id=message_id)
            else:
                odd_copies.append((ref, message_id))
            if i in (50, 150, 250):
                publisher.publish("op", {"ref": f"poison-{i}"})
            if i == 100:
                publisher.publish("op", {"ref": "flaky"})
        for ref, message_id in odd_copies:  # the copies far behind: in later batches
            publisher.publish("op", {"ref": ref}, message_id=message_id)

    run_until_idle(worker, IDLE)

    assert effects_once(pg_db, [*refs, "flaky"])
    assert set(flaky_tries) == {0, 1, 2}
    assert rabbit.depth(queue) == 0
    dead = rabbit.take_all(f"{queue}.dlq")
    assert sorted(json.loads(m.body)["ref"] for m in dead) == [
        "poison-150",
        "poison-250",
        "poison-50",
    ]
    for message in dead:
        assert message.headers[h.REASON] == "handler-failed"
        assert message.headers[h.TRIES] == QUICK.max_tries
        assert message.headers[h.FAILED_HANDLERS] == HANDLER
        assert "is poison" in message.headers[h.ERROR]
    counts = queue_counts(rabbit)
    assert counts == dict.fromkeys(counts, (0, 0)), counts

    stats = worker.stats
    assert stats.processed == 301, stats.summary()
    assert stats.duplicates == 300, stats.summary()
    # Every delivery is acked: each copy, flaky's third try, and each retried or dead one.
    assert stats.acked == stats.deliveries == 601 + 8 + 3, stats.summary()
    assert stats.failed_tries == 3 * 3 + 2, stats.summary()
    assert stats.retried == 3 * 2 + 2, stats.summary()
    assert stats.dead_letter_reasons == Counter({"handler-failed": 3})
    assert stats.deliveries == 600 + 3 * 3 + 3, stats.summary()
    # Batches it was, never more than batch_size, and no delivery went through process().
    sizes = [len(batch) for batch in calls.batches]
    assert max(sizes) <= 10
    assert sum(size > 1 for size in sizes) > 10, sizes
    # Some copies came in the same batch as their original: the batch ran them once.
    assert any(len(set(batch)) < len(batch) for batch in calls.batches)
    assert calls.singles == []


def test_invalid_deliveries_in_the_middle_of_a_batch_on_rabbitmq(
    pg_db: Database, rabbit: Rabbit
) -> None:
    queue = rabbit.queue()
    gate_entered, gate_open = threading.Event(), threading.Event()

    def gate(message: Message) -> None:
        if ref_of(message) == "gate":
            gate_entered.set()
            assert gate_open.wait(TIMEOUT)

    inbox = make_inbox(pg_db, gate)
    calls = Calls(inbox)
    worker = Worker(
        inbox, rabbit.url, [queue], prefetch=20, batch_size=10, retry=QUICK, stats_interval=None
    )
    worker.prepare()
    refs = [f"g{i}" for i in range(8)]
    with Publisher(rabbit.url, routing_key=queue) as publisher:
        publisher.publish("op", {"ref": "gate"})
        runner = run_in_thread(worker, idle_timeout=IDLE)
        try:
            # While the gate's batch blocks, the next ten are published and delivered to the
            # worker: they are all at hand when it goes on, so they form one batch.
            assert gate_entered.wait(TIMEOUT)
            for ref in refs[:4]:
                publisher.publish("op", {"ref": ref})
            publish_invalid(rabbit.url, queue)
            for ref in refs[4:]:
                publisher.publish("op", {"ref": ref})
            wait_until(lambda: rabbit.depth(queue) == 0, "every delivery sent to the worker")
            time.sleep(0.3)
        finally:
            gate_open.set()
            runner.join(TIMEOUT)
    assert not runner.is_alive()

    assert calls.batches == [["gate"], refs]
    assert effects_once(pg_db, ["gate", *refs])
    dead = rabbit.take_all(f"{queue}.dlq")
    assert sorted(m.headers[h.REASON] for m in dead) == ["invalid-message-id", "missing-message-id"]
    assert rabbit.depth(queue) == 0
    stats = worker.stats
    assert (stats.deliveries, stats.acked, stats.dead_lettered) == (11, 11, 2), stats.summary()


# --- a worker process killed between a batch's commit and its acks --------------------------


class BatchWorkers:
    """``inbox-worker broker_app:inbox --batch-size N`` processes; killed at teardown."""

    def __init__(self, db: Database, rabbit: Rabbit, tmp_path: Path) -> None:
        self.db, self.rabbit, self.tmp_path = db, rabbit, tmp_path
        self.started: list[WorkerProcess] = []

    def start(self, queue: str, *args: str, env: dict[str, str] | None = None) -> WorkerProcess:
        name = f"worker-{len(self.started) + 1}"
        log_path = self.tmp_path / f"{name}.log"
        base = {k: v for k, v in os.environ.items() if not k.startswith("BROKER_APP_")}
        with log_path.open("wb") as log:
            process = subprocess.Popen(
                [
                    *worker_command(),
                    "broker_app:inbox",
                    "--broker",
                    self.rabbit.url,
                    "--queue",
                    queue,
                    "--retry-delays",
                    "0.2,0.5",
                    "--log-level",
                    "INFO",
                    *args,
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


@pytest.fixture
def batch_workers(pg_db: Database, rabbit: Rabbit, tmp_path: Path) -> Iterator[BatchWorkers]:
    if shutil.which("rabbitmqctl") is None:
        cannot_run("needs rabbitmqctl on PATH (it counts unacked messages)")
    started = BatchWorkers(pg_db, rabbit, tmp_path)
    try:
        yield started
    finally:
        started.kill_all()


@pytest.mark.slow
def test_a_worker_killed_after_a_batch_commit_before_its_acks_loses_and_doubles_nothing(
    pg_db: Database, rabbit: Rabbit, batch_workers: BatchWorkers, tmp_path: Path
) -> None:
    queue = rabbit.queue("batch-crash")
    refs = [f"c{i}" for i in range(60)]
    declare(rabbit, queue)
    ids = publish(rabbit, queue, refs)

    first = batch_workers.start(
        queue,
        "--batch-size",
        "20",  # and no --prefetch: it defaults to the batch size
        env={
            "BROKER_APP_KILL_AFTER_COMMIT": "c30",
            "BROKER_APP_MARKER": str(tmp_path / "killed"),
            "BROKER_APP_SLOW": "0.01",  # 10 ms a message: the prefetch fills meanwhile
        },
    )
    assert first.wait(TIMEOUT) == -signal.SIGKILL, first.tail()
    assert "SIGKILL after the commit of c30, before the ack" in first.log()
    assert "(prefetch 20, batch size 20," in first.log(), first.tail()

    # What committed is a prefix of the queue, c30's batch included, each once.
    committed = effects_by_ref(pg_db)
    assert set(committed.values()) == {1}
    assert set(committed) == set(refs[: len(committed)]), sorted(committed)
    assert "c30" in committed
    # The broker takes back what was never acked: c30's whole batch (committed, not acked)
    # and everything after it.
    requeued: list[int] = []

    def nothing_unacked() -> bool:
        ready, unacked = queue_counts(rabbit)[queue]
        requeued[:] = [ready]
        return unacked == 0

    wait_until(nothing_unacked, "the broker to take back the unacked deliveries")
    [back] = requeued
    acked_by_first = len(refs) - back
    committed_unacked = len(committed) - acked_by_first
    assert acked_by_first <= refs.index("c30") < len(committed)
    assert committed_unacked >= 2, f"c30's batch held one message only: {first.tail()}"

    # DEBUG: the inbox's per-handler lines, "duplicate skipped" among them.
    second = batch_workers.start(queue, "--batch-size", "20", "--log-level", "DEBUG")
    wait_until(
        lambda: set(effects_by_ref(pg_db)) == set(refs) and rabbit.depth(queue) == 0,
        f"every effect\n{batch_workers.logs()}",
    )
    # SIGTERM finishes the batch in flight and acks it: nothing may be left unacked below.
    assert second.terminate() == 0, second.tail()

    assert effects_by_ref(pg_db) == dict.fromkeys(refs, 1), batch_workers.logs()
    counts = queue_counts(rabbit)
    assert counts == dict.fromkeys(counts, (0, 0)), counts
    stats = second.stats()
    assert (stats["deliveries"], stats["acked"]) == (back, back), stats
    # The committed-but-unacked batch came back and was skipped; only the rest ran.
    assert stats["duplicates"] == committed_unacked, stats
    assert stats["processed"] == len(refs) - len(committed), stats
    assert f"duplicate skipped: message {ids['c30']} " in second.log(), second.tail()


# --- inbox-worker --batch-size ------------------------------------------------------------

APP = """
    import sqlalchemy as sa
    from sqlalchemy.orm import sessionmaker

    from inbox import Inbox
    from inbox.schema import metadata

    engine = sa.create_engine("sqlite:///{db}")
    metadata.create_all(engine)  # inbox-worker checks the tables at start
    inbox = Inbox(sessionmaker(engine))
"""


@pytest.fixture
def app_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    (tmp_path / "batch_cli_app.py").write_text(textwrap.dedent(APP.format(db=tmp_path / "a.db")))
    monkeypatch.chdir(tmp_path)
    monkeypatch.delitem(sys.modules, "batch_cli_app", raising=False)
    monkeypatch.delenv(BROKER_URL_ENV, raising=False)
    with logging_restored():
        yield tmp_path


@contextmanager
def logging_restored() -> Iterator[None]:
    """worker_main() configures logging for the process (a root handler, quiet inbox.core
    and kombu loggers): undo that, or later tests that read the inbox's log lines see none."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    quieted = {name: logging.getLogger(name).level for name in ("inbox.core", "kombu", "amqp")}
    try:
        yield
    finally:
        for handler in root.handlers[:]:
            if handler not in handlers:
                root.removeHandler(handler)
        root.setLevel(level)
        for name, old in quieted.items():
            logging.getLogger(name).setLevel(old)


ARGS = ["batch_cli_app:inbox", "--broker", "memory://", "--queue", "q"]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--batch-size", "0"], "--batch-size: must be between 1 and 65535, got 0"),
        (["--batch-size", "x"], "--batch-size: expected a whole number"),
        (
            ["--batch-size", "100", "--prefetch", "10"],
            "batch_size (100) must not exceed prefetch (10)",
        ),
    ],
)
def test_a_bad_batch_size_exits_2_with_one_error_line(
    app_dir: Path, extra: list[str], message: str
) -> None:
    err = io.StringIO()
    code = worker_main([*ARGS, *extra], stderr=err)

    assert code == 2, err.getvalue()
    [line] = [x for x in err.getvalue().splitlines() if x.startswith("inbox-worker: error:")]
    assert message in line
    assert "Traceback" not in err.getvalue()


@pytest.mark.parametrize(
    ("extra", "prefetch", "batch_size"),
    [
        (["--batch-size", "50"], 50, 50),
        (["--batch-size", "5"], 10, 5),
        (["--batch-size", "5", "--prefetch", "7"], 7, 5),
        ([], 10, 1),
    ],
)
def test_the_prefetch_defaults_to_the_batch_size_when_larger(
    app_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    extra: list[str],
    prefetch: int,
    batch_size: int,
) -> None:
    ran: list[Worker] = []
    monkeypatch.setattr(worker_cli, "install_signal_handlers", lambda worker: None)
    monkeypatch.setattr(Worker, "run", lambda self, **kwargs: ran.append(self))
    err = io.StringIO()

    assert worker_main([*ARGS, *extra], stderr=err) == 0, err.getvalue()

    [worker] = ran
    assert (worker.prefetch, worker.batch_size) == (prefetch, batch_size)


def test_inbox_worker_runs_with_a_batch_size_alone_and_stops_on_sigterm(app_dir: Path) -> None:
    log = app_dir / "worker.log"
    with log.open("wb") as stderr:
        process = subprocess.Popen(
            [*worker_command(), *ARGS, "--batch-size", "50"],
            cwd=app_dir,
            env={
                **os.environ,
                "PYTHONPATH": os.pathsep.join([str(app_dir), os.environ.get("PYTHONPATH", "")]),
            },
            stdin=subprocess.DEVNULL,
            stdout=stderr,
            stderr=stderr,
        )
    try:
        wait_until(lambda: "consuming q" in log.read_text(), "the worker to consume")
        process.send_signal(signal.SIGTERM)
        assert process.wait(TIMEOUT) == 0, log.read_text()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)
    assert "consuming q (prefetch 50, batch size 50," in log.read_text()
