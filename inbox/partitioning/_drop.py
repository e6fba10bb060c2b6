"""Dropping expired day partitions: detached under the table lock a few at a time, then
dropped each in a transaction of its own."""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import Connection, Engine, Table, func, select
from sqlalchemy.exc import DBAPIError

from inbox.errors import ConfigurationError
from inbox.partitioning._catalog import (
    UNDEFINED_TABLE,
    detached_day_tables,
    partition_names,
    sqlstate,
)
from inbox.partitioning._ddl import Ddl, LockTable
from inbox.partitioning._layout import (
    DEFAULT_HOLD_SECONDS,
    DEFAULT_LOCK_TIMEOUT,
    partition_table,
    partitionable,
)
from inbox.partitioning._lock import is_lock_conflict, locked
from inbox.schema import DEFAULT_TABLE_NAME

__all__ = ["DroppedPartitions", "drop_detached_leftovers", "drop_partitions"]

logger = logging.getLogger("inbox.partitioning")


@dataclass(frozen=True, slots=True)
class DroppedPartitions:
    """What :func:`drop_partitions` did."""

    dropped: tuple[tuple[str, int], ...]
    """(partition, the claims it held) for every partition dropped, in order."""
    transactions: int
    """Transactions that held the table lock to detach partitions."""
    longest_seconds: float
    """The longest of those transactions, waiting for the lock included: about the longest
    time a claim waited for the drops. (Dropping a detached table locks no claim out.)"""


def drop_partitions(
    engine: Engine,
    table: str | Table,
    partitions: Sequence[str],
    *,
    cutoff: dt.datetime,
    lock_timeout: float = DEFAULT_LOCK_TIMEOUT,
    hold_seconds: float = DEFAULT_HOLD_SECONDS,
) -> DroppedPartitions:
    """Detach and drop each of ``partitions`` of ``table`` whose claims were all processed
    strictly before ``cutoff``; keep the others (a younger claim, already gone).

    The caller decides that the partitions' id ranges end before the cutoff; this function
    checks the claims: first without a lock, then again under ``ACCESS EXCLUSIVE`` on the
    parent, where the expired partitions are detached one after another until the
    transaction has held the lock for ``hold_seconds``; the next transaction takes the lock
    again for the rest. A detached range falls to the DEFAULT partition. Each detached table
    is then dropped in a transaction of its own, which locks out no claim. A lock not
    granted within ``lock_timeout`` seconds ends the dropping (the caller deletes the rest in
    batches). Day partitions an interrupted run detached are dropped first and listed too
    (see :func:`drop_detached_leftovers`). Each partition's claims are counted in the
    transaction that drops it, so concurrent cleanups never count a claim twice.
    """
    inbox_table = partitionable(engine, table)
    if isinstance(hold_seconds, bool) or not isinstance(hold_seconds, int | float):
        raise ConfigurationError("hold_seconds must be a number of seconds")
    dropped = _sweep_leftovers(engine, inbox_table)
    candidates = dict.fromkeys(_expired_partitions(engine, inbox_table, partitions, cutoff))

    transactions = 0
    longest = 0.0

    def drop_some(connection: Connection) -> tuple[list[str], list[str]]:
        """Under the lock: (partitions examined, partitions detached), oldest first, until
        the hold budget is spent. undefined_table if another cleanup dropped one."""
        locked_at = time.perf_counter()
        examined: list[str] = []
        done: list[str] = []
        ddl = Ddl(connection, inbox_table)
        for name in candidates:
            newest = partition_table(inbox_table, name).c.processed_at
            claim = connection.execute(select(func.max(newest))).scalar()
            if claim is None or claim < cutoff:
                ddl.detach(name)
                done.append(name)
            examined.append(name)
            if time.perf_counter() - locked_at >= hold_seconds:
                break
        return examined, done

    while candidates:
        began = time.perf_counter()
        try:
            examined, done = locked(engine, inbox_table, lock_timeout, drop_some, attempts=1)
        except DBAPIError as exc:
            if sqlstate(exc) == UNDEFINED_TABLE:
                with engine.connect() as connection:
                    present = partition_names(connection, inbox_table)
                gone = [name for name in candidates if name not in present]
                if not gone:
                    raise
                for name in gone:
                    del candidates[name]  # another cleanup dropped it
                continue
            if is_lock_conflict(exc):
                break  # the table is busy: the caller deletes in batches instead
            raise
        seconds = time.perf_counter() - began
        transactions += 1
        longest = max(longest, seconds)
        for name in examined:
            del candidates[name]
        for name in done:
            rows = _drop_detached(engine, inbox_table, name)
            if rows is None:
                continue  # another cleanup's leftover sweep dropped (and counted) it
            dropped.append((name, rows))
            logger.info(
                "cleanup: dropped partition %s (%d claims)",
                name,
                rows,
                extra={"inbox_deleted": rows},
            )
    return DroppedPartitions(tuple(dropped), transactions, longest)


def drop_detached_leftovers(engine: Engine, table: str | Table = DEFAULT_TABLE_NAME) -> list[str]:
    """Drop the day partitions of ``table`` that a cleanup detached but did not get to drop
    (it was interrupted between the two transactions); return their names.

    A leftover is a plain table in the inbox table's schema named like a day partition
    (``T_pYYYYMMDD``) that is not a partition: expired claims no claim statement can reach.
    """
    return [name for name, _ in _sweep_leftovers(engine, partitionable(engine, table))]


def _sweep_leftovers(engine: Engine, table: Table) -> list[tuple[str, int]]:
    """Drop the detached day partitions of ``table``; (name, claims) of those dropped."""
    with engine.connect() as connection:
        names = detached_day_tables(connection, table)
    swept: list[tuple[str, int]] = []
    for name in names:
        rows = _drop_detached(engine, table, name)
        if rows is None:
            continue
        swept.append((name, rows))
        logger.warning(
            "cleanup: dropped %s (%d claims), a day partition detached and not dropped by "
            "an interrupted (or a concurrent) cleanup",
            name,
            rows,
            extra={"inbox_deleted": rows},
        )
    return swept


def _drop_detached(engine: Engine, table: Table, name: str) -> int | None:
    """Drop the detached partition ``name``; return the claims it held when it went (None:
    it was gone already).

    The claims are counted under the drop's own lock, not when the partition was chosen:
    until it is dropped, a concurrent cleanup that listed it as a partition may still delete
    (and count) its rows in batches.
    """
    detached = partition_table(table, name)
    try:
        with engine.begin() as connection:
            connection.execute(LockTable(detached))
            rows = int(connection.execute(select(func.count()).select_from(detached)).scalar_one())
            Ddl(connection, table).drop(name)
    except DBAPIError as exc:
        if sqlstate(exc) != UNDEFINED_TABLE:  # a concurrent cleanup's leftover sweep
            raise
        return None
    return rows


def _expired_partitions(
    engine: Engine, table: Table, partitions: Sequence[str], cutoff: dt.datetime
) -> list[str]:
    """Those of ``partitions`` whose claims all precede ``cutoff`` now (read without a lock:
    the caller checks again under it)."""
    expired: list[str] = []
    # Autocommit: a partition another cleanup dropped meanwhile fails its own statement only.
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
        for name in partitions:
            target = partition_table(table, name)
            query = select(func.max(target.c.processed_at))
            try:
                newest = connection.execute(query).scalar()
            except DBAPIError as exc:
                if sqlstate(exc) == UNDEFINED_TABLE:
                    continue
                raise
            if newest is None or newest < cutoff:
                expired.append(name)
    return expired
