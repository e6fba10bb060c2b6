"""Handlers that end the inbox's transaction behind its back: detected at three named
points, never turned into a silent duplicate or a doubled effect.

* :func:`refuse_ended_transaction` — before the COMMIT: the handler ended the session's
  transaction through SQLAlchemy, or the database says the transaction is aborted or gone;
* :func:`claim_gone` — the claim row is no longer there (read where the backend cannot tell
  otherwise): a raw ``ROLLBACK``, after which the handler's later writes would commit alone;
* :func:`switched_to_autocommit` — the handler switched the connection to autocommit
  (MySQL's ``SET autocommit=1``, which also committed everything before it);
* :func:`early_commit` — after a failed handler: the claim survived the rollback with this
  transaction's instant, so something committed it early (:class:`~inbox.ClaimCommittedEarly`).

What the handler cannot reach through public methods is guarded before it happens
(:mod:`inbox.core._guards`); these catch the rest (raw SQL, the driver's own ``commit()``).
"""

from __future__ import annotations

import datetime as dt
import logging

from sqlalchemy import Connection
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session, SessionTransaction

from inbox._backends import Backend, Claims, TransactionState
from inbox._backends._autocommit import autocommits
from inbox.core._retry import is_transient
from inbox.core._startup import server_unreachable
from inbox.errors import ClaimCommittedEarly, TransactionControlError

__all__ = [
    "claim_gone",
    "early_commit",
    "refuse_ended_transaction",
    "switched_to_autocommit",
]

logger = logging.getLogger("inbox.core")


def refuse_ended_transaction(
    session: Session,
    transaction: SessionTransaction,
    state: TransactionState,
    cause: BaseException | None,
    names: str,
) -> None:
    """Before the COMMIT: raise unless ``transaction`` is still the session's live
    transaction and the database has not aborted or ended it (``state``, from the backend;
    ``cause`` the error it was aborted for, when known)."""
    if session.get_transaction() is not transaction or not transaction.is_active:
        raise TransactionControlError(
            f"handler {names!r} ended the inbox's transaction; writes it made before that "
            "may have been committed without the rest. Never end the session's transaction "
            "in a handler."
        )
    if state is TransactionState.ABORTED:
        if cause is not None:
            # Raised from the deadlock itself, so the inbox re-runs the transaction.
            raise TransactionControlError(
                f"handler {names!r} returned normally, but the database rolled back its whole "
                "transaction (a deadlock was caught and ignored?): the claim and the writes "
                "before it are gone, and committing the rest would apply it partially."
            ) from cause
        raise TransactionControlError(
            f"handler {names!r} returned normally, but a statement in its transaction "
            "failed and PostgreSQL aborted the transaction (was a database error caught and "
            "ignored?); nothing was committed. Let database errors propagate, or use "
            "session.begin_nested() around statements that may fail."
        )
    if state is TransactionState.ENDED:
        raise TransactionControlError(
            f"handler(s) {names} ended the inbox's transaction (a raw COMMIT or ROLLBACK, or "
            "the driver's commit()/rollback()) and PostgreSQL is no longer in a transaction. "
            "Statements after that may have been committed one by one (psycopg2 runs them "
            "outside any transaction): this message needs reconciling, not a retry."
        )


def claim_gone(names: str) -> TransactionControlError:
    """The error for a transaction whose claim row is gone: nothing was committed."""
    return TransactionControlError(
        f"handler(s) {names} ended the inbox's transaction (a raw ROLLBACK, the "
        "driver's rollback(), or an error the database aborted it for): the claim is "
        "gone, so nothing was committed. Never end the transaction in a handler."
    )


def switched_to_autocommit(connection: Connection, names: str) -> bool:
    """True (after discarding the connection) if a handler switched it to autocommit: every
    write, the claim included, is already in, and the connection must not go back to the
    pool in that mode."""
    if not autocommits(connection):
        return False
    logger.warning("handler(s) %s switched the connection to autocommit", names)
    connection.invalidate()
    return True


def early_commit(
    session: Session,
    claims: Claims,
    backend: Backend,
    failure: BaseException,
    won: tuple[bytes, str],
    *,
    at: dt.datetime,
) -> bool:
    """After a failed handler's rollback: whether its claim survived with this
    transaction's instant ``at`` — committed under the inbox before the failure, so a
    redelivery would be skipped as a duplicate.

    A concurrent delivery of the same message, blocked on our claim until the rollback, may
    have claimed and committed the key since, under its own instant: that is not ours.
    Raises :class:`~inbox.TransactionControlError` when it cannot be checked.
    """
    key, handler = won
    try:
        connection = session.connection(bind_arguments={"clause": claims.bind_clause})
        backend.release_locks(connection)
        survived = claims.claimed_at(connection, key, handler) == at
        type(session).rollback(session)
    except Exception as check_failed:
        # A lost connection or a server that cannot be reached (a failover, a Galera node
        # killed mid-handler) is as likely to have rolled the claim back as anything: the
        # redelivery decides. Anything else (a missing privilege) would stay unknown.
        if is_transient(check_failed) or server_unreachable(check_failed):
            logger.warning(
                "could not check whether a failed handler's claim was committed (%s)",
                type(check_failed).__name__,
            )
            return False
        # Not knowing must not turn into a silent duplicate on the next try.
        raise TransactionControlError(
            f"handler {handler!r} failed, and whether its claim had been committed under "
            f"the inbox could not be checked ({type(check_failed).__name__}: "
            f"{check_failed}); the worker role needs SELECT on the inbox table's "
            "message_id, handler and processed_at"
        ) from failure
    return survived


def committed_early(
    handler: str, failure: BaseException, message_id: object
) -> ClaimCommittedEarly:
    """The error for a failed handler whose claim had been committed early."""
    error = ClaimCommittedEarly(handler, message_id)  # type: ignore[arg-type]
    error.__cause__ = failure
    return error


def connection_lost(exc: BaseException) -> bool:
    """Whether ``exc`` (or what it was raised from) invalidated its connection."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, DBAPIError) and seen.connection_invalidated:
            return True
        seen = seen.__cause__
    return False
