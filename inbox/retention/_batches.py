"""The batched delete of expired claims from one table (a plain table or one partition):
short transactions, each at most one batch, found through the ``processed_at`` index."""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Callable
from typing import Any

from sqlalchemy import (
    Connection,
    Delete,
    Engine,
    Executable,
    Table,
    and_,
    any_,
    bindparam,
    delete,
    func,
    literal_column,
    select,
)
from sqlalchemy.exc import ProgrammingError
from sqlalchemy.sql import ColumnElement

from inbox.errors import UnsupportedDialect
from inbox.retention._catalog import UNDEFINED_TABLE
from inbox.schema import UTCDateTime

__all__ = ["count_expired", "delete_in_batches"]

logger = logging.getLogger("inbox.retention")


def count_expired(connection: Connection, table: Table, cutoff: dt.datetime) -> int:
    """How many claims of ``table`` were processed strictly before ``cutoff``."""
    query = select(func.count()).select_from(table).where(table.c.processed_at < cutoff)
    return int(connection.execute(query).scalar_one())


def delete_in_batches(
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
            if gone_ok and _is_gone(exc):
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
        try:
            with engine.connect() as connection:
                if not _any_expired(connection, table, cutoff):
                    break
        except ProgrammingError as exc:
            if gone_ok and _is_gone(exc):
                break
            raise
        after = None
    return deleted, batches, longest


def _is_gone(exc: ProgrammingError) -> bool:
    return getattr(exc.orig, "sqlstate", None) == UNDEFINED_TABLE


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
