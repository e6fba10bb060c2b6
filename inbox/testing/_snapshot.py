"""The contents of a test database, captured and put back: what lets ``assert_idempotent``
start every delivery from the same state and compare where each one ends.

A test database is small, so every table is read whole. Putting a snapshot back also resets
the counters behind auto-incremented columns, so every run numbers its new rows alike.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass

from sqlalchemy import DDL, Connection, MetaData, Table, delete, func, insert, select, text

from inbox.errors import ConfigurationError

__all__ = ["Database", "Rows", "Snapshot"]

Rows = Counter[tuple[Hashable, ...]]
"""A table's rows as a multiset of value tuples (order does not matter in a table)."""


@dataclass(frozen=True)
class Snapshot:
    """Every row of every table of one database, as read."""

    rows: Mapping[str, list[dict[str, object]]]


class Database:
    """The tables of one database (its default schema and ``schemas``), reflected once on
    ``connection``; a table is known by its key, ``name`` or ``schema.name``. Every method
    that reads or writes takes the connection to do it on (one of a blocking engine, or the
    blocking side of an async one)."""

    def __init__(self, connection: Connection, schemas: Iterable[str | None] = (None,)) -> None:
        self.metadata = MetaData()
        for schema in dict.fromkeys(schemas):
            self.metadata.reflect(connection, schema=schema)
        self._serial = {
            table.key: _counted_columns(connection, table) for table in self.metadata.sorted_tables
        }

    def table(self, name: str) -> Table:
        """The reflected table ``name``; ValueError naming the tables there are."""
        table = self.metadata.tables.get(name)
        if table is None:
            known = ", ".join(sorted(self.metadata.tables)) or "none"
            raise ConfigurationError(f"no table {name!r} in the test database (tables: {known})")
        return table

    def rows(self, snapshot: Snapshot, name: str, ignored: Iterable[str]) -> tuple[list[str], Rows]:
        """The compared columns of table ``name`` and its rows in ``snapshot`` over them."""
        skip = set(ignored)
        table = self.table(name)
        columns = [c.name for c in table.columns if c.name not in skip]
        return columns, Counter(
            tuple(_hashable(row[c]) for c in columns) for row in snapshot.rows[table.key]
        )

    def capture(self, connection: Connection) -> Snapshot:
        """Read every table."""
        return Snapshot(
            {
                table.key: [dict(row._mapping) for row in connection.execute(select(table))]
                for table in self.metadata.sorted_tables
            }
        )

    def restore(self, connection: Connection, snapshot: Snapshot) -> None:
        """Make every table hold exactly the rows of ``snapshot`` again."""
        tables = self.metadata.sorted_tables
        for table in reversed(tables):
            connection.execute(delete(table))
        for table in tables:
            if snapshot.rows[table.key]:
                connection.execute(insert(table), snapshot.rows[table.key])
        self.reset_counters(connection)

    def reset_counters(self, connection: Connection) -> None:
        """Set every auto-increment counter just above its column's highest value: the
        numbers a rolled-back attempt used up are handed out again, so a redelivery numbers
        its rows as a first delivery would."""
        dialect = connection.dialect.name
        for table in self.metadata.sorted_tables:
            columns = self._serial[table.key]
            if not columns:
                continue
            if dialect == "postgresql":
                for column in columns:
                    sequence = connection.scalar(
                        select(func.pg_get_serial_sequence(_qualified(connection, table), column))
                    )
                    highest = connection.scalar(select(func.max(table.c[column])))
                    connection.execute(select(func.setval(sequence, (highest or 0) + 1, False)))
            elif dialect in ("mysql", "mariadb"):
                # InnoDB moves a counter set below the highest value up to just above it.
                # (ALTER TABLE commits: the rows written before it are meant to stay.)
                reset = DDL("ALTER TABLE %(fullname)s AUTO_INCREMENT = 1")  # type: ignore[no-untyped-call]
                connection.execute(reset.against(table))
            else:  # SQLite AUTOINCREMENT: without its row, the next id is max(rowid) + 1
                connection.execute(
                    text("DELETE FROM sqlite_sequence WHERE name = :name"), {"name": table.name}
                )


def _counted_columns(connection: Connection, table: Table) -> list[str]:
    """The columns a counter fills that a rolled-back insert does not give back."""
    dialect = connection.dialect.name
    if dialect == "postgresql":
        qualified = _qualified(connection, table)
        return [
            column.name
            for column in table.columns
            if connection.scalar(select(func.pg_get_serial_sequence(qualified, column.name)))
        ]
    if dialect in ("mysql", "mariadb"):
        return [column.name for column in table.columns if column.autoincrement is True]
    autoincrement = connection.scalar(  # SQLite keeps AUTOINCREMENT counters in one table
        text("SELECT count(*) FROM sqlite_master WHERE name = 'sqlite_sequence'")
    )
    return ["rowid"] if autoincrement else []


def _qualified(connection: Connection, table: Table) -> str:
    return connection.dialect.identifier_preparer.format_table(table)


def _hashable(value: object) -> Hashable:
    if isinstance(value, dict | list):
        return json.dumps(value, sort_keys=True, default=str)
    return value if isinstance(value, Hashable) else repr(value)
