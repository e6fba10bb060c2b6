"""What the inbox knows of PostgreSQL: its SQLSTATEs, its row locks, its catalogs, its
counters, and which backend serves each driver."""

from __future__ import annotations

from typing import Final

from sqlalchemy import Connection, Insert, Table, func, select, text
from sqlalchemy.dialects import postgresql
from sqlalchemy.engine import URL

from inbox._backends._family import ClaimStatements, Family
from inbox._backends.postgresql._claims import claim_statements

__all__ = ["PostgreSQLFamily"]

# serialization_failure, deadlock_detected, lock_not_available.
_TRANSIENT: Final = frozenset({"40001", "40P01", "55P03"})
# Connection exceptions (08…); the server shutting down, crashed or starting (57P…).
_UNREACHABLE: Final = ("08", "57P")
_NOT_READY: Final = (
    "the database system is starting up",
    "the database system is shutting down",
    "the database system is in recovery mode",
    # A standby (a Patroni replica, a rejoining old primary) before it is consistent: with a
    # multi-host URL a worker started mid-failover meets it beside the hosts that refuse.
    "the database system is not yet accepting connections",
    "the database system is not accepting connections",
    "too many clients",
)
# SQLSTATE classes: data exception (22: a value too long for its type...), program limit
# exceeded (54: a value over PostgreSQL's field size).
_REFUSING_CLASSES: Final = frozenset({"22", "54"})
_UNDEFINED_TABLE: Final = "42P01"
_SIZE = text(
    # Bound as a parameter: the name is a checked identifier, never spliced into SQL.
    "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0) FROM pg_class c "
    "WHERE c.oid = to_regclass(:name) OR c.oid IN "
    "(SELECT inhrelid FROM pg_inherits WHERE inhparent = to_regclass(:name))"
)
# The schema the search path finds an unqualified name in: to_regclass resolves it as the
# statements on this connection do.
_SEARCHED = text(
    "SELECT n.nspname FROM pg_catalog.pg_class c "
    "JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace "
    "WHERE c.oid = to_regclass(:name)"
)
_DEFAULT_SCHEMA: Final = "public"
# A partitioned PostgreSQL table is listed as 'PARTITIONED TABLE' (its partitions as tables
# under other names), so it is looked up by name in pg_class.
_FIND_SCHEMAS = text(
    "SELECT DISTINCT n.nspname FROM pg_catalog.pg_class c "
    "JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace "
    "WHERE c.relname = :name AND c.relkind IN ('r', 'p') AND NOT c.relispartition "
    "ORDER BY n.nspname"
)


class PostgreSQLFamily(Family):
    """PostgreSQL through psycopg 3, psycopg2, pg8000 or asyncpg."""

    names = ("postgresql",)
    # "psycopg" is psycopg 3 both blocking and async (create_async_engine); asyncpg async
    # only (inbox.aio.AsyncInbox).
    drivers = frozenset({"psycopg", "psycopg2", "pg8000", "asyncpg"})

    def backend(self, driver: str) -> object | None:
        """psycopg 3 and psycopg2 read the transaction's state from libpq, asyncpg from its
        connection's transaction flag and the marker it kept; pg8000 keeps the base class's
        answer ("unknown": read the claim row), because it does not tell publicly whether
        the open transaction is aborted."""
        if driver == "psycopg":
            from inbox._backends.postgresql._psycopg import PsycopgBackend

            return PsycopgBackend()
        if driver == "psycopg2":
            from inbox._backends.postgresql._psycopg2 import Psycopg2Backend

            return Psycopg2Backend()
        if driver == "asyncpg":
            from inbox._backends.postgresql._asyncpg import AsyncpgBackend

            return AsyncpgBackend()
        return None

    def claim_statements(self, table: Table) -> ClaimStatements:
        """The marked claim and the array batch claim (``_claims``)."""
        return claim_statements(table)

    def is_transient(self, orig: BaseException | None) -> bool:
        """Serialization failure, deadlock, lock not available."""
        return getattr(orig, "sqlstate", None) in _TRANSIENT

    def unreachable(self, orig: BaseException | None) -> bool | None:
        """Connection exceptions and a server shutting down or starting; psycopg gives no
        SQLSTATE for a failed connection: a server that answered says FATAL (a refused
        login, a missing database: final, unless it is starting or stopping). Asked last,
        it answers for any error the other families left alone."""
        sqlstate = getattr(orig, "sqlstate", None)
        if sqlstate is not None:
            return str(sqlstate).startswith(_UNREACHABLE)
        message = str(orig)
        return "FATAL:" not in message or any(m in message for m in _NOT_READY)

    judges_any_connection = True

    def refuses_value(self, orig: BaseException | None) -> bool:
        """Data exceptions (22) and program limits (54)."""
        sqlstate = getattr(orig, "sqlstate", None)
        return isinstance(sqlstate, str) and sqlstate[:2] in _REFUSING_CLASSES

    def is_missing_table(self, orig: BaseException | None) -> bool:
        """undefined_table."""
        return getattr(orig, "sqlstate", None) == _UNDEFINED_TABLE

    keeps_time_zones = True

    def insert_or_ignore(self, table: Table, key: str) -> Insert | None:
        """``INSERT ... ON CONFLICT (key) DO NOTHING``."""
        statement = postgresql.insert(table).on_conflict_do_nothing(index_elements=[table.c[key]])
        return statement.execution_options(preserve_rowcount=True)

    # The drivers switch to autocommit without a message to the server.
    commits_single_writes_itself = True

    skips_locked_rows = True
    notifies = True
    walks_by_key_range = True
    schemas_query = _FIND_SCHEMAS
    has_search_path = True

    def searched_schema(self, connection: Connection, table: Table) -> str | None:
        """The schema of the table the unqualified name resolves to (``to_regclass``), None
        for ``public``."""
        name = connection.dialect.identifier_preparer.quote(table.name)
        schema = connection.execute(_SEARCHED, {"name": name}).scalar()
        return None if schema is None or schema == _DEFAULT_SCHEMA else str(schema)

    def table_bytes(self, connection: Connection, table: Table) -> int | None:
        """``pg_total_relation_size`` of the table and its partitions."""
        return int(connection.execute(_SIZE, {"name": table.fullname}).scalar_one())

    def counted_columns(self, connection: Connection, table: Table) -> list[str]:
        """The columns with a serial sequence."""
        qualified = _qualified(connection, table)
        return [
            column.name
            for column in table.columns
            if connection.scalar(select(func.pg_get_serial_sequence(qualified, column.name)))
        ]

    def reset_counters(self, connection: Connection, table: Table, columns: list[str]) -> None:
        """``setval`` of each column's sequence to just above its highest value."""
        for column in columns:
            sequence = connection.scalar(
                select(func.pg_get_serial_sequence(_qualified(connection, table), column))
            )
            highest = connection.scalar(select(func.max(table.c[column])))
            connection.execute(select(func.setval(sequence, (highest or 0) + 1, False)))

    server = True

    def throwaway_url(self, base: URL, name: str) -> URL:
        """The schema first on the search path."""
        return base.update_query_dict({"options": f"-csearch_path={name}"})

    drops_schemas_cascading = True


def _qualified(connection: Connection, table: Table) -> str:
    return connection.dialect.identifier_preparer.format_table(table)
