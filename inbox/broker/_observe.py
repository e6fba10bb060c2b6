"""What the worker records through :mod:`inbox.telemetry`: a consumer span per delivery (or
per batch, linked to each delivery's producer), continuing the producer's ``traceparent``;
the decisions as the plan carries them out (:class:`DecisionEvents`: retries and dead
letters counted, by reason); and a producer span per
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

from inbox.delivery._inbound import Inbound
from inbox.delivery._policy import DeadLetter, Halt, Retry
from inbox.telemetry import _names as n
from inbox.telemetry._api import Instruments, configured, tracing
from inbox.telemetry._context import extract_context, inject_context

__all__ = ["DecisionEvents", "observing", "traced_batch", "traced_delivery", "traced_publish"]

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


def observing() -> DecisionEvents | None:
    """What records the decisions the plans carry out (each plan calls the branch it
    takes), or None without telemetry. Asked once per delivery or batch."""
    ins = configured()
    if ins is None:
        return None
    return DecisionEvents(ins)


class DecisionEvents:
    """An :class:`~inbox.delivery._plan.Observer`: a retry or a dead letter counted (once
    per failed handler, or once with no handler when none ran), and every decision added to
    the current span as an ``inbox.decision`` event."""

    def __init__(self, ins: Instruments) -> None:
        self._ins = ins

    def acking(self, queue: str, inbound: Inbound) -> None:
        """The delivery is acked."""
        _add(_event(inbound, "ack"))

    def halting(self, queue: str, inbound: Inbound, halt: Halt) -> None:
        """A configuration error stops the worker."""
        _add(_event(inbound, "halt") | {n.ERROR_TYPE: type(halt.error).__name__})

    def retrying(self, queue: str, inbound: Inbound, retry: Retry) -> None:
        """A failed try goes to be retried."""
        for attributes in _per_handler(queue, inbound, retry.failed_handlers):
            self._ins.retries.add(1, attributes)
        _add(_event(inbound, "retry") | {n.TRIES: retry.tries})

    def dead_lettering(self, queue: str, inbound: Inbound, dead: DeadLetter) -> None:
        """The delivery goes to the dead letters."""
        from opentelemetry import trace

        reason = str(dead.reason)
        event = _event(inbound, "dead-letter") | {n.REASON: reason}
        if dead.tries is not None:
            event[n.TRIES] = dead.tries
        for attributes in _per_handler(queue, inbound, dead.failed_handlers):
            self._ins.dead_letters.add(1, {**attributes, n.REASON: reason})
        trace.get_current_span().set_status(trace.StatusCode.ERROR, reason)
        _add(event)


def _event(inbound: Inbound, decision: str) -> dict[str, Any]:
    return {n.MESSAGE_ID: str(inbound.raw_id), n.DECISION: decision}


def _add(event: dict[str, Any]) -> None:
    from opentelemetry import trace

    trace.get_current_span().add_event("inbox.decision", event)


def _per_handler(queue: str, inbound: Inbound, handlers: Sequence[str]) -> Iterator[dict[str, str]]:
    # The type only once handlers took the message: before that it is whatever a producer
    # wrote, and every distinct value would be a new time series.
    type_ = inbound.message_type
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
