"""Catalog reads of a partitioned inbox table (PostgreSQL): is it partitioned, which
partitions does it have, with which id ranges."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Final

from sqlalchemy import Connection, Engine, Table, column, false, func, select, table
from sqlalchemy.exc import DBAPIError

from inbox.partitioning._layout import Partition, PartitionLayoutError, partitionable
from inbox.schema import DEFAULT_TABLE_NAME, resolve_table

__all__ = [
    "UNDEFINED_TABLE",
    "detached_day_tables",
    "is_partitioned",
    "list_partitions",
    "partition_names",
    "read_partitions",
    "sqlstate",
]

UNDEFINED_TABLE: Final = "42P01"
"""SQLSTATE of a table that does not exist (another cleanup dropped it)."""

# PostgreSQL's text for a range bound of a bytea key under bytea_output = 'hex'.
_BOUND = re.compile(
    r"FOR VALUES FROM \((?:MINVALUE|'\\x(?P<lower>[0-9a-f]*)')\) "
    r"TO \((?:MAXVALUE|'\\x(?P<upper>[0-9a-f]*)')\)"
)

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
        return read_partitions(connection, inbox_table)


def partition_names(connection: Connection, table: Table) -> set[str]:
    """The names of the partitions ``table`` has now."""
    child = _pg_class.c
    query = (
        select(child.relname)
        .select_from(_pg_inherits.join(_pg_class, child.oid == _pg_inherits.c.inhrelid))
        .where(_pg_inherits.c.inhparent == _regclass(table))
    )
    return set(connection.execute(query).scalars())


def read_partitions(connection: Connection, table: Table) -> list[Partition]:
    """The partitions of ``table`` with their ranges, read on ``connection``."""
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


def detached_day_tables(connection: Connection, table: str | Table) -> list[str]:
    """Plain tables in ``table``'s schema named like its day partitions (``T_pYYYYMMDD``)
    that are not partitions: day partitions a cleanup detached and has not dropped (yet)."""
    inbox_table = partitionable(connection, table)
    day = re.compile(rf"{re.escape(inbox_table.name)}_p[0-9]{{8}}")
    parent = select(_pg_class.c.relnamespace).where(_pg_class.c.oid == _regclass(inbox_table))
    query = select(_pg_class.c.relname).where(
        _pg_class.c.relnamespace == parent.scalar_subquery(),
        _pg_class.c.relkind == "r",
        _pg_class.c.relispartition.is_(false()),
        _pg_class.c.relname.startswith(f"{inbox_table.name}_p", autoescape=True),
    )
    return [name for name in connection.execute(query).scalars() if day.fullmatch(name)]


def sqlstate(exc: DBAPIError) -> str | None:
    """The SQLSTATE of a database error, when the driver reports one."""
    state = getattr(exc.orig, "sqlstate", None)
    return state if isinstance(state, str) else None


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
