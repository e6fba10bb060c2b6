"""The partition DDL of an inbox table as SQLAlchemy constructs, and :class:`Ddl`, which
runs them on one connection.

Partition DDL has no SQLAlchemy construct: here are four small ones. The dialect's preparer
quotes the names, and SQLAlchemy renders the bounds (bytes computed here) as literals,
because PostgreSQL takes no bound parameters in DDL.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from sqlalchemy import Connection, Table, delete, func, insert, select
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.schema import DropTable, ExecutableDDLElement
from sqlalchemy.sql.compiler import DDLCompiler

from inbox.partitioning._ids import id_floor
from inbox.partitioning._layout import partition_table

__all__ = ["Bounds", "Ddl", "LockTable"]

Bounds = tuple[bytes | dt.date, bytes | dt.date | None]
"""``(lower, upper)`` of a range partition: an id, or a day (its first id); None: MAXVALUE."""


class Ddl:
    """The partition DDL of one inbox table, on one connection."""

    def __init__(self, connection: Connection, table: Table) -> None:
        self._connection = connection
        self._table = table

    def create(self, name: str, bounds: Bounds | None) -> str:
        """Create partition ``name`` for ``bounds`` (None: the DEFAULT partition)."""
        self._connection.execute(_CreatePartition(self._table, name, bounds))
        return name

    def detach(self, name: str) -> None:
        """Detach partition ``name`` (it becomes a plain table)."""
        self._connection.execute(_DetachPartition(self._table, name))

    def attach(self, name: str, bounds: Bounds) -> None:
        """Attach the plain table ``name`` as the partition for ``bounds``."""
        self._connection.execute(_AttachPartition(self._table, name, bounds))

    def drop(self, name: str) -> None:
        """Drop the (detached) table ``name``."""
        self._connection.execute(DropTable(partition_table(self._table, name)))

    def move_below(self, name: str, bound: bytes) -> None:
        """Move the rows of detached partition ``name`` below ``bound`` into the parent."""
        source = partition_table(self._table, name)
        below = source.c.message_id < bound
        rows = select(source.c.message_id, source.c.handler, source.c.processed_at).where(below)
        target = [self._table.c.message_id, self._table.c.handler, self._table.c.processed_at]
        self._connection.execute(insert(self._table).from_select(target, rows))
        self._connection.execute(delete(source).where(below))


class LockTable(ExecutableDDLElement):
    """``LOCK TABLE ONLY t IN ACCESS EXCLUSIVE MODE``."""

    def __init__(self, table: Table) -> None:
        self.table = table


class _PartitionDdl(ExecutableDDLElement):
    def __init__(self, parent: Table, partition: str, bounds: Bounds | None = None) -> None:
        self.parent = parent
        self.partition = partition_table(parent, partition)
        self.bounds = bounds


class _CreatePartition(_PartitionDdl):
    pass


class _AttachPartition(_PartitionDdl):
    pass


class _DetachPartition(_PartitionDdl):
    pass


@compiles(LockTable, "postgresql")
def _compile_lock(element: LockTable, compiler: DDLCompiler, **kw: Any) -> str:
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
