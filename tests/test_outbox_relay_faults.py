"""The relay under faults, against the real PostgreSQL and RabbitMQ: killed between the
broker's confirm and the delete, its broker connection closed, its database sessions
terminated, SIGTERM; and woken by NOTIFY long before its poll interval."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.exc import OperationalError
from support.databases import Database, admin_engine, cannot_run
from support.rabbit import Rabbit
from support.relay import (
    add_rows,
    connections_of,
    declare_queue,
    make_relay,
    op_row,
    outbox_ids,
    receive_all,
    relay_command,
)
from support.worker import TESTS_DIR, WorkerProcess, queue_counts, wait_until, worker_command

from inbox.broker import Relay

TIMEOUT = 60.0


@pytest.fixture(autouse=True)
def _tools() -> None:
    """rabbitmqctl closes connections."""
    if shutil.which("rabbitmqctl") is None:
        cannot_run("needs rabbitmqctl on PATH")


def start_worker(db: Database, rabbit: Rabbit, queue: str, tmp_path: Path) -> WorkerProcess:
    """``inbox-worker broker_app:inbox`` on ``queue``: one effect row per ``op`` message."""
    log_path = tmp_path / "worker.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [*worker_command(), "broker_app:inbox", "--broker", rabbit.url, "--queue", queue],
            cwd=TESTS_DIR,
            env={**os.environ, "BROKER_APP_DATABASE_URL": db.url},
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
        )
    return WorkerProcess("worker", process, log_path)


def test_a_relay_killed_between_confirm_and_delete_resends_under_the_same_ids_and_the_downstream_inbox_applies_each_once(  # noqa: E501
    pg_db: Database, rabbit: Rabbit, tmp_path: Path
) -> None:
    queue = declare_queue(rabbit, "orders")
    rows = [op_row(queue, f"o{i}") for i in range(30)]
    add_rows(pg_db.engine, rows)

    crashed = subprocess.run(
        [sys.executable, "outbox_relay_crash.py", pg_db.url, rabbit.url, "30"],
        cwd=TESTS_DIR,
        capture_output=True,
        timeout=TIMEOUT,
        check=False,
    )
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr.decode(errors="replace")
    assert outbox_ids(pg_db.engine) == sorted(r.id for r in rows)  # nothing deleted
    assert rabbit.depth(queue) == 30  # but every row was confirmed by the broker

    with make_relay(pg_db, rabbit) as relay:
        assert relay.drain() == 30
    assert outbox_ids(pg_db.engine) == []

    worker = start_worker(pg_db, rabbit, queue, tmp_path)
    try:
        wait_until(lambda: len(pg_db.effect_counts()) == 30, "every effect", TIMEOUT)
        wait_until(lambda: queue_counts(rabbit).get(queue) == (0, 0), "both copies acked", TIMEOUT)
        assert worker.terminate() == 0, worker.tail()
    finally:
        if worker.process.poll() is None:
            worker.process.kill()
    stats = worker.stats()
    assert (stats["deliveries"], stats["processed"], stats["duplicates"]) == (60, 30, 30)
    assert pg_db.effect_counts() == {(f"o{i}", "ops.apply"): 1 for i in range(30)}


def test_sigterm_finishes_the_batch_in_flight_and_exits_0(
    pg_db: Database, rabbit: Rabbit, tmp_path: Path
) -> None:
    queue = declare_queue(rabbit, "bulk")
    rows = [op_row(queue, f"b{i}") for i in range(20_000)]
    for start in range(0, len(rows), 5000):
        add_rows(pg_db.engine, rows[start : start + 5000])
    log_path = tmp_path / "relay.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [*relay_command(), "--database-url", pg_db.url, "--broker", rabbit.url],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
        )
    try:
        wait_until(lambda: rabbit.depth(queue) > 0, "the relay to start sending", TIMEOUT)
        process.send_signal(signal.SIGTERM)
        code = process.wait(TIMEOUT)
    finally:
        if process.poll() is None:
            process.kill()
    log_text = log_path.read_text()
    assert code == 0, log_text
    assert "relay stopped: " in log_text
    sent = Counter(m.message_id for m in receive_all(rabbit, queue))
    left = set(outbox_ids(pg_db.engine))
    assert max(sent.values()) == 1
    assert not left & set(sent)  # every confirmed row was deleted before the exit
    assert left | set(sent) == {r.id for r in rows}


def _closing_broker_connections(relay: Relay) -> Callable[[], None]:
    def close() -> None:
        port = relay.connection.connection.sock.getsockname()[1]
        for connection in connections_of(port):
            subprocess.run(
                ["rabbitmqctl", "close_connection", connection, "test: dropped on purpose"],
                capture_output=True,
                check=True,
                timeout=30,
            )

    return close


def _terminating_sessions(application: str) -> Callable[[], None]:
    def terminate() -> None:
        admin = admin_engine("postgresql")
        try:
            with admin.connect() as connection:
                connection.execute(
                    text(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                        "WHERE application_name = :name"
                    ),
                    {"name": application},
                )
        finally:
            admin.dispose()

    return terminate


@pytest.fixture
def running() -> Iterator[list[Relay]]:
    """Relays started in threads by a test; stopped and closed at its end."""
    relays: list[Relay] = []
    yield relays
    for relay in relays:
        relay.stop()


def _run_relay_under_fault(
    db: Database,
    rabbit: Rabbit,
    relay: Relay,
    *,
    fault: Callable[[], None],
    queue: str,
    running: list[Relay],
) -> tuple[Relay, Counter[uuid.UUID], set[uuid.UUID]]:
    """Run ``relay`` while rows are written in small transactions, injecting ``fault``
    three times along the way; return it, what reached ``queue`` and every id written."""
    running.append(relay)
    thread = threading.Thread(target=relay.run, daemon=True)
    thread.start()
    written: set[uuid.UUID] = set()
    for round_ in range(3):
        for batch in range(20):
            rows = [op_row(queue, f"{round_}.{batch}.{i}") for i in range(50)]
            add_rows(db.engine, rows)
            written.update(r.id for r in rows)
        wait_until(lambda: relay.stats.published > 0, "the relay to publish", TIMEOUT)
        fault()
    wait_until(lambda: not outbox_ids(db.engine), "the outbox to empty", TIMEOUT)
    relay.stop()
    thread.join(TIMEOUT)
    relay.close()
    return relay, Counter(m.message_id for m in receive_all(rabbit, queue)), written


def test_broker_connections_closed_under_the_relay_lose_nothing(
    pg_db: Database, rabbit: Rabbit, running: list[Relay]
) -> None:
    queue = declare_queue(rabbit, "q")
    relay = make_relay(pg_db, rabbit, batch_size=50)
    relay, sent, written = _run_relay_under_fault(
        pg_db, rabbit, relay, fault=_closing_broker_connections(relay), queue=queue, running=running
    )
    assert set(sent) == written
    assert relay.stats.broker_reconnects >= 1
    twice = sum(n - 1 for n in sent.values())
    assert twice <= relay.stats.unconfirmed + relay.stats.resent


def test_database_sessions_terminated_under_the_relay_lose_nothing(
    pg_db: Database, rabbit: Rabbit, running: list[Relay]
) -> None:
    queue = declare_queue(rabbit, "q")
    application = f"relay-{uuid.uuid4().hex[:8]}"
    # No pre-ping: a terminated pooled session must surface as an error the relay survives.
    engine = create_engine(pg_db.url, connect_args={"application_name": application})
    relay = Relay(engine, rabbit.url, batch_size=50, poll_interval=0.2, stats_interval=None)
    try:
        relay, sent, written = _run_relay_under_fault(
            pg_db,
            rabbit,
            relay,
            fault=_terminating_sessions(application),
            queue=queue,
            running=running,
        )
    finally:
        engine.dispose()
    assert set(sent) == written
    assert relay.stats.database_errors >= 1
    twice = sum(n - 1 for n in sent.values())
    assert twice <= relay.stats.unconfirmed + relay.stats.resent


def test_notify_wakes_the_relay_long_before_its_poll_interval(
    pg_db: Database, rabbit: Rabbit, running: list[Relay]
) -> None:
    poll_interval = 120.0
    queue = declare_queue(rabbit, "q")
    first, second = op_row(queue, "first"), op_row(queue, "second")
    add_rows(pg_db.engine, [first])
    relay = make_relay(pg_db, rabbit, poll_interval=poll_interval)
    running.append(relay)
    thread = threading.Thread(target=relay.run, daemon=True)
    thread.start()
    wait_until(lambda: relay.stats.published == 1, "the row waiting at start", TIMEOUT)
    time.sleep(0.5)  # the relay is idle now, waiting for a notification or 120 s
    started = time.monotonic()
    add_rows(pg_db.engine, [second])
    wait_until(lambda: relay.stats.published == 2, "the notified row", poll_interval / 4)
    assert time.monotonic() - started < poll_interval
    relay.stop()
    thread.join(TIMEOUT)
    relay.close()
    assert [m.message_id for m in receive_all(rabbit, queue)] == [first.id, second.id]


def test_a_mariadb_session_killed_between_batches_is_retried_not_fatal(
    mariadb_db: Database, rabbit: Rabbit
) -> None:
    queue = declare_queue(rabbit, "q")
    first, second = op_row(queue, "first"), op_row(queue, "second")
    add_rows(mariadb_db.engine, [first])
    # The test engine has no pre-ping: the pooled session the server killed is the one the
    # relay takes for its next batch.
    with make_relay(mariadb_db, rabbit) as relay:
        assert relay.drain() == 1
        admin = admin_engine("mariadb")
        try:
            with admin.connect() as connection:
                sessions = connection.execute(
                    text("SELECT id FROM information_schema.processlist WHERE db = :db"),
                    {"db": mariadb_db.engine.url.database},
                ).scalars()
                for session in list(sessions):
                    connection.execute(text(f"KILL {int(session)}"))
        finally:
            admin.dispose()
        add_rows(create_engine(mariadb_db.url), [second])
        assert relay.drain() == 1
        assert relay.stats.database_errors >= 1
    assert [m.message_id for m in receive_all(rabbit, queue)] == [first.id, second.id]


class _FailingDeletes:
    """Makes the relay's first ``failures`` deletes fail as a lost database session would."""

    def __init__(self, relay: Relay, failures: int) -> None:
        self.left = failures
        self._delete = relay._rows.delete
        relay._rows.delete = self  # type: ignore[method-assign]

    def __call__(self, connection: object, ids: list[uuid.UUID]) -> int:
        if self.left > 0:
            self.left -= 1
            lost = ConnectionError("simulated: session lost")
            raise OperationalError("DELETE", {}, lost, connection_invalidated=True)
        return self._delete(connection, ids)  # type: ignore[arg-type]


def test_a_failed_delete_after_the_confirms_is_done_again_and_nothing_is_sent_twice(
    db: Database, rabbit: Rabbit
) -> None:
    queue = declare_queue(rabbit, "q")
    rows = [op_row(queue, f"d{i}") for i in range(5)]
    add_rows(db.engine, rows)
    with make_relay(db, rabbit) as relay:
        _FailingDeletes(relay, 1)  # the batch's delete; the second attempt succeeds
        assert relay.drain() == 5
        assert (relay.stats.resent, relay.stats.database_errors) == (0, 1)
    assert [m.message_id for m in receive_all(rabbit, queue)] == [r.id for r in rows]
    assert outbox_ids(db.engine) == []


def test_confirmed_rows_that_cannot_be_deleted_go_out_again_and_are_counted(
    db: Database, rabbit: Rabbit
) -> None:
    queue = declare_queue(rabbit, "q")
    rows = [op_row(queue, f"r{i}") for i in range(5)]
    add_rows(db.engine, rows)
    with make_relay(db, rabbit) as relay:
        _FailingDeletes(relay, 6)  # the batch's delete and its five attempts again
        assert relay.drain() == 5
        assert relay.stats.resent == 5
    sent = Counter(m.message_id for m in receive_all(rabbit, queue))
    assert sent == {r.id: 2 for r in rows}  # each twice, under its own id
    assert outbox_ids(db.engine) == []


def test_run_until_empty_gives_up_after_its_timeout_while_a_row_stays_refused(
    db: Database, rabbit: Rabbit
) -> None:
    add_rows(db.engine, [op_row(rabbit.queue("nowhere"), "stuck")])
    with make_relay(db, rabbit, max_retry_delay=0.2) as relay, pytest.raises(TimeoutError):
        relay.run_until_empty(timeout=1.0)
    assert len(outbox_ids(db.engine)) == 1
