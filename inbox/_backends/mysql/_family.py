"""What the inbox knows of MySQL and MariaDB: their error numbers, their column types, their
claim, their row locks and limits, their catalogs."""

from __future__ import annotations

import datetime as dt
from typing import Any, Final

from sqlalchemy import DDL, Connection, Delete, Table, TextClause, delete, insert, text
from sqlalchemy.dialects import mysql
from sqlalchemy.exc import IntegrityError
from sqlalchemy.types import TypeEngine

from inbox._backends._family import ClaimStatements, ColumnKind, Family
from inbox._backends.mysql._backend import duplicate_primary_key

__all__ = ["MySQLFamily"]

# Record changed since last read (MariaDB snapshot isolation), lock wait timeout, deadlock.
_TRANSIENT: Final = frozenset({1020, 1205, 1213})
# Can't connect (2002, 2003), server gone or lost (2006, 2013), too many connections (1040),
# shutting down (1053).
_UNREACHABLE: Final = frozenset({1040, 1053, 2002, 2003, 2006, 2013})
# Data too long for column, packet over max_allowed_packet, a result larger than
# max_allowed_packet.
_REFUSALS: Final = frozenset({1406, 1153, 1301})
_NO_SUCH_TABLE: Final = 1146
_MAX_PACKET_INFO: Final = "inbox_max_allowed_packet"
_SIZE = text(
    "SELECT coalesce(sum(data_length + index_length), 0) FROM information_schema.tables "
    "WHERE table_schema = coalesce(:schema, database()) AND table_name = :name"
)
_FIND_SCHEMAS = text(
    "SELECT DISTINCT table_schema FROM information_schema.tables "
    "WHERE table_name = :name AND table_type = 'BASE TABLE' ORDER BY table_schema"
)
_READ_COMMITTED = text("SET TRANSACTION ISOLATION LEVEL READ COMMITTED")


def _code(orig: BaseException | None) -> object:
    return (getattr(orig, "args", None) or (None,))[0]


class MySQLFamily(Family):
    """MySQL and MariaDB through PyMySQL or asyncmy."""

    names = ("mysql", "mariadb")
    # (aiomysql is not among them: 0.3.2 with PyMySQL >= 1.2.3 breaks bytes parameters,
    # aio-libs/aiomysql#1080 — with PyMySQL 1.2.4 every claim key raises TypeError — so MySQL
    # and MariaDB go through asyncmy.)
    drivers = frozenset({"pymysql", "asyncmy"})

    def backend(self, driver: str) -> object | None:
        """A deadlock that rolled the transaction back remembered as it happens; on PyMySQL,
        the transaction also watched from the claim to the check (no claim-row read)."""
        if driver == "pymysql":
            from inbox._backends.mysql._pymysql import PyMySQLBackend

            return PyMySQLBackend()
        from inbox._backends.mysql._backend import MySQLBackend

        return MySQLBackend()

    def claim_statements(self, table: Table) -> ClaimStatements:
        """A plain INSERT, one by one in a batch.

        Not INSERT IGNORE: it also downgrades truncation, NOT NULL and foreign-key errors to
        warnings, so a bad row could be "ignored" and read as a duplicate. Not ON DUPLICATE
        KEY UPDATE either: with CLIENT_FOUND_ROWS (which SQLAlchemy's MySQL drivers set) a
        no-op update reports one row, exactly like an insert. A plain INSERT reports the
        duplicate as error 1062; InnoDB rolls back only that statement, and the key is
        confirmed to be the claim's (:meth:`is_duplicate_key`). A multi-row insert cannot
        say which of its rows were inserted, so a batch claims each key on its own, all in
        the same transaction: still one commit for the batch.
        """
        return ClaimStatements(insert(table), False, None)

    def is_duplicate_key(self, exc: IntegrityError) -> bool:
        """Error 1062 on the PRIMARY key."""
        return duplicate_primary_key(getattr(exc.orig, "args", ()))

    # PyMySQL's and asyncmy's (a handler's SET autocommit=1 shows there).
    autocommit_getter = "get_autocommit"

    def is_transient(self, orig: BaseException | None) -> bool:
        """Deadlock, lock wait timeout, record changed since last read."""
        code = _code(orig)
        return isinstance(code, int) and code in _TRANSIENT

    def unreachable(self, orig: BaseException | None) -> bool | None:
        """The client and server errors of a server not there, gone or full."""
        code = _code(orig)
        if isinstance(code, int) and not isinstance(code, bool):
            return code in _UNREACHABLE
        return None

    def refuses_value(self, orig: BaseException | None) -> bool:
        """Data too long, packet too large."""
        code = _code(orig)
        return isinstance(code, int) and code in _REFUSALS

    def is_missing_table(self, orig: BaseException | None) -> bool:
        """Table doesn't exist."""
        return _code(orig) == _NO_SUCH_TABLE

    def column_type(self, kind: ColumnKind, length: int | None = None) -> TypeEngine[Any] | None:
        """BINARY(16); DATETIME(6) (microseconds survive); utf8mb4 text with a binary
        collation (the server's default collation is usually case- and accent-insensitive:
        "billing.Charge" and "billing.charge" would share one claim); LONGTEXT and LONGBLOB
        (TEXT and BLOB stop at 64 KiB)."""
        found: TypeEngine[Any] | None = None
        if kind == "key":
            found = mysql.BINARY(16)
        elif kind == "instant":
            found = mysql.DATETIME(fsp=6)
        elif kind == "text":
            found = mysql.VARCHAR(length, charset="utf8mb4", collation="utf8mb4_bin")
        elif kind == "long_text":
            found = mysql.LONGTEXT(charset="utf8mb4")
        elif kind == "blob":
            found = mysql.LONGBLOB()
        return found

    limits_statements = True

    def statement_limit(self, connection: Connection) -> int | None:
        """The connection's ``max_allowed_packet``, read once per connection (the read
        begins a transaction: it is ended before the caller's write)."""
        limit = connection.info.get(_MAX_PACKET_INFO)
        if not isinstance(limit, int):
            read = connection.exec_driver_sql("SELECT @@max_allowed_packet").scalar()
            limit = connection.info[_MAX_PACKET_INFO] = int(read or 0)
            connection.rollback()
        return limit or None

    skips_locked_rows = True
    # For the relay's transaction only: at REPEATABLE READ, InnoDB would lock the gap after
    # the last row and hold every writer's INSERT until the batch was published. (A
    # session-wide level would have to be reset when the connection goes back to the pool,
    # a statement no error handling covers.)
    relay_isolation: TextClause | None = _READ_COMMITTED
    # On a small table InnoDB deletes an IN list by a full scan, which waits for the rows
    # other relays hold and deadlocks with them.
    deletes_rows_one_by_one = True

    def batch_delete(self, table: Table, cutoff: dt.datetime, limit: int) -> Delete:
        """``DELETE ... WHERE processed_at < cutoff LIMIT n`` (through the index)."""
        expired = table.c.processed_at < cutoff
        return delete(table).where(expired).with_dialect_options(mysql_limit=limit)

    schemas_query = _FIND_SCHEMAS

    def table_bytes(self, connection: Connection, table: Table) -> int | None:
        """Data and index length from information_schema."""
        found = connection.execute(_SIZE, {"schema": table.schema, "name": table.name})
        return int(found.scalar_one())

    def counted_columns(self, connection: Connection, table: Table) -> list[str]:
        """The AUTO_INCREMENT columns."""
        return [column.name for column in table.columns if column.autoincrement is True]

    def reset_counters(self, connection: Connection, table: Table, columns: list[str]) -> None:
        """InnoDB moves a counter set below the highest value up to just above it.
        (ALTER TABLE commits: the rows written before it are meant to stay.)"""
        reset = DDL("ALTER TABLE %(fullname)s AUTO_INCREMENT = 1")  # type: ignore[no-untyped-call]
        connection.execute(reset.against(table))

    # MySQL's and MariaDB's CREATE SCHEMA is CREATE DATABASE.
    server = True
