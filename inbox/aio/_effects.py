"""``AsyncInbox.effect``: the blocking inbox's effect ledger (:mod:`inbox.core.effects._ledger`)
run through ``AsyncConnection.run_sync``, with the call awaited between its writes; on
connections of its own (:mod:`inbox.core.effects._pool`), so no handler waits for a connection
another handler holds while it waits in turn."""

from __future__ import annotations

import inspect
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from sqlalchemy import Connection, Table
from sqlalchemy.ext.asyncio import AsyncEngine

from inbox.aio._completion import run_to_completion
from inbox.aio._retry import run_with_retries
from inbox.core._backends import check_supported
from inbox.core._retry import Backoff
from inbox.core._run import HandlerRun
from inbox.core.effects._blocking import (
    begin_effect,
    describe_error,
    log_superseded,
    log_unrecorded,
    now,
    refuse_sqlite_claim_store,
)
from inbox.core.effects._identity import EffectRef
from inbox.core.effects._ledger import Call, Ledger, Stored
from inbox.core.effects._pool import LedgerEngines
from inbox.core.effects._results import (
    Kept,
    KeptResults,
    encode_result,
    refuses_result,
    result_refused,
)
from inbox.errors import ConfigurationError
from inbox.schema import resolve_effect_table

__all__ = ["AsyncEffectCall", "AsyncEffects"]

logger = logging.getLogger("inbox.effects")

AsyncEffectCall = Callable[[Any], Awaitable[Any] | Any]
"""``call(key)``: an ``async def`` (or a plain function) making the effect with ``key`` as
the other side's idempotency key; its (awaited) result must be JSON-serializable."""


class AsyncEffects:
    """The effects of one async inbox: its ledger, its store, its retry policy."""

    def __init__(
        self,
        owner: object,
        store: AsyncEngine | None,
        table: str | Table,
        backoff: Backoff,
        *,
        tenants: bool = False,
    ) -> None:
        if store is not None:
            if not isinstance(store, AsyncEngine):
                raise ConfigurationError(
                    "effect_store of an AsyncInbox must be an AsyncEngine "
                    f"(create_async_engine(...)), got {type(store).__name__}"
                )
            check_supported(store.dialect)
        self._owner = owner
        self._store = store
        self._tenants = tenants
        self._ledgers = LedgerEngines()
        self._kept = KeptResults()
        self._proxies: dict[int, AsyncEngine] = {}
        self.ledger = Ledger(resolve_effect_table(table))
        self._backoff = backoff

    async def run(self, step: object, call: AsyncEffectCall, mode: object) -> Any:
        """``AsyncInbox.effect``: see its docstring."""
        run, ref, checked_mode = begin_effect(
            self._owner,
            step,
            call,
            mode,
            tenants=self._tenants,
            shared_store=self._store is not None,
        )
        engine = self._engine(run)
        if ref.legacy is not None:
            legacy = ref
            ref = await self._retrying(
                legacy, lambda: self._on(engine, self.ledger.resolve, legacy)
            )
        kept = self._kept.take(ref.key)
        if kept is not None and await self._record(engine, ref, kept):
            return kept.result()  # made by an earlier attempt here, recorded only now
        at = now()
        start = self.ledger.start
        begun: Call | Stored = await self._retrying(
            ref, lambda: self._on(engine, start, ref, checked_mode, at)
        )
        if isinstance(begun, Stored):
            return json.loads(begun.result)
        if begun.attempt > 1:
            logger.info("effect %r of %r: attempt %d", ref.step, ref.handler, begun.attempt)
        run.enter(ref.step)
        try:
            result = call(ref.key)
            if inspect.isawaitable(result):
                result = await result
        except BaseException as exc:
            # Recorded to the end even when the task is being cancelled.
            await run_to_completion(self._record_failure(engine, ref, begun, exc))
            raise
        finally:
            run.leave(ref.step)
        made = Kept(begun.attempt, *encode_result(ref, result))
        if not await self._record(engine, ref, made):
            log_superseded(ref, begun.attempt)
        return made.result()

    async def _record(self, engine: AsyncEngine, ref: EffectRef, made: Kept) -> bool:
        """:meth:`inbox.core.effects._blocking.Effects._record`, awaited."""
        finish = self.ledger.finish
        try:
            return bool(
                await self._retrying(
                    ref, lambda: self._on(engine, finish, ref, made.attempt, made.text, now())
                )
            )
        except BaseException as exc:  # a cancellation too: the call was made all the same
            if made.text is None or not isinstance(exc, Exception) or not refuses_result(exc):
                self._kept.keep(ref.key, made)
                log_unrecorded(ref, made, exc)
                raise
            await self._retrying(
                ref, lambda: self._on(engine, finish, ref, made.attempt, None, now())
            )
            raise result_refused(ref, exc) from exc

    def _engine(self, run: HandlerRun) -> AsyncEngine:
        claim_engine = run.connection.engine
        store = self._store
        refuse_sqlite_claim_store(
            None if store is None else store.url, claim_engine, store is not None
        )
        if store is not None and store.sync_engine.pool is not claim_engine.pool:
            return store
        beside = self._ledgers.beside(claim_engine if store is None else store.sync_engine)
        proxy = self._proxies.get(id(beside))
        if proxy is None or proxy.sync_engine is not beside:
            proxy = self._proxies[id(beside)] = AsyncEngine(beside)
        return proxy

    async def _record_failure(
        self, engine: AsyncEngine, ref: EffectRef, begun: Call, exc: BaseException
    ) -> None:
        try:
            recorded = await self._on(
                engine, self.ledger.fail, ref, begun.attempt, describe_error(exc), now()
            )
        except Exception:
            logger.warning(
                "effect %r of %r: could not record the failure of attempt %d",
                ref.step,
                ref.handler,
                begun.attempt,
                exc_info=True,
            )
            return
        if not recorded:
            log_superseded(ref, begun.attempt)

    @staticmethod
    async def _on(engine: AsyncEngine, step: Callable[..., Any], *args: object) -> Any:
        async with engine.connect() as connection:
            return await connection.run_sync(_call, step, *args)

    async def _retrying(self, ref: EffectRef, work: Callable[[], Awaitable[Any]]) -> Any:
        return await run_with_retries(
            work, self._backoff, lambda: f"effect {ref.step!r} of {ref.handler!r}"
        )


def _call(connection: Connection, step: Callable[..., Any], *args: object) -> Any:
    return step(connection, *args)
