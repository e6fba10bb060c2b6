"""What every I/O-free decision generator shares: the step that waits, the reply of a step
that raised, and the way a caller moves such a generator on.

The inbox's decisions (:func:`inbox.core._settlement.settle`, :func:`inbox.core._batch.settle`,
:func:`inbox.core.effects._steps.effect_steps`, the retry loop :func:`inbox.core._retry.rerun`)
are generators of steps, each sent back the step's outcome, or :class:`Failed` when the step
raised; a blocking caller and an awaiting one only carry the steps out (the way a sans-I/O
protocol is shared by its callers).
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

__all__ = ["Ended", "Failed", "Pause", "advance", "outcome"]

S = TypeVar("S")
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Pause:
    """Step: wait ``seconds`` before the next attempt; send back None."""

    seconds: float


@dataclass(frozen=True, slots=True)
class Failed:
    """What a step that raised sends back: the error, raised no further by the caller (so
    that nothing the caller does next chains to it). An exit exception (``KeyboardInterrupt``,
    a cancellation) is never retried: the generator raises it again."""

    error: BaseException


@dataclass(frozen=True, slots=True)
class Ended(Generic[T]):
    """What :func:`advance` returns once the generator has returned ``value``."""

    value: T


def advance(steps: Generator[S, Any, T], reply: object) -> S | Ended[T]:
    """Send ``reply`` (None to start) to ``steps``: the next step, or :class:`Ended`."""
    try:
        return steps.send(reply)
    except StopIteration as stop:
        return Ended(stop.value)


def outcome(reply: T | Failed) -> T:
    """``reply``, or its error raised when it is :class:`Failed`."""
    if isinstance(reply, Failed):
        raise reply.error
    return reply
