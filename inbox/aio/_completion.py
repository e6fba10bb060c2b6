"""Cleanup that a cancellation must not cut short."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

__all__ = ["run_to_completion"]

T = TypeVar("T")


async def run_to_completion(cleanup: Coroutine[Any, Any, T]) -> T:
    """Await ``cleanup`` in a task of its own until it is done, even if the calling task is
    cancelled meanwhile; a cancellation received while waiting is raised afterwards.

    Rolling back and returning the connection to the pool must finish before the caller
    goes on: abandoned halfway, the connection would stay checked out (or go back to a pool
    the application has disposed of) with the transaction open.
    """
    task = asyncio.ensure_future(cleanup)
    cancelled: asyncio.CancelledError | None = None
    while True:
        try:
            result = await asyncio.shield(task)
        except asyncio.CancelledError as exc:
            if task.done():
                raise
            cancelled = exc
        else:
            break
    if cancelled is not None:
        raise cancelled
    return result
