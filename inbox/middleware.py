"""Middleware for the inbox's handlers, and the two it ships: a logging context and timing.

Two kinds of layer, both given to the inbox's constructor, the first in the list outermost:

* ``middleware=[mw, ...]``: ``mw(message, session, call_next)`` runs INSIDE each handler's
  transaction, after its claim was won (a duplicate never reaches it), behind the same
  guards as the handler; ``call_next(message)`` runs the rest of the chain and the handler.
  A middleware that raises rolls the claim and the writes back, as the handler would.
* ``around_delivery=[hook, ...]``: ``hook(message, call_next)`` wraps each ``process()``
  call, before any claim (logging context, tracing, rate limiting); ``call_next(message)``
  returns the :class:`~inbox.ProcessResult` or raises what ``process()`` raises, and the
  hook returns that result (or raises).

On :class:`inbox.aio.AsyncInbox` both are ``async def`` and ``await call_next(message)``.
See docs/middleware.md.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from typing import TYPE_CHECKING, TypeAlias

from sqlalchemy.orm import Session

from inbox.core._chain import AsyncDeliveryHook, AsyncMiddleware, DeliveryHook, Middleware
from inbox.core._run import CURRENT_RUN
from inbox.errors import ConfigurationError
from inbox.message import Message
from inbox.result import ProcessResult

if TYPE_CHECKING:  # the asyncio layer needs greenlet, which a blocking install lacks
    from sqlalchemy.ext.asyncio import AsyncSession

__all__ = [
    "AsyncDeliveryHook",
    "AsyncMiddleware",
    "AsyncTiming",
    "DeliveryHook",
    "LogContextFilter",
    "Middleware",
    "Timing",
    "TimingReport",
    "async_log_context",
    "current_handler",
    "log_context",
]

TimingReport: TypeAlias = Callable[[str, Message, float, BaseException | None], None]
"""What :class:`Timing` calls after each handler: (handler name, message, seconds, the
error it raised or None)."""

_DELIVERY: ContextVar[Message | None] = ContextVar("inbox_delivery", default=None)
_timing_logger = logging.getLogger("inbox.timing")


def current_handler() -> str | None:
    """The name of the handler whose transaction runs here (inside a middleware or the
    handler), else None."""
    run = CURRENT_RUN.get()
    return None if run is None else run.handler


def log_context(message: Message, call_next: Callable[[Message], ProcessResult]) -> ProcessResult:
    """Delivery hook: the message being processed is known to :class:`LogContextFilter` for
    every record logged meanwhile (the inbox's own lines included)."""
    token = _DELIVERY.set(message)
    try:
        return call_next(message)
    finally:
        _DELIVERY.reset(token)


async def async_log_context(
    message: Message, call_next: Callable[[Message], Awaitable[ProcessResult]]
) -> ProcessResult:
    """:func:`log_context` for :class:`inbox.aio.AsyncInbox`."""
    token = _DELIVERY.set(message)
    try:
        return await call_next(message)
    finally:
        _DELIVERY.reset(token)


class LogContextFilter(logging.Filter):
    """A :class:`logging.Filter` that stamps every record with ``inbox_message_id``,
    ``inbox_message_type`` (set by the :func:`log_context` hook) and ``inbox_handler`` (the
    handler running, see :func:`current_handler`), each None outside a delivery.

    Add it to a :class:`logging.Handler` (``handler.addFilter(LogContextFilter())``) so that
    records of every logger are stamped, then use the fields in a format:
    ``"%(message)s id=%(inbox_message_id)s handler=%(inbox_handler)s"``. It never drops a
    record.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        """Stamp ``record``; always True."""
        message = _DELIVERY.get()
        record.inbox_message_id = None if message is None else str(message.id)
        record.inbox_message_type = None if message is None else message.type
        record.inbox_handler = current_handler()
        return True


class Timing:
    """Middleware: how long each handler ran (with the middleware after this one), reported
    to ``report`` or, by default, logged by the ``inbox.timing`` logger at ``level``."""

    def __init__(self, report: TimingReport | None = None, *, level: int = logging.INFO) -> None:
        if report is not None and not callable(report):
            raise ConfigurationError(f"report must be callable, got {type(report).__name__}")
        self._report = report if report is not None else _log_timing(level)

    def __call__(
        self, message: Message, session: Session, call_next: Callable[[Message], object]
    ) -> object:
        """Run the rest of the chain, then report its duration."""
        error: BaseException | None = None
        started = time.perf_counter()
        try:
            return call_next(message)
        except BaseException as exc:
            error = exc
            raise
        finally:
            self._report(current_handler() or "?", message, time.perf_counter() - started, error)


class AsyncTiming:
    """:class:`Timing` for :class:`inbox.aio.AsyncInbox`: the awaited handler's duration."""

    def __init__(self, report: TimingReport | None = None, *, level: int = logging.INFO) -> None:
        if report is not None and not callable(report):
            raise ConfigurationError(f"report must be callable, got {type(report).__name__}")
        self._report = report if report is not None else _log_timing(level)

    async def __call__(
        self,
        message: Message,
        session: AsyncSession,
        call_next: Callable[[Message], Awaitable[object]],
    ) -> object:
        """Await the rest of the chain, then report its duration."""
        error: BaseException | None = None
        started = time.perf_counter()
        try:
            return await call_next(message)
        except BaseException as exc:
            error = exc
            raise
        finally:
            self._report(current_handler() or "?", message, time.perf_counter() - started, error)


def _log_timing(level: int) -> TimingReport:
    def log(handler: str, message: Message, seconds: float, error: BaseException | None) -> None:
        outcome = "ran" if error is None else f"failed ({type(error).__name__})"
        _timing_logger.log(
            level,
            "handler %s %s in %.1f ms on message %s",
            handler,
            outcome,
            seconds * 1000,
            message.id,
        )

    return log
