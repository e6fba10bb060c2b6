"""Batches, awaited: the steps of :func:`inbox.core._batch.settle` (a batch transaction, a
message alone, a pause before a retry) carried out with awaits; the functions that shape the
transaction are the blocking batch's."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence

from inbox.aio._transaction import AsyncHandlerTransaction
from inbox.core._batch import (
    Alone,
    BatchParts,
    BatchResult,
    Together,
    claims_to_make,
    finish,
    handlers_to_run,
    merge,
    settle,
    split,
)
from inbox.core._batch_handlers import batched
from inbox.core._routing import Planned
from inbox.core._settlement import Settlement
from inbox.core._steps import Ended, Failed, Pause, advance
from inbox.errors import HandlerFailed
from inbox.message import Message
from inbox.result import ProcessResult

__all__ = ["AsyncBatchProcessor"]


class AsyncBatchProcessor(BatchParts[AsyncHandlerTransaction, Awaitable[ProcessResult]]):
    """Runs :meth:`inbox.aio.AsyncInbox.process_batch`: the steps of
    :func:`inbox.core._batch.settle` carried out awaiting."""

    __slots__ = ()

    async def process(
        self,
        messages: Sequence[Message],
        plan: Callable[[Message], Planned | ProcessResult],
    ) -> list[BatchResult]:
        """Each message's result or error, in order."""
        results, planned = split(messages, plan)
        steps, reply = settle([p for _, p in planned], self._backoff), None
        while not isinstance(step := advance(steps, reply), Ended):
            reply = await self._carry_out(step)
        return merge(results, planned, step.value)

    async def _carry_out(self, step: Together | Alone | Pause) -> object:
        if isinstance(step, Alone):
            try:
                return await self._alone(step.planned)
            except HandlerFailed as failed:
                return failed
        if isinstance(step, Pause):
            await asyncio.sleep(step.seconds)
            return None
        try:
            return await self._run_once(step.batch)
        except Exception as exc:
            return Failed(exc)

    async def _run_once(self, batch: Sequence[Planned]) -> list[BatchResult]:
        settlements = [Settlement(planned.message) for planned in batch]
        async with self._transaction() as transaction:
            won = {
                name: set(await transaction.claim_many(keys, name))
                for name, keys in claims_to_make(self._registry, batch)
            }
            runs = handlers_to_run(batch, won, settlements)
            for handler, message, key in batched(runs, asynchronous=True):
                await transaction.run(handler, message, self._guards[handler.name], key)
            await transaction.check_and_commit()
        return finish(settlements)
