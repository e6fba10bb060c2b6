"""The OpenTelemetry API, when it is installed: the inbox's tracer and instruments.

:data:`INSTRUMENTS` is None without ``opentelemetry-api``: every hook checks it first and
returns, so an inbox without the ``otel`` extra pays one comparison per hook. With the API
but no SDK configured, the instruments are the API's proxies, which do nothing until an SDK
is set (then they forward to it, even if the SDK is configured after ``import inbox``).
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING

from inbox.telemetry import _names as n

if TYPE_CHECKING:
    from opentelemetry.metrics import Counter, Histogram
    from opentelemetry.trace import Tracer

__all__ = ["INSTRUMENTS", "Instruments"]


@dataclass(frozen=True, slots=True)
class Instruments:
    """The tracer and every instrument the inbox records with, made once."""

    tracer: Tracer
    processed: Counter
    duplicates: Counter
    failures: Counter
    retries: Counter
    dead_letters: Counter
    effects: Counter
    outbox_sent: Counter
    outbox_refused: Counter
    consumed: Counter
    claim_duration: Histogram
    handler_duration: Histogram
    message_age: Histogram
    process_duration: Histogram


def _inbox_version() -> str:
    try:
        return version("inbox")
    except PackageNotFoundError:  # running from a source tree that was never installed
        return "0"


def _make() -> Instruments | None:
    try:
        from opentelemetry import metrics, trace
    except ImportError:
        return None
    release = _inbox_version()
    meter = metrics.get_meter(n.SCOPE, release)

    def counter(name: str, unit: str, description: str) -> Counter:
        return meter.create_counter(name, unit, description)

    def seconds(name: str, description: str, buckets: tuple[float, ...]) -> Histogram:
        return meter.create_histogram(
            name, "s", description, explicit_bucket_boundaries_advisory=buckets
        )

    return Instruments(
        tracer=trace.get_tracer(n.SCOPE, release),
        processed=counter(n.PROCESSED, "{run}", "handler runs that committed"),
        duplicates=counter(n.DUPLICATES, "{run}", "handler runs skipped as duplicates"),
        failures=counter(n.FAILURES, "{run}", "handler runs rolled back by an error"),
        retries=counter(n.RETRIES, "{delivery}", "deliveries sent to a retry queue"),
        dead_letters=counter(n.DEAD_LETTERS, "{delivery}", "deliveries dead-lettered"),
        effects=counter(n.EFFECTS, "{effect}", "effects by outcome"),
        outbox_sent=counter(n.OUTBOX_SENT, "{row}", "outbox rows published"),
        outbox_refused=counter(n.OUTBOX_REFUSED, "{row}", "outbox rows the broker refused"),
        consumed=counter(n.CONSUMED, "{message}", "deliveries the worker took"),
        claim_duration=seconds(n.CLAIM_DURATION, "the claim statement", n.SECONDS_BUCKETS),
        handler_duration=seconds(
            n.HANDLER_DURATION, "a handler's transaction, claim to commit", n.SECONDS_BUCKETS
        ),
        message_age=seconds(
            n.MESSAGE_AGE, "from the message's timestamp to its handler's commit", n.AGE_BUCKETS
        ),
        process_duration=seconds(
            n.PROCESS_DURATION, "a delivery, taken to settled", n.SECONDS_BUCKETS
        ),
    )


INSTRUMENTS: Instruments | None = _make()
"""None when ``opentelemetry-api`` is not installed."""
