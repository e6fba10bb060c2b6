"""Trace context in message headers: W3C ``traceparent``/``tracestate`` read and written
through the globally configured propagator, tolerating headers a foreign producer mangled."""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from typing import TYPE_CHECKING, Any

from inbox.telemetry._api import INSTRUMENTS, tracing

if TYPE_CHECKING:
    from opentelemetry.context import Context

__all__ = ["extract_context", "inject_context"]


def extract_context(headers: Mapping[str, Any] | None) -> Context | None:
    """The producer's context from ``headers``; None without OpenTelemetry. Header values
    that are not text (a foreign producer's bytes or numbers) are ignored, never raised."""
    if INSTRUMENTS is None:
        return None
    from opentelemetry import propagate

    return propagate.extract(headers or {}, getter=_GETTER)


def inject_context(headers: MutableMapping[str, Any]) -> None:
    """Write the current trace context into ``headers`` (``traceparent``, ``tracestate``),
    keeping any value already there: a caller's explicit context wins. Nothing without
    OpenTelemetry or before a tracer provider is set."""
    if INSTRUMENTS is None or not tracing():
        return
    from opentelemetry import propagate

    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    for key, value in carrier.items():
        headers.setdefault(key, value)


def _make_getter() -> Any:
    if INSTRUMENTS is None:
        return None
    from opentelemetry.propagators.textmap import Getter

    class TextHeaders(Getter[Mapping[str, Any]]):
        """Only ``str`` values count; anything else reads as absent."""

        def get(self, carrier: Mapping[str, Any], key: str) -> list[str] | None:
            value = carrier.get(key)
            return [value] if isinstance(value, str) else None

        def keys(self, carrier: Mapping[str, Any]) -> list[str]:
            return [key for key in carrier if isinstance(key, str)]

    return TextHeaders()


_GETTER = _make_getter()
