"""Retention: delete claims older than a window, in short batches that run beside workers.

On a PostgreSQL table partitioned by :mod:`inbox.partitioning`, expired day partitions are
dropped whole and the other partitions are cleaned in batches, one partition at a time.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    URL,
    Connection,
    Delete,
    Engine,
    Executable,
    Table,
    and_,
    any_,
    bindparam,
    create_engine,
    delete,
    func,
    literal_column,
    select,
)
from sqlalchemy.exc import ProgrammingError
from sqlalchemy.sql import ColumnElement

from inbox.errors import UnsupportedDialect
from inbox.partitioning import (
    drop_partitions,
    id_floor,
    is_partitioned,
    list_partitions,
    partition_table,
)
from inbox.schema import DEFAULT_TABLE_NAME, UTCDateTime, resolve_table

__all__ = ["MAX_BATCH_SIZE", "CleanupReport", "cleanup", "cutoff_for"]

logger = logging.getLogger(__name__)

MAX_BATCH_SIZE = 1_000_000
_UNDEFINED_TABLE = "42P01"


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

    On a table partitioned by :mod:`inbox.partitioning` (PostgreSQL), a day partition whose
    whole id range ends before the cutoff and whose newest claim is older than the cutoff is
    detached and dropped (see :func:`inbox.partitioning.drop_partitions`); every other
    partition is cleaned in batches, each partition on its own (a ``ctid`` is an address
    within one partition, not within the partitioned table). That needs the table's owner.
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
        if is_partitioned(engine, inbox_table):
            return _cleanup_partitioned(engine, inbox_table, cutoff, batch_size, started)
        deleted, batches, longest = _delete_in_batches(engine, inbox_table, cutoff, batch_size)
        elapsed = time.perf_counter() - started
        return CleanupReport(deleted, batches, elapsed, cutoff, False, longest)
    finally:
        if not isinstance(bind, Engine):
            engine.dispose()


def _cleanup_partitioned(
    engine: Engine, table: Table, cutoff: dt.datetime, batch_size: int, started: float
) -> CleanupReport:
    partitions = list_partitions(engine, table)
    expired_ids = id_floor(cutoff)
    # Day partitions whose whole id range ends before the cutoff: drop them if their claims
    # are all expired too.
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
        count, runs, slowest = _delete_in_batches(
            engine, partition_table(table, partition), cutoff, batch_size, gone_ok=True
        )
        deleted += count
        batches += runs
        longest = max(longest, slowest)
    elapsed = time.perf_counter() - started
    names = tuple(name for name, _ in drops.dropped)
    return CleanupReport(deleted, batches, elapsed, cutoff, False, longest, names)


def _delete_in_batches(
    engine: Engine, table: Table, cutoff: dt.datetime, batch_size: int, *, gone_ok: bool = False
) -> tuple[int, int, float]:
    """Delete the expired claims of ``table`` (a plain table or one partition) batch by batch;
    return (rows deleted, batches, seconds of the slowest batch). With ``gone_ok``, a table
    that disappears (a partition another cleanup dropped) ends the loop quietly.

    On PostgreSQL each batch starts where the previous one ended (``processed_at`` at or
    after the newest claim it deleted): the index entries of deleted rows stay until vacuum,
    and a batch that scanned the index from its start would step over all of them, ever more
    with each batch. Rows left behind that cursor (locked by another cleanup, or a late claim
    with an old clock) are picked up by batches from the start once the cursor is through.
    """
    step = _batch_step(table, engine.dialect.name, cutoff, batch_size)
    deleted = batches = 0
    longest = 0.0
    after: dt.datetime | None = None
    while True:
        began = time.perf_counter()
        try:
            with engine.begin() as connection:
                count, newest = step(connection, after)
        except ProgrammingError as exc:
            if gone_ok and getattr(exc.orig, "sqlstate", None) == _UNDEFINED_TABLE:
                break
            raise
        seconds = time.perf_counter() - began
        logger.debug(
            "cleanup: deleted %d claims from %s in %.1f ms",
            count,
            table.fullname,
            seconds * 1000,
            extra={"inbox_deleted": count},
        )
        longest = max(longest, seconds)
        batches += 1
        deleted += count
        if count >= batch_size:
            after = newest
            continue
        if after is None:
            break
        with engine.connect() as connection:
            if not _any_expired(connection, table, cutoff):
                break
        after = None
    return deleted, batches, longest


_Step = Callable[[Connection, "dt.datetime | None"], tuple[int, "dt.datetime | None"]]


def _batch_step(table: Table, dialect_name: str, cutoff: dt.datetime, limit: int) -> _Step:
    """Run one batch on a connection, after a keyset cursor (PostgreSQL) or not; return the
    rows it deleted and the newest ``processed_at`` among them (None where not tracked)."""
    if dialect_name != "postgresql":
        statement = _batch_delete(table, dialect_name, cutoff, limit)

        def plain(connection: Connection, after: dt.datetime | None) -> tuple[int, None]:
            return connection.execute(statement).rowcount, None

        return plain
    first = _keyset_batch(table, cutoff, limit, bounded=False)
    rest = _keyset_batch(table, cutoff, limit, bounded=True)

    def keyset(connection: Connection, after: dt.datetime | None) -> tuple[int, dt.datetime | None]:
        if after is None:
            count, newest = connection.execute(first).one()
        else:
            count, newest = connection.execute(rest, {"after": after}).one()
        return int(count), newest

    return keyset


def _keyset_batch(table: Table, cutoff: dt.datetime, limit: int, *, bounded: bool) -> Executable:
    """The PostgreSQL batch: delete at most ``limit`` expired rows (from ``:after`` on, when
    ``bounded``) by ``ctid``; select how many went and the newest ``processed_at`` of them."""
    expired = table.c.processed_at < cutoff
    if bounded:
        expired = and_(table.c.processed_at >= bindparam("after", type_=UTCDateTime()), expired)
    gone = _batch_delete(table, "postgresql", cutoff, limit, where=expired)
    deleted = gone.returning(table.c.processed_at).cte("gone")
    return select(func.count(), func.max(deleted.c.processed_at))


def _count_expired(connection: Connection, table: Table, cutoff: dt.datetime) -> int:
    query = select(func.count()).select_from(table).where(table.c.processed_at < cutoff)
    return int(connection.execute(query).scalar_one())


def _any_expired(connection: Connection, table: Table, cutoff: dt.datetime) -> bool:
    query = select(table.c.processed_at).where(table.c.processed_at < cutoff).limit(1)
    return connection.execute(query).first() is not None


def _batch_delete(
    table: Table,
    dialect_name: str,
    cutoff: dt.datetime,
    limit: int,
    *,
    where: ColumnElement[bool] | None = None,
) -> Delete:
    """One batch: at most ``limit`` expired rows, found through the ``processed_at`` index.

    Each dialect deletes by its physical row address (or a native LIMIT) so a batch touches
    only the rows it removes, never re-scanning the table by primary key. On PostgreSQL
    ``table`` must be a plain table or a single partition: a ``ctid`` is unique within one
    relation only, so on a partitioned parent the addresses of one partition's expired rows
    would also match other partitions' rows.
    """
    expired = table.c.processed_at < cutoff if where is None else where
    if dialect_name == "postgresql":
        # SKIP LOCKED lets several cleanups run at once on disjoint rows, neither waiting.
        # Oldest first (the index order, no sort): the keyset cursor relies on it.
        ctid: ColumnElement[Any] = literal_column("ctid")
        batch = select(ctid).select_from(table).where(expired).order_by(table.c.processed_at)
        batch = batch.limit(limit).with_for_update(skip_locked=True)
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
