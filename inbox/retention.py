"""Retention: delete claims older than a window, in short batches that run beside workers."""

from __future__ import annotations

import datetime as dt
import time
from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    URL,
    Connection,
    Delete,
    Engine,
    Table,
    any_,
    create_engine,
    delete,
    func,
    literal_column,
    select,
)
from sqlalchemy.sql import ColumnElement

from inbox.errors import UnsupportedDialect
from inbox.schema import DEFAULT_TABLE_NAME, resolve_table

__all__ = ["MAX_BATCH_SIZE", "CleanupReport", "cleanup", "cutoff_for"]

MAX_BATCH_SIZE = 1_000_000


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


def cutoff_for(days: int, now: dt.datetime | None = None) -> dt.datetime:
    """Return ``now - days``: claims processed strictly before it are past retention."""
    if isinstance(days, bool) or not isinstance(days, int):
        raise TypeError(f"days must be a whole number, got {type(days).__name__}")
    if days < 1:
        raise ValueError(f"days must be at least 1, got {days}")
    now = dt.datetime.now(dt.UTC) if now is None else now
    if now.tzinfo is None:
        raise ValueError("now must be timezone-aware")
    try:
        return now - dt.timedelta(days=days)
    except OverflowError:
        raise ValueError(f"days={days} reaches before year 1; use a smaller window") from None


def cleanup(
    bind: Engine | URL | str,
    *,
    days: int,
    batch_size: int = 10_000,
    dry_run: bool = False,
    table: str | Table = DEFAULT_TABLE_NAME,
    now: dt.datetime | None = None,
) -> CleanupReport:
    """Delete inbox claims whose ``processed_at`` is strictly older than ``now - days``.

    Deletes at most ``batch_size`` rows per transaction and commits each batch, so locks are
    held for one batch only and live workers are never blocked for long. ``bind`` is an
    engine or a database URL. The retention window must be longer than the longest time a
    message can still be redelivered: a deleted claim no longer deduplicates.
    """
    cutoff = cutoff_for(days, now)
    if isinstance(batch_size, bool) or not isinstance(batch_size, int):
        raise TypeError(f"batch_size must be a whole number, got {type(batch_size).__name__}")
    if not 1 <= batch_size <= MAX_BATCH_SIZE:
        raise ValueError(f"batch_size must be between 1 and {MAX_BATCH_SIZE}, got {batch_size}")
    inbox_table = resolve_table(table)
    engine = bind if isinstance(bind, Engine) else create_engine(bind)
    started = time.perf_counter()
    try:
        if dry_run:
            with engine.connect() as connection:
                expired = _count_expired(connection, inbox_table, cutoff)
            return CleanupReport(expired, 0, time.perf_counter() - started, cutoff, True)
        statement = _batch_delete(inbox_table, engine.dialect.name, cutoff, batch_size)
        deleted = batches = 0
        while True:
            with engine.begin() as connection:
                count = connection.execute(statement).rowcount
            batches += 1
            deleted += count
            if count < batch_size:
                break
        return CleanupReport(deleted, batches, time.perf_counter() - started, cutoff, False)
    finally:
        if not isinstance(bind, Engine):
            engine.dispose()


def _count_expired(connection: Connection, table: Table, cutoff: dt.datetime) -> int:
    query = select(func.count()).select_from(table).where(table.c.processed_at < cutoff)
    return int(connection.execute(query).scalar_one())


def _batch_delete(table: Table, dialect_name: str, cutoff: dt.datetime, limit: int) -> Delete:
    """One batch: at most ``limit`` expired rows, found through the ``processed_at`` index.

    Each dialect deletes by its physical row address (or a native LIMIT) so a batch touches
    only the rows it removes, never re-scanning the table by primary key.
    """
    expired = table.c.processed_at < cutoff
    if dialect_name == "postgresql":
        # SKIP LOCKED lets several cleanups run at once on disjoint rows, neither waiting.
        ctid: ColumnElement[Any] = literal_column("ctid")
        batch = select(ctid).select_from(table).where(expired).limit(limit)
        batch = batch.with_for_update(skip_locked=True)
        return delete(table).where(ctid == any_(func.array(batch.scalar_subquery())))
    if dialect_name == "sqlite":
        rowid: ColumnElement[Any] = literal_column("rowid")
        batch = select(rowid).select_from(table).where(expired).limit(limit)
        return delete(table).where(rowid.in_(batch.scalar_subquery()))
    if dialect_name in ("mysql", "mariadb"):
        return delete(table).where(expired).with_dialect_options(mysql_limit=limit)
    raise UnsupportedDialect(
        f"inbox cleanup does not support dialect {dialect_name!r}; "
        "supported: postgresql, sqlite, mysql/mariadb"
    )
