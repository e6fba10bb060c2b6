"""Batches, awaited: the blocking inbox's batch decisions (:func:`inbox.core._batch.settle` and
the functions that shape the transaction) driven with awaits."""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Mapping, Sequence

from inbox.aio._retry import run_with_retries
from inbox.aio._transaction import AsyncHandlerTransaction
from inbox.core._batch import (
    Alone,
    BatchResult,
    Steps,
    Together,
    claims_to_make,
    finish,
    handlers_to_run,
    merge,
    settle,
    split,
)
from inbox.core._batch_handlers import batched
from inbox.core._guards import Guards
from inbox.core._handlers import Registry
from inbox.core._retry import Backoff
from inbox.core._routing import Planned
from inbox.core._settlement import Settlement
from inbox.errors import HandlerFailed
from inbox.message import Message
from inbox.result import ProcessResult

__all__ = ["AsyncBatchProcessor"]


class AsyncBatchProcessor:
    """Runs :meth:`inbox.aio.AsyncInbox.process_batch` with the inbox's parts (as
    :class:`inbox.core._batch.BatchProcessor` does for the blocking inbox)."""

    def __init__(
        self,
        registry: Registry,
        transaction: Callable[[], AsyncHandlerTransaction],
        guards: Mapping[str, Guards],
        backoff: Backoff,
        alone: Callable[[Planned], Awaitable[ProcessResult]],
    ) -> None:
        self._registry = registry
        self._transaction = transaction
        self._guards = guards
        self._backoff = backoff
        self._alone = alone

    async def process(
        self,
        messages: Sequence[Message],
        plan: Callable[[Message], Planned | ProcessResult],
    ) -> list[BatchResult]:
        """Each message's result or error, in order."""
        results, planned = split(messages, plan)
        steps = settle([p for _, p in planned], self._backoff.retries)
        return merge(results, planned, await self._drive(steps))

    async def _drive(self, steps: Steps) -> list[BatchResult]:
        try:
            step = next(steps)
            while True:
                failure: Exception | None = None
                try:
                    done = await self._run(step)
                except Exception as exc:
                    failure = exc
                # Thrown outside the except block: what runs next must not chain to it.
                step = steps.send(done) if failure is None else steps.throw(failure)
                del failure
        except StopIteration as settled:
            value: list[BatchResult] = settled.value
            return value

    async def _run(self, step: Together | Alone) -> object:
        if isinstance(step, Alone):
            try:
                return await self._alone(step.planned)
            except HandlerFailed as failed:
                return failed
        size = len(step.batch)
        run = functools.partial(self._run_once, step.batch)
        return await run_with_retries(run, self._backoff, lambda: f"batch of {size} messages")

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
