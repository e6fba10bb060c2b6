"""PostgreSQL through psycopg 3: the claim rides the BEGIN's round trip, the claim check the
COMMIT's.

A handler transaction is ``BEGIN; claim; <handler>; check; COMMIT``. Sent one by one that is
two round trips more than the handler's own transaction. psycopg's pipeline mode sends
several statements and waits once, so here:

* ``BEGIN`` and the claim go in one pipeline: one round trip, like a bare ``BEGIN``;
* the claim check and ``COMMIT`` go in one pipeline: one round trip, like a bare ``COMMIT``.
  The check fails *in the database* (``1 / count(*)``: a division by zero when the claim
  row is gone), so the server skips the ``COMMIT`` queued behind it and nothing commits.

Both statements still go through SQLAlchemy's ``Connection.execute``: compiled (with any
``schema_translate_map``), logged, passed to the ``before/after_cursor_execute`` events, and
their errors wrapped, with the pool invalidating a lost connection. Only the last step, the
driver's ``cursor.execute``, is taken over, in a ``do_execute`` listener (SQLAlchemy's hook
for exactly that), and only for statements that carry this module's execution option.

Why psycopg's own BEGIN cannot be used: in pipeline mode psycopg syncs after the implicit
``BEGIN`` and waits for it (a round trip of its own). So the connection is put in autocommit
mode for the pipeline, which sends our ``BEGIN`` (the same text psycopg would send, with the
connection's isolation level, read-only and deferrable settings), and then back in
transaction mode. psycopg refuses to change ``autocommit`` while a transaction is open, so
the flag is set back directly (``_autocommit``, which is all its setter changes after that
check); ``tests/test_pipeline.py`` is the canary for a psycopg release that changes this.
From there on the connection behaves exactly as if psycopg had begun the transaction.

Off with ``execution_options={"inbox_pipeline": False}`` on the engine (a proxy that does not
support the extended protocol's pipelining), and never used for psycopg2, pg8000, asyncpg
or where libpq lacks pipeline support.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Mapping
from typing import Any, Final

from sqlalchemy import Connection, Engine, event
from sqlalchemy.engine.interfaces import DBAPICursor, ExecutionContext
from sqlalchemy.util import await_

from inbox.errors import InboxError

__all__ = ["BEGIN_WITH", "COMMIT_WITH", "DIVISION_BY_ZERO", "pipelines"]

OPTION: Final = "inbox_pipeline"
"""The engine execution option that turns pipelining off when False."""

_STEP: Final = "inbox_pipeline_step"
BEGIN_WITH: Final[Mapping[str, str]] = {_STEP: "begin"}
"""Execution options for the claim: send ``BEGIN`` and the claim in one round trip."""
COMMIT_WITH: Final[Mapping[str, str]] = {_STEP: "commit"}
"""Execution options for the claim check: send it and ``COMMIT`` in one round trip."""
DIVISION_BY_ZERO: Final = "22012"
"""The SQLSTATE of a failed claim check (``1 / count(*)`` with no claim row)."""

_IDLE: Final = 0  # libpq's PQTRANS_IDLE
_INTRANS: Final = 2  # PQTRANS_INTRANS
_ISOLATION: Final = {
    1: "READ UNCOMMITTED",
    2: "READ COMMITTED",
    3: "REPEATABLE READ",
    4: "SERIALIZABLE",
}  # psycopg.IsolationLevel, by value
_installed: weakref.WeakSet[Engine] = weakref.WeakSet()
_install_lock = threading.Lock()


def pipelines(connection: Connection) -> bool:
    """Whether the claim and its check can share round trips on ``connection`` (PostgreSQL
    through psycopg 3 with pipeline support, not turned off); installs the engine's listener
    the first time."""
    dialect = connection.dialect
    if dialect.name != "postgresql" or dialect.driver != "psycopg":
        return False
    if connection.get_execution_options().get(OPTION) is False:
        return False
    engine = connection.engine
    if engine in _installed:
        return True
    import psycopg

    if not psycopg.Pipeline.is_supported():
        return False
    with _install_lock:
        if engine not in _installed:
            event.listen(engine, "do_execute", _do_execute)
            _installed.add(engine)
    return True


def transaction_status(connection: Connection) -> int:
    """libpq's transaction status of ``connection``'s driver connection (read client-side)."""
    status: int = connection.connection.dbapi_connection.info.transaction_status  # type: ignore[union-attr]
    return status


def _do_execute(
    cursor: DBAPICursor, statement: str, parameters: Any, context: ExecutionContext
) -> bool:
    step = context.execution_options.get(_STEP)
    if step is None:
        return False  # not ours: the driver executes it as usual
    raw_cursor: Any = getattr(cursor, "_cursor", cursor)  # the asyncio adapter wraps it
    if step == "begin":
        return _begin_with(cursor, raw_cursor, statement, parameters)
    _commit_with(cursor, raw_cursor, statement, parameters)
    return True


def _begin_with(cursor: DBAPICursor, raw_cursor: Any, statement: str, parameters: Any) -> bool:
    connection = raw_cursor.connection
    if connection.autocommit or connection.info.transaction_status != _IDLE:
        return False  # a transaction is already open (or none will be): nothing to begin
    begin = _begin_statement(connection)
    if raw_cursor is cursor:
        connection.autocommit = True
        try:
            with connection.pipeline():
                connection.execute(begin)
                raw_cursor.execute(statement, parameters)
        finally:
            connection._autocommit = False
    else:
        await_(_begin_with_async(connection, raw_cursor, begin, statement, parameters))
    return True


async def _begin_with_async(
    connection: Any, raw_cursor: Any, begin: str, statement: str, parameters: Any
) -> None:
    await connection.set_autocommit(True)
    try:
        async with connection.pipeline():
            await connection.execute(begin)
            await raw_cursor.execute(statement, parameters)
    finally:
        connection._autocommit = False


def _commit_with(cursor: DBAPICursor, raw_cursor: Any, statement: str, parameters: Any) -> None:
    connection = raw_cursor.connection
    if connection.info.transaction_status != _INTRANS:
        raise InboxError("the inbox pipelines its COMMIT only in an open transaction")
    # COMMIT as a statement, not connection.commit(): that syncs, and leaving the pipeline
    # syncs again, a round trip with nothing in it.
    if raw_cursor is cursor:
        with connection.pipeline():
            raw_cursor.execute(statement, parameters)
            connection.execute("COMMIT")
    else:
        await_(_commit_with_async(connection, raw_cursor, statement, parameters))


async def _commit_with_async(
    connection: Any, raw_cursor: Any, statement: str, parameters: Any
) -> None:
    async with connection.pipeline():
        await raw_cursor.execute(statement, parameters)
        await connection.execute("COMMIT")


def _begin_statement(connection: Any) -> str:
    # What psycopg's Connection._get_tx_start_command() sends, from the public settings.
    parts = ["BEGIN"]
    if connection.isolation_level is not None:
        parts.append(f"ISOLATION LEVEL {_ISOLATION[int(connection.isolation_level)]}")
    if connection.read_only is not None:
        parts.append("READ ONLY" if connection.read_only else "READ WRITE")
    if connection.deferrable is not None:
        parts.append("DEFERRABLE" if connection.deferrable else "NOT DEFERRABLE")
    return " ".join(parts)
