"""The worker's and the publisher's telemetry through a real OpenTelemetry SDK, on the real
RabbitMQ and PostgreSQL: a consumer span per delivery continuing the producer's trace, the
publisher's ``traceparent``, a trace carried producer → worker → handler's publish → next
consumer, and retries and dead letters counted by handler and reason."""

from __future__ import annotations

import uuid

import pika
import pytest
from opentelemetry import trace
from sqlalchemy.orm import Session
from support.databases import Database
from support.effects import record_effect
from support.rabbit import Rabbit
from support.telemetry import Sdk, sdk
from support.worker import run_until_idle

from inbox import Inbox, Message
from inbox.broker import Publisher, RetryPolicy, Worker

IDLE = 1.5
QUICK = RetryPolicy((0.2,), max_tries=2)


@pytest.fixture
def otel() -> Sdk:
    return sdk()


def tracer() -> trace.Tracer:
    return trace.get_tracer("tests")


def test_a_delivery_span_continues_the_publishers_trace_and_parents_the_handler_spans(
    pg_db: Database, rabbit: Rabbit, otel: Sdk
) -> None:
    queue = rabbit.queue()
    handler = f"apply-{uuid.uuid4().hex[:8]}"
    inbox = Inbox(pg_db.sessions)
    inbox.handler("op", name=handler)(lambda m, s: record_effect(m, s, handler))
    worker = Worker(inbox, rabbit.url, [queue])
    worker.prepare()

    with (
        tracer().start_as_current_span("checkout") as root,
        Publisher(rabbit.url, routing_key=queue) as publisher,
    ):
        message_id = publisher.publish("op", {"ref": "r1"})
    run_until_idle(worker, IDLE)

    trace_id = root.get_span_context().trace_id
    [send] = otel.spans(f"send {queue}")
    [process] = otel.spans(f"process {queue}")
    [handled] = otel.spans(f"handler {handler}")
    assert send.context is not None
    assert process.context is not None
    assert send.context.trace_id == process.context.trace_id == trace_id
    assert send.kind is trace.SpanKind.PRODUCER
    assert process.kind is trace.SpanKind.CONSUMER
    assert process.parent is not None
    assert process.parent.span_id == send.context.span_id
    assert handled.parent is not None
    assert handled.parent.span_id == process.context.span_id
    assert process.attributes == {
        "messaging.system": "rabbitmq",
        "messaging.operation.name": "process",
        "messaging.operation.type": "process",
        "messaging.destination.name": queue,
        "messaging.message.id": str(message_id),
        "messaging.rabbitmq.destination.routing_key": queue,
        "messaging.message.body.size": len(b'{"ref":"r1"}'),  # compact JSON
        "inbox.message.type": "op",
    }
    [decision] = process.events
    assert decision.attributes is not None
    assert decision.attributes["inbox.decision"] == "ack"


def test_the_trace_goes_on_through_a_handlers_publish_to_the_next_consumer(
    pg_db: Database, rabbit: Rabbit, otel: Sdk
) -> None:
    first, second = rabbit.queue("first"), rabbit.queue("second")
    tag = uuid.uuid4().hex[:8]
    inbox = Inbox(pg_db.sessions)

    @inbox.handler("order", name=f"forward-{tag}")
    def forward(message: Message, session: Session) -> None:
        record_effect(message, session, "forward")
        with Publisher(rabbit.url, routing_key=second) as publisher:
            publisher.publish("shipment", {"ref": "s1"})

    inbox.handler("shipment", name=f"ship-{tag}")(lambda m, s: record_effect(m, s, "ship"))
    worker = Worker(inbox, rabbit.url, [first, second])
    worker.prepare()
    with (
        tracer().start_as_current_span("order placed") as root,
        Publisher(rabbit.url, routing_key=first) as publisher,
    ):
        publisher.publish("order", {"ref": "o1"})
    run_until_idle(worker, IDLE)

    trace_id = root.get_span_context().trace_id
    [outer] = otel.spans(f"process {first}")
    [inner_send] = otel.spans(f"send {second}")
    [inner] = otel.spans(f"process {second}")
    [forwarding] = otel.spans(f"handler forward-{tag}")
    [shipped] = otel.spans(f"handler ship-{tag}")
    for span in (outer, forwarding, inner_send, inner, shipped):
        assert span.context is not None
        assert span.context.trace_id == trace_id
    assert outer.context is not None
    assert forwarding.context is not None
    assert forwarding.parent is not None
    assert forwarding.parent.span_id == outer.context.span_id
    assert inner_send.context is not None
    assert inner_send.parent is not None
    assert inner_send.parent.span_id == forwarding.context.span_id  # sent by the handler
    assert inner.parent is not None
    assert inner.parent.span_id == inner_send.context.span_id


def test_a_callers_traceparent_header_wins_over_the_current_span(rabbit: Rabbit, otel: Sdk) -> None:
    queue = rabbit.queue()
    mine = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    with Publisher(rabbit.url, routing_key=queue) as publisher:
        publisher.connection.default_channel.queue_declare(queue=queue, durable=True)
        with tracer().start_as_current_span("elsewhere"):
            publisher.publish("op", {"ref": "x"}, headers={"traceparent": mine})
            publisher.publish("op", {"ref": "y"})
    explicit, injected = rabbit.take_all(queue)
    assert explicit.headers["traceparent"] == mine
    assert injected.headers["traceparent"].startswith("00-")
    assert injected.headers["traceparent"] != mine


def test_retries_and_dead_letters_are_counted_by_handler_and_reason(
    pg_db: Database, rabbit: Rabbit, otel: Sdk
) -> None:
    queue = rabbit.queue()
    tag = uuid.uuid4().hex[:8]
    good, bad = f"good-{tag}", f"bad-{tag}"
    inbox = Inbox(pg_db.sessions)
    inbox.handler("op", name=good)(lambda m, s: record_effect(m, s, good))

    @inbox.handler("op", name=bad)
    def fail(message: Message, session: Session) -> None:
        if message.body.get("poison"):
            raise RuntimeError("poison")

    worker = Worker(inbox, rabbit.url, [queue], retry=QUICK)
    worker.prepare()
    with Publisher(rabbit.url, routing_key=queue) as publisher:
        publisher.publish("op", {"ref": "p", "poison": True})
        publisher.publish("op", {"ref": "fine"})
        publisher.publish("nobody-handles-this", {"ref": "u"})
    connection = pika.BlockingConnection(pika.URLParameters(rabbit.url.rstrip("/") + "/%2F"))
    try:
        connection.channel().basic_publish("", queue, b"{}", pika.BasicProperties(type="op"))
    finally:
        connection.close()  # no message_id: dead-lettered before any handler
    run_until_idle(worker, IDLE)

    at = {"messaging__destination__name": queue}
    assert otel.total("inbox.retries", inbox__handler=bad, inbox__message__type="op", **at) == 1
    assert otel.total("inbox.retries", **at) == 1
    reasons = {
        (attrs["inbox.dead_letter.reason"], attrs["inbox.handler"], attrs["inbox.message.type"]): v
        for attrs, v in otel.points("inbox.dead_letters")
        if attrs.get("messaging.destination.name") == queue
    }
    assert reasons == {
        ("handler-failed", bad, "op"): 1,
        ("unhandled-type", "", ""): 1,
        ("missing-message-id", "", ""): 1,
    }
    assert otel.total("inbox.processed", inbox__handler=good) == 2  # the poison one too
    assert otel.total("inbox.failures", inbox__handler=bad) == 2
    assert otel.total("messaging.client.consumed.messages", **at) == 5  # 4 + the retry
    dead = [
        span
        for span in otel.spans(f"process {queue}")
        if span.status.status_code is trace.StatusCode.ERROR
    ]
    assert sorted(span.status.description or "" for span in dead) == [
        "handler-failed",
        "missing-message-id",
        "unhandled-type",
    ]


def test_a_batch_is_one_span_linked_to_each_producer(
    pg_db: Database, rabbit: Rabbit, otel: Sdk
) -> None:
    queue = rabbit.queue()
    handler = f"apply-{uuid.uuid4().hex[:8]}"
    inbox = Inbox(pg_db.sessions)
    inbox.handler("op", name=handler)(lambda m, s: record_effect(m, s, handler))
    worker = Worker(inbox, rabbit.url, [queue], batch_size=10, prefetch=10)
    worker.prepare()
    roots = []
    with Publisher(rabbit.url, routing_key=queue) as publisher:
        for ref in range(5):
            with tracer().start_as_current_span(f"producer {ref}") as root:
                publisher.publish("op", {"ref": str(ref)})
            roots.append(root.get_span_context().trace_id)
    run_until_idle(worker, IDLE)

    batches = otel.spans(f"process {queue}")
    assert (
        sum(int((s.attributes or {}).get("messaging.batch.message_count", 1)) for s in batches) == 5
    )
    linked = sorted(link.context.trace_id for span in batches for link in span.links)
    single = sorted(s.context.trace_id for s in batches if s.context and not s.links)
    assert sorted(linked + single) == sorted(roots)
    assert otel.total("inbox.processed", inbox__handler=handler) == 5
