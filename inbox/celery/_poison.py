"""Poison messages Celery's consumer refuses before any task runs become dead letters.

Celery logs and drops (rejects, or acks) a message whose body does not decode, whose task
name no worker knows, whose content type is not accepted or that is no task message at all.
:class:`PoisonLetters`, a consumer bootstep :class:`~inbox.celery.InboxTasks` adds to its
app, puts a copy of each on ``<queue>.dlq`` first, as it came, with the inbox's reason
headers, confirmed by the broker; then Celery's own handler drops it as before. A crash
between the two leaves the message in its queue as well (it comes back and is
dead-lettered again): never lost. When the broker refuses the copy the message is left
unacked (the worker holds it until it restarts): never lost, never looping.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Final

from celery import bootsteps

from inbox.celery._transport import publish_copy
from inbox.delivery import headers as h
from inbox.delivery._policy import DeadLetter, DeadLetterReason, dead_letter_headers
from inbox.delivery.transport import CopyRefused

__all__ = ["PoisonLetters", "dead_letter", "dead_lettering"]

logger = logging.getLogger("inbox.celery")

# The consumer's handlers Celery calls for a message it refuses (public methods of
# celery.worker.consumer.Consumer): which argument holds the message, and the reason.
_HANDLERS: Final = {
    "on_decode_error": (0, DeadLetterReason.UNDECODABLE_BODY),
    "on_unknown_message": (1, DeadLetterReason.INVALID_MESSAGE),
    "on_unknown_task": (1, DeadLetterReason.UNHANDLED_TYPE),
    "on_invalid_task": (1, DeadLetterReason.INVALID_MESSAGE),
}


class PoisonLetters(bootsteps.Step):
    """A consumer bootstep: each of the consumer's refusal handlers first dead-letters the
    message it refuses (see the module's docstring)."""

    name = "inbox.celery.PoisonLetters"

    def __init__(self, parent: Any, **kwargs: Any) -> None:
        super().__init__(parent, **kwargs)
        # Set on the consumer before it starts: its task handler and its kombu consumer
        # look these up when they are made.
        for handler, (at, reason) in _HANDLERS.items():
            setattr(
                parent, handler, dead_lettering(parent.app, getattr(parent, handler), at, reason)
            )


def dead_lettering(
    app: Any, refuse: Callable[..., Any], at: int, reason: DeadLetterReason
) -> Callable[..., Any]:
    """``refuse`` (a consumer's refusal handler, whose argument ``at`` is the message) that
    first dead-letters the message with ``reason``; when the broker refuses the copy it logs
    and returns without calling ``refuse``: the message stays unacked."""

    def handler(*args: Any) -> Any:
        message = args[at]
        error = args[at + 1] if len(args) > at + 1 else None
        try:
            dead_letter(app, message, reason, error)
        except CopyRefused as exc:
            logger.error(
                "inbox.celery: a message Celery refuses (%s) was not dead-lettered; it stays "
                "unacked until the worker restarts: %s",
                reason,
                exc,
            )
            return None
        return refuse(*args)

    return handler


def dead_letter(app: Any, message: Any, reason: DeadLetterReason, error: object) -> None:
    """Copy the kombu ``message`` as it came to its queue's ``.dlq`` with ``reason``."""
    info = message.delivery_info or {}
    queue = info.get("routing_key") or app.conf.task_default_queue
    own = dict(message.headers or {})
    if reason is DeadLetterReason.UNHANDLED_TYPE:
        detail = f"NotRegistered: no task {own.get('task')!r} in this worker"
    elif isinstance(error, BaseException):
        detail = h.describe(error)
    else:
        detail = "not a Celery task message (no task header, and no task in its body)"
    added = dead_letter_headers(own, DeadLetter(reason, detail), queue)
    body = message.body if isinstance(message.body, bytes) else str(message.body).encode()
    properties = message.properties or {}
    publish_copy(
        app,
        f"{queue}.dlq",
        body,
        own | added,
        message.content_type,
        message.content_encoding,
        properties.get("correlation_id"),
    )
