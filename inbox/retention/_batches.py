"""The batched delete of expired claims from one table (a plain table or one partition):
short transactions, each at most one batch, found through the ``processed_at`` index.

How big a batch is: a fixed number of rows (``batch_size``), or by default as many rows as
fit a time budget (``BatchSizing``, in ``_sizing.py``): each batch is sized from the rate the
previous ones achieved, so a batch takes about ``batch_seconds`` on a fast or a slow, idle
or busy server.

On PostgreSQL (docs/operations.md, "How a batch is deleted on PostgreSQL"):

* one cleanup per table at a time is the *walker*, behind an advisory lock its batch
  transactions take: oldest claims first, each batch a key range of ``processed_at``
  (``[from, to)``, ``to`` read from the index: the first claim past the batch) deleted by
  one plain ``DELETE``. No row is locked before it is deleted and nothing is returned:
  ``SELECT ... FOR UPDATE`` then ``DELETE`` wrote every row twice (heap and WAL), and
  ``RETURNING`` into a CTE cost as much again as the delete itself;
* a cleanup that finds the walker's lock taken (another cleanup of the same table is in a
  batch) runs a *helper* batch: the newest expired claims first, picked ``FOR UPDATE SKIP
  LOCKED`` and deleted by ``ctid``, so the two never wait for each other until they meet;
* each batch continues where the previous one of its kind ended (a keyset cursor on
  ``processed_at``), so no batch re-scans the index entries of the rows deleted before it;
* each batch commits with ``synchronous_commit = off``: WAL is flushed in order, so any
  later durable commit (a redelivery's new claim, say) makes the purge's commit durable
  first; all a crash can lose is the last purge commits, and their claims, which had
  expired, are deleted again by the next run. Nothing is deleted twice, nothing inside
  the window is touched.
"""

from __future__ import annotations

import datetime as dt
import logging
import time

from sqlalchemy import (
    Connection,
    Delete,
    Engine,
    Table,
    func,
    select,
)
from sqlalchemy.exc import ProgrammingError

from inbox._backends import Family, family_of, is_missing_table
from inbox.retention._pg_walk import Step, pg_step
from inbox.retention._sizing import BatchSizing

__all__ = [
    "count_expired",
    "delete_in_batches",
]

logger = logging.getLogger("inbox.retention")


def count_expired(connection: Connection, table: Table, cutoff: dt.datetime) -> int:
    """How many claims of ``table`` were processed strictly before ``cutoff``."""
    query = select(func.count()).select_from(table).where(table.c.processed_at < cutoff)
    return int(connection.execute(query).scalar_one())


def delete_in_batches(
    engine: Engine,
    table: Table,
    cutoff: dt.datetime,
    sizing: BatchSizing,
    *,
    gone_ok: bool = False,
) -> tuple[int, int, float]:
    """Delete the expired claims of ``table`` (a plain table or one partition) batch by batch;
    return (rows deleted, batches, seconds of the slowest batch). With ``gone_ok``, a table
    that disappears (a partition another cleanup dropped) ends the loop quietly.

    On PostgreSQL each batch starts where the previous one of its kind ended (the walker
    where its last key range ended, a helper at or before the oldest claim it took): the
    index entries of deleted rows stay until vacuum, and a batch that scanned the index from
    its start would step over all of them, ever more with each batch. Rows a helper left
    behind its cursor (locked by another cleanup) are looked for from the start once its
    cursor is through; the walker waits for locked rows instead, and leaves a claim that
    commits behind its cursor during the run to the next run.
    """
    family = family_of(engine)
    walks = family.walks_by_key_range
    step = pg_step(table, cutoff) if walks else _plain_step(table, family, cutoff)
    cursors: dict[bool, dt.datetime | None] = {}
    deleted = batches = 0
    longest = 0.0
    if walks:
        cursors[True] = _oldest_expired(engine, table, cutoff, gone_ok=gone_ok)
        if cursors[True] is None:
            return deleted, batches, longest  # nothing expired (most partitions): no batch
    while True:
        limit = sizing.size
        began = time.perf_counter()
        try:
            with engine.begin() as connection:
                walker, full, count, edge = step(connection, cursors, limit)
        except ProgrammingError as exc:
            if gone_ok and is_missing_table(exc.orig):
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
        sizing.record(count, seconds)
        longest = max(longest, seconds)
        batches += 1
        deleted += count
        if full:
            cursors[walker] = edge
            if pause := sizing.next_pause:
                time.sleep(pause)
            continue
        if walker or cursors.get(walker) is None:
            # The walker swept up to the cutoff (rows it met locked it waited for), or a
            # batch from the start found no more. A claim committed behind the walker's
            # cursor meanwhile (a clock a window late, an import of old claims) is left
            # for the next run: looking for one would step over the index entries of
            # every row this run deleted, seconds for millions.
            break
        try:
            with engine.connect() as connection:
                if not _any_expired(connection, table, cutoff):
                    break
        except ProgrammingError as exc:
            if gone_ok and is_missing_table(exc.orig):
                break
            raise
        cursors[walker] = None
    return deleted, batches, longest


def _plain_step(table: Table, family: Family, cutoff: dt.datetime) -> Step:
    """SQLite and MySQL/MariaDB: no cursor, every batch from the start of the index (the
    family's batched delete, ``Family.batch_delete``)."""
    statements: dict[int, Delete] = {}

    def plain(
        connection: Connection, cursors: dict[bool, dt.datetime | None], limit: int
    ) -> tuple[bool, int, int, None]:
        statement = statements.get(limit)
        if statement is None:
            statement = statements[limit] = family.batch_delete(table, cutoff, limit)
        count = int(connection.execute(statement).rowcount)
        return False, count >= limit, count, None

    return plain


def _oldest_expired(
    engine: Engine, table: Table, cutoff: dt.datetime, *, gone_ok: bool
) -> dt.datetime | None:
    """Where the walker starts: the oldest expired claim's ``processed_at``, None when there
    is none (or, with ``gone_ok``, no table). Read before the first batch, in a transaction
    that locks and writes nothing: the index entries of the claims an earlier run deleted
    stay until vacuum, and stepping over them (a good second for some millions, the first
    time) would otherwise be the first batch's, with its locks."""
    at = table.c.processed_at
    try:
        with engine.connect() as connection:
            oldest: dt.datetime | None = connection.execute(
                select(func.min(at)).where(at < cutoff)
            ).scalar()
    except ProgrammingError as exc:
        if gone_ok and is_missing_table(exc.orig):
            return None
        raise
    return oldest


def _any_expired(connection: Connection, table: Table, cutoff: dt.datetime) -> bool:
    # In index order: without it PostgreSQL may look for "any one row" with a sequential
    # scan, which reads every page the batches just emptied, and then the whole table.
    at = table.c.processed_at
    query = select(at).where(at < cutoff).order_by(at).limit(1)
    return connection.execute(query).first() is not None
