"""The handler transaction: the inbox's unit of work, shared by every way of processing.

The whole idea, as :meth:`inbox.Inbox.process` runs it for one handler::

    with HandlerTransaction(session_factory(), claims) as txn:  # BEGIN
        if txn.claim(key, handler.name):                         # one INSERT decides
            txn.run(handler, message)                            # in the same transaction
            txn.commit()                                         # claim + writes, or neither
    # leaving without commit() rolls back: the claim is released with the writes

A concurrent duplicate blocks on the uncommitted claim row and then sees the winner's
outcome, so there is no "processing" state to repair after a crash.
"""

from __future__ import annotations

import datetime as dt
import inspect
import logging
from collections.abc import Collection, Sequence
from contextvars import Token
from types import TracebackType
from typing import Final

from sqlalchemy import Connection
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session

from inbox._claim import Claims
from inbox._commit_guard import Guards, guard, unguard
from inbox._effect_run import CURRENT_RUN, HandlerRun
from inbox._handlers import RegisteredHandler
from inbox._retry import is_transient
from inbox._session_checks import (
    autocommits,
    begin_claim_transaction,
    ensure_committable,
    refuse_busy_session,
)
from inbox._shared_round_trips import DIVISION_BY_ZERO, shares_round_trips, transaction_status
from inbox.errors import (
    ClaimCommittedEarly,
    HandlerInterrupted,
    RegistrationError,
    TransactionControlError,
)
from inbox.message import Message

__all__ = ["HandlerTransaction"]

logger = logging.getLogger("inbox.core")
_LIBPQ_IN_TRANSACTION: Final = 2  # PQTRANS_INTRANS: idle in a healthy transaction


class HandlerTransaction:
    """One transaction holding claims and the writes of the handlers that won them.

    Use it as a context manager: entering begins the transaction (after refusing a session
    the inbox cannot own); :meth:`claim` / :meth:`claim_many` insert claims; :meth:`run`
    calls a handler behind guards; :meth:`commit` commits, after checking the transaction
    still holds its claims. Leaving without a commit rolls back and closes the session.
    """

    def __init__(self, session: Session, claims: Claims, owner: object = None) -> None:
        refuse_busy_session(session)
        self._owner = owner  # the inbox whose handlers run here, for inbox.effect()
        self._session = session
        self._session_type = type(session)  # its methods, not the guards a handler sees
        self._claims = claims
        self._won: tuple[bytes, str] | None = None
        self._ran: list[tuple[RegisteredHandler, Message]] = []
        self._committed = False
        self._at = dt.datetime.now(dt.UTC)

    def __enter__(self) -> HandlerTransaction:
        try:
            self._transaction, self._connection = begin_claim_transaction(
                self._session, self._claims.bind_clause
            )
        except BaseException:
            self._end()
            raise
        return self

    @property
    def connection(self) -> Connection:
        """The connection the claims and the handlers' writes share."""
        return self._connection

    def claim(self, key: bytes, handler: str) -> bool:
        """Insert the claim ``(key, handler)``: True if this transaction won it, False if it
        is a duplicate (already committed, or committed by a concurrent winner)."""
        won = self._claims.claim(self._connection, key, handler, self._at)
        if won and self._won is None:
            self._won = (key, handler)
        return won

    def claim_many(self, keys: Sequence[bytes], handler: str) -> Collection[bytes]:
        """Insert the claims for distinct ``keys`` (sorted, so that concurrent batches lock
        in the same order) in one statement; return the keys won."""
        won = self._claims.claim_many(self._connection, keys, handler, self._at)
        if won and self._won is None:
            self._won = (next(iter(won)), handler)
        return won

    def run(self, handler: RegisteredHandler, message: Message, guards: Guards, key: bytes) -> None:
        """Call ``handler`` with ``message`` and the session, which it cannot commit, roll
        back or close meanwhile; ``key`` is its claim key (what ``inbox.effect`` keys on).
        A :class:`BaseException` other than ``KeyboardInterrupt`` and ``SystemExit`` is
        raised as :class:`~inbox.HandlerInterrupted`."""
        # handler_started() and handler_finished() inlined: this is the per-message path.
        self._ran.append((handler, message))
        guard(self._session, self._connection, guards)
        current = CURRENT_RUN.set(HandlerRun(self._owner, key, handler.name, self._connection))
        try:
            returned = handler.func(message, self._session)
        except (Exception, KeyboardInterrupt, SystemExit):
            raise
        except BaseException as interrupt:
            raise HandlerInterrupted(handler.name, interrupt) from interrupt
        finally:
            CURRENT_RUN.reset(current)
            unguard(self._session, self._connection)
        if inspect.isawaitable(returned):
            if inspect.iscoroutine(returned):
                returned.close()  # never awaited: say so here rather than in a warning
            raise RegistrationError(
                f"handler {handler.name!r} returned an awaitable: the blocking Inbox cannot "
                "await it, so its work would never run. Register it on an async inbox."
            )

    def handler_started(
        self, handler: RegisteredHandler, message: Message, guards: Guards, key: bytes
    ) -> Token[HandlerRun | None]:
        """Record that ``handler`` runs on ``message`` under the claim ``key`` now, and
        guard the session and the connection until :meth:`handler_finished` (for callers
        that call it themselves); pass it the token returned."""
        self._ran.append((handler, message))
        guard(self._session, self._connection, guards)
        return CURRENT_RUN.set(HandlerRun(self._owner, key, handler.name, self._connection))

    def handler_finished(self, current: Token[HandlerRun | None]) -> None:
        """Take the guards down again; the session is the inbox's to commit or roll back."""
        CURRENT_RUN.reset(current)
        unguard(self._session, self._connection)

    def commit(self) -> None:
        """Commit the claims with the handlers' writes, or raise and commit nothing.

        Refused when the transaction is no longer the one that holds the claims: a handler
        ended it (raw ``ROLLBACK``, the driver's ``rollback()``, a swallowed error after which
        the database aborted it) — committing would apply its later writes without a claim,
        and every redelivery would apply them again.
        """
        names = ", ".join(dict.fromkeys(h.name for h, _ in self._ran))
        ensure_committable(self._session, self._transaction, self._connection, names)
        if self._won is not None and self._commit_with_check(names):
            return
        if self._won is not None and not self._claims.held(self._connection, *self._won):
            raise _claim_gone(names)
        if autocommits(self._connection):
            # A handler switched the connection to autocommit (MySQL's SET autocommit=1,
            # which also committed everything before it): every write, the claim included,
            # is already in. The connection must not go back to the pool in that mode.
            logger.warning("handler(s) %s switched the connection to autocommit", names)
            self._connection.invalidate()
            self._committed = True
            return
        # The handlers' writes and the claims commit together, or not at all.
        self._session_type.commit(self._session)
        self._committed = True

    def _commit_with_check(self, names: str) -> bool:
        """With psycopg 3 (inbox/_shared_round_trips.py), check the claim and COMMIT in one
        round trip and return True; False leaves the commit to the usual path.

        Not taken when the session's commit is not the driver's COMMIT (a savepoint: a session
        joined to an outer transaction, a handler's unreleased ``begin_nested()``), or when
        it would still write after the COMMIT went out (``before_commit`` listeners, objects
        a flush leaves pending).
        """
        session, connection = self._session, self._connection
        if (
            session.dispatch.before_commit
            or connection.in_nested_transaction()  # a savepoint: SQLAlchemy releases it
            or not shares_round_trips(connection)
            or transaction_status(connection) != _LIBPQ_IN_TRANSACTION
        ):
            return False
        self._session_type.flush(session)
        if session.new or session.dirty or session.deleted:
            return False
        assert self._won is not None
        try:
            self._claims.commit_if_held(connection, *self._won)
        except DBAPIError as failure:
            if getattr(failure.orig, "sqlstate", None) == DIVISION_BY_ZERO:
                raise _claim_gone(names) from failure
            raise
        # The driver has committed; this completes the session's bookkeeping (and its
        # after_commit events) without another round trip: psycopg sends nothing when no
        # transaction is open.
        self._session_type.commit(session)
        self._committed = True
        return True

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if self._committed:
            self._end()
            return
        self._rollback()
        try:
            if exc is not None and self._ran and self._won is not None:
                self._refuse_early_commit(exc)
        finally:
            self._end()

    def _refuse_early_commit(self, failure: BaseException) -> None:
        """After rolling back a failed handler, raise :class:`~inbox.ClaimCommittedEarly` if
        its claim survived: something committed the transaction under the inbox before the
        failure, so a redelivery would be skipped as a duplicate.

        Survived means the row is there with *this* transaction's ``processed_at``: a
        concurrent delivery of the same message, blocked on our claim until the rollback,
        may have claimed and committed the key since, under its own instant.
        """
        if not isinstance(failure, Exception) or _connection_lost(failure):
            return
        assert self._won is not None
        key, handler = self._won
        try:
            connection = self._session.connection(
                bind_arguments={"clause": self._claims.bind_clause}
            )
            if connection.dialect.name in ("mysql", "mariadb"):
                # LOCK TABLES (which also commits) outlives ROLLBACK: release it, or the check
                # fails and the connection goes back to the pool holding table locks.
                connection.exec_driver_sql("UNLOCK TABLES")
            survived = self._claims.claimed_at(connection, key, handler) == self._at
            self._rollback()
        except Exception as check_failed:
            if is_transient(check_failed):
                logger.warning(
                    "could not check whether a failed handler's claim was committed (%s)",
                    type(check_failed).__name__,
                )
                return
            # Not knowing must not turn into a silent duplicate on the next try.
            raise TransactionControlError(
                f"handler {handler!r} failed, and whether its claim had been committed under "
                f"the inbox could not be checked ({type(check_failed).__name__}: "
                f"{check_failed}); the worker role needs SELECT on the inbox table's "
                "message_id, handler and processed_at"
            ) from failure
        if survived:
            handler_run, message = self._ran[-1]
            raise ClaimCommittedEarly(handler_run.name, message.id) from failure

    def _rollback(self) -> None:
        """Roll back without letting a failing rollback hide the failure being handled."""
        try:
            self._session_type.rollback(self._session)
        except Exception:
            logger.exception("rollback after a failed handler transaction failed as well")

    def _end(self) -> None:
        self._session_type.close(self._session)


def _claim_gone(names: str) -> TransactionControlError:
    return TransactionControlError(
        f"handler(s) {names} ended the inbox's transaction (a raw ROLLBACK, the "
        "driver's rollback(), or an error the database aborted it for): the claim is "
        "gone, so nothing was committed. Never end the transaction in a handler."
    )


def _connection_lost(exc: BaseException) -> bool:
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, DBAPIError) and seen.connection_invalidated:
            return True
        seen = seen.__cause__
    return False
