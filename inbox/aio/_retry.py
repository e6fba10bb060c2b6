"""The retry loop, awaited: the steps of :func:`inbox.core._retry.rerun` carried out with
``asyncio.sleep`` instead of ``time.sleep``."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

from inbox.core._retry import Backoff, rerun
from inbox.core._steps import Ended, Failed, Pause, advance, outcome

__all__ = ["run_with_retries"]

R = TypeVar("R")


async def run_with_retries(
    work: Callable[[], Awaitable[R]], backoff: Backoff, what: Callable[[], str]
) -> R:
    """Await ``work()`` until it returns, re-running it as :func:`~inbox.core._retry.rerun`
    decides; the last error propagates (a cancellation at once, never retried)."""
    try:
        return await work()
    except Exception as exc:
        steps = rerun(work, Failed(exc), backoff, what)
    reply: object = None
    while not isinstance(step := advance(steps, reply), Ended):
        reply = None
        if isinstance(step, Pause):
            await asyncio.sleep(step.seconds)
            continue
        try:
            reply = await step()
        except Exception as exc:
            reply = Failed(exc)
    return outcome(step.value)  # type: ignore[no-any-return]
