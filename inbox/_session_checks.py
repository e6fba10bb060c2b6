"""Checks around the handler transaction that read client-side state: sessions the inbox
cannot own are refused before anything is written, and a transaction the database has
already aborted is never reported as committable."""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections.abc import Callable
from typing import Any, Final

from sqlalchemy import Connection, Dialect, Engine, event
from sqlalchemy.engine import ExceptionContext
from sqlalchemy.exc import UnboundExecutionError
from sqlalchemy.orm import Session, SessionTransaction
from sqlalchemy.sql import ClauseElement

from inbox._claim import check_supported
from inbox.errors import SessionConfigurationError, TransactionControlError

__all__ = [
    "autocommits",
    "begin_claim_transaction",
    "check_session_factory",
    "ensure_committable",
    "refuse_busy_session",
]

_MYSQL_DIALECTS: Final = ("mysql", "mariadb")
# InnoDB rolls back the whole transaction (savepoints included) on a deadlock.
_MYSQL_TRANSACTION_ABORTING: Final = frozenset({1213})
_ABORTED_BY: Final = "inbox.transaction_aborted_by"
_LIBPQ_IDLE: Final = 0  # PQTRANS_IDLE: no transaction open
_LIBPQ_IN_ERROR: Final = 3  # PQTRANS_INERROR: a statement failed, the transaction is aborted
_watched_engines: weakref.WeakSet[Engine] = weakref.WeakSet()
_watch_lock = threading.Lock()


def refuse_busy_session(session: Session) -> None:
    """Refuse a session already in a transaction: its pending work is not ours to commit or
    roll back, so this is checked before the inbox touches the session at all."""
    if not isinstance(session, Session):
        raise SessionConfigurationError(
            f"session_factory must return a sqlalchemy.orm.Session, got {type(session).__name__}"
        )
    if session.in_transaction():
        raise SessionConfigurationError(
            "session_factory returned a session that is already in a transaction; the inbox "
            "needs a fresh session per handler (e.g. sessionmaker(engine))"
        )


def check_session_factory(
    session_factory: Callable[[], Session],
    claim_statement: ClauseElement,
    *,
    asynchronous: bool = False,
) -> None:
    """Refuse, when the inbox is made, a session factory it could never use: sessions that
    come already in a transaction or bound to an outer Connection, and a database dialect or
    driver the inbox is not tested on. Nothing connects to the database here.

    A factory not bound yet (``sessionmaker()`` configured later) passes; the same checks
    then run on the first message, raising the same errors.
    """
    session = session_factory()
    if not isinstance(session, Session):
        return  # a stand-in for now; refuse_busy_session() refuses it if it is ever used
    refuse_busy_session(session)  # before the try: a busy session is not ours to close
    try:
        try:
            bind = session.get_bind(clause=claim_statement)
        except UnboundExecutionError:
            return
        _refuse_shared_transaction(session, bind)
        check_supported(bind.dialect)
        _refuse_other_flavour(bind.dialect, asynchronous=asynchronous)
    finally:
        type(session).close(session)


def _refuse_other_flavour(dialect: Dialect, *, asynchronous: bool) -> None:
    # (The other way round SQLAlchemy refuses already: an AsyncSession takes no blocking
    # engine.) A blocking Session on an asyncio engine would fail on its first statement.
    if dialect.is_async and not asynchronous:
        raise SessionConfigurationError(
            f"the {dialect.name}+{dialect.driver} engine is an asyncio engine: use "
            "inbox.aio.AsyncInbox with an async_sessionmaker, or a blocking driver"
        )


def _refuse_shared_transaction(session: Session, bind: Engine | Connection) -> None:
    if isinstance(bind, Connection) and session.join_transaction_mode != "create_savepoint":
        raise SessionConfigurationError(
            "the session is bound to a Connection: the inbox must own the transaction. Bind "
            "the sessionmaker to an Engine, or use join_transaction_mode='create_savepoint'"
        )


def begin_claim_transaction(
    session: Session, claim_statement: ClauseElement
) -> tuple[SessionTransaction, Connection]:
    """Begin the session's transaction and return it with the connection the claim uses.

    Refuses, before anything is written, a session the inbox cannot own: one that joins a
    transaction of an outer ``Connection`` (the inbox's rollback of a duplicate would roll
    that back too), and one in autocommit mode (the claim would commit on its own, so a
    failing handler would leave it behind and its message would never run again).
    """
    bind = session.get_bind(clause=claim_statement)
    _refuse_shared_transaction(session, bind)
    transaction = session.begin()
    connection = session.connection(bind_arguments={"bind": bind})
    _watch(connection.engine)
    if connection.dialect.name in _MYSQL_DIALECTS:
        connection.info.pop(_ABORTED_BY, None)
    if autocommits(connection):
        raise SessionConfigurationError(
            "the session's connection is in AUTOCOMMIT mode: the claim would commit without "
            "the handler's writes. Use an engine without isolation_level='AUTOCOMMIT'"
        )
    return transaction, connection


def _watch(engine: Engine) -> None:
    """Listen, once per MySQL/MariaDB or SQLite engine, for the errors the inbox must act on
    as they happen.

    MySQL/MariaDB: errors after which the server has rolled back everything. A handler that
    catches such an error and goes on would otherwise commit its later writes in a new
    implicit transaction, without the claim. Nothing in the driver's state shows it
    afterwards, so the error is remembered on the connection when it happens.

    SQLite: a statement cut short by a cancellation (or another exit exception) mid-execute;
    see :func:`_finish_interrupted_statement`.

    (Only these: an engine-wide listener makes every statement on the engine a little
    slower, the application's own included.)
    """
    listener = _LISTENERS.get(engine.dialect.name)
    if listener is None or engine in _watched_engines:
        return
    with _watch_lock:
        if engine not in _watched_engines:
            event.listen(engine, "handle_error", listener)
            _watched_engines.add(engine)


def _finish_interrupted_statement(context: ExceptionContext) -> None:
    """Close the cursor of a statement an exit exception interrupted, on SQLite.

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


def _remember_transaction_abort(context: ExceptionContext) -> None:
    args: tuple[object, ...] = getattr(context.original_exception, "args", ())
    if context.connection is not None and args and args[0] in _MYSQL_TRANSACTION_ABORTING:
        context.connection.info[_ABORTED_BY] = (
            context.sqlalchemy_exception or context.original_exception
        )


_LISTENERS: Final[dict[str, Callable[[ExceptionContext], None]]] = {
    "mysql": _remember_transaction_abort,
    "mariadb": _remember_transaction_abort,
    "sqlite": _finish_interrupted_statement,
}


def autocommits(connection: Connection) -> bool:
    """Whether the driver connection commits every statement itself (read client-side)."""
    if connection.get_execution_options().get("isolation_level") == "AUTOCOMMIT":
        return True
    driver: Any = connection.connection.dbapi_connection
    if getattr(driver, "autocommit", None) is True:  # psycopg; sqlite3 on Python >= 3.12
        return True
    dialect = connection.dialect.name
    if dialect == "sqlite":
        # isolation_level None is also SQLAlchemy's recipe for real SAVEPOINTs, with a
        # "begin" listener that emits BEGIN itself: then a transaction is open by now.
        return getattr(driver, "isolation_level", "") is None and not driver.in_transaction
    if dialect in _MYSQL_DIALECTS:
        get_autocommit = getattr(driver, "get_autocommit", None)
        return bool(get_autocommit()) if callable(get_autocommit) else False
    return False


def ensure_committable(
    session: Session, transaction: SessionTransaction, connection: Connection, handler: str
) -> None:
    """Raise unless ``transaction`` is still the session's live transaction, able to commit.

    Catches a handler that ended the transaction behind the guards (``get_transaction()
    .commit()``, ``connection().commit()``), and a handler that swallowed a database error
    after which the server had already rolled back: on MySQL a deadlock (the claim is gone,
    later writes would commit alone; raised so that the inbox re-runs it), on PostgreSQL any
    error outside a savepoint (its COMMIT would silently roll back while the inbox reported
    the message as processed).
    """
    if session.get_transaction() is not transaction or not transaction.is_active:
        raise TransactionControlError(
            f"handler {handler!r} ended the inbox's transaction; writes it made before that "
            "may have been committed without the rest. Never end the session's transaction "
            "in a handler."
        )
    aborted_by = connection.info.pop(_ABORTED_BY, None)
    if aborted_by is not None:
        # Raised from the deadlock itself, so the inbox re-runs the transaction (transient).
        raise TransactionControlError(
            f"handler {handler!r} returned normally, but the database rolled back its whole "
            "transaction (a deadlock was caught and ignored?): the claim and the writes "
            "before it are gone, and committing the rest would apply it partially."
        ) from aborted_by
    status = (
        _libpq_transaction_status(connection) if connection.dialect.name == "postgresql" else None
    )
    if status == _LIBPQ_IDLE:
        raise TransactionControlError(
            f"handler(s) {handler} ended the inbox's transaction (a raw COMMIT or ROLLBACK, or "
            "the driver's commit()/rollback()) and PostgreSQL is no longer in a transaction. "
            "Statements after that may have been committed one by one (psycopg2 runs them "
            "outside any transaction): this message needs reconciling, not a retry."
        )
    if status == _LIBPQ_IN_ERROR:
        raise TransactionControlError(
            f"handler {handler!r} returned normally, but a statement in its transaction "
            "failed and PostgreSQL aborted the transaction (was a database error caught and "
            "ignored?); nothing was committed. Let database errors propagate, or use "
            "session.begin_nested() around statements that may fail."
        )


def _libpq_transaction_status(connection: Connection) -> object:
    # psycopg 3 (an IntEnum) and psycopg2 (an int) both expose libpq's PQtransactionStatus.
    info = getattr(connection.connection.dbapi_connection, "info", None)
    return getattr(info, "transaction_status", None)
