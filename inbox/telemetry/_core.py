"""What the core records: each handler's outcome, time and span, claim times, message age.

:func:`watch` gives a :class:`MessageWatch` per message that
:class:`inbox.core._settlement.Settlement` feeds with outcomes as they come in;
:func:`claim_timer` times the claim statement. Without OpenTelemetry, or until an SDK is
configured, both return None: the core pays a call.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import TYPE_CHECKING, Final, ParamSpec, TypeVar

from inbox.result import Outcome
from inbox.telemetry import _names as n
from inbox.telemetry._api import (
    INSTRUMENTS,
    Instruments,
    any_provider,
    configured,
    metering,
    tracing,
)
from inbox.telemetry._context import extract_context

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.trace import Span

    from inbox.message import Message

__all__ = [
    "FAILED",
    "ClaimTimer",
    "MessageWatch",
    "claim_timer",
    "message_time",
    "watch",
    "watched",
]

P = ParamSpec("P")
T = TypeVar("T")

FAILED = "failed"
"""The ``inbox.outcome`` of a handler run that was rolled back."""

_UNTRACED: AbstractContextManager[None] = nullcontext()


def message_time(message_id: uuid.UUID) -> float | None:
    """When the message was made (epoch seconds), from its UUIDv7 id; None for other ids."""
    if message_id.version != 7:
        return None
    return (message_id.int >> 80) / 1000


class MessageWatch:
    """One message's handler runs as they settle: a span and a duration per handler, the
    outcome counters, and the end-to-end age of every commit.

    :meth:`done` and :meth:`failed` time a handler from the previous mark (``process()``
    settles handlers one after another); :meth:`settled` counts every outcome once and
    times the handlers nobody reported, as a batch commits them: by the whole settlement.
    Around a handler's run, :meth:`running` makes its span the current one, so the spans
    the handler makes (an HTTP call, an instrumented query) are its children.
    """

    __slots__ = (
        "_attributes",
        "_instruments",
        "_mark",
        "_message",
        "_metrics",
        "_open",
        "_parent",
        "_start",
        "_timed",
        "_traces",
    )

    def __init__(self, instruments: Instruments, message: Message) -> None:
        self._instruments = instruments
        self._message = message
        self._attributes: dict[str, str] = {n.MESSAGE_TYPE: message.type or ""}
        self._start = self._mark = (time.perf_counter(), time.time_ns())
        self._timed: set[str] = set()
        self._parent: Context | None = None
        self._open: dict[str, Span] = {}
        self._metrics = metering()
        self._traces = tracing()

    def running(self, handler: str) -> AbstractContextManager[None]:
        """Around ``handler``'s run (every attempt of it): its span, opened now and current
        until :meth:`done` or :meth:`failed` ends it. Nothing without tracing."""
        return self._current_span(handler) if self._traces else _UNTRACED

    @contextmanager
    def _current_span(self, handler: str) -> Iterator[None]:
        from opentelemetry import context, trace

        span = self._open[handler] = self._start_span(handler, None)
        token = context.attach(trace.set_span_in_context(span))
        try:
            yield
        except BaseException as interrupt:
            # Not settled (KeyboardInterrupt, a cancelled task): the span still ends.
            self._end(handler, FAILED, interrupt, time.time_ns())
            raise
        finally:
            context.detach(token)
            self._open.pop(handler, None)

    def done(self, handler: str, outcome: Outcome) -> None:
        """``handler`` committed (PROCESSED) or was a duplicate, just now."""
        self._finish(handler, outcome.value, None, self._mark)

    def failed(self, handler: str, error: BaseException) -> None:
        """``handler``'s transaction was rolled back by ``error``, just now."""
        self._finish(handler, FAILED, error, self._mark)

    def settled(self, outcomes: Mapping[str, Outcome], failures: Mapping[str, Exception]) -> None:
        """The message's outcomes are final: count each once; time the untimed ones."""
        ins = self._instruments
        for handler, outcome in outcomes.items():
            if self._metrics:
                attributes = {**self._attributes, n.HANDLER: handler}
                if outcome is Outcome.PROCESSED:
                    ins.processed.add(1, attributes)
                elif outcome is Outcome.DUPLICATE:
                    ins.duplicates.add(1, attributes)
            if handler not in self._timed:
                self._finish(handler, outcome.value, None, self._start)
        for handler, error in failures.items():
            if self._metrics:
                attributes = {**self._attributes, n.HANDLER: handler, n.ERROR_TYPE: _kind(error)}
                ins.failures.add(1, attributes)
            if handler not in self._timed:
                self._finish(handler, FAILED, error, self._start)

    def _finish(
        self, handler: str, outcome: str, error: BaseException | None, since: tuple[float, int]
    ) -> None:
        now = (time.perf_counter(), time.time_ns())
        ins = self._instruments
        if self._metrics:
            attributes = {**self._attributes, n.HANDLER: handler, n.OUTCOME: outcome}
            ins.handler_duration.record(now[0] - since[0], attributes)
            made = message_time(self._message.id)
            if made is not None and outcome == Outcome.PROCESSED.value:
                age = max(0.0, now[1] / 1e9 - made)
                ins.message_age.record(age, {**self._attributes, n.HANDLER: handler})
        if self._traces:
            if handler not in self._open:  # a batch's handler: its span is made afterwards
                self._open[handler] = self._start_span(handler, since[1])
            self._end(handler, outcome, error, now[1])
        self._timed.add(handler)
        self._mark = now

    def _start_span(self, handler: str, start_time: int | None) -> Span:
        """``handler``'s span, started at ``start_time`` (epoch ns; None: now)."""
        return self._instruments.tracer.start_span(
            f"handler {handler}",
            context=self._parent_context(),
            attributes={
                n.HANDLER: handler,
                n.MESSAGE_TYPE: self._attributes[n.MESSAGE_TYPE],
                n.MESSAGE_ID: str(self._message.id),
            },
            start_time=start_time,
        )

    def _end(self, handler: str, outcome: str, error: BaseException | None, end: int) -> None:
        span = self._open.pop(handler, None)
        if span is None:
            return
        span.set_attribute(n.OUTCOME, outcome)
        if error is not None:
            from opentelemetry import trace

            # The class only: a message could carry SQL parameters (row data).
            span.set_attribute(n.ERROR_TYPE, _kind(error))
            span.set_status(trace.StatusCode.ERROR, _kind(error))
        span.end(end_time=end)

    def _parent_context(self) -> Context | None:
        """The current span (the worker's delivery span) if there is one, else the
        producer's context from the message's headers."""
        from opentelemetry import trace

        if trace.get_current_span().get_span_context().is_valid:
            return None
        if self._parent is None:
            self._parent = extract_context(self._message.headers)
        return self._parent


def _kind(error: BaseException) -> str:
    return type(error).__name__


def watch(message: Message) -> MessageWatch | None:
    """A watch for ``message``'s handler runs; None without OpenTelemetry or an SDK."""
    instruments = configured()
    if instruments is None:
        return None
    return MessageWatch(instruments, message)


def watched() -> bool:
    """Whether :func:`watch` would watch a message now (OpenTelemetry installed and a
    provider set): without, the inbox may settle a message without a watch at all."""
    return INSTRUMENTS is not None and any_provider()


def claim_timer() -> ClaimTimer | None:
    """Something to time the claim statement with (``started()``, then ``record(handler,
    started)``) once a meter provider is set; None otherwise: the claim is not timed."""
    if INSTRUMENTS is None or not metering():
        return None
    return _CLAIM_TIMER


class ClaimTimer:
    """Records how long claim statements take (``inbox.claim.duration``, by handler)."""

    __slots__ = ()

    started = staticmethod(time.perf_counter)

    def record(self, handler: str, started: float) -> None:
        """Record a claim of ``handler`` that began at ``started`` (``perf_counter``)."""
        assert INSTRUMENTS is not None
        INSTRUMENTS.claim_duration.record(time.perf_counter() - started, {n.HANDLER: handler})


_CLAIM_TIMER: Final = ClaimTimer()
