"""MySQL and MariaDB through PyMySQL: whether the claim's transaction is still open, told
by what the driver saw since the claim (no claim-row read before the ``COMMIT`` on the
common path).

Every answer of the server to a statement carries its status flags (``SERVER_STATUS_IN_TRANS``
among them; PyMySQL keeps the latest as ``Connection.server_status``), but the flags alone
cannot say that the open transaction is still the claim's: ``ROLLBACK AND CHAIN``, a
``ROLLBACK`` under ``completion_type=CHAIN``, a stored procedure or a compound statement
that rolls back and writes again all answer "in a transaction" (measured on MariaDB 10.11),
and after an error packet (a deadlock) the flags are not updated at all. So the backend
watches the commands PyMySQL sends between the claim and the check, from the claim on:

* every one must be a query that cannot end a transaction — DML, ``SELECT`` (stored
  functions and triggers may not commit or roll back: error 1422), SQLAlchemy's savepoint
  statements — written in upper case as SQLAlchemy writes them;
* every one but the last must have succeeded (PyMySQL keeps the result of a query that
  succeeded, ``Connection._result``, until the next command; a failed one leaves None), and
  so must the last;
* the flags at the check must say "in a transaction", not autocommit, no results unread.

Anything else — a ``ROLLBACK`` or ``COMMIT`` (raw or the driver's), ``SET``, ``CALL``, a DDL
statement, a ping, a failed statement, a lower-case statement written by hand, a connection
with ``CLIENT.MULTI_STATEMENTS`` — turns the watch off for this transaction, and the claim
row is read before the ``COMMIT`` exactly as before: correct, one round trip slower.

The watch is the class of the PyMySQL connection, swapped for :class:`_Watched` (a subclass
that only looks at each command before sending it) from the claim to the check, and only
where the connection is exactly PyMySQL's ``Connection`` (a subclass of the application's
keeps the slow path). It relies on three PyMySQL internals, listed in docs/architecture.md
with their canaries: ``_execute_command(command, sql)``, ``_result`` and ``server_status``.

The claim itself is sent on PyMySQL's connection (:mod:`inbox._backends.mysql._claim`). And
the inbox's ``COMMIT`` (or a duplicate's or failed handler's ``ROLLBACK``) is watched the
same way (:class:`_Ending`): when the server answers that no transaction is left open, the
``ROLLBACK`` the pool sends as it takes the connection back is not sent (:class:`_Ended`),
unless any other command came in between.
"""

from __future__ import annotations

from typing import Any, Final

from pymysql.connections import Connection as PyMySQLConnection
from pymysql.constants import CLIENT, COMMAND, SERVER_STATUS
from sqlalchemy import Connection

from inbox._backends._base import Claimed, ClaimRow, TransactionState, statement_listeners
from inbox._backends._claims import Claims
from inbox._backends.mysql._backend import _ABORTED_BY, MySQLBackend
from inbox._backends.mysql._claim import DriverClaim

__all__ = ["PyMySQLBackend", "ending", "still_open", "watch"]

_IN_TRANS: Final = SERVER_STATUS.SERVER_STATUS_IN_TRANS
_NOT_PLAIN: Final = (
    SERVER_STATUS.SERVER_STATUS_AUTOCOMMIT | SERVER_STATUS.SERVER_MORE_RESULTS_EXISTS
)
_MULTI_STATEMENTS: Final = CLIENT.MULTI_STATEMENTS
_COM_QUERY: Final = COMMAND.COM_QUERY
# Queries that cannot end a transaction (other than by failing, which is watched too).
_CANNOT_END: Final = (
    b"INSERT ",
    b"UPDATE ",
    b"DELETE ",
    b"SELECT ",
    b"REPLACE ",
    b"SAVEPOINT ",
    b"RELEASE SAVEPOINT ",
    b"ROLLBACK TO SAVEPOINT ",
)


class _Watched(PyMySQLConnection):  # type: ignore[misc]
    """A PyMySQL connection between the claim and the check: it stops being watched (back to
    PyMySQL's own class) at the first command that could have ended the transaction, or
    that follows a failed one."""

    def _execute_command(self, command: int, sql: Any) -> Any:
        if (
            command != _COM_QUERY
            or self._result is None
            or sql.__class__ is not bytes
            or not sql.startswith(_CANNOT_END)
        ):
            self.__class__ = PyMySQLConnection
        return PyMySQLConnection._execute_command(self, command, sql)


def watch(driver: Any) -> bool:
    """Start watching ``driver`` right after the claim succeeded on it; False (not watched)
    where it cannot be: not exactly PyMySQL's class, multi-statements on, or flags that do
    not say a plain open transaction."""
    if driver.__class__ is not PyMySQLConnection or driver.client_flag & _MULTI_STATEMENTS:
        return False
    status = driver.server_status
    if not status & _IN_TRANS or status & _NOT_PLAIN or driver._result is None:
        return False
    driver.__class__ = _Watched
    return True


def still_open(driver: Any) -> bool:
    """Stop watching ``driver``; True if, since :func:`watch`, nothing could have ended its
    transaction and the flags still say it is open."""
    if driver.__class__ is not _Watched:
        return False
    driver.__class__ = PyMySQLConnection
    status = driver.server_status
    return bool(status & _IN_TRANS) and not status & _NOT_PLAIN and driver._result is not None


class _Ending(PyMySQLConnection):  # type: ignore[misc]
    """A PyMySQL connection whose transaction the inbox is about to end (``COMMIT``, after
    the session's flush, or ``ROLLBACK``): if the server answers that no transaction is
    left open, the ``ROLLBACK`` the pool sends as the connection goes back to it is
    answered here, without a round trip (:class:`_Ended`). Only that answer decides, so the
    statements before it (the session's flush, a ``before_commit`` listener's) change
    nothing; an error answer raises before it is looked at."""

    def commit(self) -> None:
        self.__class__ = PyMySQLConnection
        PyMySQLConnection.commit(self)
        if not self.server_status & _IN_TRANS:
            self.__class__ = _Ended

    def rollback(self) -> None:
        self.__class__ = PyMySQLConnection
        PyMySQLConnection.rollback(self)
        if not self.server_status & _IN_TRANS:
            self.__class__ = _Ended


class _Ended(PyMySQLConnection):  # type: ignore[misc]
    """Right after the server said that the inbox's ``COMMIT`` or ``ROLLBACK`` left no
    transaction open: a ``ROLLBACK`` now would change nothing on the server (no transaction,
    so no lock, no write to undo), and is not sent. Any command turns this off."""

    def _execute_command(self, command: int, sql: Any) -> Any:
        self.__class__ = PyMySQLConnection
        return PyMySQLConnection._execute_command(self, command, sql)

    def rollback(self) -> None:
        self.__class__ = PyMySQLConnection
        if self.server_status & _IN_TRANS:
            PyMySQLConnection.rollback(self)


def ending(driver: Any) -> None:
    """The inbox's next command on ``driver`` ends its transaction: watch its answer (see
    :class:`_Ending`); only on exactly PyMySQL's class, or a watched one."""
    if driver.__class__ is PyMySQLConnection or driver.__class__ is _Watched:
        driver.__class__ = _Ending


class PyMySQLBackend(MySQLBackend):
    """PyMySQL: the claim on the driver's connection, then the transaction watched until the
    check, which is then answered without reading the claim row; no ``ROLLBACK`` sent when
    the pool takes the connection back after the inbox ended its transaction."""

    def __init__(self) -> None:
        super().__init__()
        self._claim = DriverClaim()

    def begin_and_claim(self, connection: Connection, claims: Claims, row: ClaimRow) -> Claimed:
        """The claim on PyMySQL's connection (through SQLAlchemy for a subclass of it, or
        where statement listeners would see it); a won claim's connection watched from here
        on."""
        connection.info.pop(_ABORTED_BY, None)  # before_claims, written out
        driver = connection.connection.dbapi_connection
        if driver.__class__ is PyMySQLConnection and not statement_listeners(connection):
            won_it = self._claim.claim(connection, driver, claims.table, row)
        else:
            won_it = claims.claim(connection, *row)
        if not won_it:
            return Claimed(False, marked=False, alone=False)
        if watch(driver):
            return Claimed(True, marked=True, alone=False, handle=driver)
        return Claimed(True, marked=False, alone=False)

    def state(self, connection: Connection, claimed: Claimed) -> TransactionState:
        """ABORTED after a deadlock; OPEN if the watch saw nothing that could have ended the
        transaction (the watch ends here); else unknown (read the row)."""
        state = super().state(connection, claimed)
        driver = claimed.handle
        if (
            driver is not None
            and still_open(driver)
            and state is TransactionState.UNKNOWN
            and connection.connection.dbapi_connection is driver
        ):
            # The COMMIT follows (a before_commit listener's statement would turn this off).
            driver.__class__ = _Ending
            return TransactionState.OPEN
        return state

    def before_rollback(self, connection: Connection) -> None:
        """Stop watching; the rollback that follows is the inbox's (a duplicate's, a failed
        handler's)."""
        ending(connection.connection.dbapi_connection)
