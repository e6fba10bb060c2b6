"""What the worker does with a delivery, decided without a broker: ack, retry or dead-letter.

:func:`decide` is a pure function of what the inbox made of the message (a result, or the
error ``process`` raised), the tries recorded on the delivery, and the :class:`RetryPolicy`.
The worker carries the decision out; nothing here does I/O.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Final

from inbox.delivery import headers as h
from inbox.delivery._frames import error_frames
from inbox.delivery.topology import RetryPolicy
from inbox.errors import (
    SETUP_ERRORS,
    HandlerFailed,
    InvalidBody,
    InvalidKey,
    TransactionControlError,
    UncertainEffect,
    UnhandledMessage,
)
from inbox.result import ProcessResult

__all__ = [
    "ACK",
    "Ack",
    "DeadLetter",
    "DeadLetterReason",
    "Decision",
    "Halt",
    "Retry",
    "dead_letter_headers",
    "decide",
    "describe_failure",
    "retry_headers",
]

# A misconfigured session factory or database is not the message's fault: every message
# would fail the same way, so none of them may be retried away or dead-lettered.


class DeadLetterReason(StrEnum):
    """Why a delivery went to ``<queue>.dlq`` (its ``x-inbox-reason`` header)."""

    MISSING_ID = "missing-message-id"
    INVALID_ID = "invalid-message-id"
    UNREADABLE_PROPERTIES = "unreadable-properties"
    UNDECODABLE_BODY = "undecodable-body"
    BODY_TOO_LARGE = "body-too-large"
    INVALID_MESSAGE = "invalid-message"
    UNHANDLED_TYPE = "unhandled-type"
    INVALID_KEY = "invalid-key"
    INVALID_BODY = "invalid-body"
    HANDLER_FAILED = "handler-failed"
    TRANSACTION_ENDED = "transaction-ended"
    UNCERTAIN_EFFECT = "uncertain-effect"
    COPY_TOO_LARGE = "copy-too-large"


@dataclass(frozen=True, slots=True)
class Ack:
    """Every handler committed or was a duplicate: ack the delivery."""


@dataclass(frozen=True, slots=True)
class Retry:
    """Failed try number ``tries``: send a copy that comes back after ``delay_ms``."""

    tries: int
    delay_ms: int
    error: str
    failed_handlers: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """Send the delivery to ``<queue>.dlq`` with ``reason``; ``tries`` is set when the
    decision follows a failed try (it is then the number of tries that failed)."""

    reason: DeadLetterReason
    detail: str
    tries: int | None = None
    failed_handlers: tuple[str, ...] = ()
    claim_keys: tuple[tuple[str, uuid.UUID], ...] = ()
    """Each handler that claims under a key other than the message id, with that key."""
    frame: str | None = None
    """Where in the application's code the handlers failed (the ``x-inbox-error-frame``
    header)."""


@dataclass(frozen=True, slots=True)
class Halt:
    """A configuration error: give the delivery back untouched and stop the worker."""

    error: BaseException


Decision = Ack | Retry | DeadLetter | Halt

ACK: Final = Ack()
"""The one :class:`Ack` every edge uses (a value, made once: a call less per delivery)."""


def decide(
    outcome: ProcessResult | BaseException, tries_so_far: int, policy: RetryPolicy
) -> Decision:
    """The decision for a delivery whose processing gave ``outcome``.

    ``tries_so_far`` is the number of failed tries recorded on the delivery (its
    ``x-inbox-tries`` header). ``KeyboardInterrupt`` and ``SystemExit`` are never decided on:
    they stop the process.
    """
    if isinstance(outcome, ProcessResult):
        return ACK
    if isinstance(outcome, KeyboardInterrupt | SystemExit):
        raise TypeError(f"{type(outcome).__name__} stops the worker; it is not decided on")
    failures = outcome.failures if isinstance(outcome, HandlerFailed) else {}
    for raised in (outcome, *failures.values()):
        if isinstance(raised, SETUP_ERRORS):
            return Halt(raised)
    if isinstance(outcome, UnhandledMessage):
        return DeadLetter(DeadLetterReason.UNHANDLED_TYPE, str(outcome))
    if isinstance(outcome, InvalidKey):
        return DeadLetter(DeadLetterReason.INVALID_KEY, str(outcome))
    if isinstance(outcome, InvalidBody):
        return DeadLetter(DeadLetterReason.INVALID_BODY, str(outcome))
    tries = tries_so_far + 1
    described = (
        describe_failure(outcome) if isinstance(outcome, HandlerFailed) else h.describe(outcome)
    )
    failed = tuple(failures)
    if any(isinstance(e, TransactionControlError) for e in failures.values()):
        # The handler ended the inbox's transaction: its claim may be committed without the
        # rest of its writes, so a retry would be skipped as a duplicate. A person decides.
        reason = DeadLetterReason.TRANSACTION_ENDED
    elif any(isinstance(e, UncertainEffect) for e in failures.values()):
        # An effect outside the database may have been made and must not be made again:
        # every retry would raise the same. A person finds out what happened.
        reason = DeadLetterReason.UNCERTAIN_EFFECT
    elif policy.exhausted(tries):
        reason = DeadLetterReason.HANDLER_FAILED
    else:
        return Retry(tries, policy.delay_ms(tries), described, failed)
    # Only here, on the way to the dead-letter queue: the success path never walks a traceback.
    return DeadLetter(
        reason, described, tries, failed, _claim_keys(outcome), error_frames(failures)
    )


def _claim_keys(outcome: BaseException) -> tuple[tuple[str, uuid.UUID], ...]:
    if not isinstance(outcome, HandlerFailed):
        return ()
    own = outcome.message_id.bytes
    return tuple(
        (name, uuid.UUID(bytes=key)) for name, key in outcome.claim_keys.items() if key != own
    )


def describe_failure(failed: HandlerFailed) -> str:
    """``handler: ExceptionType: message`` for each failed handler, joined by ``; ``."""
    return "; ".join(f"{name}: {h.describe(exc)}" for name, exc in failed.failures.items())


def retry_headers(headers: Mapping[str, Any], retry: Retry) -> dict[str, Any]:
    """The headers a retry copy adds to the delivery's own ``headers``."""
    return h.failure_headers(headers, retry.tries, retry.error, retry.failed_handlers)


def dead_letter_headers(headers: Mapping[str, Any], dead: DeadLetter, queue: str) -> dict[str, Any]:
    """The headers a dead letter from ``queue`` adds to the delivery's own ``headers``."""
    extra: dict[str, Any] = {}
    if dead.tries is not None:
        extra = h.failure_headers(headers, dead.tries, dead.detail, dead.failed_handlers)
    extra |= {
        h.REASON: str(dead.reason),
        h.SOURCE_QUEUE: queue,
        h.DEAD_LETTERED_AT: h.now_utc(),
    }
    if dead.claim_keys:
        extra[h.CLAIM_KEYS] = h.claim_keys_value(dead.claim_keys)
    if dead.frame is not None:
        extra[h.ERROR_FRAME] = dead.frame
    extra.setdefault(h.ERROR, h.truncate(dead.detail))
    return extra
