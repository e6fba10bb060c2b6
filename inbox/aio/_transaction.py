"""The handler transaction, awaited: :class:`~inbox.core._transaction.HandlerTransaction` driven
from async code.

SQLAlchemy's asyncio layer is a thin shell around the blocking ``Session``: ``run_sync``
runs blocking-style code on ``AsyncSession.sync_session`` in a greenlet and awaits the
driver wherever that code does I/O. So the blocking transaction's steps (begin and the
checks, the claim-row read and commit, the rollback and the early-commit check) run here
unchanged; the handler is awaited between the same guards, and a backend that speaks to its
driver directly (psycopg 3) awaits its claim natively. Every other backend begins and claims
in one ``run_sync``.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable, Collection, Sequence
from types import TracebackType
from typing import cast

from sqlalchemy import Connection
from sqlalchemy.ext.asyncio import AsyncSession

from inbox._backends import ClaimRow, Claims
from inbox.aio._completion import run_to_completion
from inbox.core._guards import Guards
from inbox.core._handlers import RegisteredHandler
from inbox.core._transaction import HandlerTransaction
from inbox.errors import HandlerInterrupted, RegistrationError, SessionConfigurationError
from inbox.message import Message
from inbox.telemetry._core import claim_timer

__all__ = ["AsyncHandlerTransaction"]


class AsyncHandlerTransaction:
    """One transaction holding claims and the writes of the async handlers that won them.

    ``async with`` it; :meth:`begin_and_claim` / :meth:`claim_many` begin it and insert
    claims; :meth:`run` awaits a handler behind guards; :meth:`check_and_commit` commits
    after checking the claims are still held. Leaving without a commit (an error, a
    cancellation) rolls back and closes the session, to completion even when the task is
    cancelled again meanwhile.
    """

    __slots__ = ("_session", "_transaction")

    def __init__(self, session: AsyncSession, claims: Claims, owner: object = None) -> None:
        if not isinstance(session, AsyncSession):
            raise SessionConfigurationError(
                "session_factory must return a sqlalchemy.ext.asyncio.AsyncSession (use "
                f"async_sessionmaker(engine)), got {type(session).__name__}"
            )
        self._session = session
        self._transaction = HandlerTransaction(session.sync_session, claims, owner)

    async def __aenter__(self) -> AsyncHandlerTransaction:
        return self

    async def begin_and_claim(self, key: bytes, handler: str) -> bool:
        """Begin with the claim ``(key, handler)``: True if won, False if a duplicate."""
        transaction = self._transaction
        begun = await self._session.run_sync(_begin_and_claim, transaction, key, handler)
        if begun is True or begun is False:  # claimed in the greenlet (no call: a hot path)
            return begun
        # A backend with a claim of its own for async code (psycopg 3): awaited natively.
        connection = begun
        row = ClaimRow(key, handler, transaction.at)
        timer = claim_timer()
        started = 0.0 if timer is None else timer.started()
        claimed = await transaction.backend.begin_and_claim_async(
            self._session, connection, transaction.claims, row
        )
        if timer is not None:
            timer.record(handler, started)
        transaction.claimed(claimed, key, handler)
        return claimed.won

    async def claim_many(self, keys: Sequence[bytes], handler: str) -> Collection[bytes]:
        """Insert the claims for distinct sorted ``keys`` in one statement; the keys won."""
        return await self._session.run_sync(_claim_many, self._transaction, keys, handler)

    async def run(
        self, handler: RegisteredHandler, message: Message, guards: Guards, key: bytes
    ) -> None:
        """Await ``handler`` with ``message`` and the session, which it cannot commit, roll
        back or close meanwhile; ``key`` is its claim key (what ``inbox.effect`` keys on).
        A cancellation propagates as itself; any other
        :class:`BaseException` but ``KeyboardInterrupt`` and ``SystemExit`` is raised as
        :class:`~inbox.HandlerInterrupted`, as the blocking inbox does."""
        func = cast("Callable[[Message, AsyncSession], object]", handler.func)
        current = self._transaction.handler_started(handler, message, guards, key)
        try:
            returned = func(message, self._session)
            if not inspect.isawaitable(returned):
                raise RegistrationError(
                    f"handler {handler.name!r} returned {type(returned).__name__}, not an "
                    "awaitable: the async inbox awaits its handlers (make it 'async def')"
                )
            await cast("Awaitable[object]", returned)
        except (Exception, asyncio.CancelledError, KeyboardInterrupt, SystemExit):
            raise
        except BaseException as interrupt:
            raise HandlerInterrupted(handler.name, interrupt) from interrupt
        finally:
            self._transaction.handler_finished(current)

    async def check_and_commit(self) -> None:
        """Commit the claims with the handlers' writes, or raise and commit nothing."""
        await self._session.run_sync(_check_and_commit, self._transaction)

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await run_to_completion(self._finish(exc))

    async def _finish(self, exc: BaseException | None) -> None:
        transaction = self._transaction
        ended = None
        if exc is None and transaction.duplicate:
            ended = await transaction.backend.end_duplicate_async(
                self._session, transaction.connection, transaction.claimed_as
            )
        await self._session.run_sync(_finish, transaction, exc, ended)


def _begin_and_claim(
    _session: object, transaction: HandlerTransaction, key: bytes, handler: str
) -> Connection | bool:
    # Begin, and claim in the same greenlet where the backend claims through SQLAlchemy
    # anyway (one run_sync per message instead of two): whether won. A backend that claims
    # natively from async code gets the connection back instead.
    connection = transaction.begin()
    backend = transaction.backend
    if backend.claims_natively_async:
        return connection
    row = ClaimRow(key, handler, transaction.at)
    timer = claim_timer()
    started = 0.0 if timer is None else timer.started()
    claimed = backend.begin_and_claim(connection, transaction.claims, row)
    if timer is not None:
        timer.record(handler, started)
    transaction.claimed(claimed, key, handler)
    return claimed.won


def _claim_many(
    _session: object, transaction: HandlerTransaction, keys: Sequence[bytes], handler: str
) -> Collection[bytes]:
    return transaction.claim_many(keys, handler)


def _check_and_commit(_session: object, transaction: HandlerTransaction) -> None:
    transaction.check_and_commit()


def _finish(
    _session: object,
    transaction: HandlerTransaction,
    exc: BaseException | None,
    ended: bool | None,
) -> None:
    transaction.finish(exc, duplicate_ended=ended)
