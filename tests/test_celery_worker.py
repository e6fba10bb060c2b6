"""Inbox tasks run by Celery's real prefork worker (a subprocess) on RabbitMQ and on Redis,
against PostgreSQL: a pool child killed after its commit and before the ack, a duplicated
task id, a key shared by task ids, retries, and a chain whose first step is redelivered."""

from __future__ import annotations

import importlib
import io
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from celery import chain
from support.databases import Database
from support.rabbit import AMQP_URL, rabbit_area
from support.redis import REDIS_URL, redis_area

from inbox.admin.cli import admin_main
from inbox.celery import result_metadata

TESTS = Path(__file__).resolve().parent
WAIT = 60.0


DeadLetters = Callable[[str], list[dict[str, Any]]]


@pytest.fixture(params=["rabbitmq", "redis"])
def broker(request: pytest.FixtureRequest) -> Iterator[tuple[str, str, DeadLetters]]:
    """(broker URL, a queue name unique to this test, a reader of a queue's messages'
    headers); the queues are deleted afterwards."""
    if request.param == "rabbitmq":
        with rabbit_area() as rabbit:

            def taken(queue: str) -> list[dict[str, Any]]:
                return [m.headers for m in rabbit.take_all(queue)] if rabbit.depth(queue) else []

            yield AMQP_URL, rabbit.queue("celery"), taken
    else:
        with redis_area(REDIS_URL.rsplit("/", 1)[0] + "/5") as area:

            def pushed(queue: str) -> list[dict[str, Any]]:
                with area.client() as client:  # kombu's Redis transport: JSON in a list
                    return [json.loads(raw)["headers"] for raw in client.lrange(queue, 0, -1)]

            yield area.url, area.stream("celery"), pushed


@contextmanager
def worker(
    broker_url: str,
    queue: str,
    db: Database,
    markers: Path,
    *,
    backend: str | None = None,
    log: Path | None = None,
) -> Iterator[subprocess.Popen[bytes]]:
    """A prefork worker (2 children) consuming ``queue``, its standard error written to
    ``log`` when given; it and every process of its group (a pool child orphaned by a killed
    main process too) are gone on exit."""
    env = {
        **os.environ,
        "INBOX_CELERY_BROKER": broker_url,
        "INBOX_CELERY_QUEUE": queue,
        "INBOX_CELERY_DATABASE": db.url,
        "INBOX_CELERY_MARKERS": str(markers),
        "PYTHONPATH": os.pathsep.join([str(TESTS), str(TESTS.parent)]),
        **({"INBOX_CELERY_BACKEND": backend} if backend else {}),
    }
    command = [sys.executable, "-m", "celery", "-A", "celery_app", "worker", "--pool=prefork"]
    command += ["-c", "2", "-Q", queue, "-l", "warning", "--without-heartbeat"]
    command += ["--without-mingle", "--without-gossip", "-n", f"w-{uuid.uuid4().hex[:8]}@%h"]
    errors = None if log is None else log.open("ab")
    process = subprocess.Popen(command, cwd=TESTS, env=env, start_new_session=True, stderr=errors)
    try:
        yield process
    finally:
        process.send_signal(signal.SIGTERM)
        with suppress(subprocess.TimeoutExpired):
            process.wait(timeout=20)
        with suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        if errors is not None:
            errors.close()


def until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {WAIT:g} s waiting for {what}")
        time.sleep(0.1)


@contextmanager
def sender(
    broker_url: str, queue: str, db: Database, monkeypatch: pytest.MonkeyPatch
) -> Iterator[ModuleType]:
    """The test app imported in this process, to send tasks as a client does."""
    result_metadata.create_all(db.engine)
    monkeypatch.setenv("INBOX_CELERY_BROKER", broker_url)
    monkeypatch.setenv("INBOX_CELERY_QUEUE", queue)
    monkeypatch.setenv("INBOX_CELERY_DATABASE", db.url)
    monkeypatch.syspath_prepend(str(TESTS))
    sys.modules.pop("celery_app", None)
    module = importlib.import_module("celery_app")
    try:
        yield module
    finally:
        module.app.close()
        module.engine.dispose()
        sys.modules.pop("celery_app", None)


def test_a_prefork_worker_commits_each_task_once_whatever_celery_redelivers(
    pg_db: Database,
    broker: tuple[str, str, DeadLetters],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    broker_url, queue, dead_letters = broker
    letters: list[dict[str, Any]] = []

    def all_settled() -> bool:
        counts = pg_db.effect_counts()
        if not letters:  # read (and on RabbitMQ taken) once it is there
            letters.extend(dead_letters(f"{queue}.dlq"))
        return bool(
            counts.get(("flaky", "ct.flaky"))
            and any(handler == "ct.after" for _, handler in counts)
            and ("killed", "ct.record") in counts
            and not (tmp_path / "kill-killed").exists()
            and not (tmp_path / "kill-first").exists()
            and letters
        )

    with sender(broker_url, queue, pg_db, monkeypatch) as celery_app:
        killed = "killed"
        (tmp_path / f"kill-{killed}").touch()
        # The chain's next step is sent only after the first step's __call__ returns, which
        # the kill prevents: it runs only if the redelivered first step returns its stored value.
        first = "first"
        (tmp_path / f"kill-{first}").touch()
        celery_app.record.delay(killed)
        same_id = str(uuid.uuid4())
        for _ in range(3):
            celery_app.record.apply_async(("dup",), task_id=same_id)
        for _ in range(3):
            celery_app.charge.delay("o-1")
        celery_app.flaky.delay("flaky")
        (tmp_path / "fail-bad").touch()
        celery_app.fragile.delay("bad")
        chain(celery_app.record.s(first), celery_app.after.s()).delay()
        with worker(broker_url, queue, pg_db, tmp_path):
            until(all_settled, "every task to commit or be dead-lettered")
            time.sleep(1)  # room for a second commit to show
        counts = pg_db.effect_counts()
        assert counts[("killed", "ct.record")] == 1
        assert counts[("dup", "ct.record")] == 1
        assert counts[("first", "ct.record")] == 1
        assert counts[("o-1", "ct.charge")] == 1
        assert counts[("flaky", "ct.flaky")] == 1
        [(previous, _)] = [key for key in counts if key[1] == "ct.after"]
        assert previous.startswith("first:"), "the chain went on with the stored value"
        assert counts[(previous, "ct.after")] == 1
        assert ("bad", "ct.fragile") not in counts
        [letter] = letters
        assert letter["task"] == "ct.fragile"
        assert letter["x-inbox-reason"] == "handler-failed"
        assert letter["x-inbox-tries"] == 2


def test_a_task_failed_for_good_is_a_dead_letter_that_replays_as_a_celery_task(
    pg_db: Database, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with rabbit_area() as area, sender(AMQP_URL, area.queue("celery"), pg_db, monkeypatch) as app:
        queue = area.queue("celery")
        (tmp_path / "fail-bad").touch()
        fragile = app.fragile.delay("bad")
        app.strict.delay("not-a-mapping")
        with worker(AMQP_URL, queue, pg_db, tmp_path):
            until(lambda: area.depth(f"{queue}.dlq") == 2, "two dead letters")
        assert pg_db.effect_counts() == {}, "every failed try was rolled back"
        letters = {m.headers["task"]: m for m in area.take_all(f"{queue}.dlq")}
        failed, poison = letters["ct.fragile"], letters["ct.strict"]
        assert failed.headers["x-inbox-reason"] == "handler-failed"
        assert failed.headers["x-inbox-tries"] == 2  # the first try and Celery's one retry
        assert "RuntimeError: bad fails on purpose" in failed.headers["x-inbox-error"]
        assert failed.headers["x-inbox-queue"] == queue
        assert failed.headers["id"] == fragile.id
        assert failed.properties["correlation_id"] == fragile.id
        assert failed.content_type == "application/json"
        assert failed.headers["lang"] == "py"
        assert failed.headers["retries"] == 1
        assert poison.headers["x-inbox-reason"] == "invalid-key"

        # Back in the dead-letter queue, then replayed by the inbox command once fixed.
        with area.connection() as connection:
            producer = connection.Producer()
            for letter in (failed, poison):
                producer.publish(
                    letter.body,
                    routing_key=f"{queue}.dlq",
                    headers=letter.headers,
                    content_type=letter.content_type,
                    content_encoding=letter.content_encoding,
                    correlation_id=letter.properties["correlation_id"],
                )
        (tmp_path / "fail-bad").unlink()
        listed = io.StringIO()
        assert (
            admin_main(["dlq", "list", "--broker", AMQP_URL, "--queue", queue], stdout=listed) == 0
        )
        assert "handler-failed" in listed.getvalue()
        assert "invalid-key" in listed.getvalue()
        replay = ["dlq", "replay", "--broker", AMQP_URL, "--queue", queue]
        code = admin_main([*replay, "--reason", "handler-failed", "-q"], stdout=io.StringIO())
        assert code == 0
        with worker(AMQP_URL, queue, pg_db, tmp_path):
            until(lambda: pg_db.effect_counts() == {("bad", "ct.fragile"): 1}, "the replayed task")
        assert area.depth(f"{queue}.dlq") == 1  # the poison message stays


def test_a_real_worker_refuses_to_start_with_one_line_per_setting_problem(
    tmp_path: Path,
) -> None:
    (tmp_path / "refused_app.py").write_text(
        "from celery import Celery\n"
        "from sqlalchemy import create_engine\n"
        "from sqlalchemy.orm import sessionmaker\n"
        "from inbox import Inbox\n"
        "from inbox.celery import InboxTasks\n"
        "from inbox.schema import metadata\n"
        "app = Celery('refused_app', broker='redis://127.0.0.1:6379/5')\n"
        "app.conf.worker_prefetch_multiplier = 1\n"
        "engine = create_engine('sqlite://')\n"
        "metadata.create_all(engine)  # the tables are there: only the settings are wrong\n"
        "sessions = sessionmaker(engine)\n"
        "tasks = InboxTasks(app, Inbox(sessions), sessions)\n"
        "@tasks.task(name='r.early', acks_late=False, time_limit=30)\n"
        "def early(session): ...\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(TESTS.parent)])}
    command = [sys.executable, "-m", "celery", "-A", "refused_app", "worker", "-c", "1"]
    done = subprocess.run(
        command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 1
    lines = [line for line in done.stderr.splitlines() if line.startswith("inbox.celery")]
    assert lines == [
        "inbox.celery refuses to start the worker: inbox task 'r.early': acks_late is off, so "
        "a worker lost mid-task loses the task; fix: remove acks_late=False from the task "
        "(or set task_acks_late=True)"
    ]
