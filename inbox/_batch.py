"""Batches: many messages in one handler transaction, one claim statement per handler, and
bisection down to the failing messages when the batch rolls back."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Mapping, Sequence

from inbox._commit_guard import Guards
from inbox._handlers import Registry
from inbox._plan import CONFIGURATION_ERRORS, Planned, Settlement
from inbox._retry import Backoff, is_transient, run_with_retries
from inbox._transaction import HandlerTransaction
from inbox.errors import ClaimCommittedEarly, HandlerFailed, InboxError
from inbox.message import Message
from inbox.result import Outcome, ProcessResult

__all__ = ["BatchProcessor"]

logger = logging.getLogger("inbox.core")

_Result = ProcessResult | InboxError


class BatchProcessor:
    """Runs :meth:`inbox.Inbox.process_batch` with the inbox's own parts: its registry, a
    factory of handler transactions, the handlers' guards, the retry policy, and ``alone``,
    the per-message path that a batch bisected down to one message takes."""

    def __init__(
        self,
        registry: Registry,
        transaction: Callable[[], HandlerTransaction],
        guards: Mapping[str, Guards],
        backoff: Backoff,
        alone: Callable[[Planned], ProcessResult],
    ) -> None:
        self._registry = registry
        self._transaction = transaction
        self._guards = guards
        self._backoff = backoff
        self._alone = alone

    def process(
        self,
        messages: Sequence[Message],
        plan: Callable[[Message], Planned | ProcessResult],
    ) -> list[_Result]:
        """Each message's result or error, in order (see :meth:`inbox.Inbox.process_batch`)."""
        results: list[_Result | None] = [None] * len(messages)
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
        settled = self._settle([p for _, p in planned])
        for (index, _), outcome in zip(planned, settled, strict=True):
            results[index] = outcome
        return [r for r in results if r is not None]

    def _settle(self, batch: Sequence[Planned]) -> list[_Result]:
        if len(batch) <= 1:
            return [self._process_alone(planned) for planned in batch]
        try:
            run = functools.partial(self._run_once, batch)
            return run_with_retries(run, self._backoff, lambda: f"batch of {len(batch)} messages")
        except CONFIGURATION_ERRORS:
            raise
        except ClaimCommittedEarly as early:
            # A handler committed the batch's claims under the inbox: which handlers' writes
            # went in with them cannot be known, so every message goes to reconciliation.
            return [_failed(planned, early) for planned in batch]
        except Exception as exc:
            failure = exc
        # Outside the except block: the halves' own errors must not chain to this one.
        if is_transient(failure):
            # Deadlocks, lock timeouts, a lost connection outlasted the retries: maybe one
            # message's locks, maybe the database. Each message alone then, as without
            # batching: the healthy ones commit, each gets its own retries.
            logger.warning(
                "batch of %d messages failed with a transient database error after %d "
                "retries (%s); processing its messages one by one",
                len(batch),
                self._backoff.retries,
                type(failure).__name__,
            )
            del failure
            return [self._process_alone(planned) for planned in batch]
        middle = len(batch) // 2
        logger.info(
            "batch of %d messages rolled back (%s: %s); splitting it in %d + %d",
            len(batch),
            type(failure).__name__,
            failure,
            middle,
            len(batch) - middle,
        )
        del failure
        return self._settle(batch[:middle]) + self._settle(batch[middle:])

    def _process_alone(self, planned: Planned) -> _Result:
        try:
            return self._alone(planned)
        except HandlerFailed as failed:
            return failed

    def _run_once(self, batch: Sequence[Planned]) -> list[_Result]:
        settlements = [Settlement(planned.message) for planned in batch]
        with self._transaction() as transaction:
            won = self._claim(transaction, batch)
            for planned, settlement in zip(batch, settlements, strict=True):
                for handler, key in zip(planned.handlers, planned.keys, strict=True):
                    owned = won[handler.name]
                    if key not in owned:
                        settlement.outcomes[handler.name] = Outcome.DUPLICATE
                        continue
                    owned.discard(key)  # a later message with this key is a duplicate
                    transaction.run(handler, planned.message, self._guards[handler.name])
                    settlement.outcomes[handler.name] = Outcome.PROCESSED
            transaction.commit()
        results: list[_Result] = []
        for settlement in settlements:
            for name in [n for n, o in settlement.outcomes.items() if o is Outcome.DUPLICATE]:
                settlement.done(name, Outcome.DUPLICATE)  # logged once committed
            results.append(settlement.result())
        return results

    def _claim(
        self, transaction: HandlerTransaction, batch: Sequence[Planned]
    ) -> dict[str, set[bytes]]:
        """One claim statement per handler for all its keys in the batch; the keys won."""
        keys_by_handler: dict[str, set[bytes]] = {}
        for planned in batch:
            for handler, key in zip(planned.handlers, planned.keys, strict=True):
                keys_by_handler.setdefault(handler.name, set()).add(key)
        won: dict[str, set[bytes]] = {}
        for handler in self._registry:  # registration order, as every batch does
            keys = keys_by_handler.get(handler.name)
            if keys:
                won[handler.name] = set(transaction.claim_many(sorted(keys), handler.name))
        return won


def _failed(planned: Planned, error: Exception) -> HandlerFailed:
    failures = {handler.name: error for handler in planned.handlers}
    result = ProcessResult(planned.message.id, {})
    failed = HandlerFailed(planned.message.id, failures, result)
    failed.__cause__ = error
    return failed
