"""``AsyncInbox.effect``: the steps of :func:`inbox.core.effects._steps.effect_steps` carried
out awaiting: the ledger's writes run through ``AsyncConnection.run_sync`` on connections of
their own (:mod:`inbox.core.effects._pool`), so no handler waits for a connection another
handler holds while it waits in turn; the call awaited between them."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable
from typing import Any

from sqlalchemy import Connection, Table
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from inbox._backends import check_supported
from inbox.aio._completion import run_to_completion
from inbox.core._run import CURRENT_RUN, HandlerRun
from inbox.core._steps import Failed
from inbox.core.effects._blocking import ledger_engine
from inbox.core.effects._identity import EffectRef
from inbox.core.effects._pool import OPTION_SETS_KEPT
from inbox.core.effects._steps import Call, EffectsBase, Write
from inbox.core.effects._tenant import read_searched_schema, schema_to_read
from inbox.errors import ConfigurationError

__all__ = ["AsyncEffectCall", "AsyncEffects"]

AsyncEffectCall = Callable[[Any], Awaitable[Any] | Any]
"""``call(key)``: an ``async def`` (or a plain function) making the effect with ``key`` as
the other side's idempotency key; its (awaited) result must be JSON-serializable."""


class AsyncEffects(EffectsBase[AsyncEngine]):
    """The effects of one async inbox: its ledger, its store, its retry policy."""

    _proxies: dict[int, AsyncEngine]  # an AsyncEngine around each ledger engine

    @staticmethod
    def _check_store(store: object) -> None:
        if not isinstance(store, AsyncEngine):
            raise ConfigurationError(
                "effect_store of an AsyncInbox must be an AsyncEngine "
                f"(create_async_engine(...)), got {type(store).__name__}"
            )
        check_supported(store.dialect)

    async def run(self, step: object, call: AsyncEffectCall, mode: object) -> Any:
        """``AsyncInbox.effect``: see its docstring."""
        claims = self._tenant_claims
        if claims is not None:
            current = CURRENT_RUN.get()
            effects = self.ledger.table if self._store is None else None
            if current is not None and schema_to_read(current.connection, claims, effects):
                await _read_searched_schema(current.connection, claims, effects)
        run, _, steps = self._begin(step, call, mode)
        engine = self._engine(run)
        reply: object = None
        try:
            while True:
                step = steps.send(reply)
                if step.__class__ is Write:
                    write = _write(engine, step)
                    try:
                        # A failure is recorded to the end even when the task is cancelled.
                        to_completion = step.to_completion
                        reply = await (run_to_completion(write) if to_completion else write)
                    except BaseException as exc:
                        reply = Failed(exc)
                elif step.__class__ is Call:
                    reply = await _call(run, call, step.ref)
                else:
                    await asyncio.sleep(step.seconds)  # type: ignore[union-attr]
                    reply = None
        except StopIteration as stop:
            return stop.value

    def _engine(self, run: HandlerRun) -> AsyncEngine:
        store = self._store
        sync_store = None if store is None else store.sync_engine
        engine = ledger_engine(self._ledgers, sync_store, run.connection.engine)
        if store is not None and engine is sync_store:
            return store
        proxies = self._proxies
        proxy = proxies.get(id(engine))
        if proxy is None or proxy.sync_engine is not engine:
            if len(proxies) >= OPTION_SETS_KEPT:  # bounded as the ledger engines are
                del proxies[next(iter(proxies))]
            proxy = proxies[id(engine)] = AsyncEngine(engine)
        return proxy


async def _read_searched_schema(
    connection: Connection, claims: Table, effects: Table | None
) -> None:
    """Read the schemas the claim connection's search path finds the claim table and the
    effect table beside it in (once per pooled connection), through the driver's greenlet
    as every statement is."""
    claim_connection = AsyncConnection(AsyncEngine(connection.engine), connection)
    await claim_connection.run_sync(read_searched_schema, claims, effects)


async def _write(engine: AsyncEngine, write: Write) -> Any:
    async with engine.connect() as connection:
        return await connection.run_sync(_on, write)


def _on(connection: Connection, write: Write) -> Any:
    return write.op(connection, *write.args)


async def _call(run: HandlerRun, call: AsyncEffectCall, ref: EffectRef) -> Any:
    run.enter(ref.step)
    try:
        result = call(ref.key)
        if inspect.isawaitable(result):
            result = await result
    except BaseException as exc:
        return Failed(exc)
    finally:
        run.leave(ref.step)
    return result
