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

import time
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Final

from inbox.telemetry import _names as n

if TYPE_CHECKING:
    from opentelemetry.metrics import Counter, Histogram
    from opentelemetry.trace import Tracer

__all__ = [
    "INSTRUMENTS",
    "Instruments",
    "any_provider",
    "configured",
    "metering",
    "refresh",
    "tracing",
]


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


class _Providers:
    """Whether a tracer and a meter provider have been set, asked through the public API.

    OpenTelemetry sets each at most once and never unsets it, so a True is kept; a False is
    looked at again at most once a second (an application configures its SDK at start;
    asking on every message would cost more than the message's telemetry).
    """

    __slots__ = ("_next_look", "metrics", "traces")

    def __init__(self) -> None:
        self.traces = self.metrics = False
        self._next_look = 0.0

    def tracing(self) -> bool:
        """A tracer provider has been set."""
        if not self.traces and time.monotonic() >= self._next_look:
            self._look()
        return self.traces

    def metering(self) -> bool:
        """A meter provider has been set."""
        if not self.metrics and time.monotonic() >= self._next_look:
            self._look()
        return self.metrics

    def any(self) -> bool:
        """A tracer or a meter provider has been set."""
        if not (self.traces or self.metrics) and time.monotonic() >= self._next_look:
            self._look()
        return self.traces or self.metrics

    def refresh(self) -> None:
        """Look at once, at the next question, for a provider set since the last look."""
        self._next_look = 0.0

    def _look(self) -> None:
        if INSTRUMENTS is None:
            self._next_look = float("inf")
            return
        self._next_look = time.monotonic() + _LOOK_AGAIN
        from opentelemetry import metrics, trace

        # Before a provider is set, each getter returns the API's proxy: for traces a public
        # class; for metrics a private one, told by name (were it renamed, the inbox would
        # record through the proxy: still correct, only costlier). tests/test_telemetry.py
        # is the canary.
        self.traces = not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)
        self.metrics = type(metrics.get_meter_provider()).__name__ != _METER_PROXY


_LOOK_AGAIN: Final = 1.0  # seconds
_METER_PROXY: Final = "_ProxyMeterProvider"
_PROVIDERS = _Providers()
tracing = _PROVIDERS.tracing
"""An OpenTelemetry tracer provider has been set (an SDK records spans)."""
metering = _PROVIDERS.metering
"""An OpenTelemetry meter provider has been set (an SDK records metrics)."""
any_provider = _PROVIDERS.any
"""An OpenTelemetry tracer or meter provider has been set."""
refresh = _PROVIDERS.refresh
"""Look for a provider set since the inbox last looked (it looks at most once a second)."""


def configured() -> Instruments | None:
    """The instruments when the API is installed and a tracer or meter provider is set;
    None otherwise: then there is nothing to record."""
    if INSTRUMENTS is None or not _PROVIDERS.any():
        return None
    return INSTRUMENTS
