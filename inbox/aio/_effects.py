"""``AsyncInbox.effect``: the blocking inbox's effect ledger (:mod:`inbox._effect_ledger`)
run through ``AsyncConnection.run_sync``, with the call awaited between its writes."""

from __future__ import annotations

import inspect
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from sqlalchemy import Connection, Engine, Table
from sqlalchemy.ext.asyncio import AsyncEngine

from inbox._backends import check_supported
from inbox._effect_ledger import Call, EffectRef, Ledger, Stored
from inbox._effect_run import HandlerRun
from inbox._effects import (
    begin_effect,
    describe_error,
    encode_result,
    log_superseded,
    now,
    refuse_sqlite_claim_store,
    result_refused,
)
from inbox._retry import Backoff, is_transient
from inbox.aio._completion import run_to_completion
from inbox.aio._retry import run_with_retries
from inbox.schema import resolve_effect_table

__all__ = ["AsyncEffectCall", "AsyncEffects"]

logger = logging.getLogger("inbox.effects")

AsyncEffectCall = Callable[[Any], Awaitable[Any] | Any]
"""``call(key)``: an ``async def`` (or a plain function) making the effect with ``key`` as
the other side's idempotency key; its (awaited) result must be JSON-serializable."""


class AsyncEffects:
    """The effects of one async inbox: its ledger, its store, its retry policy."""

    def __init__(
        self, owner: object, store: AsyncEngine | None, table: str | Table, backoff: Backoff
    ) -> None:
        if store is not None:
            if not isinstance(store, AsyncEngine):
                raise TypeError(
                    "effect_store of an AsyncInbox must be an AsyncEngine "
                    f"(create_async_engine(...)), got {type(store).__name__}"
                )
            check_supported(store.dialect)
        self._owner = owner
        self._store = store
        self._proxies: dict[int, AsyncEngine] = {}
        self.ledger = Ledger(resolve_effect_table(table))
        self._backoff = backoff

    async def run(self, step: object, call: AsyncEffectCall, mode: object) -> Any:
        """``AsyncInbox.effect``: see its docstring."""
        run, ref, checked_mode = begin_effect(self._owner, step, call, mode)
        engine = self._engine(run)
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
        text, unstorable = encode_result(ref, result)
        try:
            finished = await self._retrying(
                ref, lambda: self._on(engine, self.ledger.finish, ref, begun.attempt, text, now())
            )
        except Exception as refused:
            if text is None or is_transient(refused):
                raise  # still 'started': the next attempt decides by the mode
            await self._retrying(
                ref, lambda: self._on(engine, self.ledger.finish, ref, begun.attempt, None, now())
            )
            raise result_refused(ref, refused) from refused
        if not finished:
            log_superseded(ref, begun)
        if unstorable is not None:
            raise unstorable
        assert text is not None
        return json.loads(text)

    def _engine(self, run: HandlerRun) -> AsyncEngine:
        claim_engine = run.connection.engine
        store = self._store
        refuse_sqlite_claim_store(
            None if store is None else store.url, claim_engine, store is not None
        )
        if store is not None:
            return store
        proxy = self._proxies.get(id(claim_engine))
        if proxy is None or proxy.sync_engine is not claim_engine:
            proxy = self._proxies[id(claim_engine)] = _proxy(claim_engine)
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
            log_superseded(ref, begun)

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


def _proxy(engine: Engine) -> AsyncEngine:
    """The ``AsyncEngine`` around the claim's engine (same pool): the default store."""
    return AsyncEngine(engine)
