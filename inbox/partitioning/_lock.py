"""Partition changes under the parent table's ACCESS EXCLUSIVE lock, with a bounded wait for
it and the shared retry loop for lock timeouts and deadlocks."""

from __future__ import annotations

from collections.abc import Callable
from typing import Final, TypeVar

from sqlalchemy import Connection, Engine, Table, func, select
from sqlalchemy.exc import DBAPIError

from inbox.core._retry import Backoff, run_with_retries
from inbox.errors import ConfigurationError
from inbox.partitioning._catalog import sqlstate
from inbox.partitioning._ddl import LockTable

__all__ = ["LOCK_ATTEMPTS", "is_lock_conflict", "locked"]

LOCK_ATTEMPTS: Final = 5
"""Tries of a partition change whose lock was not granted in time."""

# lock_not_available (lock_timeout), deadlock_detected: the DDL is tried again.
_RETRY_SQLSTATES: Final = frozenset({"55P03", "40P01"})

_R = TypeVar("_R")


def is_lock_conflict(exc: BaseException) -> bool:
    """True for a lock timeout or a deadlock: the table was busy, not the change wrong."""
    return isinstance(exc, DBAPIError) and sqlstate(exc) in _RETRY_SQLSTATES


def locked(
    engine: Engine,
    table: Table,
    lock_timeout: float,
    work: Callable[[Connection], _R],
    *,
    attempts: int = LOCK_ATTEMPTS,
) -> _R:
    """Run ``work`` in a transaction that first takes ACCESS EXCLUSIVE on the parent table
    (waiting at most ``lock_timeout`` seconds for any lock), up to ``attempts`` times while
    the lock is not granted in time; then the lock error propagates."""
    if isinstance(lock_timeout, bool) or not isinstance(lock_timeout, int | float):
        raise ConfigurationError("lock_timeout must be a number of seconds")
    if not 0 < lock_timeout <= 3600:
        raise ConfigurationError(
            f"lock_timeout must be > 0 and at most 3600 seconds, got {lock_timeout}"
        )
    milliseconds = str(max(1, round(lock_timeout * 1000)))

    def attempt() -> _R:
        with engine.begin() as connection:
            connection.execute(select(func.set_config("lock_timeout", milliseconds, True)))
            connection.execute(LockTable(table))
            return work(connection)

    backoff = Backoff(retries=attempts - 1, base_delay=0.05, retryable=is_lock_conflict)
    return run_with_retries(attempt, backoff, lambda: f"partition change on {table.fullname}")
