"""A chain and a chord whose inbox step is killed with SIGKILL after its commit and before
Celery acks it, stores its result or sends the next step: the pool child, and separately the
worker's main process. Real prefork workers (subprocesses) on RabbitMQ, PostgreSQL, a Redis
result backend (a chord needs one)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from celery import chain, chord
from support.databases import Database
from support.rabbit import AMQP_URL, rabbit_area
from support.redis import REDIS_URL
from test_celery_worker import sender, until, worker

BACKEND = REDIS_URL.rsplit("/", 1)[0] + "/5"


@pytest.mark.parametrize("victim", ["kill", "killmain"])
def test_a_step_killed_after_its_commit_feeds_its_chain_and_its_chord_once(
    victim: str, pg_db: Database, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("INBOX_CELERY_BACKEND", BACKEND)  # a chord needs a result backend
    with rabbit_area() as area, sender(AMQP_URL, area.queue("celery"), pg_db, monkeypatch) as app:
        queue = area.queue("celery")
        for ref in ("m1", "c1"):
            (tmp_path / f"{victim}-{ref}").touch()
        chain(app.step.s("m1"), app.after.s()).delay()
        chord([app.step.s("c1"), app.step.s("c2")], app.collect.s()).delay()

        def settled() -> bool:
            counts = pg_db.effect_counts()
            return (
                sum(n for (_, task), n in counts.items() if task == "ct.after") >= 1
                and sum(n for (_, task), n in counts.items() if task == "ct.collect") >= 2
            )

        def ended() -> bool:
            # Every expected commit made, and every message of the queue (a redelivered
            # step, a second chain or chord step if one was sent) acked by a live worker:
            # nothing is left that could commit again.
            return settled() and area.unsettled(queue) == 0

        # A killed main process takes the worker down: the next worker gets the unacked
        # deliveries back from RabbitMQ (each killed step at most once more).
        deadline = time.monotonic() + 60
        done = False
        while not done:
            assert time.monotonic() < deadline, f"not settled: {pg_db.effect_counts()}"
            with worker(AMQP_URL, queue, pg_db, tmp_path, backend=BACKEND) as process:
                try:
                    until(lambda: ended() or process.poll() is not None, "the end or worker died")
                except AssertionError as exc:  # say which part of the end is missing
                    unsettled = area.unsettled(queue)
                    commits = pg_db.effect_counts()
                    raise AssertionError(f"{exc}: {unsettled} unsettled, {commits}") from None
                done = process.poll() is None
        counts = pg_db.effect_counts()
        assert not list(tmp_path.glob(f"{victim}-*")), "both kills happened"
        assert counts[("m1", "ct.step")] == 1
        assert counts[("c1", "ct.step")] == 1
        assert counts[("c2", "ct.step")] == 1
        values = {
            ref: value
            for (value, task) in counts
            if task == "ct.step:value"
            for ref in [value.split(":", 1)[0]]
        }
        assert counts[(values["m1"], "ct.after")] == 1, "the chain got the first run's value"
        collected = {value: n for (value, task), n in counts.items() if task == "ct.collect"}
        assert collected == {values["c1"]: 1, values["c2"]: 1}, "the chord counted each once"
