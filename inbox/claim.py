"""The claim: one insert-or-ignore statement that decides "new or duplicate"."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import Final

from sqlalchemy import Connection, Dialect, Executable, Table, insert
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import IntegrityError

from inbox.errors import InboxError, UnsupportedDialect

__all__ = ["Claimer", "claimer_for"]

_MYSQL_DUPLICATE_ENTRY: Final = 1062

Claimer = Callable[[Connection, bytes, str, dt.datetime], bool]
"""Insert the claim ``(key, handler, processed_at)`` on a connection in a transaction.

Returns True when this transaction inserted the row (it owns the message for that handler)
and False when the row already exists (a duplicate).
"""


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
        return _rowcount_claimer(
            postgresql.insert(table).on_conflict_do_nothing(index_elements=key)
        )
    if dialect_name == "sqlite":
        return _rowcount_claimer(sqlite.insert(table).on_conflict_do_nothing(index_elements=key))
    if dialect_name in ("mysql", "mariadb"):
        return _mysql_claimer(table)
    raise UnsupportedDialect(
        f"the inbox has no claim statement for dialect {dialect_name!r}; "
        "supported: postgresql, sqlite, mysql/mariadb"
    )


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
