"""Metrics and handler spans of the core, recorded through a real OpenTelemetry SDK (an
in-memory reader and exporter) while real databases run the handlers: each outcome counted
once per handler and message type, the handler and claim times, the end-to-end age, a span
per handler run continuing the message's ``traceparent``; and with OpenTelemetry absent the
inbox still works and records nothing.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import uuid

import pytest
from opentelemetry import trace
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from sqlalchemy.orm import Session
from support.aio import async_engine, run
from support.aio import record_effect as async_record_effect
from support.databases import Database
from support.effects import record_effect
from support.telemetry import Sdk, sdk

from inbox import HandlerFailed, Inbox, Message
from inbox.aio import AsyncInbox
from inbox.message import uuid7

TRACE_ID = 0x4BF92F3577B34DA6A3CE929D0E0E4736
PARENT_SPAN_ID = 0x00F067AA0BA902B7
TRACEPARENT = f"00-{TRACE_ID:032x}-{PARENT_SPAN_ID:016x}-01"
SECRET = "customer Jane Roe, card 4111"  # row data a failure message may carry


@pytest.fixture
def otel() -> Sdk:
    return sdk()


def names() -> tuple[str, str, str]:
    """Handler names and a message type unique to one test (the SDK is process-wide)."""
    tag = uuid.uuid4().hex[:8]
    return f"ok-{tag}", f"bad-{tag}", f"type-{tag}"


def two_handler_inbox(db: Database, ok: str, bad: str, message_type: str) -> Inbox:
    inbox = Inbox(db.sessions)

    @inbox.handler(message_type, name=ok)
    def apply(message: Message, session: Session) -> None:
        record_effect(message, session, ok)

    @inbox.handler(message_type, name=bad)
    def refuse(message: Message, session: Session) -> None:
        record_effect(message, session, bad)
        if message.body.get("fail"):
            raise ValueError(SECRET)

    return inbox


def test_each_outcome_is_counted_once_per_handler_and_type(db: Database, otel: Sdk) -> None:
    ok, bad, message_type = names()
    inbox = two_handler_inbox(db, ok, bad, message_type)
    failing = Message(id=uuid7(), type=message_type, body={"ref": "r", "fail": True})
    passing = Message(id=uuid7(), type=message_type, body={"ref": "r"})

    for _ in range(2):
        with pytest.raises(HandlerFailed):
            inbox.process(failing)
    inbox.process(passing)

    by = {"inbox__message__type": message_type}
    assert otel.total("inbox.processed", inbox__handler=ok, **by) == 2  # failing, passing
    assert otel.total("inbox.duplicates", inbox__handler=ok, **by) == 1  # failing again
    assert otel.total("inbox.processed", inbox__handler=bad, **by) == 1  # passing
    assert otel.total("inbox.failures", inbox__handler=bad, error__type="ValueError", **by) == 2
    assert otel.total("inbox.failures", inbox__handler=ok) == 0
    # One duration per handler run, by outcome; one claim per run; an age per commit.
    assert otel.total("inbox.handler.duration", inbox__handler=ok, inbox__outcome="processed") == 2
    assert otel.total("inbox.handler.duration", inbox__handler=ok, inbox__outcome="duplicate") == 1
    assert otel.total("inbox.handler.duration", inbox__handler=bad, inbox__outcome="failed") == 2
    assert otel.total("inbox.claim.duration", inbox__handler=ok) == 3
    assert otel.total("inbox.claim.duration", inbox__handler=bad) == 3
    ages = otel.histogram("inbox.message.age", inbox__handler=ok)
    assert sum(p.count for p in ages) == 2
    assert all(0 <= p.min <= p.max < 60 for p in ages)


def test_a_span_per_handler_run_with_its_outcome_and_no_row_data(db: Database, otel: Sdk) -> None:
    ok, bad, message_type = names()
    inbox = two_handler_inbox(db, ok, bad, message_type)
    message = Message(id=uuid7(), type=message_type, body={"ref": "r", "fail": True})

    with pytest.raises(HandlerFailed):
        inbox.process(message)

    [committed] = otel.spans(f"handler {ok}")
    [failed] = otel.spans(f"handler {bad}")
    assert committed.attributes is not None
    assert failed.attributes is not None
    assert committed.attributes["inbox.outcome"] == "processed"
    assert committed.attributes["messaging.message.id"] == str(message.id)
    assert committed.attributes["inbox.message.type"] == message_type
    assert committed.status.status_code is trace.StatusCode.UNSET
    assert failed.attributes["inbox.outcome"] == "failed"
    assert failed.attributes["error.type"] == "ValueError"
    assert failed.status.status_code is trace.StatusCode.ERROR
    assert SECRET not in repr(failed.to_json())
    # The handlers ran one after the other, each span covering its own transaction.
    assert committed.end_time is not None
    assert failed.start_time is not None
    assert committed.end_time <= failed.start_time


def test_the_handler_spans_continue_the_messages_traceparent(db: Database, otel: Sdk) -> None:
    ok, bad, message_type = names()
    inbox = two_handler_inbox(db, ok, bad, message_type)
    message = Message(
        id=uuid7(), type=message_type, body={"ref": "r"}, headers={"traceparent": TRACEPARENT}
    )

    inbox.process(message)

    spans = otel.spans(f"handler {ok}") + otel.spans(f"handler {bad}")
    assert len(spans) == 2
    for span in spans:
        assert span.context is not None
        assert span.parent is not None
        assert span.context.trace_id == TRACE_ID
        assert span.parent.span_id == PARENT_SPAN_ID


def test_spans_made_inside_a_handler_are_children_of_its_span(db: Database, otel: Sdk) -> None:
    """The handler's span is the current one while it runs: an outside call traced inside
    (an SMS, a payment) shows under it, and under the message's trace."""
    ok, _, message_type = names()
    inbox = Inbox(db.sessions)
    tracer = trace.get_tracer("tests.handler")

    @inbox.handler(message_type, name=ok)
    def send_sms(message: Message, session: Session) -> None:
        with tracer.start_as_current_span(f"sms-{ok}"):
            record_effect(message, session, ok)

    message = Message(
        id=uuid7(), type=message_type, body={"ref": "r"}, headers={"traceparent": TRACEPARENT}
    )
    inbox.process(message)

    [handler_span] = otel.spans(f"handler {ok}")
    [call] = otel.spans(f"sms-{ok}")
    assert handler_span.context is not None
    assert handler_span.parent is not None
    assert handler_span.parent.span_id == PARENT_SPAN_ID
    assert handler_span.attributes is not None
    assert handler_span.attributes["inbox.outcome"] == "processed"
    assert call.parent is not None
    assert call.context is not None
    assert call.parent.span_id == handler_span.context.span_id
    assert call.context.trace_id == TRACE_ID
    assert handler_span.start_time is not None
    assert call.start_time is not None
    assert handler_span.end_time is not None
    assert call.end_time is not None
    assert handler_span.start_time <= call.start_time <= call.end_time <= handler_span.end_time
    assert not trace.get_current_span().get_span_context().is_valid  # nothing left current


def test_an_interrupted_handler_still_ends_its_span_and_restores_the_context(
    db: Database, otel: Sdk
) -> None:
    ok, _, message_type = names()
    inbox = Inbox(db.sessions)

    @inbox.handler(message_type, name=ok)
    def interrupted(message: Message, session: Session) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        inbox.process(Message(id=uuid7(), type=message_type, body={"ref": "r"}))

    [span] = otel.spans(f"handler {ok}")
    assert span.attributes is not None
    assert span.attributes["inbox.outcome"] == "failed"
    assert span.attributes["error.type"] == "KeyboardInterrupt"
    assert span.end_time is not None
    assert not trace.get_current_span().get_span_context().is_valid


def test_a_garbled_traceparent_starts_a_new_trace_instead_of_failing(
    db: Database, otel: Sdk
) -> None:
    ok, bad, message_type = names()
    inbox = two_handler_inbox(db, ok, bad, message_type)
    for garbled in ("00-zz-yy-01", b"\xff\x00", 17, ""):
        inbox.process(
            Message(
                id=uuid7(), type=message_type, body={"ref": "r"}, headers={"traceparent": garbled}
            )
        )

    spans = otel.spans(f"handler {ok}")
    assert len(spans) == 4
    assert all(span.parent is None for span in spans)
    assert otel.total("inbox.processed", inbox__handler=ok) == 4


def test_a_batch_counts_each_outcome_once_despite_its_bisection(db: Database, otel: Sdk) -> None:
    ok, bad, message_type = names()
    inbox = two_handler_inbox(db, ok, bad, message_type)
    batch = [
        Message(id=uuid7(), type=message_type, body={"ref": str(index), "fail": index == 2})
        for index in range(4)
    ]
    first = inbox.process_batch(batch)
    again = inbox.process_batch(batch)

    assert [isinstance(r, HandlerFailed) for r in first] == [False, False, True, False]
    assert [isinstance(r, HandlerFailed) for r in again] == [False, False, True, False]
    # The whole batch rolled back first (nothing counted), then its halves committed.
    assert otel.total("inbox.processed", inbox__handler=ok) == 4
    assert otel.total("inbox.processed", inbox__handler=bad) == 3
    assert otel.total("inbox.duplicates", inbox__handler=ok) == 4
    assert otel.total("inbox.duplicates", inbox__handler=bad) == 3
    assert otel.total("inbox.failures", inbox__handler=bad) == 2
    assert otel.total("inbox.handler.duration", inbox__handler=ok) == 8
    assert len(otel.spans(f"handler {ok}")) == 8


def test_without_opentelemetry_the_inbox_works_and_records_nothing(tmp_path: object) -> None:
    code = textwrap.dedent(
        """
        import sys
        sys.modules["opentelemetry"] = None  # as if not installed: every import fails
        from sqlalchemy import create_engine
        from sqlalchemy.orm import sessionmaker
        import inbox.telemetry
        from inbox import Inbox, Message
        from inbox.message import uuid7
        from inbox.schema import metadata
        from inbox.telemetry import _core

        assert inbox.telemetry.ENABLED is False
        assert _core.watch(Message(id=uuid7(), type="t", body={"ref": "r"})) is None
        assert _core.claim_timer() is None
        inbox.telemetry.record_effect("done", "h", "step")
        inbox.telemetry.record_outbox(sent=1, refused=1)
        headers = {}
        inbox.telemetry.inject_context(headers)
        assert headers == {}
        engine = create_engine("sqlite://")
        metadata.create_all(engine)
        box = Inbox(sessionmaker(engine))
        box.handler("t", name="h")(lambda message, session: None)
        message = Message(id=uuid7(), type="t", body={"ref": "r"})
        print(box.process(message).outcome, box.process(message).outcome)
        assert not any(name.startswith("opentelemetry.") for name in sys.modules)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["processed", "duplicate"]


def test_before_an_sdk_is_configured_nothing_is_recorded_and_after_it_everything() -> None:
    # A process of its own: the SDK is configured after `import inbox`, as an application
    # that sets up OpenTelemetry in its main() does.
    code = textwrap.dedent(
        """
        from opentelemetry import metrics
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import InMemoryMetricReader
        from sqlalchemy import create_engine
        from sqlalchemy.orm import sessionmaker
        import inbox.telemetry
        from inbox import Inbox, Message
        from inbox.message import uuid7
        from inbox.schema import metadata
        from inbox.telemetry import _core

        engine = create_engine("sqlite://")
        metadata.create_all(engine)
        box = Inbox(sessionmaker(engine))
        box.handler("t", name="h")(lambda message, session: None)
        before = Message(id=uuid7(), type="t", body={})
        assert _core.watch(before) is None
        box.process(before)
        reader = InMemoryMetricReader()
        metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
        inbox.telemetry.refresh()  # else noticed within a second
        box.process(Message(id=uuid7(), type="t", body={}))
        box.process(before)
        found = {
            metric.name: sum(point.value for point in metric.data.data_points)
            for resource in reader.get_metrics_data().resource_metrics
            for scope in resource.scope_metrics
            for metric in scope.metrics
            if metric.name in ("inbox.processed", "inbox.duplicates")
        }
        print(found["inbox.processed"], found["inbox.duplicates"])
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["1", "1"]


def test_the_async_inbox_records_the_same(pg_db: Database, otel: Sdk) -> None:
    ok, bad, message_type = names()

    async def main() -> None:
        async with async_engine(pg_db, "psycopg") as engine:
            inbox = AsyncInbox(async_sessionmaker(engine))

            @inbox.handler(message_type, name=ok)
            async def apply(message: Message, session: AsyncSession) -> None:
                with trace.get_tracer("tests.handler").start_as_current_span(f"call-{ok}"):
                    await async_record_effect(message, session, ok)

            @inbox.handler(message_type, name=bad)
            async def refuse(message: Message, session: AsyncSession) -> None:
                raise ValueError(SECRET)

            message = Message(id=uuid7(), type=message_type, body={"ref": "r"})
            for _ in range(2):
                with pytest.raises(HandlerFailed):
                    await inbox.process(message)

    run(main())

    assert otel.total("inbox.processed", inbox__handler=ok, inbox__message__type=message_type) == 1
    assert otel.total("inbox.duplicates", inbox__handler=ok) == 1
    assert otel.total("inbox.failures", inbox__handler=bad, error__type="ValueError") == 2
    assert otel.total("inbox.claim.duration", inbox__handler=ok) == 2
    assert [s.attributes["inbox.outcome"] for s in otel.spans(f"handler {ok}")] == [
        "processed",
        "duplicate",
    ]
    [call] = otel.spans(f"call-{ok}")  # the first delivery's; the second is a duplicate
    first = otel.spans(f"handler {ok}")[0]
    assert call.parent is not None
    assert first.context is not None
    assert call.parent.span_id == first.context.span_id


def test_effects_are_counted_by_outcome(pg_db: Database, otel: Sdk) -> None:
    handler, _, message_type = names()
    inbox = Inbox(pg_db.sessions)
    calls: list[uuid.UUID] = []
    attempts: list[int] = []

    @inbox.handler(message_type, name=handler)
    def send(message: Message, session: Session) -> None:
        attempts.append(1)
        inbox.effect("sms", lambda key: calls.append(key) or {"sent": True})
        if len(attempts) == 1:
            raise ValueError("after the effect")

    message = Message(id=uuid7(), type=message_type, body={})
    with pytest.raises(HandlerFailed):
        inbox.process(message)
    inbox.process(message)  # the retry gets the stored result, no second call

    assert len(calls) == 1
    by = {"inbox__handler": handler, "inbox__effect__step": "sms"}
    assert otel.total("inbox.effects", inbox__outcome="started", **by) == 1
    assert otel.total("inbox.effects", inbox__outcome="done", **by) == 1
    assert otel.total("inbox.effects", inbox__outcome="stored", **by) == 1
    assert otel.total("inbox.effects", inbox__outcome="failed", **by) == 0
