"""The retry loop, awaited: the blocking loop's decisions (:meth:`Backoff.delay_after`) and
log line, with ``asyncio.sleep`` instead of ``time.sleep``."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

from inbox.core._retry import Backoff, log_retry

__all__ = ["run_with_retries"]

R = TypeVar("R")


async def run_with_retries(
    work: Callable[[], Awaitable[R]],
    backoff: Backoff,
    what: Callable[[], str],
    failure: Exception | None = None,
) -> R:
    """Await ``work()`` until it returns, re-running it after the errors ``backoff`` retries;
    the last error propagates (a cancellation at once, never retried). ``failure`` is the
    error of a first attempt the caller already made."""
    reruns = 0
    while True:
        if failure is not None:
            delay = backoff.delay_after(failure, reruns)
            if delay is None:
                raise failure
            reruns += 1
            log_retry(what, failure, reruns, backoff, delay)
            await asyncio.sleep(delay)
            failure = None
        try:
            return await work()
        except Exception as exc:
            failure = exc
