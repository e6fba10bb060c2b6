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

from sqlalchemy import Connection, MetaData, Table, delete, insert, select

from inbox._backends import family_of
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
        family = family_of(connection)
        self._serial = {
            table.key: family.counted_columns(connection, table)
            for table in self.metadata.sorted_tables
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
        family = family_of(connection)
        for table in self.metadata.sorted_tables:
            columns = self._serial[table.key]
            if columns:
                family.reset_counters(connection, table, columns)


def _hashable(value: object) -> Hashable:
    if isinstance(value, dict | list):
        return json.dumps(value, sort_keys=True, default=str)
    return value if isinstance(value, Hashable) else repr(value)
