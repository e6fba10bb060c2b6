"""Real ``inbox-worker`` processes (RabbitMQ, PostgreSQL) SIGKILLed around an effect, and the
redelivery a second worker handles; provider calls are counted per key in a file.

Killed inside the call or after it returned but before the done record, the record says
'started': at-least-once calls again with the same key (two calls, one key), at-most-once
never calls again and the delivery is dead-lettered at once (``uncertain-effect``). Killed
after the done record, the redelivery gets the stored result in both modes: one call.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import pytest
from sqlalchemy import select
from support.databases import Database, cannot_run
from support.ledger import FileProvider, records
from support.rabbit import Rabbit
from support.worker import (
    TESTS_DIR,
    TIMEOUT,
    WorkerProcess,
    declare,
    effects_by_ref,
    publish,
    queue_counts,
    wait_until,
    worker_command,
)

from inbox.delivery.topology import QueueTopology
from inbox.schema import inbox_message

pytestmark = pytest.mark.slow

HANDLER: Final = "sms.send"


@dataclass
class EffectWorkers:
    """Starts ``inbox-worker effect_app:inbox`` processes; kills any left at teardown."""

    db: Database
    rabbit: Rabbit
    tmp_path: Path
    started: list[WorkerProcess] = field(default_factory=list)

    @property
    def provider(self) -> FileProvider:
        return FileProvider(self.tmp_path / "provider-calls")

    def start(self, queue: str, mode: str, kill: str | None = None) -> WorkerProcess:
        name = f"worker-{len(self.started) + 1}"
        log_path = self.tmp_path / f"{name}.log"
        env = {k: v for k, v in os.environ.items() if not k.startswith("EFFECT_APP_")}
        env |= {
            "EFFECT_APP_DATABASE_URL": self.db.url,
            "EFFECT_APP_PROVIDER_FILE": str(self.provider.path),
            "EFFECT_APP_MODE": mode,
        }
        if kill is not None:
            env |= {"EFFECT_APP_KILL": kill, "EFFECT_APP_MARKER": str(self.tmp_path / "killed")}
        with log_path.open("wb") as log:
            process = subprocess.Popen(
                [
                    *worker_command(),
                    "effect_app:inbox",
                    "--broker",
                    self.rabbit.url,
                    "--queue",
                    queue,
                    "--retry-delays",
                    "0.2",
                    "--max-tries",
                    "5",
                ],
                cwd=TESTS_DIR,
                env=env,
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
    if shutil.which("rabbitmqctl") is None:
        cannot_run("needs rabbitmqctl on PATH")


@pytest.fixture
def workers(pg_db: Database, rabbit: Rabbit, tmp_path: Path) -> Iterator[EffectWorkers]:
    started = EffectWorkers(pg_db, rabbit, tmp_path)
    try:
        yield started
    finally:
        started.kill_all()


def settled(rabbit: Rabbit) -> bool:
    return all(count == (0, 0) for count in queue_counts(rabbit).values())


def claims(db: Database) -> int:
    with db.engine.connect() as connection:
        return len(connection.execute(select(inbox_message.c.message_id)).all())


@pytest.mark.parametrize("kill", ["in-call", "after-call"])
def test_killed_before_the_done_record_at_least_once_calls_again_with_the_same_key(
    pg_db: Database, rabbit: Rabbit, workers: EffectWorkers, kill: str
) -> None:
    queue = rabbit.queue(kill)
    declare(rabbit, queue)
    publish(rabbit, queue, ["a"])
    first = workers.start(queue, "at-least-once", kill)
    assert first.wait() == -signal.SIGKILL, first.tail()
    assert f"effect_app: SIGKILL {kill}" in first.log()
    [started] = records(pg_db.engine)
    assert (started["status"], started["attempts"]) == ("started", 1)
    assert claims(pg_db) == 0  # the claim died with the process

    second = workers.start(queue, "at-least-once")
    wait_until(lambda: effects_by_ref(pg_db, HANDLER) == {"a": 1}, "the delivery row", TIMEOUT)
    wait_until(lambda: settled(rabbit), "every queue empty", TIMEOUT)
    assert second.terminate() == 0, second.tail()

    calls = workers.provider.per_key()
    assert calls == {str(started["effect_key"]): 2}, calls  # two calls, one key
    [done] = records(pg_db.engine)
    assert (done["status"], done["attempts"]) == ("done", 2)
    assert effects_by_ref(pg_db, HANDLER) == {"a": 1}


@pytest.mark.parametrize("kill", ["in-call", "after-call"])
def test_killed_before_the_done_record_at_most_once_dead_letters_uncertain_effect(
    pg_db: Database, rabbit: Rabbit, workers: EffectWorkers, kill: str
) -> None:
    queue = rabbit.queue(kill)
    dlq = QueueTopology(queue).dead_letter_queue
    declare(rabbit, queue)
    ids = publish(rabbit, queue, ["a"])
    first = workers.start(queue, "at-most-once", kill)
    assert first.wait() == -signal.SIGKILL, first.tail()

    second = workers.start(queue, "at-most-once")
    wait_until(lambda: rabbit.depth(dlq) == 1, f"the dead letter in {dlq}", TIMEOUT)
    assert second.terminate() == 0, second.tail()

    assert workers.provider.per_key().total() == 1  # never called twice
    [letter] = rabbit.take_all(dlq)
    assert letter.headers["x-inbox-reason"] == "uncertain-effect", letter.headers
    assert letter.properties["message_id"] == str(ids["a"])
    assert "UncertainEffect" in letter.headers["x-inbox-error"]
    assert effects_by_ref(pg_db, HANDLER) == {}
    [record] = records(pg_db.engine)
    assert (record["status"], record["attempts"]) == ("started", 1)
    stats = second.stats()
    assert (stats["dead_lettered"], stats["retried"]) == (1, 0), stats  # at once


@pytest.mark.parametrize("mode", ["at-least-once", "at-most-once"])
def test_killed_after_the_done_record_the_redelivery_gets_the_stored_result(
    pg_db: Database, rabbit: Rabbit, workers: EffectWorkers, mode: str
) -> None:
    queue = rabbit.queue("after-done")
    declare(rabbit, queue)
    publish(rabbit, queue, ["a"])
    first = workers.start(queue, mode, "after-done")
    assert first.wait() == -signal.SIGKILL, first.tail()
    [done] = records(pg_db.engine)
    assert (done["status"], done["attempts"]) == ("done", 1)

    second = workers.start(queue, mode)
    wait_until(lambda: effects_by_ref(pg_db, HANDLER) == {"a": 1}, "the delivery row", TIMEOUT)
    wait_until(lambda: settled(rabbit), "every queue empty", TIMEOUT)
    assert second.terminate() == 0, second.tail()
    assert workers.provider.per_key() == {str(done["effect_key"]): 1}
    assert records(pg_db.engine) == [done]
