"""The settle plan every edge carries out: counters, log lines and copy headers, with no I/O.

The kombu dispatcher (:mod:`inbox.broker._dispatch`) and the FastStream edge
(:mod:`inbox.faststream._edge`) each read a delivery, run the inbox and then ask a
:class:`Settling` what the outcome means: it counts the handlers' outcomes, decides (ack,
retry, dead letter, halt, :func:`inbox.delivery._policy.decide`), writes the log line of the
decision and the headers of the copy. What is left to each edge is the I/O: the ack, the
confirmed copy, the give-back. So the two edges cannot drift apart in what they count, log or
write into a copy's headers.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, Final

from inbox.delivery import headers as h
from inbox.delivery._copies import trimmed_headers
from inbox.delivery._policy import (
    DeadLetter,
    DeadLetterReason,
    Decision,
    Halt,
    Retry,
    dead_letter_headers,
    decide,
    retry_headers,
)
from inbox.delivery._stats import WorkerStats
from inbox.delivery.topology import RetryPolicy
from inbox.errors import HandlerFailed
from inbox.result import Outcome, ProcessResult

__all__ = ["MAX_REFUSAL_WAIT", "Settling"]

MAX_REFUSAL_WAIT: Final = 30.0
"""The longest wait, in seconds, between two attempts at a copy the broker refused."""


class Settling:
    """What one edge counts, logs and writes when it settles a delivery (see the module)."""

    __slots__ = ("halted_by", "logger", "policy", "stats")

    def __init__(self, stats: WorkerStats, policy: RetryPolicy, logger: logging.Logger) -> None:
        self.stats = stats
        self.policy = policy
        self.logger = logger
        self.halted_by: BaseException | None = None
        """The configuration error that stopped the edge, once one did."""

    def decide(
        self,
        message_id: object,
        outcome: ProcessResult | BaseException,
        headers: Mapping[str, Any],
    ) -> Decision:
        """Count the handlers' outcomes (a line per duplicate) and decide what to do with the
        delivery that carried ``headers`` (its tries so far are read from them)."""
        result = outcome.result if isinstance(outcome, HandlerFailed) else outcome
        if isinstance(result, ProcessResult):
            for name, o in result.outcomes.items():
                if o is Outcome.PROCESSED:
                    self.stats.processed += 1
                elif o is Outcome.DUPLICATE:
                    self.stats.duplicates += 1
                    self.logger.info("message %s: %s skipped (duplicate)", message_id, name)
        return decide(outcome, h.tries_so_far(headers), self.policy)

    def halt(self, halt: Halt) -> None:
        """Record and log the configuration error that stops the consumer."""
        self.halted_by = halt.error
        self.logger.critical("configuration error, stopping: %s", h.describe(halt.error))

    def retry(
        self,
        retry: Retry,
        *,
        message_id: object,
        message_type: object,
        queue: str,
        headers: Mapping[str, Any],
    ) -> dict[str, Any]:
        """Count and log a failed try that will be retried; the headers the copy adds."""
        self.stats.failed_tries += 1
        self.stats.retried += 1
        self.logger.warning(
            "message %s (type %r) on %s: try %d/%d failed (%s); retry in %g s",
            message_id,
            message_type,
            queue,
            retry.tries,
            self.policy.max_tries,
            retry.error,
            retry.delay_ms / 1000,
        )
        return retry_headers(headers, retry)

    def dead_letter(
        self,
        dead: DeadLetter,
        *,
        message_id: object,
        message_type: object,
        queue: str,
        dead_letters: str,
        headers: Mapping[str, Any],
    ) -> dict[str, Any]:
        """Count and log a dead letter from ``queue`` to ``dead_letters``; the headers the
        copy adds."""
        if dead.tries is not None:
            self.stats.failed_tries += 1
        self.stats.dead_lettered += 1
        self.stats.dead_letter_reasons[str(dead.reason)] += 1
        self.logger.error(
            "message %s (type %r) dead-lettered to %s: %s%s: %s%s",
            message_id,
            message_type,
            dead_letters,
            dead.reason,
            f" after {dead.tries} tries" if dead.tries else "",
            dead.detail,
            f" (claim keys: {h.claim_keys_value(dead.claim_keys)})" if dead.claim_keys else "",
        )
        return dead_letter_headers(headers, dead, queue)

    def too_large(
        self,
        *,
        message_id: object,
        target: str,
        dead_letters: str,
        own: Mapping[str, Any],
        added: Mapping[str, Any],
    ) -> dict[str, Any]:
        """Count and log a copy for ``target`` that does not fit the broker's size limit (one
        AMQP frame, NATS's ``max_payload``), which goes to ``dead_letters`` instead; the
        trimmed headers it goes with (:func:`inbox.delivery._copies.trimmed_headers`)."""
        self.logger.error(
            "message %s: its copy for %s does not fit the broker's size limit; dead-lettered "
            "to %s with its own headers trimmed",
            message_id,
            target,
            dead_letters,
        )
        if target != dead_letters:  # a dead letter already counted as one
            self.stats.dead_lettered += 1
        self.stats.dead_letter_reasons[str(DeadLetterReason.COPY_TOO_LARGE)] += 1
        return trimmed_headers(own, added)

    def refused(
        self, message_id: object, target: str, refused: BaseException, refusals: int
    ) -> float:
        """Log a copy the broker refused for the ``refusals``-th time before; how long, in
        seconds, to hold the delivery before the next attempt (doubling, at most 30 s)."""
        wait = min(MAX_REFUSAL_WAIT, 2.0**refusals)
        self.logger.error(
            "message %s: the broker refused its copy for %s (%s); kept unacked, "
            "next attempt in %g s",
            message_id,
            target,
            refused,
            wait,
        )
        return wait

    def acked(self) -> None:
        """Count an acked delivery."""
        self.stats.acked += 1
