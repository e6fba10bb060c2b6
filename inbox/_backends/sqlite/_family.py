"""What the inbox knows of SQLite: its result codes, its insert-or-ignore, its ``rowid``, its
counters, and its one writer at a time."""

from __future__ import annotations

import datetime as dt
import sqlite3
from typing import Any, Final

from sqlalchemy import (
    Connection,
    Delete,
    Insert,
    LargeBinary,
    Table,
    delete,
    literal_column,
    select,
    text,
    type_coerce,
)
from sqlalchemy.dialects import sqlite
from sqlalchemy.sql import ColumnElement

from inbox._backends._family import ClaimStatements, Family

__all__ = ["SQLiteFamily"]

# SQLITE_BUSY, SQLITE_LOCKED.
_TRANSIENT: Final = frozenset({5, 6})
_TOOBIG: Final = 18
# SQLite learned INSERT ... RETURNING in 3.35.
_RETURNING: Final = (3, 35)


class SQLiteFamily(Family):
    """SQLite through sqlite3 or aiosqlite."""

    names = ("sqlite",)
    drivers = frozenset({"pysqlite", "aiosqlite"})

    def backend(self, driver: str) -> object | None:
        """A statement an exit exception cut short is closed at once."""
        from inbox._backends.sqlite._backend import SQLiteBackend

        return SQLiteBackend()

    def claim_statements(self, table: Table) -> ClaimStatements:
        """``INSERT ... ON CONFLICT DO NOTHING``; a batch as one multi-row insert returning
        the keys inserted, as raw bytes (3.35+: SQLAlchemy's "insertmanyvalues" sends the
        parameter sets as a single statement, in pages of 1,000 rows)."""
        key = [table.c.message_id, table.c.handler]
        one = (
            sqlite.insert(table)
            .on_conflict_do_nothing(index_elements=key)
            .execution_options(preserve_rowcount=True)
        )
        many = None
        if sqlite3.sqlite_version_info >= _RETURNING:
            many = (
                sqlite.insert(table)
                .on_conflict_do_nothing(index_elements=key)
                .returning(type_coerce(table.c.message_id, LargeBinary))
            )
        return ClaimStatements(one, True, many)

    # isolation_level None is also SQLAlchemy's recipe for real SAVEPOINTs, with a "begin"
    # listener that emits BEGIN itself: then a transaction is open by now.
    autocommits_without_isolation_level = True

    def is_transient(self, orig: BaseException | None) -> bool:
        """SQLITE_BUSY and SQLITE_LOCKED (extended codes included)."""
        code = getattr(orig, "sqlite_errorcode", None)
        return isinstance(code, int) and code & 0xFF in _TRANSIENT

    def unreachable(self, orig: BaseException | None) -> bool | None:
        """Never: a file that cannot be opened stays so."""
        return False if hasattr(orig, "sqlite_errorcode") else None

    def refuses_value(self, orig: BaseException | None) -> bool:
        """SQLITE_TOOBIG."""
        return getattr(orig, "sqlite_errorcode", None) == _TOOBIG

    def is_missing_table(self, orig: BaseException | None) -> bool:
        """sqlite3 says it in the message only."""
        return str(orig).startswith("no such table")

    def insert_or_ignore(self, table: Table, key: str) -> Insert | None:
        """``INSERT ... ON CONFLICT (key) DO NOTHING``."""
        statement = sqlite.insert(table).on_conflict_do_nothing(index_elements=[table.c[key]])
        return statement.execution_options(preserve_rowcount=True)

    def batch_delete(self, table: Table, cutoff: dt.datetime, limit: int) -> Delete:
        """By ``rowid``, the expired rows found through the ``processed_at`` index."""
        rowid: ColumnElement[Any] = literal_column("rowid")
        batch = select(rowid).select_from(table).where(table.c.processed_at < cutoff).limit(limit)
        return delete(table).where(rowid.in_(batch.scalar_subquery()))

    one_writer_at_a_time = True

    def counted_columns(self, connection: Connection, table: Table) -> list[str]:
        """``rowid`` when AUTOINCREMENT counters exist (kept in one table)."""
        autoincrement = connection.scalar(
            text("SELECT count(*) FROM sqlite_master WHERE name = 'sqlite_sequence'")
        )
        return ["rowid"] if autoincrement else []

    def reset_counters(self, connection: Connection, table: Table, columns: list[str]) -> None:
        """AUTOINCREMENT: without its row, the next id is max(rowid) + 1."""
        connection.execute(
            text("DELETE FROM sqlite_sequence WHERE name = :name"), {"name": table.name}
        )
