"""What a database family and driver does for the handler transaction, behind one interface.

The handler transaction (:mod:`inbox.core._transaction`) knows no SQLSTATE, libpq status or
event listener: it asks its backend to

* **begin and claim** — open the transaction with the claim as its first statement;
* **tell whether the transaction ended under the handler** — from what the client already
  knows where the database tells it (no round trip), else "unknown";
* **check and commit** — where that says unknown, read the claim row before the COMMIT.

This base class does all of it through SQLAlchemy's public ``Connection.execute``, with
"unknown" as its answer, which is right for every supported driver; the subclasses only
know their driver better (``postgresql/_psycopg.py``, ``postgresql/_psycopg2.py``,
``mysql/_backend.py``, ``sqlite/_backend.py``).
"""

from __future__ import annotations

import datetime as dt
import enum
import threading
import weakref
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from sqlalchemy import Connection, Engine, event
from sqlalchemy.engine import ExceptionContext

from inbox._backends._claims import Claims

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncSession
    from sqlalchemy.sql import ClauseElement

__all__ = ["Backend", "ClaimRow", "Claimed", "TransactionState", "statement_listeners"]


_watched: weakref.WeakSet[Engine] = weakref.WeakSet()
_watch_lock = threading.Lock()


class TransactionState(enum.Enum):
    """What the client knows, without asking the database, of the claim's transaction."""

    OPEN = "open"
    """Still the transaction that holds the claim, able to commit."""
    UNKNOWN = "unknown"
    """The client cannot tell: read the claim row before committing."""
    ENDED = "ended"
    """No transaction is open: something committed or rolled it back under the handler."""
    ABORTED = "aborted"
    """The database aborted it (a statement failed): a COMMIT would silently roll back."""


class Claimed(NamedTuple):
    """How the first claim of a transaction went."""

    won: bool
    """This transaction inserted the claim row (else: a duplicate)."""
    marked: bool
    """The database will tell the client when the transaction ends (see ``state``)."""
    alone: bool
    """Nothing but BEGIN and the claim ran in the transaction (so ending it is cheap)."""
    handle: Any = None
    """What the backend keeps of the transaction for its later questions (its driver's
    connection, say), or None."""


class ClaimRow(NamedTuple):
    """One claim to insert: the 16-byte key, the handler's name, the transaction's instant."""

    key: bytes
    handler: str
    at: dt.datetime


class Backend:
    """The handler transaction's operations on one database family and driver, through
    SQLAlchemy; subclasses override what their driver lets them do better."""

    refuses_autocommit: bool = False
    """The backend refuses a connection in autocommit mode itself, in its claims (else the
    handler transaction asks before the first claim)."""
    claims_natively_async: bool = False
    """The subclass overrides :meth:`begin_and_claim_async` (set for it, by
    ``__init_subclass__``): async code awaits that; else it begins and claims in one
    ``run_sync``."""
    error_listener: Callable[[ExceptionContext], None] | None = None
    """A ``handle_error`` listener the backend needs on every engine it serves: it runs only
    when a statement fails, so it costs the application's statements nothing."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.claims_natively_async = cls.begin_and_claim_async is not Backend.begin_and_claim_async

    def watch(self, engine: Engine) -> None:
        """Called with each engine before its transactions: install :attr:`error_listener`
        (once per engine)."""
        listener = self.error_listener
        if listener is None or engine in _watched:
            return
        with _watch_lock:
            if engine not in _watched:
                event.listen(engine, "handle_error", listener)
                _watched.add(engine)

    def write_alone(
        self, connection: Connection, statement: ClauseElement, params: Mapping[str, object]
    ) -> int | None:
        """Run the write ``statement`` as a transaction of its own on ``connection`` (not in
        one) in a single round trip and return its row count, where the driver has a
        cheaper way than SQLAlchemy's; None (the default): run it the ordinary way."""
        return None

    def before_claims(self, connection: Connection) -> None:
        """Called before the first claim of each transaction (nothing by default)."""

    def begin_and_claim(self, connection: Connection, claims: Claims, row: ClaimRow) -> Claimed:
        """Claim ``(key, handler)`` as the first statement of the connection's transaction
        (SQLAlchemy has begun it; the driver begins it with this statement)."""
        self.before_claims(connection)
        return Claimed(claims.claim(connection, *row), marked=False, alone=False)

    async def begin_and_claim_async(
        self,
        session: AsyncSession,
        connection: Connection,
        claims: Claims,
        row: ClaimRow,
    ) -> Claimed:
        """:meth:`begin_and_claim` from async code, for the ``AsyncSession`` whose
        synchronous side holds ``connection``."""
        return await session.run_sync(_claim, self, connection, claims, row)

    def claim_many(
        self,
        connection: Connection,
        claims: Claims,
        keys: Sequence[bytes],
        handler: str,
        at: dt.datetime,
    ) -> Collection[bytes]:
        """Claim distinct sorted ``keys`` at once (a batch); return the keys won. A batch's
        transaction is never marked: its claim rows are read before its one COMMIT."""
        self.before_claims(connection)
        return claims.claim_many(connection, keys, handler, at)

    def state(self, connection: Connection, claimed: Claimed) -> TransactionState:
        """What the client knows of the claim's transaction now, without a round trip;
        ``claimed`` is what the first claim returned."""
        return TransactionState.UNKNOWN

    def end_duplicate(self, connection: Connection, claimed: Claimed) -> bool:
        """End a duplicate's transaction below the session if that is cheaper than the
        session's rollback; True if it did (the session's rollback then sends nothing)."""
        return False

    async def end_duplicate_async(
        self, session: AsyncSession, connection: Connection, claimed: Claimed
    ) -> bool:
        """:meth:`end_duplicate` from async code (False: the session's rollback ends it)."""
        return False

    def abort_cause(self, connection: Connection) -> BaseException | None:
        """When :meth:`state` says ABORTED: the error the database aborted it for, if the
        backend remembered it (else None)."""
        return None

    def before_rollback(self, connection: Connection) -> None:
        """Called before the session rolls back a transaction the inbox began."""

    def release_locks(self, connection: Connection) -> None:
        """After a rollback, before reading the claim row again: release what outlives a
        ROLLBACK (nothing by default)."""


def statement_listeners(connection: Connection) -> bool:
    """Whether statement listeners (``before_`` / ``after_cursor_execute``) would see a
    statement on ``connection`` (a claim sent on the driver's connection must then go their
    way, through SQLAlchemy). ``_has_events`` is SQLAlchemy's own flag, set on a connection
    or engine (or their class) as any connection event listener is added, and read by
    SQLAlchemy before every statement: without it there is no listener to ask about (the
    common case costs no call into the event system)."""
    if not (connection._has_events or connection.engine._has_events):
        return False
    dispatch = connection.engine.dispatch
    return bool(dispatch.before_cursor_execute or dispatch.after_cursor_execute)


def _claim(
    _session: object, backend: Backend, connection: Connection, claims: Claims, row: ClaimRow
) -> Claimed:
    return backend.begin_and_claim(connection, claims, row)
