"""Re-running work the database aborted for reasons of timing: which errors those are, how
long to wait, and the one retry loop every caller shares.

The decisions (:func:`is_transient`, :meth:`Backoff.delay_after`, the loop :func:`rerun`) do
no I/O, so a blocking caller and an async one make them the same way: the step generators
(settle, the batch, effects) yield from :func:`rerun` and their shells wait, blocking or
awaiting; :func:`run_with_retries` carries the loop out for one blocking call.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import Any, Final, TypeAlias, TypeVar

from sqlalchemy.exc import DBAPIError

from inbox._backends import is_transient_error
from inbox.core._steps import Ended, Failed, Pause, advance, outcome

__all__ = ["Backoff", "Rerun", "is_transient", "log_retry", "rerun", "run_with_retries"]

logger = logging.getLogger("inbox.core")

_CHAIN_LIMIT: Final = 8

R = TypeVar("R")
S = TypeVar("S")


def is_transient(exc: BaseException) -> bool:
    """True if ``exc`` (or an exception it was raised from) is a transient database error.

    Transient means the transaction was aborted by the database for reasons of timing, not
    content: a deadlock, a serialization failure, a lock timeout, a busy SQLite file, or a
    lost connection. Re-running the transaction is safe here even after a lost COMMIT: if
    the commit did land, the claim is found and the re-run is a duplicate.
    """
    seen: BaseException | None = exc
    for _ in range(_CHAIN_LIMIT):
        if seen is None:
            return False
        if isinstance(seen, DBAPIError) and _is_transient_dbapi_error(seen):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _is_transient_dbapi_error(exc: DBAPIError) -> bool:
    # Which error codes say so is each database family's knowledge (_backends/).
    return exc.connection_invalidated or is_transient_error(exc.orig)


@dataclass(frozen=True, slots=True)
class Backoff:
    """When to re-run: at most ``retries`` times, for errors ``retryable`` accepts, after an
    exponential delay (``base_delay * 2**n`` before the n-th re-run, jittered by 0.5..1.5)."""

    retries: int
    base_delay: float = 0.005
    retryable: Callable[[BaseException], bool] = field(default=is_transient)

    def delay_after(self, exc: BaseException, reruns: int) -> float | None:
        """The delay before re-running after ``exc``, when ``reruns`` re-runs were already
        made; None when the error is final (not retryable, or the retries are spent)."""
        if reruns >= self.retries or not self.retryable(exc):
            return None
        return float(self.base_delay * 2 ** (reruns + 1) * random.uniform(0.5, 1.5))


Rerun: TypeAlias = Generator[S | Pause, Any, Any]


def rerun(step: S, failed: Failed, backoff: Backoff, what: Callable[[], str]) -> Rerun[S]:
    """The retry loop's steps once ``step`` has ``failed``: a :class:`Pause`, then ``step``
    again, for as long as ``backoff`` retries the error; returns the reply that ends it:
    the step's outcome, or the :class:`Failed` that is final (an exit exception at once).
    ``what`` names the work in the log line of each retry.

    Callers yield ``step`` themselves first and enter the loop only when it failed, so a
    first try that succeeds costs no generator."""
    reruns = 0
    while isinstance(error := failed.error, Exception):
        delay = backoff.delay_after(error, reruns)
        if delay is None:
            break
        reruns += 1
        log_retry(what, error, reruns, backoff, delay)
        yield Pause(delay)
        done = yield step
        if not isinstance(done, Failed):
            return done
        failed = done
    return failed


def run_with_retries(work: Callable[[], R], backoff: Backoff, what: Callable[[], str]) -> R:
    """Call ``work`` until it returns, re-running it as :func:`rerun` decides; the last
    error propagates. ``what`` names the work in the log line of each retry."""
    try:
        return work()
    except Exception as exc:
        steps = rerun(work, Failed(exc), backoff, what)
    reply: object = None
    while not isinstance(step := advance(steps, reply), Ended):
        reply = None
        if isinstance(step, Pause):
            time.sleep(step.seconds)
            continue
        try:
            reply = step()
        except Exception as exc:
            reply = Failed(exc)
    return outcome(step.value)  # type: ignore[no-any-return]


def log_retry(
    what: Callable[[], str], exc: BaseException, reruns: int, backoff: Backoff, delay: float
) -> None:
    """Log the ``reruns``-th re-run of the work ``what`` names, due in ``delay`` seconds."""
    logger.info(
        "%s: transient database error (%s), retry %d/%d in %.3f s",
        what(),
        type(exc).__name__,
        reruns,
        backoff.retries,
        delay,
    )
