"""One audit line for every action the console takes (who, what, on what, how many), on the
``inbox.console.audit`` logger; and, when OpenTelemetry is installed, one span
``inbox.console.action`` carrying the same facts as attributes and an ``inbox.audit``
event. OpenTelemetry stays optional: without it only the line is written."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Final

from inbox._oneline import bounded

__all__ = ["AUDIT_LOGGER", "audit"]

AUDIT_LOGGER: Final = "inbox.console.audit"
_log = logging.getLogger(AUDIT_LOGGER)


def audit(who: str, action: str, count: int, details: Mapping[str, object]) -> None:
    """Record that ``who`` did ``action`` to ``count`` things (``details``: the target, the
    filters, ``dry_run``, ``outcome``...)."""
    facts = " ".join(f"{k}={bounded(str(v), 200)!r}" for k, v in details.items())
    _log.info("console action by=%r action=%s count=%d %s", who, action, count, facts)
    try:
        from opentelemetry import trace
    except ImportError:
        return
    attributes: dict[str, str | int | bool] = {
        "inbox.console.who": who,
        "inbox.console.action": action,
        "inbox.console.count": count,
    }
    for key, value in details.items():
        attributes[f"inbox.console.{key}"] = (
            value if isinstance(value, bool | int) else bounded(str(value), 200)
        )
    tracer = trace.get_tracer("inbox.console")
    with tracer.start_as_current_span("inbox.console.action", attributes=attributes) as span:
        span.add_event("inbox.audit", attributes)
