"""Celery inbox tasks in the inbox's metrics and traces, under the task's name: processed,
duplicate, Celery's retry and the dead letter, recorded by a real Celery worker (Celery's
in-process test worker, solo pool) on RabbitMQ and PostgreSQL; ``inbox status --queue``
counts the Celery queue's dead letters."""

from __future__ import annotations

import io
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from celery import Celery, signals
from celery.contrib.testing.worker import start_worker
from opentelemetry import context, trace
from sqlalchemy.orm import Session, sessionmaker
from support.databases import Database, effects
from support.rabbit import AMQP_URL, rabbit_area
from support.telemetry import Sdk, sdk

from inbox import Inbox
from inbox.admin.cli import admin_main
from inbox.celery import InboxTasks

WAIT = 30.0


@pytest.fixture
def otel() -> Sdk:
    return sdk()


def until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {WAIT:g} s waiting for {what}")
        time.sleep(0.05)


@pytest.fixture
def task_spans() -> Iterator[None]:
    """A span around each task run, current while it runs, as an OpenTelemetry Celery
    instrumentation makes: the inbox's decision events land on it."""
    running: dict[str, tuple[Any, object]] = {}

    def started(task_id: str, task: Any, **_: Any) -> None:
        span = trace.get_tracer("tests").start_span(f"run/{task.name}")
        running[task_id] = (span, context.attach(trace.set_span_in_context(span)))

    def ended(task_id: str, **_: Any) -> None:
        span, token = running.pop(task_id)
        context.detach(token)  # type: ignore[arg-type]
        span.end()

    signals.task_prerun.connect(started, weak=False)
    signals.task_postrun.connect(ended, weak=False)
    try:
        yield
    finally:
        signals.task_prerun.disconnect(started)
        signals.task_postrun.disconnect(ended)


def test_a_celery_workers_outcomes_are_counted_and_traced_under_the_task_name(
    pg_db: Database, otel: Sdk, task_spans: None
) -> None:
    tag = uuid.uuid4().hex[:8]
    names = {kind: f"tel.{kind}.{tag}" for kind in ("record", "flaky", "broken")}
    with rabbit_area() as rabbit:
        queue = rabbit.queue("celery")
        app = Celery(f"tel{tag}", broker=AMQP_URL)
        app.conf.update(task_default_queue=queue, worker_prefetch_multiplier=1)
        sessions = sessionmaker(pg_db.engine)
        tasks = InboxTasks(app, Inbox(sessions), sessions)

        @tasks.task(name=names["record"])
        def record(session: Session, ref: str) -> str:
            session.execute(effects.insert().values(ref=ref, handler="record"))
            return ref

        @tasks.task(name=names["flaky"], bind=True, max_retries=1, default_retry_delay=0)
        def flaky(self: Any, session: Session, ref: str) -> None:
            session.execute(effects.insert().values(ref=ref, handler="flaky"))
            if not self.request.retries:
                raise self.retry(countdown=0)

        @tasks.task(name=names["broken"])
        def broken(session: Session, ref: str) -> None:
            raise LookupError(f"{ref} is broken on purpose")

        with start_worker(app, pool="solo", perform_ping_check=False, queues=[queue]):
            same = str(uuid.uuid4())
            record.apply_async(("twice",), task_id=same)
            record.apply_async(("twice",), task_id=same)  # a duplicated send: runs once
            flaky.delay("flaky")
            broken.delay("broken")
            until(lambda: rabbit.depth(f"{queue}.dlq") == 1, "the dead letter")
            until(
                lambda: (
                    pg_db.effect_counts().get(("flaky", "flaky")) == 1
                    and otel.total("inbox.duplicates", inbox__handler=names["record"]) == 1
                ),
                "the retried task and the duplicate",
            )

        assert pg_db.effect_counts() == {("twice", "record"): 1, ("flaky", "flaky"): 1}
        for kind, processed in (("record", 1), ("flaky", 1), ("broken", 0)):
            handler = names[kind]
            assert otel.total("inbox.processed", inbox__handler=handler) == processed, kind
            assert otel.total("inbox.processed", inbox__message__type=handler) == processed
        assert otel.total("inbox.failures", inbox__handler=names["broken"]) == 1
        assert otel.total("inbox.failures", inbox__handler=names["flaky"]) == 1  # the retry
        retried = {"inbox__handler": names["flaky"], "messaging__destination__name": queue}
        assert otel.total("inbox.retries", **retried) == 1
        assert otel.total("inbox.retries", inbox__handler=names["record"]) == 0
        dead = {"inbox__handler": names["broken"], "messaging__destination__name": queue}
        assert otel.total("inbox.dead_letters", **dead) == 1
        [(attributes, _)] = [
            p for p in otel.points("inbox.dead_letters") if p[0]["inbox.handler"] == names["broken"]
        ]
        assert attributes["inbox.dead_letter.reason"] == "handler-failed"

        # Traces: the inbox's handler spans by task name, the decisions on the task's span.
        outcomes = sorted(
            str((s.attributes or {})["inbox.outcome"])
            for s in otel.spans(f"handler {names['record']}")
        )
        assert outcomes == ["duplicate", "processed"]
        [failed] = otel.spans(f"handler {names['broken']}")
        assert (failed.attributes or {})["error.type"] == "LookupError"
        [*_, run_broken] = otel.spans(f"run/{names['broken']}")
        [event] = [e for e in run_broken.events if e.name == "inbox.decision"]
        assert (event.attributes or {})["inbox.decision"] == "dead-letter"
        assert run_broken.status.status_code is trace.StatusCode.ERROR
        decisions = [
            (e.attributes or {})["inbox.decision"]
            for s in otel.spans(f"run/{names['flaky']}")
            for e in s.events
        ]
        assert decisions == ["retry"]

        # inbox status --queue Q counts the Celery queue's dead letters (<Q>.dlq).
        out = io.StringIO()
        argv = ["status", "--database-url", pg_db.url, "--broker", AMQP_URL, "--queue", queue]
        assert admin_main(argv, stdout=out) == 0, out.getvalue()
        assert f"dead letters in {queue}.dlq: 1\n" in out.getvalue()
        app.close()
