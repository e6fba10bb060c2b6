"""Creating a partitioned inbox table, and keeping day partitions ahead of the clock."""

from __future__ import annotations

import datetime as dt

from sqlalchemy import Connection, Engine, MetaData, Table

from inbox.errors import ConfigurationError
from inbox.partitioning._catalog import read_partitions
from inbox.partitioning._ddl import Ddl
from inbox.partitioning._ids import KEYS_BOUND, LAST_DAY, date_of, day_name, day_ranges, id_floor
from inbox.partitioning._ids import today as today_of
from inbox.partitioning._layout import (
    DEFAULT_DAYS_AHEAD,
    DEFAULT_LOCK_TIMEOUT,
    check_whole,
    future_of,
    last_interval,
    partitionable,
)
from inbox.partitioning._lock import locked
from inbox.schema import DEFAULT_TABLE_NAME

__all__ = ["create_partitioned_table", "ensure_partitions"]


def create_partitioned_table(
    connection: Connection,
    table: str | Table = DEFAULT_TABLE_NAME,
    *,
    start: dt.date | None = None,
    days_ahead: int = DEFAULT_DAYS_AHEAD,
    interval_days: int = 1,
    now: dt.datetime | None = None,
) -> list[str]:
    """Create ``table`` partitioned by ``RANGE (message_id)`` and return its partitions' names.

    The table has exactly the columns, primary key and ``processed_at`` index of
    :func:`inbox.schema.inbox_table`. Its partitions: ``T_before`` (DEFAULT), one per
    ``interval_days`` from ``start`` (default: today, UTC) until ``days_ahead`` days after
    today, ``T_future`` up to :data:`KEYS_BOUND` and ``T_keys`` above it. Runs in the
    caller's transaction (e.g. ``op.get_bind()`` in an alembic revision); the table must not
    exist yet.
    """
    inbox_table = partitionable(connection, table)
    check_whole(days_ahead, "days_ahead", 0)
    check_whole(interval_days, "interval_days", 1)
    today = today_of(now)
    first = today if start is None else start
    if isinstance(first, dt.datetime) or not isinstance(first, dt.date):
        raise ConfigurationError(f"start must be a datetime.date, got {type(first).__name__}")
    horizon = today + dt.timedelta(days=days_ahead + 1)
    if not first < horizon < LAST_DAY:
        raise ConfigurationError(
            f"start must be before {horizon} and the horizon before {LAST_DAY}"
        )

    parent = inbox_table.to_metadata(MetaData())
    parent.dialect_kwargs["postgresql_partition_by"] = "RANGE (message_id)"
    parent.create(connection)
    ddl = Ddl(connection, inbox_table)
    name = inbox_table.name
    created = [ddl.create(f"{name}_before", None)]
    ranges = list(day_ranges(first, horizon, interval_days))
    created += [ddl.create(day_name(name, lo), (lo, hi)) for lo, hi in ranges]
    created.append(ddl.create(f"{name}_future", (ranges[-1][1], KEYS_BOUND)))
    created.append(ddl.create(f"{name}_keys", (KEYS_BOUND, None)))
    return created


def ensure_partitions(
    engine: Engine,
    table: str | Table = DEFAULT_TABLE_NAME,
    *,
    days_ahead: int = DEFAULT_DAYS_AHEAD,
    interval_days: int | None = None,
    now: dt.datetime | None = None,
    lock_timeout: float = DEFAULT_LOCK_TIMEOUT,
) -> list[str]:
    """Make sure day partitions exist until ``days_ahead`` days after today (UTC); return
    the names of the partitions it created (none when they already exist: idempotent).

    New day partitions are carved out of ``T_future`` in one transaction under
    ``ACCESS EXCLUSIVE`` on the parent: detach ``T_future``, create the day partitions, move
    the rows of their range (fast clocks, business keys) into them, attach ``T_future`` again
    for the rest. Claims wait meanwhile (milliseconds for tables of ordinary size); the wait
    for the lock is bounded by ``lock_timeout`` seconds and retried, five tries in all. No
    lock is taken when the partitions already exist. ``interval_days`` defaults to the width
    of the last day partition.
    """
    inbox_table = partitionable(engine, table)
    check_whole(days_ahead, "days_ahead", 0)
    if interval_days is not None:
        check_whole(interval_days, "interval_days", 1)
    horizon = today_of(now) + dt.timedelta(days=days_ahead + 1)
    if horizon >= LAST_DAY:
        raise ConfigurationError(f"days_ahead reaches past {LAST_DAY}")
    with engine.connect() as connection:
        future = future_of(read_partitions(connection, inbox_table), inbox_table)
        if future.lower >= id_floor(horizon):
            return []  # nothing to create: no lock taken

    def split(connection: Connection) -> list[str]:
        partitions = read_partitions(connection, inbox_table)  # again, under the lock
        future = future_of(partitions, inbox_table)
        width = interval_days or last_interval(partitions, future)
        ranges = list(day_ranges(date_of(future.lower), horizon, width))
        if not ranges:
            return []
        new_lower = id_floor(ranges[-1][1])
        ddl = Ddl(connection, inbox_table)
        ddl.detach(future.name)
        created = [ddl.create(day_name(inbox_table.name, lo), (lo, hi)) for lo, hi in ranges]
        ddl.move_below(future.name, new_lower)
        ddl.attach(future.name, (new_lower, future.upper))
        return created

    return locked(engine, inbox_table, lock_timeout, split)
