"""Running workers in tests: until idle, in a thread, and removing their queues.

These were hooks on :class:`inbox.broker.Worker` (``run(idle_timeout=...)``,
``delete_queues()``); they live here (and, for the demo, in ``inbox.broker._idle``) so that
the production API is only what a production worker needs.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from inbox.broker import Worker
from inbox.broker._idle import delete_queues, run_until_idle

__all__ = ["delete_queues", "run_in_thread", "run_until_idle", "wait_until"]


def run_in_thread(worker: Worker, idle_timeout: float | None = None) -> threading.Thread:
    """Start ``worker`` in a daemon thread (until idle, when ``idle_timeout`` is given)."""

    def target() -> None:
        if idle_timeout is None:
            worker.run()
        else:
            run_until_idle(worker, idle_timeout)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread


def wait_until(condition: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    """Poll ``condition`` until it holds; fail the test naming ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(0.02)
