"""SQLite: the claim and the claim-row read through SQLAlchemy (in process, no round trip);
a statement an exit exception cut short is closed at once."""

from __future__ import annotations

import contextlib

from sqlalchemy.engine import ExceptionContext

from inbox._backends._base import Backend

__all__ = ["SQLiteBackend"]


class SQLiteBackend(Backend):
    """SQLite through sqlite3 or aiosqlite."""

    def __init__(self) -> None:
        self.error_listener = _finish_interrupted_statement


def _finish_interrupted_statement(context: ExceptionContext) -> None:
    """Close the cursor of a statement an exit exception interrupted.

    SQLAlchemy invalidates the connection then, without closing the cursor; SQLite cannot
    close a connection with a statement still pending, so it keeps it as a zombie holding
    the transaction's locks (the claim's write lock) until the cursor is garbage-collected,
    and every other writer waits. With aiosqlite a cancelled ``await`` leaves exactly that:
    the statement still runs on aiosqlite's thread. The close is queued there behind it and
    before the connection's close, so it takes effect even if this task is cancelled again.
    """
    # The execution context's cursor: SQLAlchemy 2.1 leaves ExceptionContext.cursor unset.
    execution = context.execution_context
    cursor = getattr(execution, "cursor", None)
    if isinstance(context.original_exception, Exception) or cursor is None:
        return
    with contextlib.suppress(Exception):  # the connection is being invalidated anyway
        cursor.close()
