"""One audit line for every action the console takes (who, what, on what, how many), on the
``inbox.console.audit`` logger; and, when OpenTelemetry is installed, one span
``inbox.console.action`` carrying the same facts as attributes and an ``inbox.audit``
event. OpenTelemetry stays optional: without it only the line is written.

``inbox console`` sends the lines to stderr (:func:`log_to`), and with ``--audit-file`` also
as JSON lines to a file; an application serving :func:`inbox.console.create_app` itself
configures the logger as it configures its others. The process also keeps the last
:data:`RECENT_KEPT` records for the console's audit page (:func:`recent_audit`), which reads
the audit file instead when one is configured (:mod:`inbox.operations._audit_trail`: the
records of earlier runs and of the ``inbox`` command are there too)."""

from __future__ import annotations

import datetime as dt
import logging
import sys
import threading
from collections import deque
from collections.abc import Mapping
from typing import Final, TextIO

from inbox._oneline import bounded
from inbox.errors import ConfigurationError
from inbox.operations._audit_trail import AuditRecord, audit_line, plain, read_newest

__all__ = [
    "AUDIT_LOGGER",
    "LOG_LEVELS",
    "RECENT_KEPT",
    "AuditJson",
    "AuditRecord",
    "audit",
    "log_to",
    "recent_audit",
]

AUDIT_LOGGER: Final = "inbox.console.audit"
LOG_LEVELS: Final = ("debug", "info", "warning", "error")
"""What ``inbox console --log-level`` takes; the audit lines are ``info``."""
_CONSOLE_LOGGER: Final = "inbox.console"
_FACTS: Final = "inbox_audit"
_HANDLER_NAME: Final = "inbox-console"
_log = logging.getLogger(AUDIT_LOGGER)


def audit(who: str, action: str, count: int, details: Mapping[str, object]) -> None:
    """Record that ``who`` did ``action`` to ``count`` things (``details``: the target, the
    filters, ``dry_run``, ``outcome``...)."""
    who = bounded(who, 100)  # a refused sign-in's user name is whatever was typed
    facts = " ".join(f"{k}={bounded(str(v), 200)!r}" for k, v in details.items())
    record = {"who": who, "action": action, "count": count, **plain(details)}
    _remember(record)
    _log.info(
        "console action by=%r action=%s count=%d %s",
        who,
        action,
        count,
        facts,
        extra={_FACTS: record},
    )
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


RECENT_KEPT: Final = 1000
"""The audit records this process keeps for the console's audit page, at most (the newest)."""
_recent: deque[AuditRecord] = deque(maxlen=RECENT_KEPT)
_recent_lock = threading.Lock()


def _remember(record: Mapping[str, object]) -> None:
    details = {k: v for k, v in record.items() if k not in ("who", "action", "count")}
    count = record["count"]
    remembered = AuditRecord(
        dt.datetime.now(dt.UTC),
        str(record["who"]),
        str(record["action"]),
        count if isinstance(count, int) else 0,
        details,
    )
    with _recent_lock:
        _recent.append(remembered)


def recent_audit(audit_file: str | None = None) -> list[AuditRecord]:
    """The last :data:`RECENT_KEPT` audit records, newest first (what the console's audit
    page shows): of the ``audit_file`` when one is given (read from its end, bounded: those
    of earlier runs and of the ``inbox`` command too), else of this process."""
    if audit_file is not None:
        return read_newest(audit_file, RECENT_KEPT)
    with _recent_lock:
        return list(reversed(_recent))


class AuditJson(logging.Formatter):
    """An audit record as one JSON object: ``time`` (UTC, ISO 8601), ``who``, ``action``,
    ``count`` and the details."""

    def format(self, record: logging.LogRecord) -> str:
        """The record's audit facts as a JSON line (its message for any other record)."""
        facts = getattr(record, _FACTS, None)
        at = dt.datetime.fromtimestamp(record.created, dt.UTC)
        body = facts if isinstance(facts, dict) else {"message": record.getMessage()}
        return audit_line(at, body)


def log_to(level: str, audit_file: str | None = None, stream: TextIO | None = None) -> None:
    """Write the console's log lines (the audit lines among them) at ``level`` and above to
    ``stream`` (stderr by default); with ``audit_file``, also append every audit line to it
    as JSON (:class:`AuditJson`), whatever ``level`` says. A file that cannot be opened is
    a ConfigurationError. Called again, it replaces what it set up before."""
    if level not in LOG_LEVELS:
        raise ConfigurationError(f"unknown log level {level!r}: one of {', '.join(LOG_LEVELS)}")
    handlers: list[logging.Handler] = []
    if audit_file is not None:
        try:
            to_file = logging.FileHandler(audit_file, mode="a", encoding="utf-8")
        except OSError as exc:
            raise ConfigurationError(
                f"cannot open the audit file {audit_file}: {exc.strerror}"
            ) from None
        to_file.setFormatter(AuditJson())
        to_file.setLevel(logging.INFO)
        # Only the audit lines go to the file: the other console lines are not audit facts.
        to_file.addFilter(lambda record: record.name == AUDIT_LOGGER)
        handlers.append(to_file)
    lines = logging.StreamHandler(sys.stderr if stream is None else stream)
    lines.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    lines.setLevel(level.upper())
    handlers.append(lines)
    console = logging.getLogger(_CONSOLE_LOGGER)
    for old in [x for x in console.handlers if x.name == _HANDLER_NAME]:
        console.removeHandler(old)
        old.close()
    for handler in handlers:
        handler.set_name(_HANDLER_NAME)
        console.addHandler(handler)
    # The logger passes the audit lines on whatever the level; each handler filters.
    console.setLevel(min(logging.INFO, logging.getLevelName(level.upper())))
