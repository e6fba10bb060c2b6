"""Which handlers take a message and under which claim keys, decided before any I/O
(typed bodies checked too), and the errors that say the inbox is set up wrong."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from inbox.core._bodies import BodyRejected
from inbox.core._handlers import RegisteredHandler, Registry
from inbox.errors import (
    ConfigurationError,
    InvalidBody,
    UnhandledMessage,
)
from inbox.message import Message
from inbox.result import ProcessResult, Unhandled

__all__ = ["Planned", "describe", "plan", "require_messages"]

logger = logging.getLogger("inbox.core")


@dataclass(frozen=True, slots=True)
class Planned:
    """A message with the handlers that take it and each handler's claim key, in order."""

    message: Message
    handlers: Sequence[RegisteredHandler]
    keys: Sequence[bytes]


def require_messages(messages: object, method: str) -> Sequence[Message]:
    """Return ``messages`` if it is a sequence of :class:`~inbox.Message`, else TypeError."""
    if isinstance(messages, Message) or not isinstance(messages, Sequence):
        raise ConfigurationError(
            f"{method}() takes a sequence of inbox.Message, got {type(messages).__name__}"
        )
    for message in messages:
        if message.__class__ is not Message and not isinstance(message, Message):
            raise ConfigurationError(
                f"{method}() takes inbox.Message items, got {type(message).__name__}"
            )
    return messages


def plan(message: object, registry: Registry, on_unhandled: Unhandled) -> Planned | ProcessResult:
    """The handlers that take ``message`` with their claim keys, or the finished result of a
    message no handler takes (when the inbox ignores those).

    Raises :class:`~inbox.UnhandledMessage` for a type no handler takes (unless ignored) and
    :class:`~inbox.InvalidKey` when a key cannot be derived and :class:`~inbox.InvalidBody`
    when a body does not validate as a handler's ``body=`` type: then nothing runs at all.
    """
    if message.__class__ is not Message and not isinstance(message, Message):
        raise ConfigurationError(f"process() takes an inbox.Message, got {type(message).__name__}")
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
