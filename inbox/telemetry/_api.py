"""The OpenTelemetry API, when it is installed: the inbox's tracer and instruments, and
whether an SDK is configured.

:data:`INSTRUMENTS` is None without ``opentelemetry-api``. With the API, the instruments are
the API's proxies, made at import; they forward to an SDK once one is set, even after
``import inbox``. Until then every hook returns at once: :func:`tracing` and
:func:`metering` say whether a tracer or meter provider has been set, and recording through
the proxies before that (building attributes, no-op spans, extracting contexts) would cost
microseconds per message for nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING

from inbox.telemetry import _names as n

if TYPE_CHECKING:
    from opentelemetry.metrics import Counter, Histogram
    from opentelemetry.trace import Tracer

__all__ = ["INSTRUMENTS", "Instruments", "configured", "metering", "tracing"]


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
    from inbox._version import DISTRIBUTION, __version__

    try:
        return version(DISTRIBUTION)
    except PackageNotFoundError:  # running from a source tree that was never installed
        return __version__


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


_UNKNOWN = object()


class _Providers:
    """Whether a tracer and a meter provider have been set. OpenTelemetry sets each at most
    once and never unsets it, so a True is kept and only a False is looked at again."""

    __slots__ = ("_metrics_api", "_trace_api", "metrics", "traces")

    def __init__(self) -> None:
        self.traces = self.metrics = False
        self._trace_api: object = None
        self._metrics_api: object = None
        if INSTRUMENTS is not None:
            from opentelemetry import trace
            from opentelemetry.metrics import _internal

            self._trace_api, self._metrics_api = trace, _internal

    # The API's own proxies forward only once these globals are set: the one internal name
    # of each relied on. Were one renamed, every hook would record, which is still correct.
    def tracing(self) -> bool:
        if not self.traces and self._trace_api is not None:
            self.traces = getattr(self._trace_api, "_TRACER_PROVIDER", _UNKNOWN) is not None
        return self.traces

    def metering(self) -> bool:
        if not self.metrics and self._metrics_api is not None:
            self.metrics = getattr(self._metrics_api, "_METER_PROVIDER", _UNKNOWN) is not None
        return self.metrics


_PROVIDERS = _Providers()


def tracing() -> bool:
    """An OpenTelemetry tracer provider has been set (an SDK records spans)."""
    return _PROVIDERS.traces or _PROVIDERS.tracing()


def metering() -> bool:
    """An OpenTelemetry meter provider has been set (an SDK records metrics)."""
    return _PROVIDERS.metrics or _PROVIDERS.metering()


def configured() -> Instruments | None:
    """The instruments when the API is installed and a tracer or meter provider is set;
    None otherwise: then there is nothing to record."""
    if INSTRUMENTS is None or not (tracing() or metering()):
        return None
    return INSTRUMENTS
