"""What the worker records through :mod:`inbox.telemetry`: a consumer span per delivery (or
per batch, linked to each delivery's producer), continuing the producer's ``traceparent``;
the decisions (retries and dead letters counted, by reason); and a producer span per
publish, whose context goes out in the message's headers.

Every function is a no-op without OpenTelemetry or before an SDK is configured (a check, a
shared null context).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping, MutableMapping, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any, Final

from kombu.message import Message as Delivery

from inbox.delivery._policy import Ack, Decision, Halt, Retry
from inbox.telemetry import _names as n
from inbox.telemetry._api import Instruments, configured, tracing
from inbox.telemetry._context import extract_context, inject_context

__all__ = ["observe_decision", "traced_batch", "traced_delivery", "traced_publish"]

_NULL: Final[AbstractContextManager[None]] = nullcontext()
PROCESS: Final = "process"


def traced_delivery(system: str, queue: str, delivery: Delivery) -> AbstractContextManager[None]:
    """The span of one delivery, from taken to settled (current meanwhile, so the handler
    spans are its children), and its ``messaging.process.duration``."""
    instruments = configured()
    if instruments is None:
        return _NULL
    return _consuming(instruments, system, queue, [delivery])


def traced_batch(
    system: str, queues: Sequence[str], deliveries: Sequence[Delivery]
) -> AbstractContextManager[None]:
    """One span for a batch, linked to the producer of each delivery (the messaging
    conventions' batch processing): a batch has no single parent."""
    instruments = configured()
    if instruments is None:
        return _NULL
    return _consuming(instruments, system, ", ".join(dict.fromkeys(queues)), deliveries)


@contextmanager
def _consuming(
    ins: Instruments, system: str, queue: str, deliveries: Sequence[Delivery]
) -> Iterator[None]:
    from opentelemetry import trace

    metric_attributes = {
        n.SYSTEM: system,
        n.OPERATION_NAME: PROCESS,
        n.DESTINATION: queue,
    }
    attributes: dict[str, Any] = {**metric_attributes, n.OPERATION_TYPE: PROCESS}
    parent = None
    links: list[trace.Link] = []
    if len(deliveries) == 1:
        attributes |= _delivery_attributes(deliveries[0])
        parent = extract_context(deliveries[0].headers)
    else:
        attributes[n.BATCH_SIZE] = len(deliveries)
        for delivery in deliveries:
            producer = trace.get_current_span(extract_context(delivery.headers))
            if producer.get_span_context().is_valid:
                links.append(trace.Link(producer.get_span_context()))
    ins.consumed.add(len(deliveries), metric_attributes)
    started = time.perf_counter()
    try:
        with ins.tracer.start_as_current_span(
            f"{PROCESS} {queue}",
            context=parent,
            kind=trace.SpanKind.CONSUMER,
            attributes=attributes,
            links=links,
            record_exception=False,  # an exception's text can hold row data
        ):
            yield
    finally:
        ins.process_duration.record(time.perf_counter() - started, metric_attributes)


def _delivery_attributes(delivery: Delivery) -> dict[str, Any]:
    properties: Mapping[str, Any] = delivery.properties or {}
    attributes: dict[str, Any] = {}
    for key, name in ((n.MESSAGE_ID, "message_id"), (n.CONVERSATION_ID, "correlation_id")):
        value = properties.get(name)
        if isinstance(value, str) and value:
            attributes[key] = value
    routing_key = (delivery.delivery_info or {}).get("routing_key")
    if isinstance(routing_key, str) and routing_key:
        attributes[n.ROUTING_KEY] = routing_key
    body = delivery.body
    if isinstance(body, bytes | str):
        attributes[n.BODY_SIZE] = len(body)
    type_ = properties.get("type")
    if isinstance(type_, str):
        attributes[n.MESSAGE_TYPE] = type_
    return attributes


def observe_decision(queue: str, delivery: Delivery, decision: Decision) -> None:
    """Count a retry or a dead letter (once per failed handler, or once with no handler
    when none ran) and add the decision to the current span as an event."""
    ins = configured()
    if ins is None:
        return
    from opentelemetry import trace

    properties: Mapping[str, Any] = delivery.properties or {}
    event: dict[str, Any] = {n.MESSAGE_ID: str(properties.get("message_id"))}
    span = trace.get_current_span()
    if isinstance(decision, Ack):
        event[n.DECISION] = "ack"
    elif isinstance(decision, Halt):
        event[n.DECISION] = "halt"
        event[n.ERROR_TYPE] = type(decision.error).__name__
    elif isinstance(decision, Retry):
        event |= {n.DECISION: "retry", n.TRIES: decision.tries}
        for attributes in _per_handler(queue, properties, decision.failed_handlers):
            ins.retries.add(1, attributes)
    else:
        event |= {n.DECISION: "dead-letter", n.REASON: str(decision.reason)}
        if decision.tries is not None:
            event[n.TRIES] = decision.tries
        for attributes in _per_handler(queue, properties, decision.failed_handlers):
            ins.dead_letters.add(1, {**attributes, n.REASON: str(decision.reason)})
        span.set_status(trace.StatusCode.ERROR, str(decision.reason))
    span.add_event("inbox.decision", event)


def _per_handler(
    queue: str, properties: Mapping[str, Any], handlers: Sequence[str]
) -> Iterator[dict[str, str]]:
    # The type only once handlers took the message: before that it is whatever a producer
    # wrote, and every distinct value would be a new time series.
    type_ = properties.get("type")
    message_type = type_ if handlers and isinstance(type_, str) else ""
    for handler in handlers or ("",):
        yield {n.DESTINATION: queue, n.MESSAGE_TYPE: message_type, n.HANDLER: handler}


def traced_publish(
    system: str, destination: str, message_id: str, headers: MutableMapping[str, Any]
) -> AbstractContextManager[None]:
    """A producer span around one publish; its context goes into ``headers`` (a
    ``traceparent`` already there is kept: the caller's explicit context wins)."""
    instruments = configured()
    if instruments is None or not tracing():
        return _NULL
    return _publishing(instruments, system, destination, message_id, headers)


@contextmanager
def _publishing(
    ins: Instruments,
    system: str,
    destination: str,
    message_id: str,
    headers: MutableMapping[str, Any],
) -> Iterator[None]:
    from opentelemetry import trace

    with ins.tracer.start_as_current_span(
        f"send {destination}",
        kind=trace.SpanKind.PRODUCER,
        attributes={
            n.SYSTEM: system,
            n.OPERATION_NAME: "send",
            n.OPERATION_TYPE: "send",
            n.DESTINATION: destination,
            n.MESSAGE_ID: message_id,
        },
        record_exception=False,
    ):
        inject_context(headers)
        yield
