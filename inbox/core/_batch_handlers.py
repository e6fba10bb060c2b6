"""Batch handlers: one call with every message a batch won, instead of one call per message.

A batch handler (``@inbox.batch_handler``) takes ``(messages, session)``. Each message still
gets its own claim row ``(key, handler)``, and the batch's claims for the handler go in the
one ``claim_many`` statement :mod:`inbox.core._batch` makes; the handler is then called ONCE with
the messages whose claims that statement won (duplicates never reach it), in batch order, so
it can write them all with one ``executemany`` or multi-row statement.

Everything else is the per-message contract, reused rather than copied:

* ``process(message)`` calls it with a one-element list (:func:`one_element`, the
  handler's per-message function), in its own transaction with its own claim;
* in ``process_batch`` it runs inside the batch's transaction after the per-message
  handlers (:func:`batched`); if it raises, the batch rolls back with its claims and the
  bisection in :func:`inbox.core._batch.settle` re-runs halves until the failing message is
  alone and comes back as :class:`~inbox.HandlerFailed`, the healthy ones committed;
* ``body=`` is validated per message before any claim, and the handler gets the typed
  messages.

``inbox.effect`` is keyed by ONE message's claim, so it is refused inside a batch handler
(also for a one-element list, so the handler behaves the same on both paths); middleware
wraps one message at a time, so a batch handler on an inbox with ``middleware=`` is refused
at registration.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterable, Iterator
from dataclasses import replace
from typing import Any, TypeAlias

from inbox.core._handlers import HandlerFunc, RegisteredHandler
from inbox.core._run import CURRENT_RUN
from inbox.errors import RegistrationError
from inbox.message import Message

__all__ = ["BatchHandlerFunc", "batched", "check_batch_handler", "one_element"]

BatchHandlerFunc: TypeAlias = Callable[[list[Message], Any], object]
"""A batch handler: called with the messages whose claims its batch won, and the session
whose transaction holds those claims."""

Run: TypeAlias = tuple[RegisteredHandler, Message, bytes]
"""One handler run a batch transaction makes: (handler, message, claim key)."""


def check_batch_handler(name: str, middleware: tuple[Any, ...]) -> None:
    """Refuse a batch handler on an inbox with middleware (which wraps one message)."""
    if middleware:
        raise RegistrationError(
            f"batch handler {name!r}: middleware= wraps one message at a time and a batch "
            "handler takes a list, so the two cannot be combined; register it on an inbox "
            "without middleware (several Inbox objects may share one table), or make it a "
            "per-message @handler"
        )


def one_element(batch: BatchHandlerFunc, *, asynchronous: bool) -> HandlerFunc:
    """The per-message function of a batch handler: ``batch([message], session)``."""
    if asynchronous:
        return functools.partial(_await_one, batch)
    return functools.partial(_call_one, batch)


def batched(runs: Iterable[Run], *, asynchronous: bool) -> Iterator[Run]:
    """``runs`` with the runs of each batch handler gathered into one: per-message handlers'
    runs as they come, then one run per batch handler (in order of first appearance) whose
    function calls it with all its messages; its message and key are the last ones'."""
    gathered: dict[str, tuple[RegisteredHandler, list[Message], Message, bytes]] = {}
    for handler, message, key in runs:
        if handler.batch is None:
            yield handler, message, key
            continue
        typed = message if handler.typed is None else handler.typed
        entry = gathered.get(handler.name)
        if entry is None:
            gathered[handler.name] = (handler, [typed], message, key)
        else:
            entry[1].append(typed)
            gathered[handler.name] = (entry[0], entry[1], message, key)
    call = _await_all if asynchronous else _call_all
    for handler, messages, last, key in gathered.values():
        assert handler.batch is not None
        whole = replace(handler, func=functools.partial(call, handler.batch, messages))
        yield whole, last, key


def _call_one(batch: BatchHandlerFunc, message: Message, session: Any) -> object:
    return _call_all(batch, [message], message, session)


async def _await_one(batch: BatchHandlerFunc, message: Message, session: Any) -> object:
    return await _await_all(batch, [message], message, session)


def _call_all(
    batch: BatchHandlerFunc, messages: list[Message], _last: Message, session: Any
) -> object:
    # No claim key of its own: inbox.effect() must refuse here (see the module docstring).
    current = CURRENT_RUN.set(None)
    try:
        return batch(messages, session)
    finally:
        CURRENT_RUN.reset(current)


async def _await_all(
    batch: BatchHandlerFunc, messages: list[Message], _last: Message, session: Any
) -> object:
    current = CURRENT_RUN.set(None)
    try:
        returned = batch(messages, session)
        if not inspect.isawaitable(returned):
            raise RegistrationError(
                f"batch handler {batch!r} returned {type(returned).__name__}, not an "
                "awaitable: the async inbox awaits its handlers (make it 'async def')"
            )
        return await returned
    finally:
        CURRENT_RUN.reset(current)
