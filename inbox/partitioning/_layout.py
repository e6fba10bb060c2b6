"""The partition layout of a partitioned inbox table: its partitions as values, the names
and limits it imposes, and the checks every partition operation starts with."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from sqlalchemy import Column, Connection, Engine, MetaData, String, Table

from inbox._column_types import BinaryUUID, UTCDateTime
from inbox.errors import ConfigurationError, InboxError, UnsupportedDialect
from inbox.partitioning._ids import date_of
from inbox.schema import resolve_table

__all__ = [
    "DEFAULT_DAYS_AHEAD",
    "DEFAULT_HOLD_SECONDS",
    "DEFAULT_LOCK_TIMEOUT",
    "MAX_TABLE_NAME_LENGTH",
    "Future",
    "Partition",
    "PartitionLayoutError",
    "check_whole",
    "future_of",
    "last_interval",
    "partition_table",
    "partitionable",
]

DEFAULT_DAYS_AHEAD: Final = 7
"""Days of partitions :func:`ensure_partitions` (and ``inbox-cleanup``) keeps ahead."""
DEFAULT_LOCK_TIMEOUT: Final = 2.0
"""Seconds a partition change waits for its table lock before it gives up (and retries)."""
DEFAULT_HOLD_SECONDS: Final = 0.03
"""Seconds :func:`drop_partitions` goes on dropping under one lock before it commits."""

_DAY_SUFFIX_LENGTH: Final = len("_p20260101")
MAX_TABLE_NAME_LENGTH: Final = 63 - _DAY_SUFFIX_LENGTH
"""Longest name of a partitioned inbox table: its partitions' names must fit in 63 bytes."""


class PartitionLayoutError(InboxError):
    """The partitioned inbox table does not have the layout this module maintains."""


@dataclass(frozen=True, slots=True)
class Partition:
    """One partition of a partitioned inbox table and its id range ``[lower, upper)``."""

    name: str
    lower: bytes | None
    """The lowest id in the partition; None for MINVALUE and for the DEFAULT partition."""
    upper: bytes | None
    """The first id after the partition; None for MAXVALUE and for the DEFAULT partition."""
    is_default: bool = False

    @property
    def is_bounded(self) -> bool:
        """True for a partition with a finite range on both sides (a day, or ``_future``)."""
        return self.lower is not None and self.upper is not None


@dataclass(frozen=True, slots=True)
class Future:
    """The ``T_future`` partition, whose range new day partitions are carved from."""

    name: str
    lower: bytes
    upper: bytes


def partition_table(table: str | Table, partition: Partition | str) -> Table:
    """A :class:`~sqlalchemy.Table` naming one partition of ``table`` (same schema, same
    columns), for statements that must run on that partition alone."""
    inbox_table = resolve_table(table)
    name = partition.name if isinstance(partition, Partition) else partition
    return Table(
        name,
        MetaData(),
        Column("message_id", BinaryUUID(), primary_key=True),
        Column("handler", String(), primary_key=True),
        Column("processed_at", UTCDateTime(), nullable=False),
        schema=inbox_table.schema,
    )


def partitionable(bind: Engine | Connection, table: str | Table) -> Table:
    """``table`` resolved, once checked that it can be partitioned here (PostgreSQL, and a
    name short enough for its partitions' names)."""
    inbox_table = resolve_table(table)
    if bind.dialect.name != "postgresql":
        raise UnsupportedDialect(f"inbox partitioning needs PostgreSQL, not {bind.dialect.name!r}")
    if len(inbox_table.name) > MAX_TABLE_NAME_LENGTH:
        raise ConfigurationError(
            f"a partitioned inbox table's name must be at most {MAX_TABLE_NAME_LENGTH} "
            f"characters (its partitions add {_DAY_SUFFIX_LENGTH}), got {inbox_table.name!r}"
        )
    return inbox_table


def check_whole(value: object, label: str, low: int) -> None:
    """Refuse ``value`` unless it is a whole number of at least ``low``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigurationError(f"{label} must be a whole number, got {type(value).__name__}")
    if value < low:
        raise ConfigurationError(f"{label} must be at least {low}, got {value}")


def future_of(partitions: list[Partition], table: Table) -> Future:
    """The ``T_future`` partition of ``table`` among ``partitions``; a layout error if it
    is missing or unbounded."""
    name = f"{table.name}_future"
    for partition in partitions:
        if partition.name == name and partition.lower is not None:
            if partition.upper is None:
                break
            return Future(name, partition.lower, partition.upper)
    raise PartitionLayoutError(
        f"{table.fullname} has no partition {name} with a bounded range: is it partitioned "
        "by inbox.partitioning.create_partitioned_table?"
    )


def last_interval(partitions: list[Partition], future: Future) -> int:
    """The width in days of the day partition just below ``T_future`` (1 if there is none)."""
    days = [
        p for p in partitions if p.is_bounded and p.name != future.name and p.upper == future.lower
    ]
    if not days or days[0].lower is None:
        return 1
    width = date_of(future.lower) - date_of(days[0].lower)
    return max(1, width.days)
