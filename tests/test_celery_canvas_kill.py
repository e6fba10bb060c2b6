"""A chain and a chord whose inbox step is killed with SIGKILL after its commit and before
Celery acks it, stores its result or sends the next step. Real prefork workers
(subprocesses) on RabbitMQ, PostgreSQL, a Redis result backend (a chord needs one).

The chain and the chord are checked with a kill of the pool child and of the worker's main
process. A main-process kill orphans the pool child, which goes on to report its chord part
and may claim the chord's callback dispatch (Celery 5.7's Redis backend); the harness then
kills the orphan. The test with the main process killed makes that land between the claim
and the publish every time (the process about to publish the chord's body dies first): the
redelivered part finds the claim taken, and its recheck (inbox.celery._chords) sends the
callback once the dead process's lease has passed."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest
from celery import chain, chord
from support.databases import Database
from support.rabbit import AMQP_URL, Rabbit, rabbit_area
from support.redis import REDIS_URL
from test_celery_worker import sender, until, worker

BACKEND = REDIS_URL.rsplit("/", 1)[0] + "/5"


def committed(db: Database, task: str) -> int:
    return sum(n for (_, name), n in db.effect_counts().items() if name == task)


def step_values(db: Database) -> dict[str, str]:
    """The value each step's (single) run returned, by its ref."""
    return {
        value.split(":", 1)[0]: value
        for (value, task) in db.effect_counts()
        if task == "ct.step:value"
    }


def run_to_the_end(
    db: Database,
    tmp_path: Path,
    area: Rabbit,
    queue: str,
    settled: Callable[[], bool],
    *,
    within: float = 60,
) -> None:
    """Workers, one after the other (a killed main process takes its worker down: the next
    one gets the unacked deliveries back), until every expected commit is made and every
    message of the queue (a redelivered step, a second next step if one was sent) is acked
    by a live worker: nothing is left that could commit again."""
    deadline = time.monotonic() + within
    done = False
    while not done:
        assert time.monotonic() < deadline, f"not settled: {db.effect_counts()}"
        with worker(AMQP_URL, queue, db, tmp_path, backend=BACKEND) as process:
            try:
                until(
                    lambda: (
                        (settled() and area.unsettled(queue) == 0) or process.poll() is not None
                    ),
                    "the end or worker died",
                )
            except AssertionError as exc:  # say which part of the end is missing
                left, commits = area.unsettled(queue), db.effect_counts()
                raise AssertionError(f"{exc}: {left} unsettled, {commits}") from None
            done = process.poll() is None
    assert not list(tmp_path.glob("kill*-*")), "the kill happened"


def run_chord_to_the_end(
    db: Database, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, refs: tuple[str, str]
) -> None:
    """A chord of two steps (``refs``) and ``ct.collect``, run to the end; each step
    committed once, each value collected once, the callback published once."""
    monkeypatch.setenv("INBOX_CELERY_BACKEND", BACKEND)  # a chord needs a result backend
    with rabbit_area() as area, sender(AMQP_URL, area.queue("celery"), db, monkeypatch) as app:
        chord([app.step.s(ref) for ref in refs], app.collect.s()).delay()
        run_to_the_end(
            db,
            tmp_path,
            area,
            area.queue("celery"),
            lambda: committed(db, "ct.collect") >= len(refs),
            within=120,
        )
    counts = db.effect_counts()
    assert all(counts[(ref, "ct.step")] == 1 for ref in refs)
    values = step_values(db)
    collected = {value: n for (value, task), n in counts.items() if task == "ct.collect"}
    assert collected == {values[ref]: 1 for ref in refs}, "the chord counted each once"
    published = (tmp_path / "published-collect").read_text().splitlines()
    assert len(published) == 1, f"the callback was published {len(published)} times"


@pytest.mark.parametrize("victim", ["kill", "killmain"])
def test_a_chain_step_killed_after_its_commit_feeds_the_next_step_its_first_value(
    victim: str, pg_db: Database, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("INBOX_CELERY_BACKEND", BACKEND)
    with rabbit_area() as area, sender(AMQP_URL, area.queue("celery"), pg_db, monkeypatch) as app:
        (tmp_path / f"{victim}-m1").touch()
        chain(app.step.s("m1"), app.after.s()).delay()
        run_to_the_end(
            pg_db, tmp_path, area, area.queue("celery"), lambda: committed(pg_db, "ct.after") >= 1
        )
    counts = pg_db.effect_counts()
    assert counts[("m1", "ct.step")] == 1
    value = step_values(pg_db)["m1"]
    assert counts[(value, "ct.after")] == 1, "the chain got the first run's value"
    assert committed(pg_db, "ct.after") == 1


def test_a_chord_header_step_killed_after_its_commit_is_counted_once(
    pg_db: Database, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "kill-c1").touch()
    run_chord_to_the_end(pg_db, tmp_path, monkeypatch, ("c1", "c2"))


def test_a_chord_whose_dispatcher_dies_after_a_main_process_kill_sends_its_callback_once(
    pg_db: Database, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "killmain-d1").touch()
    (tmp_path / "diepublish-collect").touch()  # whoever dispatches first dies holding it
    run_chord_to_the_end(pg_db, tmp_path, monkeypatch, ("d1", "d2"))
    assert not (tmp_path / "diepublish-collect").exists(), "a dispatcher died holding the claim"
