"""Sessions the inbox cannot own are refused before anything is written: at ``Inbox()``
when the factory can be tried without connecting, and again as each transaction begins."""

from __future__ import annotations

from collections.abc import Callable

from sqlalchemy import Connection, Dialect, Engine
from sqlalchemy.exc import UnboundExecutionError
from sqlalchemy.orm import Session
from sqlalchemy.sql import ClauseElement

from inbox._backends import check_supported
from inbox.errors import SessionConfigurationError

__all__ = ["check_session_factory", "refuse_busy_session", "refuse_shared_transaction"]


def refuse_busy_session(session: Session) -> None:
    """Refuse a session already in a transaction: its pending work is not ours to commit or
    roll back, so this is checked before the inbox touches the session at all."""
    if session.__class__ is not Session and not isinstance(session, Session):
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
    if session.__class__ is not Session and not isinstance(session, Session):
        return  # a stand-in for now; refuse_busy_session() refuses it if it is ever used
    refuse_busy_session(session)  # before the try: a busy session is not ours to close
    try:
        try:
            bind = session.get_bind(clause=claim_statement)
        except UnboundExecutionError:
            return
        refuse_shared_transaction(session, bind)
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


def refuse_shared_transaction(session: Session, bind: Engine | Connection) -> None:
    """Refuse a session that joins a transaction of an outer ``Connection``: the inbox's
    rollback of a duplicate would roll that back too."""
    if isinstance(bind, Connection) and session.join_transaction_mode != "create_savepoint":
        raise SessionConfigurationError(
            "the session is bound to a Connection: the inbox must own the transaction. Bind "
            "the sessionmaker to an Engine, or use join_transaction_mode='create_savepoint'"
        )
