"""The handler transaction: refuse sessions the inbox cannot own, keep handlers from ending
it, and refuse to report PROCESSED for a transaction that will not commit."""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Mapping
from typing import Any, Final, NoReturn

from sqlalchemy import Connection, Engine, event
from sqlalchemy.engine import ExceptionContext
from sqlalchemy.orm import Session, SessionTransaction
from sqlalchemy.sql import ClauseElement

from inbox.errors import SessionConfigurationError, TransactionControlError

__all__ = [
    "begin_claim_transaction",
    "ensure_committable",
    "guard_session",
    "refuse_busy_session",
    "transaction_guards",
    "unguard_session",
]

_SESSION_CONTROL: Final = ("commit", "rollback", "close", "reset")
_MYSQL_DIALECTS: Final = ("mysql", "mariadb")
# InnoDB rolls back the whole transaction (savepoints included) on a deadlock.
_MYSQL_TRANSACTION_ABORTING: Final = frozenset({1213})
_ABORTED_BY: Final = "inbox.transaction_aborted_by"
# Connection's own commit step, which every commit of its transaction goes through
# (session.get_transaction().commit(), session.connection().commit()); shadowed on the
# instance while a handler runs, so that a commit from inside a handler never reaches the
# database.
_CONNECTION_COMMIT: Final = "_commit_impl"
_LIBPQ_IN_ERROR: Final = 3  # PQTRANS_INERROR: a statement failed, the transaction is aborted
_watched_engines: weakref.WeakSet[Engine] = weakref.WeakSet()
_watch_lock = threading.Lock()


def refuse_busy_session(session: Session) -> None:
    """Refuse a session already in a transaction: its pending work is not ours to commit or
    roll back, so this is checked before the inbox touches the session at all."""
    if session.in_transaction():
        raise SessionConfigurationError(
            "session_factory returned a session that is already in a transaction; the inbox "
            "needs a fresh session per handler (e.g. sessionmaker(engine))"
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
    if isinstance(bind, Connection) and session.join_transaction_mode != "create_savepoint":
        raise SessionConfigurationError(
            "the session is bound to a Connection: the inbox must own the transaction. Bind "
            "the sessionmaker to an Engine, or use join_transaction_mode='create_savepoint'"
        )
    transaction = session.begin()
    connection = session.connection(bind_arguments={"bind": bind})
    _watch(connection.engine)
    if connection.dialect.name in _MYSQL_DIALECTS:
        connection.info.pop(_ABORTED_BY, None)
    if _autocommits(connection):
        raise SessionConfigurationError(
            "the session's connection is in AUTOCOMMIT mode: the claim would commit without "
            "the handler's writes. Use an engine without isolation_level='AUTOCOMMIT'"
        )
    return transaction, connection


def _watch(engine: Engine) -> None:
    """Listen, once per MySQL/MariaDB engine, for errors after which the server has rolled
    back everything.

    A handler that catches such an error and goes on would otherwise commit its later
    writes in a new implicit transaction, without the claim. Nothing in the driver's state
    shows it afterwards, so the error is remembered on the connection when it happens.
    (Only there: an engine-wide listener makes every statement on the engine a little
    slower, the application's own included.)
    """
    if engine.dialect.name not in _MYSQL_DIALECTS or engine in _watched_engines:
        return
    with _watch_lock:
        if engine not in _watched_engines:
            event.listen(engine, "handle_error", _remember_transaction_abort)
            _watched_engines.add(engine)


def _remember_transaction_abort(context: ExceptionContext) -> None:
    args: tuple[object, ...] = getattr(context.original_exception, "args", ())
    if context.connection is not None and args and args[0] in _MYSQL_TRANSACTION_ABORTING:
        context.connection.info[_ABORTED_BY] = (
            context.sqlalchemy_exception or context.original_exception
        )


def _autocommits(connection: Connection) -> bool:
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
    if connection.dialect.name == "postgresql" and _libpq_transaction_status(connection) == (
        _LIBPQ_IN_ERROR
    ):
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


def transaction_guards(handler: str) -> Mapping[str, Callable[..., NoReturn]]:
    """Stand-ins for the session methods that would end the inbox's transaction, and for the
    connection's commit step."""

    def forbidden(method: str) -> Callable[..., NoReturn]:
        def refuse(*args: object, **kwargs: object) -> NoReturn:
            raise TransactionControlError(
                f"handler {handler!r} called session.{method}(): the inbox owns the "
                "transaction (it commits the claim and your writes together). Use "
                "session.flush() to send writes early, or session.begin_nested() for a "
                "savepoint; raise an exception to roll everything back."
            )

        return refuse

    def refuse_commit(*args: object, **kwargs: object) -> NoReturn:
        raise TransactionControlError(
            f"handler {handler!r} ended the inbox's transaction with a commit; it was refused "
            "and nothing was committed. The inbox commits the claim and your writes together: "
            "never commit in a handler."
        )

    guards = {method: forbidden(method) for method in _SESSION_CONTROL}
    guards[_CONNECTION_COMMIT] = refuse_commit
    return guards


def guard_session(
    session: Session,
    guards: Mapping[str, Callable[..., NoReturn]],
    connection: Connection,
) -> None:
    """Hide the session's transaction-ending methods behind ``guards`` for a handler call,
    and refuse any commit on the claim's connection until :func:`unguard_session`.

    Instance attributes shadow the class methods; the inbox itself always calls the class
    methods (``type(session).commit(session)``), after :func:`unguard_session`.
    """
    for name, guard in guards.items():
        target = connection if name == _CONNECTION_COMMIT else session
        target.__dict__[name] = guard


def unguard_session(session: Session, connection: Connection) -> None:
    """Remove the guards, so a session that outlives the call (scoped_session) is intact."""
    for method in _SESSION_CONTROL:
        session.__dict__.pop(method, None)
    connection.__dict__.pop(_CONNECTION_COMMIT, None)
