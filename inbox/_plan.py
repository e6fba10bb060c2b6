"""The decisions around the handler transactions that do no I/O: which handlers take a
message and under which keys, and how their outcomes become a result or an error.

Blocking and async inboxes share these; only running the transactions differs.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Final

from inbox._bodies import BodyRejected
from inbox._handlers import RegisteredHandler, Registry
from inbox._oneline import describe_error
from inbox.errors import (
    HandlerFailed,
    InvalidBody,
    SessionConfigurationError,
    UnhandledMessage,
    UnsupportedDialect,
)
from inbox.message import Message
from inbox.result import Outcome, ProcessResult, Unhandled
from inbox.telemetry._core import MessageWatch, watch

__all__ = [
    "CONFIGURATION_ERRORS",
    "Planned",
    "Settlement",
    "describe",
    "plan",
    "require_messages",
]

logger = logging.getLogger("inbox.core")

CONFIGURATION_ERRORS: Final = (SessionConfigurationError, UnsupportedDialect)
"""Errors that say the inbox is set up wrong, not that a message failed: they are raised as
themselves at once (no handler failure recorded, nothing retried)."""

_UNWATCHED: AbstractContextManager[None] = nullcontext()


@dataclass(frozen=True, slots=True)
class Planned:
    """A message with the handlers that take it and each handler's claim key, in order."""

    message: Message
    handlers: Sequence[RegisteredHandler]
    keys: Sequence[bytes]


def require_messages(messages: object, method: str) -> Sequence[Message]:
    """Return ``messages`` if it is a sequence of :class:`~inbox.Message`, else TypeError."""
    if isinstance(messages, Message) or not isinstance(messages, Sequence):
        raise TypeError(
            f"{method}() takes a sequence of inbox.Message, got {type(messages).__name__}"
        )
    for message in messages:
        if not isinstance(message, Message):
            raise TypeError(f"{method}() takes inbox.Message items, got {type(message).__name__}")
    return messages


def plan(message: object, registry: Registry, on_unhandled: Unhandled) -> Planned | ProcessResult:
    """The handlers that take ``message`` with their claim keys, or the finished result of a
    message no handler takes (when the inbox ignores those).

    Raises :class:`~inbox.UnhandledMessage` for a type no handler takes (unless ignored) and
    :class:`~inbox.InvalidKey` when a key cannot be derived and :class:`~inbox.InvalidBody`
    when a body does not validate as a handler's ``body=`` type: then nothing runs at all.
    """
    if not isinstance(message, Message):
        raise TypeError(f"process() takes an inbox.Message, got {type(message).__name__}")
    handlers: Sequence[RegisteredHandler] = registry.for_type(message.type)
    if not handlers:
        if on_unhandled is Unhandled.RAISE:
            raise UnhandledMessage(message.id, message.type)
        logger.info("message %s of type %r ignored: no handler", message.id, message.type)
        return ProcessResult(message.id, {})
    if registry.typed:
        handlers = _with_bodies(message, handlers)
    return Planned(message, handlers, [handler.claim_key(message) for handler in handlers])


def _with_bodies(
    message: Message, handlers: Sequence[RegisteredHandler]
) -> Sequence[RegisteredHandler]:
    """``handlers``, each with a ``body=`` type bound to the message carrying its validated
    body (see :meth:`RegisteredHandler.bound_to`); :class:`~inbox.InvalidBody` for the
    first body that does not validate, so nothing is claimed."""
    if all(handler.parse_body is None for handler in handlers):
        return handlers
    typed: dict[type, Message] = {}
    bound = []
    for handler in handlers:
        if handler.parse_body is None or handler.body_type is None:
            bound.append(handler)
            continue
        if handler.body_type not in typed:
            try:
                body = handler.parse_body(message.body)
            except BodyRejected as exc:
                raise InvalidBody(
                    handler.name, message.id, handler.body_type.__qualname__, exc.reason
                ) from None
            typed[handler.body_type] = message.with_body(body)
        bound.append(handler.bound_to(typed[handler.body_type]))
    return bound


def describe(handler: RegisteredHandler, message: Message) -> str:
    """Name one handler's run on one message, for the log line of a retry."""
    return f"handler {handler.name} on message {message.id}"


@dataclass(slots=True)
class Settlement:
    """The outcomes of one message's handlers as they come in, then its result."""

    message: Message
    outcomes: dict[str, Outcome] = field(default_factory=dict)
    failures: dict[str, Exception] = field(default_factory=dict)
    watch: MessageWatch | None = field(init=False, repr=False, compare=False)
    """The message's telemetry (None without OpenTelemetry): with tracing, its
    ``running(handler)`` makes the handler's span current around its run, retries included."""

    def __post_init__(self) -> None:
        self.watch = watch(self.message)

    def running(self, handler: str) -> AbstractContextManager[None]:
        """Around ``handler``'s run, retries included: with tracing, its span is the
        current one (see :meth:`inbox.telemetry._core.MessageWatch.running`)."""
        if self.watch is None:
            return _UNWATCHED
        return self.watch.running(handler)

    def done(self, handler: str, outcome: Outcome) -> None:
        """Record a handler that committed (PROCESSED) or was skipped (DUPLICATE)."""
        self.outcomes[handler] = outcome
        if self.watch is not None:
            self.watch.done(handler, outcome)
        if outcome is Outcome.DUPLICATE:
            logger.info(
                "duplicate skipped: message %s (type %r) already processed by %s",
                self.message.id,
                self.message.type,
                handler,
            )
        else:
            logger.debug(
                "message %s (type %r) processed by %s", self.message.id, self.message.type, handler
            )

    def failed(self, handler: str, error: Exception) -> None:
        """Record a handler whose transaction was rolled back."""
        self.failures[handler] = error
        if self.watch is not None:
            self.watch.failed(handler, error)
        # One line per failure; the traceback only at DEBUG (the caller also gets the
        # error in HandlerFailed, and a worker logs its decision: retry or dead letter).
        logger.warning(
            "handler %s failed on message %s (type %r), rolled back: %s",
            handler,
            self.message.id,
            self.message.type,
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
            raise HandlerFailed(self.message.id, self.failures, result) from first
        return result
