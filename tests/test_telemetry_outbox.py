"""Trace context through the outbox, on the real RabbitMQ and PostgreSQL with a real
OpenTelemetry SDK: producer → worker → a handler's ``Outbox.publish`` → the relay → the next
consumer, one trace, each consumer's span the child of what sent its message."""

from __future__ import annotations

import uuid

import pytest
from opentelemetry import trace
from sqlalchemy.orm import Session
from support.databases import Database
from support.effects import record_effect
from support.rabbit import Rabbit
from support.telemetry import Sdk, sdk
from support.worker import run_until_idle

from inbox import Inbox, Message, Outbox
from inbox.broker import Publisher, Relay, Worker

IDLE = 1.5


@pytest.fixture
def otel() -> Sdk:
    return sdk()


def test_the_trace_goes_through_the_outbox_and_the_relay_to_the_next_consumer(
    pg_db: Database, rabbit: Rabbit, otel: Sdk
) -> None:
    orders, shipments = rabbit.queue("orders"), rabbit.queue("shipments")
    tag = uuid.uuid4().hex[:8]
    inbox = Inbox(pg_db.sessions)
    outbox = Outbox()

    @inbox.handler("order", name=f"ship-order-{tag}")
    def ship(message: Message, session: Session) -> None:
        record_effect(message, session, "ship-order")
        outbox.publish(session, "shipment", {"ref": "s1"}, routing_key=shipments)

    inbox.handler("shipment", name=f"track-{tag}")(lambda m, s: record_effect(m, s, "track"))
    worker = Worker(inbox, rabbit.url, [orders, shipments])
    worker.prepare()
    with (
        trace.get_tracer("tests").start_as_current_span("order placed") as root,
        Publisher(rabbit.url, routing_key=orders) as publisher,
    ):
        publisher.publish("order", {"ref": "o1"})
    run_until_idle(worker, IDLE)
    sent_before = otel.total("inbox.outbox.sent")
    relay = Relay(pg_db.engine, rabbit.url, listen=False, stats_interval=None)
    try:
        assert relay.run_until_empty(timeout=20) == 1
    finally:
        relay.stop()
    assert otel.total("inbox.outbox.sent") == sent_before + 1  # the relay counts its rows
    run_until_idle(Worker(inbox, rabbit.url, [shipments]), IDLE)  # a worker runs once

    [ordered] = otel.spans(f"process {orders}")
    [shipping] = otel.spans(f"handler ship-order-{tag}")
    [shipped] = otel.spans(f"process {shipments}")
    assert ordered.context is not None
    assert shipping.context is not None
    assert shipping.parent is not None
    assert shipping.parent.span_id == ordered.context.span_id
    assert shipped.context is not None
    assert shipped.context.trace_id == root.get_span_context().trace_id
    assert shipped.parent is not None
    assert shipped.parent.span_id == shipping.context.span_id  # written by the handler
    assert pg_db.effect_counts() == {("o1", "ship-order"): 1, ("s1", "track"): 1}
