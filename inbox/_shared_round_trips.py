"""PostgreSQL through psycopg 3: the claim rides the BEGIN's round trip, the claim check the
COMMIT's.

A handler transaction is ``BEGIN; claim; <handler>; check; COMMIT``. Sent one by one, that is
two round trips more than the handler's own transaction. Here:

* ``BEGIN; <claim>`` goes as one query string: one round trip, like a bare ``BEGIN``;
* ``<check>; COMMIT`` goes as one query string: one round trip, like a bare ``COMMIT``.
  The check fails *in the database* (``1 / count(*)``: a division by zero when the claim
  row is gone), and PostgreSQL runs nothing of a query string after a failed statement: the
  ``COMMIT`` never runs and the transaction stays aborted, to be rolled back.

PostgreSQL takes several statements in one message only without bound parameters (the
"simple query" protocol), so the parameters are bound by psycopg itself on the client
(``ClientCursor.mogrify``: psycopg's own quoting for the connection's encoding and settings;
psycopg2 binds every query this way). psycopg's pipeline mode would keep server-side binding,
but measured here it cost more than the round trip it saves: it waits on the socket once per
queued statement (``benchmarks/README.md``, "The claim's round trips").

Both statements still go through SQLAlchemy's ``Connection.execute``: compiled (with any
``schema_translate_map``), logged, passed to the ``before/after_cursor_execute`` events, and
their errors wrapped, with the pool invalidating a lost connection. Only the last step, the
driver's ``cursor.execute``, is taken over, in a ``do_execute`` listener (SQLAlchemy's hook
for exactly that), and only for statements that carry this module's execution option.

psycopg sends its own ``BEGIN`` (a round trip) before the first statement on an idle
connection, so the connection is in autocommit mode for that one call, with the ``BEGIN``
psycopg would have sent (the connection's isolation level, read-only and deferrable
settings) in front of the claim, and then back in transaction mode. psycopg refuses to
change ``autocommit`` while a transaction is open, so the flag is set back directly
(``_autocommit``, which is all its setter changes after that check);
``tests/test_shared_round_trips.py`` is the canary for a psycopg release that changes this.
From there on the connection behaves exactly as if psycopg had begun the transaction.

Off with ``execution_options={"inbox_share_round_trips": False}`` on the engine; never used for
psycopg2, pg8000 or asyncpg.
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

__all__ = ["BEGIN_WITH", "COMMIT_WITH", "DIVISION_BY_ZERO", "OPTION", "shares_round_trips"]

OPTION: Final = "inbox_share_round_trips"
"""The engine execution option that turns this off when False."""

_STEP: Final = "inbox_shared_round_trip"
BEGIN_WITH: Final[Mapping[str, str]] = {_STEP: "begin"}
"""Execution options for the claim: ``BEGIN`` and the claim in one round trip."""
COMMIT_WITH: Final[Mapping[str, str]] = {_STEP: "commit"}
"""Execution options for the claim check: the check and ``COMMIT`` in one round trip."""
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
_BINDER: Final = "inbox.client_binder"  # a ClientCursor kept in the pool record's info
_installed: weakref.WeakSet[Engine] = weakref.WeakSet()
_install_lock = threading.Lock()


def shares_round_trips(connection: Connection) -> bool:
    """Whether the claim and its check can share round trips on ``connection`` (PostgreSQL
    through psycopg 3, not turned off); installs the engine's listener the first time."""
    dialect = connection.dialect
    if dialect.name != "postgresql" or dialect.driver != "psycopg":
        return False
    if connection.get_execution_options().get(OPTION) is False:
        return False
    engine = connection.engine
    if engine not in _installed:
        with _install_lock:
            if engine not in _installed:
                event.listen(engine, "do_execute", _do_execute)
                _installed.add(engine)
    return True


def transaction_status(connection: Connection) -> int:
    """libpq's transaction status of ``connection``'s driver connection (read client-side)."""
    driver: Any = connection.connection.driver_connection
    status: int = driver.info.transaction_status
    return status


def _do_execute(
    cursor: DBAPICursor, statement: str, parameters: Any, context: ExecutionContext
) -> bool:
    step = context.execution_options.get(_STEP)
    if step is None:
        return False  # not ours: the driver executes it as usual
    fairy = context.root_connection.connection
    driver: Any = fairy.driver_connection
    if step == "begin":
        if driver.autocommit or driver.info.transaction_status != _IDLE:
            return False  # a transaction is already open: nothing to begin
        claim = _bind(fairy.info, driver, statement, parameters)
        _set_autocommit(driver)
        try:
            _execute_together(cursor, _begin_statement(driver), claim)
        finally:
            driver._autocommit = False  # the transaction is open (or aborted): psycopg's again
        # On to the claim's result, whose row count SQLAlchemy reads. psycopg's nextset() does
        # no I/O; on the asyncio adapter, past it (whose nextset() awaits it by mistake).
        getattr(cursor, "_cursor", cursor).nextset()
        return True
    if driver.info.transaction_status != _INTRANS:
        raise InboxError("the inbox sends its COMMIT with the check only in an open transaction")
    _execute_together(cursor, _bind(fairy.info, driver, statement, parameters), "COMMIT")
    return True


def _execute_together(cursor: DBAPICursor, *statements: str) -> None:
    # The one place the library sends SQL joined from pieces: a constant BEGIN or COMMIT and
    # a statement SQLAlchemy rendered whose values psycopg bound (_bind). No parameters go
    # with it, so psycopg sends it with the simple query protocol, which runs them in order
    # and stops at the first error.
    cursor.execute("; ".join(statements))


def _bind(info: dict[Any, Any], driver: Any, statement: str, parameters: Any) -> str:
    binder = info.get(_BINDER)
    if binder is None or binder.connection is not driver:
        import psycopg

        client_cursor = psycopg.AsyncClientCursor if _is_async(driver) else psycopg.ClientCursor
        binder = info[_BINDER] = client_cursor(driver)
    query: str = binder.mogrify(statement, parameters)
    return query


def _set_autocommit(driver: Any) -> None:
    if _is_async(driver):
        await_(driver.set_autocommit(True))
    else:
        driver.autocommit = True


def _is_async(driver: Any) -> bool:
    import psycopg  # only ever reached with psycopg connections

    return isinstance(driver, psycopg.AsyncConnection)


def _begin_statement(driver: Any) -> str:
    # What psycopg's Connection._get_tx_start_command() sends, from the public settings.
    parts = ["BEGIN"]
    if driver.isolation_level is not None:
        parts.append(f"ISOLATION LEVEL {_ISOLATION[int(driver.isolation_level)]}")
    if driver.read_only is not None:
        parts.append("READ ONLY" if driver.read_only else "READ WRITE")
    if driver.deferrable is not None:
        parts.append("DEFERRABLE" if driver.deferrable else "NOT DEFERRABLE")
    return " ".join(parts)
