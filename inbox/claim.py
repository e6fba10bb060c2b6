"""The claim: one insert-or-ignore statement that decides "new or duplicate"."""

from __future__ import annotations

import datetime as dt
import sqlite3
from collections.abc import Callable, Collection, Sequence
from typing import Any, Final

from sqlalchemy import Connection, Dialect, Executable, Insert, Table, insert
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import IntegrityError

from inbox.errors import InboxError, UnsupportedDialect

__all__ = ["BatchClaimer", "Claimer", "batch_claimer_for", "claimer_for"]

_MYSQL_DUPLICATE_ENTRY: Final = 1062

Claimer = Callable[[Connection, bytes, str, dt.datetime], bool]
"""Insert the claim ``(key, handler, processed_at)`` on a connection in a transaction.

Returns True when this transaction inserted the row (it owns the message for that handler)
and False when the row already exists (a duplicate).
"""

BatchClaimer = Callable[[Connection, Sequence[bytes], str, dt.datetime], Collection[bytes]]
"""Insert the claims ``(key, handler, processed_at)`` for distinct ``keys`` at once; return
the keys this transaction inserted (it owns them); the others were duplicates."""

# SQLite learned INSERT ... RETURNING in 3.35.
_SQLITE_RETURNING: Final = (3, 35)


def claimer_for(table: Table, dialect: Dialect) -> Claimer:
    """Return the claim function for ``table`` on a dialect; the statement is built once.

    Why one statement is safe: the primary key decides. A concurrent transaction inserting
    the same key blocks on our uncommitted row and then sees our outcome: if we commit it
    finds the row (duplicate); if we roll back, its insert goes through and it runs the
    handler. There is no window between a check and an insert because there is no check.
    """
    # The conflict target is the claim key itself: a violation of any other constraint on
    # the table is an error, never mistaken for a duplicate.
    key = [table.c.message_id, table.c.handler]
    dialect_name = dialect.name
    if dialect_name == "postgresql":
        return _postgresql_claimer(
            postgresql.insert(table).on_conflict_do_nothing(index_elements=key), dialect
        )
    if dialect_name == "sqlite":
        return _rowcount_claimer(sqlite.insert(table).on_conflict_do_nothing(index_elements=key))
    if dialect_name in ("mysql", "mariadb"):
        return _mysql_claimer(table)
    raise UnsupportedDialect(
        f"the inbox has no claim statement for dialect {dialect_name!r}; "
        "supported: postgresql, sqlite, mysql/mariadb"
    )


def _postgresql_claimer(statement: Insert, dialect: Dialect) -> Claimer:
    # The claim runs once per handler transaction, so its SQL is rendered once here and sent
    # with exec_driver_sql: no per-call compile-cache lookup or bind processing (the values
    # are already what psycopg takes: bytes, str, an aware UTC datetime), but the same
    # connection events, error wrapping, pool invalidation and logging as any statement.
    # psycopg prepares the unchanging text on the server after a few executions.
    sql = str(statement.compile(dialect=dialect))
    fallback = _rowcount_claimer(statement)
    options = {"preserve_rowcount": True}

    def claim(connection: Connection, key: bytes, handler: str, at: dt.datetime) -> bool:
        if connection.get_execution_options().get("schema_translate_map"):
            return fallback(connection, key, handler, at)  # the rendered name may not apply
        params = {"message_id": key, "handler": handler, "processed_at": at}
        result = connection.exec_driver_sql(sql, params, execution_options=options)
        return _won(result.rowcount)

    return claim


def _rowcount_claimer(statement: Executable) -> Claimer:
    # SQLAlchemy keeps an INSERT's rowcount only when asked; 1 means we inserted, 0 conflict.
    statement = statement.execution_options(preserve_rowcount=True)

    def claim(connection: Connection, key: bytes, handler: str, at: dt.datetime) -> bool:
        params = {"message_id": key, "handler": handler, "processed_at": at}
        return _won(connection.execute(statement, params).rowcount)

    return claim


def _won(rowcount: int) -> bool:
    if rowcount not in (0, 1):
        # Reading an unknown count as "duplicate" would silently drop the message.
        raise InboxError(f"the driver reported rowcount {rowcount} for the claim insert")
    return rowcount == 1


def _mysql_claimer(table: Table) -> Claimer:
    # Not INSERT IGNORE: it also downgrades truncation, NOT NULL and foreign-key errors to
    # warnings, so a bad row could be "ignored" and read as a duplicate. Not ON DUPLICATE KEY
    # UPDATE either: with CLIENT_FOUND_ROWS (which SQLAlchemy's MySQL drivers set) a no-op
    # update reports one row, exactly like an insert. A plain INSERT reports the duplicate as
    # error 1062; InnoDB rolls back only that statement, and we confirm the key is ours.
    statement = insert(table)

    def claim(connection: Connection, key: bytes, handler: str, at: dt.datetime) -> bool:
        params = {"message_id": key, "handler": handler, "processed_at": at}
        try:
            connection.execute(statement, params)
        except IntegrityError as exc:
            if _is_primary_key_duplicate(exc):
                return False
            raise
        return True

    return claim


def _is_primary_key_duplicate(exc: IntegrityError) -> bool:
    args: tuple[object, ...] = getattr(exc.orig, "args", ())
    return (
        len(args) >= 2
        and args[0] == _MYSQL_DUPLICATE_ENTRY
        and isinstance(args[1], str)
        # MariaDB says "for key 'PRIMARY'", MySQL 8 "for key '<table>.PRIMARY'".
        and "PRIMARY'" in args[1]
    )


def batch_claimer_for(table: Table, dialect: Dialect) -> BatchClaimer:
    """Return the claim function for many keys at once, for ``table`` on a dialect.

    PostgreSQL and SQLite (3.35+) send ONE statement, ``INSERT ... VALUES (...), (...) ON
    CONFLICT DO NOTHING RETURNING message_id``: the returned keys are the ones this
    transaction won. MySQL/MariaDB cannot say which rows of a multi-row insert-or-ignore
    were inserted (and ``INSERT IGNORE`` would hide other errors), so there each key gets
    the single-row claim, all in the same transaction: still one commit for the batch.
    Callers pass keys in a fixed (sorted) order, so concurrent batches that share keys take
    their row locks in the same order instead of deadlocking.
    """
    key = [table.c.message_id, table.c.handler]
    dialect_name = dialect.name
    if dialect_name == "postgresql":
        returning: Insert = postgresql.insert(table).on_conflict_do_nothing(index_elements=key)
    elif dialect_name == "sqlite" and sqlite3.sqlite_version_info >= _SQLITE_RETURNING:
        returning = sqlite.insert(table).on_conflict_do_nothing(index_elements=key)
    else:
        return _one_by_one(claimer_for(table, dialect))
    return _returning_claimer(returning.returning(table.c.message_id))


def _returning_claimer(statement: Insert) -> BatchClaimer:
    def claim_many(
        connection: Connection, keys: Sequence[bytes], handler: str, at: dt.datetime
    ) -> Collection[bytes]:
        if not keys:
            return frozenset()
        rows: list[dict[str, Any]] = [
            {"message_id": key, "handler": handler, "processed_at": at} for key in keys
        ]
        # One parameter set per key: SQLAlchemy's "insertmanyvalues" sends them as a single
        # multi-row INSERT ... RETURNING (in pages of 1,000 rows).
        won = {uuid.bytes for uuid in connection.execute(statement, rows).scalars()}
        if not won <= set(keys):
            raise InboxError("the claim insert returned a key it was not given")
        return won

    return claim_many


def _one_by_one(claim: Claimer) -> BatchClaimer:
    def claim_many(
        connection: Connection, keys: Sequence[bytes], handler: str, at: dt.datetime
    ) -> Collection[bytes]:
        return {key for key in keys if claim(connection, key, handler, at)}

    return claim_many
