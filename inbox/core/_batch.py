"""Batches: many messages in one handler transaction, one claim statement per handler, and
bisection down to the failing messages when the batch rolls back.

The decisions do no I/O, so the blocking and the async inbox share them: :func:`settle` is a
generator that yields the steps to run (:class:`Together`, :class:`Alone`, a
:class:`~inbox.core._steps.Pause` before a retry) and is sent each step's results (or
:class:`~inbox.core._steps.Failed`); :func:`split`, :func:`claims_to_make`,
:func:`handlers_to_run` and :func:`finish` shape the batch and its transaction.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeAlias, TypeVar

from inbox.core._batch_handlers import batched
from inbox.core._guards import Guards
from inbox.core._handlers import RegisteredHandler, Registry
from inbox.core._retry import Backoff, is_transient, rerun
from inbox.core._routing import Planned
from inbox.core._settlement import Settlement
from inbox.core._steps import Ended, Failed, Pause, advance
from inbox.core._transaction import HandlerTransaction
from inbox.errors import SETUP_ERRORS, ClaimCommittedEarly, HandlerFailed, InboxError
from inbox.message import Message
from inbox.result import Outcome, ProcessResult

__all__ = [
    "Alone",
    "BatchParts",
    "BatchProcessor",
    "BatchResult",
    "Steps",
    "Together",
    "claims_to_make",
    "finish",
    "handlers_to_run",
    "merge",
    "settle",
    "split",
]

logger = logging.getLogger("inbox.core")

BatchResult: TypeAlias = ProcessResult | InboxError
T = TypeVar("T")
A = TypeVar("A")


@dataclass(frozen=True, slots=True)
class Together:
    """Step: run these messages in one handler transaction; send back their results in
    order, or :class:`~inbox.core._steps.Failed` with the error the transaction ended with."""

    batch: Sequence[Planned]


@dataclass(frozen=True, slots=True)
class Alone:
    """Step: process this message as ``process()`` would; send back its result, or its
    :class:`~inbox.HandlerFailed` as the result."""

    planned: Planned


Steps: TypeAlias = Generator[Together | Alone | Pause, Any, list[BatchResult]]


def split(
    messages: Sequence[Message], plan: Callable[[Message], Planned | ProcessResult]
) -> tuple[list[BatchResult | None], list[tuple[int, Planned]]]:
    """Plan every message: the results known already (by position; None for the others)
    and the planned messages with their positions."""
    results: list[BatchResult | None] = [None] * len(messages)
    planned: list[tuple[int, Planned]] = []
    for index, message in enumerate(messages):
        try:
            made = plan(message)
        except InboxError as exc:  # UnhandledMessage, InvalidKey: this message only
            results[index] = exc
            continue
        if isinstance(made, ProcessResult):
            results[index] = made
        else:
            planned.append((index, made))
    return results, planned


def merge(
    results: list[BatchResult | None],
    planned: Sequence[tuple[int, Planned]],
    settled: Sequence[BatchResult],
) -> list[BatchResult]:
    """Put the settled results of the planned messages at their positions."""
    for (index, _), outcome in zip(planned, settled, strict=True):
        results[index] = outcome
    return [r for r in results if r is not None]


def settle(batch: Sequence[Planned], backoff: Backoff) -> Steps:
    """The steps that settle ``batch``: together (re-run after transient errors as
    ``backoff`` allows), then halves of it down to the failing messages, or each message
    alone when the database keeps aborting it."""
    if len(batch) <= 1:
        alone: list[BatchResult] = []
        for planned in batch:
            alone.append((yield Alone(planned)))
        return alone
    together = Together(batch)
    done = yield together
    if done.__class__ is Failed and not isinstance(done.error, SETUP_ERRORS):
        size = len(batch)
        done = yield from rerun(together, done, backoff, lambda: f"batch of {size} messages")
    if done.__class__ is not Failed:
        settled: list[BatchResult] = done
        return settled
    failure = done.error
    if isinstance(failure, SETUP_ERRORS) or not isinstance(failure, Exception):
        raise failure
    if isinstance(failure, ClaimCommittedEarly):
        # A handler committed the batch's claims under the inbox: which handlers' writes
        # went in with them cannot be known, so every message goes to reconciliation.
        return [_failed(planned, failure) for planned in batch]
    if is_transient(failure):
        # Deadlocks, lock timeouts, a lost connection outlasted the retries: maybe one
        # message's locks, maybe the database. Each message alone then, as without
        # batching: the healthy ones commit, each gets its own retries.
        logger.warning(
            "batch of %d messages failed with a transient database error after %d "
            "retries (%s); processing its messages one by one",
            len(batch),
            backoff.retries,
            type(failure).__name__,
        )
        del failure, done
        each: list[BatchResult] = []
        for planned in batch:
            each.append((yield Alone(planned)))
        return each
    middle = len(batch) // 2
    logger.info(
        "batch of %d messages rolled back (%s: %s); splitting it in %d + %d",
        len(batch),
        type(failure).__name__,
        failure,
        middle,
        len(batch) - middle,
    )
    del failure, done
    first = yield from settle(batch[:middle], backoff)
    return first + (yield from settle(batch[middle:], backoff))


def claims_to_make(registry: Registry, batch: Sequence[Planned]) -> list[tuple[str, list[bytes]]]:
    """Each handler's distinct keys in the batch, sorted, handlers in registration order (as
    every batch claims them, so concurrent batches lock in the same order)."""
    keys_by_handler: dict[str, set[bytes]] = {}
    for planned in batch:
        for handler, key in zip(planned.handlers, planned.keys, strict=True):
            keys_by_handler.setdefault(handler.name, set()).add(key)
    return [
        (handler.name, sorted(keys))
        for handler in registry
        if (keys := keys_by_handler.get(handler.name))
    ]


def handlers_to_run(
    batch: Sequence[Planned], won: dict[str, set[bytes]], settlements: Sequence[Settlement]
) -> Iterator[tuple[RegisteredHandler, Message, bytes]]:
    """The handler runs (handler, message, claim key) the batch's transaction makes, in
    order, given the keys ``won``:
    each outcome is recorded in ``settlements`` (PROCESSED once the caller asks for the
    next run, so a run that raises is never recorded)."""
    for planned, settlement in zip(batch, settlements, strict=True):
        for handler, key in zip(planned.handlers, planned.keys, strict=True):
            owned = won[handler.name]
            if key not in owned:
                settlement.outcomes[handler.name] = Outcome.DUPLICATE
                continue
            owned.discard(key)  # a later message with this key is a duplicate
            yield handler, planned.message, key
            settlement.outcomes[handler.name] = Outcome.PROCESSED


def finish(settlements: Sequence[Settlement]) -> list[BatchResult]:
    """The results of a committed batch transaction."""
    results: list[BatchResult] = []
    for settlement in settlements:
        for name in [n for n, o in settlement.outcomes.items() if o is Outcome.DUPLICATE]:
            settlement.done(name, Outcome.DUPLICATE)  # logged once committed
        results.append(settlement.result())
    return results


@dataclass(frozen=True, slots=True)
class BatchParts(Generic[T, A]):
    """What a batch runs with, from its inbox: the registry, a factory of handler
    transactions, the handlers' guards, the retry policy, and ``_alone``, the per-message
    path that a batch bisected down to one message takes."""

    _registry: Registry
    _transaction: Callable[[], T]
    _guards: Mapping[str, Guards]
    _backoff: Backoff
    _alone: Callable[[Planned], A]


class BatchProcessor(BatchParts[HandlerTransaction, ProcessResult]):
    """Runs :meth:`inbox.Inbox.process_batch`: the steps of :func:`settle` carried out
    blocking."""

    __slots__ = ()

    def process(
        self,
        messages: Sequence[Message],
        plan: Callable[[Message], Planned | ProcessResult],
    ) -> list[BatchResult]:
        """Each message's result or error, in order (see :meth:`inbox.Inbox.process_batch`)."""
        results, planned = split(messages, plan)
        steps, reply = settle([p for _, p in planned], self._backoff), None
        while not isinstance(step := advance(steps, reply), Ended):
            reply = self._carry_out(step)
        return merge(results, planned, step.value)

    def _carry_out(self, step: Together | Alone | Pause) -> object:
        if isinstance(step, Alone):
            try:
                return self._alone(step.planned)
            except HandlerFailed as failed:
                return failed
        if isinstance(step, Pause):
            time.sleep(step.seconds)
            return None
        try:
            return self._run_once(step.batch)
        except Exception as exc:
            return Failed(exc)

    def _run_once(self, batch: Sequence[Planned]) -> list[BatchResult]:
        settlements = [Settlement(planned.message) for planned in batch]
        with self._transaction() as transaction:
            won = {
                name: set(transaction.claim_many(keys, name))
                for name, keys in claims_to_make(self._registry, batch)
            }
            runs = handlers_to_run(batch, won, settlements)
            for handler, message, key in batched(runs, asynchronous=False):
                transaction.run(handler, message, self._guards[handler.name], key)
            transaction.check_and_commit()
        return finish(settlements)


def _failed(planned: Planned, error: Exception) -> HandlerFailed:
    failures = {handler.name: error for handler in planned.handlers}
    result = ProcessResult(planned.message.id, {})
    keys = dict(zip((handler.name for handler in planned.handlers), planned.keys, strict=True))
    failed = HandlerFailed(planned.message.id, failures, result, keys)
    failed.__cause__ = error
    return failed
