"""AsyncInbox: the Inbox for asyncio code, on SQLAlchemy's ``AsyncSession``."""

from __future__ import annotations

import asyncio
import functools
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeAlias, TypeVar, overload

from sqlalchemy import Table
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession
from sqlalchemy.orm import Session

from inbox.aio._batch import AsyncBatchProcessor
from inbox.aio._effects import AsyncEffectCall, AsyncEffects
from inbox.aio._transaction import AsyncHandlerTransaction
from inbox.core._chain import AsyncDeliveryHook, AsyncMiddleware
from inbox.core._handlers import KeyFunc, RegisteredHandler, require_async
from inbox.core._registration import InboxBase
from inbox.core._routing import Planned, require_messages
from inbox.core._sessions import check_session_factory
from inbox.core._settlement import Failed, Pause, Run, advance, settle
from inbox.core.effects._identity import EffectMode
from inbox.errors import SETUP_ERRORS, InboxError, SessionConfigurationError
from inbox.message import Message
from inbox.result import Outcome, ProcessResult

__all__ = ["AsyncHandlerFunc", "AsyncInbox"]

AsyncHandlerFunc: TypeAlias = Callable[[Message, AsyncSession], Awaitable[object]]
"""An async handler: awaited with the message and the ``AsyncSession`` holding the claim."""

A = TypeVar("A", bound=AsyncHandlerFunc)
AB = TypeVar("AB", bound=Callable[[list[Message], AsyncSession], Awaitable[object]])
B = TypeVar("B")  # a handler's body= type
R = TypeVar("R")


class AsyncInbox(InboxBase[AsyncSession, AsyncEngine, AsyncMiddleware, AsyncDeliveryHook]):
    """The transactional inbox for asyncio: register ``async def`` handlers, then
    ``await process()`` each delivered message.

    ``session_factory`` makes a new :class:`~sqlalchemy.ext.asyncio.AsyncSession` per
    handler transaction (an ``async_sessionmaker`` bound to an engine from
    ``create_async_engine``). ``table``, ``on_unhandled``, ``transient_retries`` and
    ``effect_table`` mean what they mean for :class:`inbox.Inbox`, and so do the outcomes,
    errors and guards; ``effect_store`` is an :class:`~sqlalchemy.ext.asyncio.AsyncEngine`.

    A task cancelled while a handler runs (or while its claim or commit is on the wire)
    rolls the handler's transaction back, returns the connection to the pool and raises the
    :class:`asyncio.CancelledError` as itself; ``asyncio.timeout()`` around ``process()``
    behaves the same. Unlike the blocking inbox, the cancellation is not wrapped in
    :class:`~inbox.HandlerInterrupted`: it belongs to the task, not to the handler.

    ``sessions_for``, ``middleware`` and ``around_delivery`` are those of
    :class:`inbox.Inbox`, with ``async def`` middleware and hooks.
    """

    _EXAMPLE_FACTORY = "sqlalchemy.ext.asyncio.async_sessionmaker(engine)"
    _ASYNCHRONOUS = True

    def _check_factory(self, session_factory: Callable[[], AsyncSession]) -> None:
        check_session_factory(
            functools.partial(_sync_session, session_factory),
            self._claims.bind_clause,
            asynchronous=True,
        )

    def _start(
        self, effect_store: AsyncEngine | None, effect_table: str | Table, *, tenants: bool
    ) -> None:
        self._batches = AsyncBatchProcessor(
            self._registry, self._transaction, self._guards, self._backoff, self._run_planned
        )
        self._effects = AsyncEffects(
            self,
            effect_store,
            effect_table,
            self._backoff,
            tenants=tenants,
            claims=self._claims.table,
        )

    @overload
    def handler(self, func: A, /) -> A: ...

    @overload
    def handler(
        self,
        message_type: str | None = None,
        /,
        *,
        name: str | None = None,
        key: KeyFunc | None = None,
    ) -> Callable[[A], A]: ...

    @overload
    def handler(
        self,
        message_type: str | None = None,
        /,
        *,
        body: type[B],
        name: str | None = None,
        key: Callable[[Message[B]], str | uuid.UUID | bytes] | None = None,
    ) -> Callable[
        [Callable[[Message[B], AsyncSession], Awaitable[R]]],
        Callable[[Message[B], AsyncSession], Awaitable[R]],
    ]: ...

    def handler(
        self,
        func_or_type: Any = None,
        /,
        *,
        name: str | None = None,
        key: KeyFunc | None = None,
        body: type[Any] | None = None,
    ) -> Any:
        """Register an ``async def`` handler, in the forms :meth:`inbox.Inbox.handler`
        takes (bare, a type, ``name=``, ``key=``, ``body=``). ``key=`` stays a plain function: keys
        are derived before any I/O. A plain ``def`` handler is a
        :class:`~inbox.RegistrationError` here.

        The decorator only registers: it returns the function unchanged.
        """
        return self._decorator(func_or_type, name, key, body)

    @overload
    def batch_handler(self, func: AB, /) -> AB: ...

    @overload
    def batch_handler(
        self,
        message_type: str | None = None,
        /,
        *,
        name: str | None = None,
        key: KeyFunc | None = None,
    ) -> Callable[[AB], AB]: ...

    @overload
    def batch_handler(
        self,
        message_type: str | None = None,
        /,
        *,
        body: type[B],
        name: str | None = None,
        key: Callable[[Message[B]], str | uuid.UUID | bytes] | None = None,
    ) -> Callable[
        [Callable[[list[Message[B]], AsyncSession], Awaitable[R]]],
        Callable[[list[Message[B]], AsyncSession], Awaitable[R]],
    ]: ...

    def batch_handler(
        self,
        func_or_type: Any = None,
        /,
        *,
        name: str | None = None,
        key: KeyFunc | None = None,
        body: type[Any] | None = None,
    ) -> Any:
        """Register an ``async def`` batch handler ``(messages, session)``: what
        :meth:`inbox.Inbox.batch_handler` registers, awaited (once per
        :meth:`process_batch` transaction with the messages it won; with a one-element
        list by :meth:`process`).

        The decorator only registers: it returns the function unchanged.
        """
        return self._decorator(func_or_type, name, key, body, batch=True)

    def _check_handler(self, func: Callable[..., Any]) -> None:
        require_async(func)

    async def process(self, message: Message) -> ProcessResult:
        """Run every handler that takes ``message``, each exactly once, each in its own
        transaction with its own claim; the result and errors are those of
        :meth:`inbox.Inbox.process`."""
        if self._deliver is not None:
            return await self._deliver(message)  # type: ignore[no-any-return]
        planned = self._plan(message)
        if isinstance(planned, ProcessResult):
            return planned
        return await self._run_planned(planned)

    async def _process(self, message: Message) -> ProcessResult:
        planned = self._plan(message)
        if isinstance(planned, ProcessResult):
            return planned
        return await self._run_planned(planned)

    async def process_batch(self, messages: Sequence[Message]) -> list[ProcessResult | InboxError]:
        """Process many messages in ONE transaction, with one claim statement per handler;
        results, bisection and errors are those of :meth:`inbox.Inbox.process_batch`
        (one ``process()`` after another with ``around_delivery`` hooks or ``sessions_for``)."""
        batch = require_messages(messages, "process_batch")
        if self._one_by_one():
            return [await self._process_or_error(message) for message in batch]
        return await self._batches.process(batch, self._plan)

    async def _process_or_error(self, message: Message) -> ProcessResult | InboxError:
        try:
            return await self.process(message)
        except SETUP_ERRORS:
            raise
        except InboxError as exc:
            return exc

    async def effect(
        self,
        step: str,
        call: AsyncEffectCall,
        *,
        mode: EffectMode | str = EffectMode.AT_LEAST_ONCE,
    ) -> Any:
        """Await ``call(key)``, an effect outside the database, as
        :meth:`inbox.Inbox.effect` makes it (same records, keys, modes and errors); the
        ledger's writes run on a connection of ``effect_store``, or of the inbox's engine.
        ``call`` is usually an ``async def``; a plain function's result is taken as is.
        A cancellation while the call runs is recorded as the attempt's failure and
        propagates as itself."""
        return await self._effects.run(step, call, mode)

    async def _run_planned(self, planned: Planned) -> ProcessResult:
        # The decisions are settle()'s (inbox/core/_settlement.py); here they are awaited.
        steps, reply = settle(planned, self._backoff), None
        while not isinstance(step := advance(steps, reply), ProcessResult):
            reply = await (self._attempt(step) if isinstance(step, Run) else _pause(step))
        return step

    async def _attempt(self, run: Run) -> Outcome | Failed:
        try:
            return await self._run_once(run.handler, run.key, run.message)
        except BaseException as exc:  # settle() raises an exit exception again
            return Failed(exc)

    async def _run_once(self, handler: RegisteredHandler, key: bytes, message: Message) -> Outcome:
        async with self._transaction(message) as transaction:
            if not await transaction.begin_and_claim(key, handler.name):
                return Outcome.DUPLICATE  # leaving rolls back: nothing of ours to keep
            await transaction.run(handler, message, self._guards[handler.name], key)
            await transaction.check_and_commit()
        return Outcome.PROCESSED

    def _transaction(self, message: Message | None = None) -> AsyncHandlerTransaction:
        return AsyncHandlerTransaction(self._new_session(message), self._claims, self)


def _sync_session(session_factory: Callable[[], AsyncSession]) -> Session:
    """The blocking ``Session`` behind a new ``AsyncSession``, for the construction checks
    (they connect to nothing)."""
    session: object = session_factory()
    if isinstance(session, AsyncSession):
        return session.sync_session
    if isinstance(session, Session):
        type(session).close(session)
        raise SessionConfigurationError(
            "AsyncInbox needs an async_sessionmaker (sessions from create_async_engine); "
            "session_factory returned a blocking Session: use inbox.Inbox for that"
        )
    raise SessionConfigurationError(
        "session_factory must return a sqlalchemy.ext.asyncio.AsyncSession (use "
        f"async_sessionmaker(engine)), got {type(session).__name__}"
    )


async def _pause(pause: Pause) -> Failed | None:
    await asyncio.sleep(pause.seconds)
    return None
