"""The retry loop, awaited: the blocking loop's decisions (:meth:`Backoff.delay_after`) and
log line, with ``asyncio.sleep`` instead of ``time.sleep``."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

from inbox._retry import Backoff, log_retry

__all__ = ["run_with_retries"]

R = TypeVar("R")


async def run_with_retries(
    work: Callable[[], Awaitable[R]], backoff: Backoff, what: Callable[[], str]
) -> R:
    """Await ``work()`` until it returns, re-running it after the errors ``backoff`` retries;
    the last error propagates (a cancellation at once, never retried)."""
    reruns = 0
    while True:
        try:
            return await work()
        except Exception as exc:
            delay = backoff.delay_after(exc, reruns)
            if delay is None:
                raise
            reruns += 1
            log_retry(what, exc, reruns, backoff, delay)
        await asyncio.sleep(delay)
