"""The middleware chain and the delivery hooks, composed once when the inbox is built (hooks)
or a handler is registered (middleware), so that a message pays only for the layers it has.

A middleware layer is a ``functools.partial`` of one small function: with no middleware the
handler transaction calls the user's function itself, with no layer in between.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING, Any, TypeAlias

from sqlalchemy.orm import Session

from inbox.core._handlers import HandlerFunc, is_coroutine_callable
from inbox.errors import ConfigurationError, RegistrationError
from inbox.message import Message
from inbox.result import ProcessResult

if TYPE_CHECKING:  # the asyncio layer needs greenlet, which a blocking install lacks
    from sqlalchemy.ext.asyncio import AsyncSession

__all__ = [
    "AsyncDeliveryHook",
    "AsyncMiddleware",
    "DeliveryHook",
    "Middleware",
    "check_layers",
    "wrap_delivery",
    "wrap_handler",
]

Middleware: TypeAlias = Callable[[Message, Session, Callable[[Message], object]], object]
"""A blocking middleware: ``(message, session, call_next) -> what call_next returned``."""

AsyncMiddleware: TypeAlias = (
    "Callable[[Message, AsyncSession, Callable[[Message], Awaitable[object]]], Awaitable[object]]"
)
"""An async middleware: ``async (message, session, call_next)``, awaiting ``call_next``."""

DeliveryHook: TypeAlias = Callable[[Message, Callable[[Message], ProcessResult]], ProcessResult]
"""A blocking delivery hook: ``(message, call_next) -> ProcessResult``, before any claim."""

AsyncDeliveryHook: TypeAlias = Callable[
    [Message, Callable[[Message], Awaitable[ProcessResult]]], Awaitable[ProcessResult]
]
"""An async delivery hook: ``async (message, call_next) -> ProcessResult``."""

Deliver = Callable[[Message], Any]
"""One delivery's processing: ``process()`` without the hooks (a ProcessResult, or an
awaitable of one)."""


def check_layers(layers: object, option: str, *, asynchronous: bool) -> tuple[Any, ...]:
    """``layers`` as a tuple of callables of the inbox's flavour, else a clear error."""
    if layers is None:
        return ()
    if isinstance(layers, str | bytes) or not isinstance(layers, Iterable):
        raise ConfigurationError(
            f"{option} must be a list of callables, got {type(layers).__name__}"
        )
    checked = tuple(layers)
    for layer in checked:
        if not callable(layer):
            raise ConfigurationError(f"{option} items must be callable, got {type(layer).__name__}")
        if asynchronous and not is_coroutine_callable(layer):
            raise RegistrationError(
                f"{option} item {layer!r} is not a coroutine function: the async inbox awaits "
                "it (make it 'async def'), or use it on the blocking inbox.Inbox"
            )
        if not asynchronous and is_coroutine_callable(layer):
            raise RegistrationError(
                f"{option} item {layer!r} is a coroutine function: the blocking Inbox would "
                "never await it. Use it on inbox.aio.AsyncInbox, or make it a plain function"
            )
    return checked


def wrap_handler(
    func: HandlerFunc, middleware: tuple[Any, ...], *, asynchronous: bool
) -> HandlerFunc:
    """``func`` behind ``middleware`` (the first is the outermost), or ``func`` itself."""
    layer = _await_layer if asynchronous else _call_layer
    step: HandlerFunc = func
    for outer in reversed(middleware):
        step = functools.partial(layer, outer, step)
    return step


def _call_layer(middleware: Any, call_next: HandlerFunc, message: Message, session: Any) -> object:
    # call_next takes the message only: the session is the transaction's, never another one.
    return middleware(message, session, lambda next_message: call_next(next_message, session))


async def _await_layer(
    middleware: Any, call_next: HandlerFunc, message: Message, session: Any
) -> object:
    # A coroutine function, so that what wraps the chain (inbox.testing) sees an async handler.
    return await middleware(message, session, lambda next_message: call_next(next_message, session))


def wrap_delivery(deliver: Deliver, hooks: tuple[Any, ...], *, asynchronous: bool) -> Deliver:
    """``deliver`` behind the ``around_delivery`` hooks (the first is the outermost)."""
    layer = _await_hook if asynchronous else _call_hook
    step = deliver
    for hook in reversed(hooks):
        step = functools.partial(layer, hook, step)
    return step


def _call_hook(hook: Any, call_next: Deliver, message: Message) -> ProcessResult:
    return _checked(hook, hook(message, call_next))


async def _await_hook(
    hook: Any, call_next: Callable[[Message], Awaitable[ProcessResult]], message: Message
) -> ProcessResult:
    return _checked(hook, await hook(message, call_next))


def _checked(hook: Any, returned: object) -> ProcessResult:
    if not isinstance(returned, ProcessResult):
        raise ConfigurationError(
            f"around_delivery hook {hook!r} returned {type(returned).__name__}: it must return "
            "what call_next(message) returned (or raise)"
        )
    return returned
