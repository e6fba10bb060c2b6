"""Optional PostgreSQL partitioning of the inbox table by message id, so that retention drops
whole partitions instead of deleting rows.

Why by ``message_id`` and not by ``processed_at``: on a partitioned PostgreSQL table every
unique constraint must contain the partition key. Partitioned by ``processed_at``, the
primary key ``(message_id, handler)`` would hold per partition only, and a redelivery
processed on a later day would land in another partition and run again. Partitioned by
``RANGE (message_id)``, the key contains the partition key, so a key always maps to one
partition and the primary key stays the duplicate guard for the whole table.

Producers stamp UUIDv7 ids, whose first 6 bytes are the big-endian Unix time in
milliseconds, so a range of ids is a range of time. The layout of a table ``T``:

==================  =================================================================
``T_before``        the DEFAULT partition: ids before the first day partition, and the
                    ranges of day partitions that were dropped (so an id there, from a
                    producer with a slow clock or a business key, still has a home)
``T_pYYYYMMDD``     one partition per day (or per ``interval_days``) of UUIDv7 ids
``T_future``        from the end of the last day partition to :data:`KEYS_BOUND`
``T_keys``          :data:`KEYS_BOUND` to MAXVALUE
==================  =================================================================

:data:`KEYS_BOUND` is the first id of millisecond ``3 * 2**40`` (the year 2074). Business
keys (``uuid5`` of an idempotency key) and random ids are uniform over all 16 bytes, so about
98.8 % of them land in ``T_keys``; the rest are spread over the other partitions. That is why
a day partition is dropped only when its id range ends before the cutoff *and* its newest
claim is older than the cutoff (see :func:`drop_partitions`): a business key or a slow clock's
id may have put a young claim into an old range.

Maintenance is :func:`ensure_partitions` (creates day partitions ahead by splitting
``T_future``) and :func:`inbox.cleanup` (drops expired day partitions, deletes expired rows
elsewhere in batches); ``inbox-cleanup`` runs both.
"""

from __future__ import annotations

import datetime as dt
import logging
import random
import re
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Final, TypeVar

from sqlalchemy import (
    Column,
    Connection,
    Engine,
    MetaData,
    String,
    Table,
    column,
    delete,
    false,
    func,
    insert,
    select,
    table,
)
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.schema import DropTable, ExecutableDDLElement
from sqlalchemy.sql.compiler import DDLCompiler

from inbox.errors import InboxError, UnsupportedDialect
from inbox.schema import DEFAULT_TABLE_NAME, BinaryUUID, UTCDateTime, resolve_table

__all__ = [
    "DEFAULT_DAYS_AHEAD",
    "DEFAULT_HOLD_SECONDS",
    "DEFAULT_LOCK_TIMEOUT",
    "KEYS_BOUND",
    "MAX_TABLE_NAME_LENGTH",
    "DroppedPartitions",
    "Partition",
    "PartitionLayoutError",
    "create_partitioned_table",
    "drop_detached_leftovers",
    "drop_partitions",
    "ensure_partitions",
    "id_floor",
    "is_partitioned",
    "list_partitions",
    "partition_table",
    "skip_partitions",
]

_KEYS_BOUND_MS: Final = 3 * 2**40
KEYS_BOUND: Final = _KEYS_BOUND_MS.to_bytes(6, "big") + bytes(10)
"""The lowest id of ``T_keys``: the first UUIDv7 of millisecond ``3 * 2**40`` (in 2074)."""

DEFAULT_DAYS_AHEAD: Final = 7
"""Days of partitions :func:`ensure_partitions` (and ``inbox-cleanup``) keeps ahead."""
DEFAULT_LOCK_TIMEOUT: Final = 2.0
"""Seconds a partition change waits for its table lock before it gives up (and retries)."""
DEFAULT_HOLD_SECONDS: Final = 0.03
"""Seconds :func:`drop_partitions` goes on dropping under one lock before it commits."""

logger = logging.getLogger(__name__)

_LOCK_ATTEMPTS: Final = 5
_DAY_SUFFIX_LENGTH: Final = len("_p20260101")
MAX_TABLE_NAME_LENGTH: Final = 63 - _DAY_SUFFIX_LENGTH
"""Longest name of a partitioned inbox table: its partitions' names must fit in 63 bytes."""

_R = TypeVar("_R")

_EPOCH: Final = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_MILLISECOND: Final = dt.timedelta(milliseconds=1)
_LAST_DAY: Final = (_EPOCH + _KEYS_BOUND_MS * _MILLISECOND).date()
# PostgreSQL's text for a range bound of a bytea key under bytea_output = 'hex'.
_BOUND = re.compile(
    r"FOR VALUES FROM \((?:MINVALUE|'\\x(?P<lower>[0-9a-f]*)')\) "
    r"TO \((?:MAXVALUE|'\\x(?P<upper>[0-9a-f]*)')\)"
)
# lock_not_available (lock_timeout), deadlock_detected: the DDL is tried again.
_RETRY_SQLSTATES: Final = frozenset({"55P03", "40P01"})
_UNDEFINED_TABLE: Final = "42P01"

_pg_class = table(
    "pg_class",
    column("oid"),
    column("relname"),
    column("relnamespace"),
    column("relkind"),
    column("relispartition"),
    column("relpartbound"),
    schema="pg_catalog",
)
_pg_inherits = table("pg_inherits", column("inhrelid"), column("inhparent"), schema="pg_catalog")


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


def id_floor(moment: dt.datetime | dt.date) -> bytes:
    """The lowest 16-byte UUIDv7 of ``moment``'s millisecond (a date means its midnight UTC).

    Every UUIDv7 minted at or after ``moment`` compares greater than or equal to it (bytes
    compare like their big-endian timestamp), every one minted before compares less.
    """
    if not isinstance(moment, dt.datetime):
        moment = dt.datetime.combine(moment, dt.time(), tzinfo=dt.UTC)
    if moment.tzinfo is None:
        raise ValueError("moment must be timezone-aware")
    milliseconds = (moment - _EPOCH) // _MILLISECOND
    if not 0 <= milliseconds < 2**48:
        raise ValueError(f"{moment.isoformat()} is outside the UUIDv7 time range")
    return milliseconds.to_bytes(6, "big") + bytes(10)


def skip_partitions(
    table: str | Table = DEFAULT_TABLE_NAME,
) -> Callable[[str | None, str, Mapping[str, str | None]], bool]:
    """An alembic ``include_name`` hook that hides the partitions of ``table`` from
    autogenerate, which would otherwise propose to drop them (they are tables PostgreSQL
    reports but no metadata defines). Everything else is included."""
    name = resolve_table(table).name
    partition_name = re.compile(rf"{re.escape(name)}_(?:before|future|keys|p[0-9]{{8}})")

    def include_name(name: str | None, type_: str, parent_names: Mapping[str, str | None]) -> bool:
        return not (type_ == "table" and name is not None and partition_name.fullmatch(name))

    return include_name


def is_partitioned(bind: Engine | Connection, table: str | Table = DEFAULT_TABLE_NAME) -> bool:
    """True if ``table`` exists and is a partitioned table (PostgreSQL only; False elsewhere)."""
    inbox_table = resolve_table(table)
    if bind.dialect.name != "postgresql":
        return False
    with _connection(bind) as connection:
        query = select(_pg_class.c.relkind).where(_pg_class.c.oid == _regclass(inbox_table))
        kind = connection.execute(query).scalar()
    return kind == "p"


def list_partitions(
    bind: Engine | Connection, table: str | Table = DEFAULT_TABLE_NAME
) -> list[Partition]:
    """The partitions of ``table``, the DEFAULT one first, then in order of their ranges."""
    inbox_table = resolve_table(table)
    with _connection(bind) as connection:
        return _partitions(connection, inbox_table)


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
    :func:`inbox.schema.inbox_table` (they are created from it). Its partitions:
    ``T_before`` (DEFAULT), one per ``interval_days`` from ``start`` (default: today, UTC)
    until ``days_ahead`` days after today, ``T_future`` up to :data:`KEYS_BOUND` and
    ``T_keys`` above it. Runs in the caller's transaction (e.g. ``op.get_bind()`` in an
    alembic revision); the table must not exist yet.
    """
    inbox_table = _partitionable(connection, table)
    _check_whole(days_ahead, "days_ahead", 0)
    _check_whole(interval_days, "interval_days", 1)
    today = _today(now)
    first = today if start is None else start
    if isinstance(first, dt.datetime) or not isinstance(first, dt.date):
        raise TypeError(f"start must be a datetime.date, got {type(first).__name__}")
    horizon = today + dt.timedelta(days=days_ahead + 1)
    if not first < horizon < _LAST_DAY:
        raise ValueError(f"start must be before {horizon} and the horizon before {_LAST_DAY}")

    parent = inbox_table.to_metadata(MetaData())
    parent.dialect_kwargs["postgresql_partition_by"] = "RANGE (message_id)"
    parent.create(connection)
    ddl = _Ddl(connection, inbox_table)
    created = [ddl.create(f"{inbox_table.name}_before", None)]
    ranges = list(_day_ranges(first, horizon, interval_days))
    created += [ddl.create(_day_name(inbox_table, lo), (lo, hi)) for lo, hi in ranges]
    created.append(ddl.create(f"{inbox_table.name}_future", (ranges[-1][1], KEYS_BOUND)))
    created.append(ddl.create(f"{inbox_table.name}_keys", (KEYS_BOUND, None)))
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

    New day partitions are carved out of ``T_future`` in one transaction: ``DETACH``
    ``T_future``, create the day partitions for the range it gives up, move the rows of that
    range (ids from producers with fast clocks, business keys whose bytes fall there) from
    ``T_future`` through the parent into them, and ``ATTACH`` ``T_future`` again for the
    rest of its range. The detached table is re-attached rather than replaced so that only
    the rows of the new range move; re-attaching reads ``T_future`` (and the DEFAULT
    partition) once to validate the ranges. ``interval_days`` defaults to the width of the
    last day partition.

    Locks: ``ACCESS EXCLUSIVE`` on the parent table (taken first, ``LOCK TABLE ONLY``) and on
    ``T_future`` and ``T_before`` until the transaction commits. Meanwhile every claim on the
    table waits — for the catalog changes, moving the rows of the new range (usually none)
    and reading ``T_future`` and ``T_before``: milliseconds for tables of ordinary size. (If
    maintenance lapsed and ``T_future`` already holds days of ordinary traffic, the catch-up
    moves those rows under the lock.) While the lock is being acquired, new claims queue
    behind it, so that wait is bounded by ``lock_timeout`` seconds (in-flight handler
    transactions must finish first); when it runs out the transaction is rolled back and
    tried again later, up to five times, and then the lock error is raised. Nothing
    happens, and no lock is taken, when the partitions already exist.
    """
    inbox_table = _partitionable(engine, table)
    _check_whole(days_ahead, "days_ahead", 0)
    if interval_days is not None:
        _check_whole(interval_days, "interval_days", 1)
    horizon = _today(now) + dt.timedelta(days=days_ahead + 1)
    if horizon >= _LAST_DAY:
        raise ValueError(f"days_ahead reaches past {_LAST_DAY}")
    with engine.connect() as connection:
        if _future(_partitions(connection, inbox_table), inbox_table).lower >= id_floor(horizon):
            return []  # nothing to create: no lock taken

    def split(connection: Connection) -> list[str]:
        partitions = _partitions(connection, inbox_table)  # again, under the lock
        future = _future(partitions, inbox_table)
        width = interval_days or _last_interval(partitions, future)
        ranges = list(_day_ranges(_date_of(future.lower), horizon, width))
        if not ranges:
            return []
        new_lower = id_floor(ranges[-1][1])
        ddl = _Ddl(connection, inbox_table)
        ddl.detach(future.name)
        created = [ddl.create(_day_name(inbox_table, lo), (lo, hi)) for lo, hi in ranges]
        ddl.move_below(future.name, new_lower)
        ddl.attach(future.name, (new_lower, future.upper))
        return created

    return _locked(engine, inbox_table, lock_timeout, split)


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
    checks the claims. Each partition's rows are counted and its newest claim read first,
    without a lock. Then, in transactions holding ``ACCESS EXCLUSIVE`` on the parent (so no
    claim can land in a partition meanwhile), the newest claims are read again through the
    ``processed_at`` index and the expired partitions detached, one after another, until the
    transaction has held the lock for ``hold_seconds``; it commits (catalog changes only)
    and the next one takes the lock again for the rest. A detached range falls to the
    DEFAULT partition. Each detached table is then dropped in a transaction of its own,
    which locks nothing but that table: removing its files, the slow part, holds up no
    claim. (A run interrupted between the two leaves a detached table behind; the next run
    drops it: see :func:`drop_detached_leftovers`.) Claims wait while a detaching
    transaction holds the lock, and while it waits for it (at most ``lock_timeout`` seconds:
    a lock not granted in time ends the dropping, and the caller deletes the rest in
    batches).
    """
    inbox_table = _partitionable(engine, table)
    if isinstance(hold_seconds, bool) or not isinstance(hold_seconds, int | float):
        raise TypeError("hold_seconds must be a number of seconds")
    drop_detached_leftovers(engine, inbox_table)
    counted = _expired_partitions(engine, inbox_table, partitions, cutoff)
    candidates = dict(counted)

    dropped: list[tuple[str, int]] = []
    transactions = 0
    longest = 0.0

    def drop_some(connection: Connection) -> tuple[list[str], list[str]]:
        """Under the lock: (partitions examined, partitions dropped), oldest first, until
        the hold budget is spent. undefined_table if another cleanup dropped one."""
        locked = time.perf_counter()
        examined: list[str] = []
        done: list[str] = []
        ddl = _Ddl(connection, inbox_table)
        for name in candidates:
            newest = partition_table(inbox_table, name).c.processed_at
            claim = connection.execute(select(func.max(newest))).scalar()
            if claim is None or claim < cutoff:
                ddl.detach(name)
                done.append(name)
            examined.append(name)
            if time.perf_counter() - locked >= hold_seconds:
                break
        return examined, done

    while candidates:
        began = time.perf_counter()
        try:
            examined, done = _locked(engine, inbox_table, lock_timeout, drop_some, attempts=1)
        except DBAPIError as exc:
            if _sqlstate(exc) == _UNDEFINED_TABLE:
                with engine.connect() as connection:
                    present = _partition_names(connection, inbox_table)
                gone = [name for name in candidates if name not in present]
                if not gone:
                    raise
                for name in gone:
                    del candidates[name]  # another cleanup dropped it
                continue
            if _sqlstate(exc) in _RETRY_SQLSTATES:
                break  # the table is busy: the caller deletes in batches instead
            raise
        seconds = time.perf_counter() - began
        transactions += 1
        longest = max(longest, seconds)
        for name in examined:
            del candidates[name]
        for name in done:
            _drop_detached(engine, inbox_table, name)
            rows = counted[name]
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
    inbox_table = _partitionable(engine, table)
    day = re.compile(rf"{re.escape(inbox_table.name)}_p[0-9]{{8}}")
    parent = select(_pg_class.c.relnamespace).where(_pg_class.c.oid == _regclass(inbox_table))
    query = select(_pg_class.c.relname).where(
        _pg_class.c.relnamespace == parent.scalar_subquery(),
        _pg_class.c.relkind == "r",
        _pg_class.c.relispartition.is_(false()),
        _pg_class.c.relname.startswith(f"{inbox_table.name}_p", autoescape=True),
    )
    with engine.connect() as connection:
        names = [name for name in connection.execute(query).scalars() if day.fullmatch(name)]
    for name in names:
        _drop_detached(engine, inbox_table, name)
        logger.warning("cleanup: dropped %s, a day partition detached by an earlier run", name)
    return names


def _drop_detached(engine: Engine, table: Table, name: str) -> None:
    try:
        with engine.begin() as connection:
            _Ddl(connection, table).drop(name)
    except DBAPIError as exc:
        if _sqlstate(exc) != _UNDEFINED_TABLE:  # a concurrent cleanup's leftover sweep
            raise


def _expired_partitions(
    engine: Engine, table: Table, partitions: Sequence[str], cutoff: dt.datetime
) -> dict[str, int]:
    """Those of ``partitions`` whose claims all precede ``cutoff`` now, with their counts."""
    expired: dict[str, int] = {}
    # Autocommit: a partition another cleanup dropped meanwhile fails its own statement only.
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
        for name in partitions:
            target = partition_table(table, name)
            query = select(func.count(), func.max(target.c.processed_at))
            try:
                rows, newest = connection.execute(query).one()
            except DBAPIError as exc:
                if _sqlstate(exc) == _UNDEFINED_TABLE:
                    continue
                raise
            if newest is None or newest < cutoff:
                expired[name] = int(rows)
    return expired


def _locked(
    engine: Engine,
    table: Table,
    lock_timeout: float,
    work: Callable[[Connection], _R],
    *,
    attempts: int = _LOCK_ATTEMPTS,
) -> _R:
    """Run ``work`` in a transaction that first takes ACCESS EXCLUSIVE on the parent table
    (waiting at most ``lock_timeout`` seconds for any lock), retrying lock timeouts."""
    if isinstance(lock_timeout, bool) or not isinstance(lock_timeout, int | float):
        raise TypeError("lock_timeout must be a number of seconds")
    if not 0 < lock_timeout <= 3600:
        raise ValueError(f"lock_timeout must be > 0 and at most 3600 seconds, got {lock_timeout}")
    milliseconds = str(max(1, round(lock_timeout * 1000)))
    for attempt in range(1, attempts + 1):
        try:
            with engine.begin() as connection:
                connection.execute(select(func.set_config("lock_timeout", milliseconds, True)))
                connection.execute(_LockTable(table))
                return work(connection)
        except DBAPIError as exc:
            if attempt == attempts or _sqlstate(exc) not in _RETRY_SQLSTATES:
                raise
            time.sleep(0.05 * 2**attempt * random.uniform(0.5, 1.5))
    raise AssertionError("unreachable")  # pragma: no cover


_Bounds = tuple[bytes | dt.date, bytes | dt.date | None]


class _Ddl:
    """The partition DDL of one inbox table, on one connection."""

    def __init__(self, connection: Connection, table: Table) -> None:
        self._connection = connection
        self._table = table

    def create(self, name: str, bounds: _Bounds | None) -> str:
        """Create partition ``name`` for ``bounds`` (None: the DEFAULT partition)."""
        self._connection.execute(_CreatePartition(self._table, name, bounds))
        return name

    def detach(self, name: str) -> None:
        self._connection.execute(_DetachPartition(self._table, name))

    def attach(self, name: str, bounds: _Bounds) -> None:
        self._connection.execute(_AttachPartition(self._table, name, bounds))

    def drop(self, name: str) -> None:
        self._connection.execute(DropTable(partition_table(self._table, name)))

    def move_below(self, name: str, bound: bytes) -> None:
        """Move the rows of detached partition ``name`` below ``bound`` into the parent."""
        source = partition_table(self._table, name)
        below = source.c.message_id < bound
        rows = select(source.c.message_id, source.c.handler, source.c.processed_at).where(below)
        target = [self._table.c.message_id, self._table.c.handler, self._table.c.processed_at]
        self._connection.execute(insert(self._table).from_select(target, rows))
        self._connection.execute(delete(source).where(below))


# Partition DDL has no SQLAlchemy construct: here are four small ones. The dialect's preparer
# quotes the names, and SQLAlchemy renders the bounds (bytes computed here) as literals,
# because PostgreSQL takes no bound parameters in DDL.


class _LockTable(ExecutableDDLElement):
    def __init__(self, table: Table) -> None:
        self.table = table


class _PartitionDdl(ExecutableDDLElement):
    def __init__(self, parent: Table, partition: str, bounds: _Bounds | None = None) -> None:
        self.parent = parent
        self.partition = partition_table(parent, partition)
        self.bounds = bounds


class _CreatePartition(_PartitionDdl):
    pass


class _AttachPartition(_PartitionDdl):
    pass


class _DetachPartition(_PartitionDdl):
    pass


@compiles(_LockTable, "postgresql")
def _compile_lock(element: _LockTable, compiler: DDLCompiler, **kw: Any) -> str:
    return (
        f"LOCK TABLE ONLY {compiler.preparer.format_table(element.table)} IN ACCESS EXCLUSIVE MODE"
    )


@compiles(_CreatePartition, "postgresql")
def _compile_create(element: _CreatePartition, compiler: DDLCompiler, **kw: Any) -> str:
    partition, parent = _names(element, compiler)
    return f"CREATE TABLE {partition} PARTITION OF {parent} {_for_values(element, compiler)}"


@compiles(_AttachPartition, "postgresql")
def _compile_attach(element: _AttachPartition, compiler: DDLCompiler, **kw: Any) -> str:
    partition, parent = _names(element, compiler)
    return f"ALTER TABLE {parent} ATTACH PARTITION {partition} {_for_values(element, compiler)}"


@compiles(_DetachPartition, "postgresql")
def _compile_detach(element: _DetachPartition, compiler: DDLCompiler, **kw: Any) -> str:
    partition, parent = _names(element, compiler)
    return f"ALTER TABLE {parent} DETACH PARTITION {partition}"


def _names(element: _PartitionDdl, compiler: DDLCompiler) -> tuple[str, str]:
    preparer = compiler.preparer
    return preparer.format_table(element.partition), preparer.format_table(element.parent)


def _for_values(element: _PartitionDdl, compiler: DDLCompiler) -> str:
    if element.bounds is None:
        return "DEFAULT"
    lower, upper = element.bounds

    def literal(bound: bytes | dt.date) -> str:
        value = bound if isinstance(bound, bytes) else id_floor(bound)
        return str(
            compiler.sql_compiler.process(func.decode(value.hex(), "hex"), literal_binds=True)
        )

    high = "MAXVALUE" if upper is None else literal(upper)
    return f"FOR VALUES FROM ({literal(lower)}) TO ({high})"


@contextmanager
def _connection(bind: Engine | Connection) -> Iterator[Connection]:
    if isinstance(bind, Connection):
        yield bind
    else:
        with bind.connect() as connection:
            yield connection


def _regclass(table: Table) -> Any:
    """``to_regclass`` of the table's name, quoted by the server: its oid, or NULL."""
    name = func.quote_ident(table.name)
    if table.schema:
        name = func.concat(func.quote_ident(table.schema), ".", name)
    return func.to_regclass(name)


def _partition_names(connection: Connection, table: Table) -> set[str]:
    child = _pg_class.c
    query = (
        select(child.relname)
        .select_from(_pg_inherits.join(_pg_class, child.oid == _pg_inherits.c.inhrelid))
        .where(_pg_inherits.c.inhparent == _regclass(table))
    )
    return set(connection.execute(query).scalars())


def _partitions(connection: Connection, table: Table) -> list[Partition]:
    # pg_get_expr prints bytea bounds in the session's bytea_output: ask for hex (hex is the
    # default; the setting lasts until the end of the caller's transaction).
    connection.execute(select(func.set_config("bytea_output", "hex", True)))
    child = _pg_class.c
    rows = connection.execute(
        select(child.relname, func.pg_get_expr(child.relpartbound, child.oid, True))
        .select_from(_pg_inherits.join(_pg_class, child.oid == _pg_inherits.c.inhrelid))
        .where(_pg_inherits.c.inhparent == _regclass(table))
    ).all()
    partitions: list[Partition] = []
    for name, bound in rows:
        if bound is None:
            continue  # dropped since this statement's snapshot (pg_get_expr then gives NULL)
        if bound == "DEFAULT":
            partitions.append(Partition(name, None, None, is_default=True))
            continue
        match = _BOUND.fullmatch(bound)
        if match is None:
            raise PartitionLayoutError(
                f"partition {name} of {table.fullname} has a bound this module cannot read: {bound}"
            )
        lower, upper = match["lower"], match["upper"]
        partitions.append(
            Partition(
                name,
                None if lower is None else bytes.fromhex(lower),
                None if upper is None else bytes.fromhex(upper),
            )
        )
    partitions.sort(key=lambda p: (not p.is_default, p.lower or b""))
    return partitions


@dataclass(frozen=True, slots=True)
class _Future:
    name: str
    lower: bytes
    upper: bytes


def _future(partitions: list[Partition], table: Table) -> _Future:
    name = f"{table.name}_future"
    for partition in partitions:
        if partition.name == name and partition.lower is not None:
            if partition.upper is None:
                break
            return _Future(name, partition.lower, partition.upper)
    raise PartitionLayoutError(
        f"{table.fullname} has no partition {name} with a bounded range: is it partitioned "
        "by inbox.partitioning.create_partitioned_table?"
    )


def _last_interval(partitions: list[Partition], future: _Future) -> int:
    days = [
        p for p in partitions if p.is_bounded and p.name != future.name and p.upper == future.lower
    ]
    if not days or days[0].lower is None:
        return 1
    width = _date_of(future.lower) - _date_of(days[0].lower)
    return max(1, width.days)


def _date_of(bound: bytes) -> dt.date:
    milliseconds = int.from_bytes(bound[:6], "big")
    return (_EPOCH + milliseconds * _MILLISECOND).date()


def _day_ranges(
    first: dt.date, horizon: dt.date, interval_days: int
) -> Iterator[tuple[dt.date, dt.date]]:
    step = dt.timedelta(days=interval_days)
    lower = first
    while lower < horizon:
        yield lower, lower + step
        lower += step


def _day_name(table: Table, day: dt.date) -> str:
    return f"{table.name}_p{day:%Y%m%d}"


def _today(now: dt.datetime | None) -> dt.date:
    moment = dt.datetime.now(dt.UTC) if now is None else now
    if moment.tzinfo is None:
        raise ValueError("now must be timezone-aware")
    return moment.astimezone(dt.UTC).date()


def _check_whole(value: object, label: str, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{label} must be a whole number, got {type(value).__name__}")
    if value < low:
        raise ValueError(f"{label} must be at least {low}, got {value}")


def _partitionable(bind: Engine | Connection, table: str | Table) -> Table:
    inbox_table = resolve_table(table)
    if bind.dialect.name != "postgresql":
        raise UnsupportedDialect(f"inbox partitioning needs PostgreSQL, not {bind.dialect.name!r}")
    if len(inbox_table.name) > MAX_TABLE_NAME_LENGTH:
        raise ValueError(
            f"a partitioned inbox table's name must be at most {MAX_TABLE_NAME_LENGTH} "
            f"characters (its partitions add {_DAY_SUFFIX_LENGTH}), got {inbox_table.name!r}"
        )
    return inbox_table


def _sqlstate(exc: DBAPIError) -> str | None:
    state = getattr(exc.orig, "sqlstate", None)
    return state if isinstance(state, str) else None
