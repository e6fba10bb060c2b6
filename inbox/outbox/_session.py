"""The session a publish joins: a ``Session``, an ``AsyncSession`` (through its synchronous
side), or a ``scoped_session`` / ``async_scoped_session`` of them; and the refusal of one
whose writes would commit one by one.

An outbox row written in autocommit mode would be sent even if the application's later
work failed, and the business write before it could commit without the row: exactly the
dual write the outbox exists to prevent. A blocking session is checked at the call, on the
connection its flush will use (taking it from the pool if the transaction has none yet: no
statement is sent). An ``AsyncSession`` cannot take a connection without an ``await``, so
at the call only its engine's settings are read, and its connection is checked when the
flush that would write the row begins, before any of that flush's statements.
"""

from __future__ import annotations

import sys
from typing import Any, Final

from sqlalchemy import Connection, Engine, event
from sqlalchemy.exc import UnboundExecutionError
from sqlalchemy.orm import Mapper, Session, scoped_session

from inbox._backends._autocommit import autocommits
from inbox.errors import SessionConfigurationError
from inbox.outbox._mapping import OutboxRecord

__all__ = ["joined_session"]

_AUTOCOMMIT: Final = "AUTOCOMMIT"
_LISTENING: Final = "inbox.outbox.checks_flushes"


def joined_session(session: object, mapper: Mapper[Any]) -> Session:
    """The blocking ``Session`` behind ``session``, after refusing one in autocommit mode or
    without a bind for the outbox table."""
    session = _in_scope(session)
    if isinstance(session, Session):
        _refuse_no_transaction(session)
        _refuse_autocommit_now(session, mapper)
        return session
    sync_session = getattr(session, "sync_session", None)  # AsyncSession, without importing it
    if isinstance(sync_session, Session):
        _refuse_no_transaction(sync_session)
        _refuse_autocommit_soon(sync_session, mapper)
        return sync_session
    raise SessionConfigurationError(
        "outbox.publish() takes the sqlalchemy Session (or AsyncSession) whose transaction "
        f"the message belongs to, got {type(session).__name__}"
    )


def _in_scope(session: object) -> object:
    """The current session of a ``scoped_session`` or ``async_scoped_session``."""
    if isinstance(session, scoped_session):
        return session()
    # Only if the application imported SQLAlchemy's asyncio layer (which needs greenlet).
    aio = sys.modules.get("sqlalchemy.ext.asyncio")
    if aio is not None and isinstance(session, aio.async_scoped_session):
        current: object = session()
        return current
    return session


def _refuse_no_transaction(session: Session) -> None:
    if not session.autobegin and not session.in_transaction():
        raise SessionConfigurationError(
            "the session (autobegin=False) has no transaction to publish in; begin one "
            "first: the outbox never begins a transaction of its own"
        )


def _refuse_autocommit_now(session: Session, mapper: Mapper[Any]) -> None:
    try:
        connection = session.connection(bind_arguments={"mapper": mapper})
    except UnboundExecutionError as exc:
        raise _unbound(mapper) from exc
    if autocommits(connection):
        raise _refused()


def _refuse_autocommit_soon(session: Session, mapper: Mapper[Any]) -> None:
    try:
        bind = session.get_bind(mapper=mapper)
    except UnboundExecutionError as exc:
        raise _unbound(mapper) from exc
    engine = bind.engine if isinstance(bind, Connection) else bind
    if (
        _engine_autocommits(engine)
        or (isinstance(bind, Connection) and bind.get_execution_options().get("isolation_level"))
        == _AUTOCOMMIT
    ):
        raise _refused()
    if not session.info.get(_LISTENING):
        session.info[_LISTENING] = True
        event.listen(session, "before_flush", _check_before_flush)


def _engine_autocommits(engine: Engine) -> bool:
    if engine.get_execution_options().get("isolation_level") == _AUTOCOMMIT:
        return True
    # create_engine(isolation_level=...) is kept on the dialect; where a SQLAlchemy release
    # keeps it elsewhere, the check before the flush still refuses the session.
    return getattr(engine.dialect, "_on_connect_isolation_level", None) == _AUTOCOMMIT


def _check_before_flush(session: Session, flush_context: object, instances: object) -> None:
    mappers = {obj.__mapper__ for obj in session.new if isinstance(obj, OutboxRecord)}
    for mapper in mappers:
        if autocommits(session.connection(bind_arguments={"mapper": mapper})):
            raise _refused()


def _refused() -> SessionConfigurationError:
    return SessionConfigurationError(
        "the session's connection is in AUTOCOMMIT mode: the outbox row would commit on its "
        "own, apart from the writes it announces. Publish in a session with a transaction "
        "(an engine without isolation_level='AUTOCOMMIT')"
    )


def _unbound(mapper: Mapper[Any]) -> SessionConfigurationError:
    return SessionConfigurationError(
        f"the session has no bind for the outbox table {mapper.local_table.description!r}: "
        "bind the session to an engine, or name the table in its binds= "
        "(binds={..., outbox.table: engine})"
    )
