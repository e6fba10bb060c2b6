"""The handler transaction, awaited: :class:`~inbox._transaction.HandlerTransaction` run on
the ``AsyncSession``'s synchronous side.

SQLAlchemy's asyncio layer is a thin shell around the blocking ``Session``: ``run_sync``
runs blocking-style code on ``AsyncSession.sync_session`` in a greenlet and awaits the
driver wherever that code does I/O. So every step of the blocking transaction (begin and
the checks, the claim, the claim-held check and commit, the rollback and the early-commit
check) runs here unchanged; only the handler is awaited, between guards that shadow the same
``Session`` and ``Connection`` methods the ``AsyncSession`` delegates to.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable, Collection, Sequence
from types import TracebackType
from typing import cast

from sqlalchemy.ext.asyncio import AsyncSession

from inbox._claim import Claims
from inbox._commit_guard import Guards
from inbox._handlers import RegisteredHandler
from inbox._transaction import HandlerTransaction
from inbox.aio._completion import run_to_completion
from inbox.errors import HandlerInterrupted, RegistrationError, SessionConfigurationError
from inbox.message import Message

__all__ = ["AsyncHandlerTransaction"]


class AsyncHandlerTransaction:
    """One transaction holding claims and the writes of the async handlers that won them.

    ``async with`` begins it; :meth:`claim` / :meth:`claim_many` insert claims; :meth:`run`
    awaits a handler behind guards; :meth:`commit` commits after checking the claims are
    still held. Leaving without a commit (an error, a cancellation) rolls back and closes
    the session, to completion even when the task is cancelled again meanwhile.
    """

    def __init__(self, session: AsyncSession, claims: Claims, owner: object = None) -> None:
        if not isinstance(session, AsyncSession):
            raise SessionConfigurationError(
                "session_factory must return a sqlalchemy.ext.asyncio.AsyncSession (use "
                f"async_sessionmaker(engine)), got {type(session).__name__}"
            )
        self._session = session
        self._transaction = HandlerTransaction(session.sync_session, claims, owner)

    async def __aenter__(self) -> AsyncHandlerTransaction:
        # On failure (a cancellation included) __enter__ has closed the session itself.
        await self._session.run_sync(_sync_step(self._transaction.__enter__))
        return self

    async def claim(self, key: bytes, handler: str) -> bool:
        """Insert the claim ``(key, handler)``: True if won, False if a duplicate."""
        claim = self._transaction.claim
        return await self._session.run_sync(lambda _: claim(key, handler))

    async def claim_many(self, keys: Sequence[bytes], handler: str) -> Collection[bytes]:
        """Insert the claims for distinct sorted ``keys`` in one statement; the keys won."""
        claim_many = self._transaction.claim_many
        return await self._session.run_sync(lambda _: claim_many(keys, handler))

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

    async def commit(self) -> None:
        """Commit the claims with the handlers' writes, or raise and commit nothing."""
        await self._session.run_sync(_sync_step(self._transaction.commit))

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        end = self._transaction.__exit__
        await run_to_completion(self._session.run_sync(lambda _: end(exc_type, exc, traceback)))


def _sync_step(step: Callable[[], object]) -> Callable[[object], None]:
    def run(_session: object) -> None:
        step()

    return run
