"""``cleanup``: delete claims older than a window, in short batches that run beside workers;
on a partitioned table, drop expired day partitions whole and clean the rest in batches."""

from __future__ import annotations

import dataclasses
import datetime as dt
import math
import time
from dataclasses import dataclass
from typing import Final

from sqlalchemy import URL, Engine, Table, create_engine

from inbox.errors import ConfigurationError
from inbox.partitioning._catalog import is_partitioned, list_partitions
from inbox.partitioning._drop import drop_partitions
from inbox.partitioning._ids import first_id_at
from inbox.partitioning._layout import partition_table
from inbox.retention._batches import count_expired, delete_in_batches
from inbox.retention._effect_records import (
    count_expired_effects,
    delete_expired_effects,
    effect_sizing,
    has_effect_table,
)
from inbox.retention._sizing import DEFAULT_BATCH_SECONDS, BatchSizing
from inbox.retention._task_results import (
    count_expired_results,
    delete_expired_results,
    has_result_table,
)
from inbox.schema import (
    DEFAULT_EFFECT_TABLE_NAME,
    DEFAULT_RESULT_TABLE_NAME,
    DEFAULT_TABLE_NAME,
    resolve_effect_table,
    resolve_result_table,
    resolve_table,
)

__all__ = [
    "DEFAULT_BATCH_SECONDS",
    "MAX_BATCH_SECONDS",
    "MAX_CLEANUP_BATCH_SIZE",
    "MAX_PAUSE_RATIO",
    "CleanupReport",
    "cleanup",
    "cutoff_for",
]

MAX_CLEANUP_BATCH_SIZE: Final = 1_000_000
"""The largest ``batch_size`` :func:`cleanup` accepts."""
MIN_BATCH_SECONDS: Final = 0.001
MAX_BATCH_SECONDS: Final = 60.0
"""The bounds of ``batch_seconds`` (``pause_seconds``: 0 to the same)."""
MAX_PAUSE_RATIO: Final = 100.0
"""The largest ``pause_ratio``: the purge busy at least 1 % of the time."""


@dataclass(frozen=True, slots=True)
class CleanupReport:
    """What one cleanup run did (or, with ``dry_run``, would do)."""

    deleted: int
    """Rows deleted; with ``dry_run``, rows that would be deleted."""
    batches: int
    """Delete transactions run (0 for a dry run)."""
    seconds: float
    cutoff: dt.datetime
    """Claims with ``processed_at`` strictly before this instant were (or would be) deleted."""
    dry_run: bool
    longest_batch_seconds: float = 0.0
    """Seconds of the slowest single transaction that can hold up a claim: a delete batch,
    or (partitioned tables) one that detaches expired partitions under the table lock, its
    wait for the lock included. 0.0 for a dry run."""
    partitions_dropped: tuple[str, ...] = ()
    """Partitions dropped whole (partitioned tables only); their rows count in ``deleted``."""
    effects_deleted: int = 0
    """Effect records deleted with their claims (``Inbox.effect``); with ``dry_run``, the
    records that would be. Not counted in ``deleted``."""
    results_deleted: int = 0
    """Celery inbox tasks' stored return values deleted after the claims (same window); with
    ``dry_run``, those that would be. Not counted in ``deleted``."""


def cutoff_for(days: int, now: dt.datetime | None = None) -> dt.datetime:
    """Return ``now - days``: claims processed strictly before it are past retention."""
    if isinstance(days, bool) or not isinstance(days, int):
        raise ConfigurationError(f"days must be a whole number, got {type(days).__name__}")
    if days < 1:
        raise ConfigurationError(f"days must be at least 1, got {days}")
    now = dt.datetime.now(dt.UTC) if now is None else now
    if now.tzinfo is None:
        raise ConfigurationError("now must be timezone-aware")
    try:
        return now - dt.timedelta(days=days)
    except OverflowError:
        raise ConfigurationError(
            f"days={days} reaches before year 1; use a smaller window"
        ) from None


def cleanup(
    bind: Engine | URL | str,
    *,
    days: int,
    batch_size: int | None = None,
    dry_run: bool = False,
    table: str | Table = DEFAULT_TABLE_NAME,
    now: dt.datetime | None = None,
    effect_table: str | Table | None = DEFAULT_EFFECT_TABLE_NAME,
    batch_seconds: float = DEFAULT_BATCH_SECONDS,
    pause_seconds: float = 0.0,
    result_table: str | Table | None = DEFAULT_RESULT_TABLE_NAME,
    pause_ratio: float = 0.0,
) -> CleanupReport:
    """Delete inbox claims whose ``processed_at`` is strictly older than ``now - days``.

    Deletes in batches, each in a transaction of its own, so live workers are never blocked
    for long: by default each batch holds as many rows as take about ``batch_seconds``
    (0.025 s) at the rate the previous batches achieved (from 2,000 rows, at most twice the
    previous batch, 100 to 100,000 rows); with ``batch_size``, exactly that many rows per
    batch (the last one fewer). ``pause_seconds`` between two batches leaves the server to
    the workers for that long (a slower purge, shorter waits for the claims beside it);
    ``pause_ratio`` paces it by its own measured batch time instead: after a batch of ``t``
    seconds it sleeps ``pause_ratio * t`` (the longer of the two pauses when both are given),
    so on a loaded server, whose batches take longer, the pauses grow with them.
    ``bind`` is an engine or a database URL. The window
    must be longer than the longest time a message can still be redelivered: a deleted claim
    no longer deduplicates. On a table partitioned by :mod:`inbox.partitioning`
    (PostgreSQL), expired day partitions are dropped whole (see
    :func:`inbox.partitioning.drop_partitions`) and every other partition is cleaned in
    batches, one partition at a time; that needs the table's owner.

    The records of :meth:`inbox.Inbox.effect` in ``effect_table`` (in the same database;
    skipped when the table does not exist, or with ``effect_table=None``) go first, those
    whose committed claim is past retention only: see docs/effects.md, "Cleanup". The
    return values of Celery inbox tasks in ``result_table`` (same database; skipped when it
    does not exist, or with ``result_table=None``) stored before the cutoff go after the
    claims, those whose claim is gone only, in batches sized the same way: see
    docs/celery.md, "The result table".
    """
    cutoff = cutoff_for(days, now)
    _check_batching(batch_size, batch_seconds, pause_seconds)
    _check_pause_ratio(pause_ratio)
    inbox_table = resolve_table(table)
    effects = None if effect_table is None else resolve_effect_table(effect_table)
    results = None if result_table is None else resolve_result_table(result_table)
    engine = bind if isinstance(bind, Engine) else create_engine(bind)
    started = time.perf_counter()
    try:
        if effects is not None and not has_effect_table(engine, effects):
            effects = None
        if results is not None and not has_result_table(engine, results):
            results = None
        if dry_run:
            with engine.connect() as connection:
                expired = count_expired(connection, inbox_table, cutoff)
            gone = (
                0
                if effects is None
                else count_expired_effects(engine, effects, inbox_table, cutoff)
            )
            stale = (
                0
                if results is None
                else count_expired_results(engine, results, inbox_table, cutoff)
            )
            return CleanupReport(
                expired,
                0,
                time.perf_counter() - started,
                cutoff,
                True,
                effects_deleted=gone,
                results_deleted=stale,
            )
        # Effects first: while their claims are still there, no redelivery reads them.
        gone, _, effect_longest = (
            (0, 0, 0.0)
            if effects is None
            else delete_expired_effects(
                engine,
                effects,
                inbox_table,
                cutoff,
                effect_sizing(batch_size, batch_seconds, pause_seconds, pause_ratio),
            )
        )
        sizing = BatchSizing(
            batch_size, batch_seconds, pause=pause_seconds, pause_ratio=pause_ratio
        )
        if is_partitioned(engine, inbox_table):
            report = _cleanup_partitioned(engine, inbox_table, cutoff, sizing, started)
        else:
            deleted, batches, longest = delete_in_batches(engine, inbox_table, cutoff, sizing)
            elapsed = time.perf_counter() - started
            report = CleanupReport(deleted, batches, elapsed, cutoff, False, longest)
        # Results after their claims, and only those whose claim is gone: while a claim is
        # there, a redelivery reads its result.
        stale, _, result_longest = (
            (0, 0, 0.0)
            if results is None
            else delete_expired_results(
                engine,
                results,
                inbox_table,
                cutoff,
                effect_sizing(batch_size, batch_seconds, pause_seconds, pause_ratio),
            )
        )
        return dataclasses.replace(
            report,
            seconds=time.perf_counter() - started,
            longest_batch_seconds=max(report.longest_batch_seconds, effect_longest, result_longest),
            effects_deleted=gone,
            results_deleted=stale,
        )
    finally:
        if not isinstance(bind, Engine):
            engine.dispose()


def _check_batching(batch_size: int | None, batch_seconds: float, pause_seconds: float) -> None:
    if batch_size is not None:
        if isinstance(batch_size, bool) or not isinstance(batch_size, int):
            raise ConfigurationError(
                f"batch_size must be a whole number, got {type(batch_size).__name__}"
            )
        if not 1 <= batch_size <= MAX_CLEANUP_BATCH_SIZE:
            raise ConfigurationError(
                f"batch_size must be between 1 and {MAX_CLEANUP_BATCH_SIZE}, got {batch_size}"
            )
    _check_seconds("batch_seconds", batch_seconds, MIN_BATCH_SECONDS)
    _check_seconds("pause_seconds", pause_seconds, 0.0)


def _check_pause_ratio(pause_ratio: float) -> None:
    if isinstance(pause_ratio, bool) or not isinstance(pause_ratio, int | float):
        raise ConfigurationError(f"pause_ratio must be a number, got {type(pause_ratio).__name__}")
    if not (math.isfinite(pause_ratio) and 0.0 <= pause_ratio <= MAX_PAUSE_RATIO):
        raise ConfigurationError(
            f"pause_ratio must be between 0 and {MAX_PAUSE_RATIO:g}, got {pause_ratio}"
        )


def _check_seconds(name: str, value: float, least: float) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigurationError(f"{name} must be a number, got {type(value).__name__}")
    if not (math.isfinite(value) and least <= value <= MAX_BATCH_SECONDS):
        raise ConfigurationError(
            f"{name} must be between {least} and {MAX_BATCH_SECONDS}, got {value}"
        )


def _cleanup_partitioned(
    engine: Engine, table: Table, cutoff: dt.datetime, sizing: BatchSizing, started: float
) -> CleanupReport:
    partitions = list_partitions(engine, table)
    expired_ids = first_id_at(cutoff)
    # Day partitions whose whole id range ends before the cutoff: drop them if their claims
    # are all expired too. (None when the cutoff is before 1970.)
    old_days = [
        p.name for p in partitions if p.lower is not None and p.upper and p.upper <= expired_ids
    ]
    drops = drop_partitions(engine, table, old_days, cutoff=cutoff)
    dropped = {name for name, _ in drops.dropped}
    deleted = sum(rows for _, rows in drops.dropped)
    batches = 0
    longest = drops.longest_seconds
    for partition in partitions:
        if partition.name in dropped:
            continue
        # Kept (a young claim in an old range, the lock was busy) or not a day partition.
        count, runs, slowest = delete_in_batches(
            engine, partition_table(table, partition), cutoff, sizing, gone_ok=True
        )
        deleted += count
        batches += runs
        longest = max(longest, slowest)
    elapsed = time.perf_counter() - started
    names = tuple(name for name, _ in drops.dropped)
    return CleanupReport(deleted, batches, elapsed, cutoff, False, longest, names)
