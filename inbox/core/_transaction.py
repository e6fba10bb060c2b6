"""The handler transaction: the inbox's unit of work, shared by every way of processing.

The whole idea, as :meth:`inbox.Inbox.process` runs it for one handler::

    with HandlerTransaction(session_factory(), claims) as txn:
        if txn.begin_and_claim(key, handler.name):   # BEGIN; one INSERT decides
            txn.run(handler, message, guards, key)   # in the same transaction
            txn.check_and_commit()                   # claim + writes, or neither
    # leaving without a commit rolls back: the claim is released with the writes

A concurrent duplicate blocks on the uncommitted claim row and then sees the winner's
outcome, so there is no "processing" state to repair after a crash. What is particular to a
database and driver lives in its backend (:mod:`inbox._backends`); the checks for handlers
that end the transaction themselves in :mod:`inbox.core._misuse`.
"""

from __future__ import annotations

import datetime as dt
import inspect
from collections.abc import Collection, Sequence
from contextvars import Token
from types import TracebackType

from sqlalchemy import Connection, Engine
from sqlalchemy.orm import Session, SessionTransaction

from inbox._backends import Backend, Claimed, ClaimRow, Claims, TransactionState, backend_for
from inbox._backends._autocommit import refuse_autocommit
from inbox.core import _misuse as misuse
from inbox.core._guards import Guards, guard, unguard
from inbox.core._handlers import RegisteredHandler
from inbox.core._run import CURRENT_RUN, HandlerRun
from inbox.core._sessions import refuse_busy_session, refuse_shared_transaction
from inbox.errors import HandlerInterrupted, RegistrationError
from inbox.message import Message
from inbox.telemetry._core import claim_timer

__all__ = ["HandlerTransaction"]

_NOT_CLAIMED = Claimed(won=False, marked=False, alone=False)


class HandlerTransaction:
    """One transaction holding claims and the writes of the handlers that won them.

    Use it as a context manager. :meth:`begin_and_claim` (or, for a batch,
    :meth:`claim_many`) begins it; :meth:`run` calls a handler behind guards;
    :meth:`check_and_commit` commits after making sure the transaction still holds its
    claims. Leaving without a commit rolls back and closes the session.
    """

    __slots__ = (
        "_at",
        "_backend",
        "_claimed",
        "_claims",
        "_committed",
        "_connection",
        "_owner",
        "_ran",
        "_session",
        "_transaction",
        "_won",
    )

    def __init__(self, session: Session, claims: Claims, owner: object = None) -> None:
        refuse_busy_session(session)
        self._session = session
        self._claims = claims
        self._owner = owner  # the inbox whose handlers run here, for inbox.effect()
        self._transaction: SessionTransaction | None = None
        self._claimed = _NOT_CLAIMED
        self._won: tuple[bytes, str] | None = None
        self._ran: list[tuple[RegisteredHandler, Message]] = []
        self._committed = False
        self._at = dt.datetime.now(dt.UTC)

    def __enter__(self) -> HandlerTransaction:
        return self

    @property
    def connection(self) -> Connection:
        """The connection the claims and the handlers' writes share."""
        return self._connection

    @property
    def backend(self) -> Backend:
        """The backend of the connection's database and driver (once begun)."""
        return self._backend

    @property
    def claims(self) -> Claims:
        """The claim statements of the inbox's table."""
        return self._claims

    @property
    def at(self) -> dt.datetime:
        """The instant this transaction stamps on its claims."""
        return self._at

    @property
    def claimed_as(self) -> Claimed:
        """How the first claim went."""
        return self._claimed

    def begin(self) -> Connection:
        """Begin the session's transaction (refusing one the inbox cannot own) and return
        the connection the claims use; the driver begins with the first statement."""
        session = self._session
        bind = session.get_bind(clause=self._claims.bind_clause)
        if bind.__class__ is not Engine:  # an Engine's own transaction is never shared
            refuse_shared_transaction(session, bind)
        self._transaction = session.begin()
        try:
            connection = self._connection = session.connection(bind_arguments={"bind": bind})
        except BaseException:
            # No connection (the server could not be reached): nothing was claimed, so the
            # transaction counts as never begun and leaving only closes the session; the
            # connection error propagates as it is.
            self._transaction = None
            raise
        backend = self._backend = backend_for(connection.dialect)
        if backend.error_listener is not None:
            backend.watch(connection.engine)
        if not backend.refuses_autocommit:
            refuse_autocommit(connection)
        return connection

    def begin_and_claim(self, key: bytes, handler: str) -> bool:
        """Begin, with the claim ``(key, handler)`` as the first statement: True if this
        transaction won it, False if it is a duplicate (already committed, or committed by
        a concurrent winner)."""
        connection = self.begin()
        row = ClaimRow(key, handler, self._at)
        timer = claim_timer()
        if timer is None:
            claimed = self._backend.begin_and_claim(connection, self._claims, row)
        else:
            started = timer.started()
            claimed = self._backend.begin_and_claim(connection, self._claims, row)
            timer.record(handler, started)
        self.claimed(claimed, key, handler)
        return claimed.won

    def claimed(self, claimed: Claimed, key: bytes, handler: str) -> None:
        """Record how the first claim went (for callers that claim themselves)."""
        self._claimed = claimed
        if claimed.won:
            self._won = (key, handler)

    def claim_many(self, keys: Sequence[bytes], handler: str) -> Collection[bytes]:
        """Insert the claims for distinct ``keys`` (sorted, so that concurrent batches lock
        in the same order) in one statement, beginning first if need be; the keys won."""
        if self._transaction is None:
            self.begin()
        timer = claim_timer()
        started = 0.0 if timer is None else timer.started()
        won = self._backend.claim_many(self._connection, self._claims, keys, handler, self._at)
        if timer is not None:
            timer.record(handler, started)
        if won and self._won is None:
            self._won = (next(iter(won)), handler)
        return won

    def run(self, handler: RegisteredHandler, message: Message, guards: Guards, key: bytes) -> None:
        """Call ``handler`` with ``message`` and the session, which it cannot commit, roll
        back or close meanwhile; ``key`` is its claim key (what ``inbox.effect`` keys on).
        A :class:`BaseException` other than ``KeyboardInterrupt`` and ``SystemExit`` is
        raised as :class:`~inbox.HandlerInterrupted`."""
        # handler_started() and handler_finished() written out: this runs once per message.
        session, transaction, connection = self._session, self._transaction, self._connection
        assert transaction is not None
        self._ran.append((handler, message))
        guard(session, transaction, connection, guards)
        run = HandlerRun(self._owner, key, handler.name, connection, message.id, message.headers)
        current = CURRENT_RUN.set(run)
        try:
            returned = handler.func(message, session)
        except (Exception, KeyboardInterrupt, SystemExit):
            raise
        except BaseException as interrupt:
            raise HandlerInterrupted(handler.name, interrupt) from interrupt
        finally:
            CURRENT_RUN.reset(current)
            unguard(session, transaction, connection)
        if returned is not None and inspect.isawaitable(returned):
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
        guard the session until :meth:`handler_finished` (for callers that call the handler
        themselves); pass that the token returned."""
        self._ran.append((handler, message))
        assert self._transaction is not None
        guard(self._session, self._transaction, self._connection, guards)
        run = HandlerRun(
            self._owner, key, handler.name, self._connection, message.id, message.headers
        )
        return CURRENT_RUN.set(run)

    def handler_finished(self, current: Token[HandlerRun | None]) -> None:
        """Take the guards down again; the session is the inbox's to commit or roll back."""
        CURRENT_RUN.reset(current)
        assert self._transaction is not None
        unguard(self._session, self._transaction, self._connection)

    def check_and_commit(self) -> None:
        """Commit the claims with the handlers' writes, or raise and commit nothing.

        Refused when the transaction is no longer the one that holds the claims: a handler
        ended it (raw ``ROLLBACK``, the driver's ``rollback()``, a swallowed error after which
        the database aborted it) — committing would apply its later writes without a claim,
        and every redelivery would apply them again.
        """
        session, connection, backend = self._session, self._connection, self._backend
        assert self._transaction is not None
        state = backend.state(connection, self._claimed)
        if state is not TransactionState.OPEN or session.get_transaction() is not self._transaction:
            self._check_unknown(state)
            if self._committed:
                return
        # The handlers' writes and the claims commit together, or not at all.
        type(session).commit(session)
        self._committed = True

    def _check_unknown(self, state: TransactionState) -> None:
        names = self._names()
        cause = backend_cause(self._backend, self._connection, state)
        misuse.refuse_ended_transaction(self._session, self._transaction, state, cause, names)  # type: ignore[arg-type]
        if state is TransactionState.OPEN:
            return
        if self._won is not None and not self._claims.held(self._connection, *self._won):
            raise misuse.claim_gone(names)
        if misuse.switched_to_autocommit(self._connection, names):
            self._committed = True

    def _names(self) -> str:
        return ", ".join(dict.fromkeys(h.name for h, _ in self._ran))

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.finish(exc)

    @property
    def duplicate(self) -> bool:
        """Begun, lost its only claim, and ran nothing: nothing of ours to keep."""
        return (
            self._transaction is not None
            and not self._committed
            and not self._claimed.won
            and not self._ran
        )

    def finish(self, exc: BaseException | None, *, duplicate_ended: bool | None = None) -> None:
        """End the transaction as leaving the ``with`` block does: close it if committed,
        else roll it back (after a failed handler, telling an early commit apart), then
        close the session. ``duplicate_ended`` says the backend already ended a duplicate's
        transaction (an async caller awaited that itself)."""
        session = self._session
        if self._committed or self._transaction is None:
            type(session).close(session)
            return
        try:
            alive = not self._connection.invalidated
            if exc is None and self.duplicate and alive:
                if duplicate_ended is None:
                    duplicate_ended = self._backend.end_duplicate(self._connection, self._claimed)
                if not duplicate_ended:
                    self._backend.before_rollback(self._connection)
                self._rollback()
                return
            intact = self._state_if_alive(exc) if alive else None
            if alive:
                self._backend.before_rollback(self._connection)
            self._rollback()
            if (
                isinstance(exc, Exception)
                and self._ran
                and self._won is not None
                and intact is not TransactionState.OPEN  # held the claim to the end
                and misuse.early_commit(
                    session, self._claims, self._backend, exc, self._won, at=self._at
                )
            ):
                handler, message = self._ran[-1]
                raise misuse.committed_early(handler.name, exc, message.id)
        finally:
            type(session).close(session)

    def _state_if_alive(self, exc: BaseException | None) -> TransactionState | None:
        # None: the connection is gone (nothing to roll back or check on it).
        if exc is not None and misuse.connection_lost(exc):
            return None
        try:
            return self._backend.state(self._connection, self._claimed)
        except Exception:  # an invalidated connection: the rollback below says what it can
            return TransactionState.UNKNOWN

    def _rollback(self) -> None:
        """Roll back without letting a failing rollback hide the failure being handled."""
        try:
            type(self._session).rollback(self._session)
        except Exception:
            misuse.logger.exception("rollback after a failed handler transaction failed as well")


def backend_cause(
    backend: Backend, connection: Connection, state: TransactionState
) -> BaseException | None:
    """The error the backend remembers the transaction was aborted for, when ABORTED."""
    return backend.abort_cause(connection) if state is TransactionState.ABORTED else None
