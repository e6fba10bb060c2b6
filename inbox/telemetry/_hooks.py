"""Hooks for the parts of the inbox outside the core: effects, the outbox relay, and the
decisions of edges that settle deliveries their own way (Celery's retries and dead letters)."""

from __future__ import annotations

from typing import Any

from inbox.errors import ConfigurationError
from inbox.telemetry import _names as n
from inbox.telemetry._api import INSTRUMENTS, metering, tracing

__all__ = ["record_decision", "record_effect", "record_outbox"]


def record_effect(outcome: str, handler: str, step: str) -> None:
    """Count one effect of ``handler`` at ``step`` that ended with ``outcome`` (for
    example ``"done"``, ``"skipped"``, ``"failed"``): ``inbox.effects``."""
    if INSTRUMENTS is None or not metering():
        return
    INSTRUMENTS.effects.add(1, {n.OUTCOME: outcome, n.HANDLER: handler, n.STEP: step})


def record_outbox(*, sent: int = 0, refused: int = 0, destination: str = "") -> None:
    """Count outbox rows the relay published (``sent``) and rows the broker refused
    (``refused``): ``inbox.outbox.sent``, ``inbox.outbox.refused``."""
    if INSTRUMENTS is None or not metering():
        return
    attributes = {n.DESTINATION: destination}
    if sent:
        INSTRUMENTS.outbox_sent.add(sent, attributes)
    if refused:
        INSTRUMENTS.outbox_refused.add(refused, attributes)


def record_decision(
    decision: str,
    *,
    handler: str,
    destination: str,
    message_id: str,
    reason: str | None = None,
    tries: int | None = None,
) -> None:
    """Record a delivery of ``handler``'s message sent to be retried (``decision="retry"``:
    ``inbox.retries``) or dead-lettered (``"dead-letter"`` with its ``reason``:
    ``inbox.dead_letters``), from ``destination``, as the kombu worker records its own: the
    counter, and an ``inbox.decision`` event on the current span (status ERROR for a dead
    letter). The message type is the handler's name (a Celery task's name)."""
    if decision not in ("retry", "dead-letter"):
        raise ConfigurationError(f"decision must be 'retry' or 'dead-letter', got {decision!r}")
    if INSTRUMENTS is None:
        return
    attributes = {n.DESTINATION: destination, n.HANDLER: handler, n.MESSAGE_TYPE: handler}
    if metering():
        if decision == "retry":
            INSTRUMENTS.retries.add(1, attributes)
        else:
            INSTRUMENTS.dead_letters.add(1, {**attributes, n.REASON: reason or ""})
    if tracing():
        from opentelemetry import trace

        event: dict[str, Any] = {n.MESSAGE_ID: message_id, n.DECISION: decision}
        if reason is not None:
            event[n.REASON] = reason
        if tries is not None:
            event[n.TRIES] = tries
        span = trace.get_current_span()
        if decision == "dead-letter":
            span.set_status(trace.StatusCode.ERROR, reason or decision)
        span.add_event("inbox.decision", event)
