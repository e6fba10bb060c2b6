"""A message's handler runs settled into its result, written once for the blocking and the
async inbox: :func:`settle` is a generator of the steps to take (run a handler's
transaction, wait before a retry as :func:`inbox.core._retry.rerun` decides), sent each
step's outcome; the inboxes only carry the steps out, one blocking, one awaiting (the way a
sans-I/O protocol is shared by its callers).
"""

from __future__ import annotations

import functools
import logging
import uuid
from collections.abc import Generator
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import TypeAlias

from inbox._oneline import describe_error
from inbox.core._handlers import RegisteredHandler
from inbox.core._retry import Backoff, rerun
from inbox.core._routing import Planned, describe
from inbox.core._steps import Failed, Pause
from inbox.errors import SETUP_ERRORS, HandlerFailed
from inbox.message import Message
from inbox.result import Outcome, ProcessResult
from inbox.telemetry._core import MessageWatch, watch

__all__ = ["Failed", "Pause", "Run", "Settlement", "Steps", "advance", "settle", "settled"]

logger = logging.getLogger("inbox.core")

_UNWATCHED: AbstractContextManager[None] = nullcontext()


@dataclass(frozen=True, slots=True)
class Run:
    """Step: run ``handler``'s transaction on ``message`` under ``key`` once; send back its
    :class:`~inbox.Outcome`, or a :class:`Failed` with the error it raised."""

    handler: RegisteredHandler
    key: bytes
    message: Message


Steps: TypeAlias = Generator[Run | Pause, "Outcome | Failed | None", ProcessResult]


def settle(planned: Planned, backoff: Backoff, *, first: Failed | None = None) -> Steps:
    """The steps that settle ``planned``: each handler's transaction, re-run after transient
    errors as ``backoff`` allows; returns the result (or raises
    :class:`~inbox.HandlerFailed`, or a configuration error as itself).

    ``first``: the first handler's first run was already made, unwatched, and failed so
    (see :func:`settled`): the steps go on from there, deciding as for any run."""
    message = planned.message
    settlement = Settlement(message)
    watch = settlement.watch
    for handler, key in zip(planned.handlers, planned.keys, strict=True):
        running = _UNWATCHED if watch is None else watch.running(handler.name)
        with running:
            run = Run(handler, key, message)
            if first is None:
                done = yield run
            else:
                done, first = first, None
            if done.__class__ is Failed and not isinstance(done.error, SETUP_ERRORS):
                what = functools.partial(describe, handler, message)
                done = yield from rerun(run, done, backoff, what)
            if done.__class__ is not Failed:
                settlement.done(handler.name, done, key)  # type: ignore[arg-type]
                continue
            error = done.error
            if isinstance(error, SETUP_ERRORS) or not isinstance(error, Exception):
                raise error
            settlement.failed(handler.name, error, key)
    if settlement.failures:  # for the dead letter: where each handler's claims are
        settlement.claim_keys = dict(
            zip((h.name for h in planned.handlers), planned.keys, strict=True)
        )
    return settlement.result()


def settled(message: Message, handler: str, outcome: Outcome, key: bytes) -> ProcessResult:
    """The result of a message taken by one ``handler`` whose first run ended in
    ``outcome``, with no telemetry watching (:func:`~inbox.telemetry._core.watched` False):
    what :func:`settle` returns then, without its steps (the common case, made cheap)."""
    _log_done(message, handler, outcome, key)
    return ProcessResult(message.id, {handler: outcome})


def advance(steps: Steps, reply: Outcome | Failed | None) -> Run | Pause | ProcessResult:
    """Send ``reply`` (None to start) to ``steps``: the next step, or the result."""
    try:
        return steps.send(reply)
    except StopIteration as finished:
        result: ProcessResult = finished.value
        return result


@dataclass(slots=True)
class Settlement:
    """The outcomes of one message's handlers as they come in, then its result."""

    message: Message
    outcomes: dict[str, Outcome] = field(default_factory=dict)
    failures: dict[str, Exception] = field(default_factory=dict)
    claim_keys: dict[str, bytes] | None = None
    """Each handler's claim key, once a handler failed (for :class:`~inbox.HandlerFailed`)."""
    watch: MessageWatch | None = field(init=False, repr=False, compare=False)
    """The message's telemetry (None without OpenTelemetry): with tracing, its
    ``running(handler)`` makes the handler's span current around its run, retries included."""

    def __post_init__(self) -> None:
        self.watch = watch(self.message)

    def done(self, handler: str, outcome: Outcome, key: bytes | None = None) -> None:
        """Record a handler that committed (PROCESSED) or was skipped (DUPLICATE) under
        claim ``key`` (None: a batch's duplicate, logged without it)."""
        self.outcomes[handler] = outcome
        if self.watch is not None:
            self.watch.done(handler, outcome)
        _log_done(self.message, handler, outcome, key)

    def failed(self, handler: str, error: Exception, key: bytes | None = None) -> None:
        """Record a handler whose transaction was rolled back (it claims under ``key``)."""
        self.failures[handler] = error
        if self.watch is not None:
            self.watch.failed(handler, error)
        # One line per failure; the traceback only at DEBUG (the caller also gets the
        # error in HandlerFailed, and a worker logs its decision: retry or dead letter).
        logger.warning(
            "handler %s failed on message %s (type %r)%s, rolled back: %s",
            handler,
            self.message.id,
            self.message.type,
            _under(self.message, key),
            describe_error(error),
            exc_info=error if logger.isEnabledFor(logging.DEBUG) else None,
            extra={"inbox_error": error},  # for log filters: the error itself
        )

    def result(self) -> ProcessResult:
        """The result, or :class:`~inbox.HandlerFailed` (chained from the first failure)
        when a handler failed: the others' outcomes are in its ``result``."""
        result = ProcessResult(self.message.id, dict(self.outcomes))
        if self.watch is not None:
            self.watch.settled(self.outcomes, self.failures)
        if self.failures:
            first = next(iter(self.failures.values()))
            raise HandlerFailed(self.message.id, self.failures, result, self.claim_keys) from first
        return result


def _log_done(message: Message, handler: str, outcome: Outcome, key: bytes | None) -> None:
    # isEnabledFor first: the key is formatted only for a line that is written.
    if outcome is Outcome.DUPLICATE:
        if logger.isEnabledFor(logging.INFO):
            logger.info(
                "duplicate skipped: message %s (type %r) already processed by %s%s",
                message.id,
                message.type,
                handler,
                _under(message, key),
            )
    elif logger.isEnabledFor(logging.DEBUG):
        logger.debug(
            "message %s (type %r) processed by %s%s",
            message.id,
            message.type,
            handler,
            _under(message, key),
        )


def _under(message: Message, key: bytes | None) -> str:
    """`` under claim key K`` for a log line, when the handler claims under a key that is not
    the message id (``key=``, an ``idempotency-key``): the claims are found by that key."""
    if key is None or key == message.id.bytes:
        return ""
    return f" under claim key {uuid.UUID(bytes=key)}"
