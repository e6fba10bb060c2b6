"""The log output of the command-line processes: one line per event, as text or JSON.

A record's traceback is written only when asked for (``--tracebacks``, or ``DEBUG``): it is
SQLAlchemy's full rendering of a database error, SQL and bound parameters included. Without
it every record is one line, line breaks in its message shown as `` | ``.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
from typing import Final, TextIO

from inbox._oneline import bounded

__all__ = ["LOG_FORMATS", "configure_logging"]

LOG_FORMATS: Final = ("text", "json")
_TEXT_FORMAT: Final = "%(asctime)s %(levelname)s %(name)s: %(message)s"
_MAX_LINE: Final = 4000


class _OneLineFormatter(logging.Formatter):
    """Text records without their tracebacks: one line per event."""

    def format(self, record: logging.LogRecord) -> str:
        saved = record.exc_info, record.exc_text, record.stack_info
        record.exc_info = record.exc_text = record.stack_info = None
        try:
            return bounded(super().format(record), _MAX_LINE)
        finally:
            record.exc_info, record.exc_text, record.stack_info = saved


class _JsonFormatter(logging.Formatter):
    """One JSON object per record: ``time`` (UTC, ISO 8601), ``level``, ``logger``,
    ``message``, and ``traceback`` when tracebacks are asked for."""

    def __init__(self, tracebacks: bool) -> None:
        super().__init__()
        self._tracebacks = tracebacks

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": dt.datetime.fromtimestamp(record.created, dt.UTC).isoformat(
                timespec="milliseconds"
            ),
            "level": record.levelname,
            "logger": record.name,
            "message": bounded(record.getMessage(), _MAX_LINE),
        }
        if self._tracebacks and record.exc_info:
            entry["traceback"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False, default=str)


def configure_logging(
    level: str, tracebacks: bool, stream: TextIO, log_format: str = "text"
) -> None:
    """Send the process's log records to ``stream`` at ``level`` in ``log_format``."""
    tracebacks = tracebacks or level == "DEBUG"
    formatter: logging.Formatter
    if log_format == "json":
        formatter = _JsonFormatter(tracebacks)
    elif tracebacks:
        formatter = logging.Formatter(_TEXT_FORMAT)
    else:
        formatter = _OneLineFormatter(_TEXT_FORMAT)
    handler = logging.StreamHandler(stream)
    handler.setFormatter(formatter)
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(level)
    if level != "DEBUG":
        # One line per event: the worker logs each failure, dead letter and skipped duplicate
        # itself (under inbox.worker), so the core's per-handler lines (and kombu's
        # connection chatter) are for DEBUG only.
        logging.getLogger("inbox.core").setLevel(logging.ERROR)
        logging.getLogger("kombu").setLevel(logging.WARNING)
        logging.getLogger("amqp").setLevel(logging.WARNING)
        logging.getLogger("alembic").setLevel(logging.WARNING)  # reading the revisions at start
