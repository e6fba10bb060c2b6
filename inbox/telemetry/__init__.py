"""Metrics and traces through OpenTelemetry, when ``opentelemetry-api`` is installed
(``pip install 'sqlalchemy-inbox[otel]'``); without it, or before a tracer or meter provider is
set, nothing is recorded and each hook returns after a check. The inbox never configures an SDK
itself (except ``inbox-worker --metrics-port``): configure one in your application as usual.
It looks for a newly set provider at most once a second; :func:`refresh` after setting one
makes the very next message recorded.

What is recorded, under which names, is in docs/operations.md, "Metrics and traces".
"""

from __future__ import annotations

from inbox.telemetry._api import INSTRUMENTS, refresh
from inbox.telemetry._context import extract_context, inject_context
from inbox.telemetry._hooks import record_decision, record_effect, record_outbox

__all__ = [
    "ENABLED",
    "extract_context",
    "inject_context",
    "record_decision",
    "record_effect",
    "record_outbox",
    "refresh",
]

ENABLED: bool = INSTRUMENTS is not None
"""True when ``opentelemetry-api`` is installed (whether or not an SDK is configured)."""
