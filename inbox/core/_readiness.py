"""Is the database ready for a worker right now? For ``/readyz``: reachable (``SELECT 1``
through the inbox's own engine) and its tables at the revision this version needs (the start
check, :func:`inbox.core._startup.check_schema`)."""

from __future__ import annotations

from sqlalchemy import literal, select

from inbox._oneline import database_error_line
from inbox.core._registration import AnyInbox
from inbox.core._startup import SchemaNotReady, check_schema, worker_engine, worker_tables

__all__ = ["database_not_ready"]


def database_not_ready(inbox: AnyInbox) -> str | None:
    """Why the database is not ready for ``inbox``'s worker, on one line without secrets;
    None when it is (or when the inbox's sessions are not bound to an engine: then there is
    nothing to check before a session binds one, as at start)."""
    engine = worker_engine(inbox)
    if engine is None:
        return None
    try:
        with engine.connect() as connection:
            connection.execute(select(literal(1))).scalar_one()
        check_schema(engine, worker_tables(inbox))
    except SchemaNotReady as exc:
        return str(exc)
    except Exception as exc:  # unreachable, refused, dropped: one line, no SQL, no secrets
        return database_error_line(exc, engine.url)
    return None
