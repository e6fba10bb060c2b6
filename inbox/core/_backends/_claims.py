"""The claim statements of one inbox table: the insert-or-ignore that decides "new or
duplicate", the batch claim, and the two reads that tell whether a claim row is there.

Why one statement is safe: the primary key ``(message_id, handler)`` decides. A concurrent
transaction inserting the same key blocks on our uncommitted row and then sees our outcome:
if we commit it finds the row (duplicate); if we roll back, its insert goes through and it
runs the handler. There is no window between a check and an insert, because there is no
check. The conflict target is the claim key itself: a violation of any other constraint on
the table is an error, never mistaken for a duplicate.
"""

from __future__ import annotations

import datetime as dt
import sqlite3
from collections.abc import Collection, Hashable, Mapping, Sequence
from typing import Any, Final

from sqlalchemy import (
    Connection,
    Dialect,
    Insert,
    LargeBinary,
    Select,
    Table,
    bindparam,
    cast,
    func,
    insert,
    literal_column,
    select,
    type_coerce,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import IntegrityError
from sqlalchemy.sql.elements import ColumnElement

from inbox.errors import InboxError, UnsupportedDialect

__all__ = [
    "MARKER",
    "SUPPORTED_DRIVERS",
    "Claims",
    "check_supported",
    "translation_key",
]

SUPPORTED_DRIVERS: Final[dict[str, frozenset[str]]] = {
    # "psycopg" is psycopg 3 both blocking and async (create_async_engine); asyncpg,
    # aiosqlite and asyncmy are async only (inbox.aio.AsyncInbox).
    "postgresql": frozenset({"psycopg", "psycopg2", "pg8000", "asyncpg"}),
    "sqlite": frozenset({"pysqlite", "aiosqlite"}),
    "mysql": frozenset({"pymysql", "asyncmy"}),
    "mariadb": frozenset({"pymysql", "asyncmy"}),
}
"""The drivers the dedup suite runs on, per dialect; any other is refused, not guessed at.
(aiomysql is not among them: 0.3.2 with PyMySQL >= 1.2.3 breaks bytes parameters,
aio-libs/aiomysql#1080 — with PyMySQL 1.2.4 every claim key raises TypeError — so MySQL and
MariaDB go through asyncmy.)"""

MARKER: Final = "default_transaction_read_only"
"""The server parameter the PostgreSQL claim sets for its own transaction only.

PostgreSQL (14 and later) reports every change of it to the client, which keeps the latest
value without asking: ``on`` after the claim, back to the session's value the moment that
transaction ends, however it ends (a raw ``COMMIT`` or ``ROLLBACK``, the driver's). Reading
it before the COMMIT tells, without a round trip, whether the transaction that holds the
claim is still the open one (:mod:`inbox.core._backends`). It changes nothing for the
transaction that sets it: a default applies to transactions that begin later."""

_MYSQL_DUPLICATE_ENTRY: Final = 1062
# SQLite learned INSERT ... RETURNING in 3.35.
_SQLITE_RETURNING: Final = (3, 35)
_MARKS_ITS_TRANSACTION: Final[ColumnElement[bool]] = func.set_config(
    literal_column("'default_transaction_read_only'"),  # MARKER
    literal_column("'on'"),
    literal_column("true"),
) == literal_column("'on'")


def check_supported(dialect: Dialect) -> None:
    """Raise :class:`~inbox.UnsupportedDialect` unless the inbox is tested on this dialect and
    driver: a driver that binds or counts differently could turn every claim into an error,
    or worse, into a silent duplicate."""
    drivers = SUPPORTED_DRIVERS.get(dialect.name)
    if drivers is None:
        raise UnsupportedDialect(
            f"the inbox has no claim statement for dialect {dialect.name!r}; "
            f"supported: {', '.join(sorted(SUPPORTED_DRIVERS))}"
        )
    if dialect.driver not in drivers:
        raise UnsupportedDialect(
            f"the inbox is not tested with the {dialect.name}+{dialect.driver} driver; "
            f"use one of: {', '.join(f'{dialect.name}+{d}' for d in sorted(drivers))}"
        )


def translation_key(translate: Mapping[str | None, str | None] | None) -> Hashable:
    """A ``schema_translate_map`` as a dictionary key (None without one)."""
    return tuple(sorted(translate.items(), key=repr)) if translate else None


class Claims:
    """The claim statements of one inbox table, built once, and run on a ``Connection``
    through SQLAlchemy (the path every driver takes; psycopg 3 has a faster one of its own
    for the first claim of a transaction, :mod:`inbox.core._backends._psycopg`)."""

    def __init__(self, table: Table) -> None:
        self.table = table
        # What a session's get_bind() sees, so that binds={inbox_table: engine} route it.
        self.bind_clause = table.insert()
        this_claim = (
            table.c.message_id == bindparam("message_id"),
            table.c.handler == bindparam("handler"),
        )
        self._held: Select[Any] = select(func.count()).where(*this_claim)
        self._claimed_at: Select[Any] = select(table.c.processed_at).where(*this_claim)
        self.marked_claim = _marked_claim(table)
        self._postgresql_many = _array_claim(table)
        key = [table.c.message_id, table.c.handler]
        self._sqlite_one = (
            sqlite.insert(table)
            .on_conflict_do_nothing(index_elements=key)
            .execution_options(preserve_rowcount=True)
        )
        self._sqlite_many = (
            sqlite.insert(table)
            .on_conflict_do_nothing(index_elements=key)
            .returning(table.c.message_id)
        )
        self._mysql_one = insert(table)

    def claim(self, connection: Connection, key: bytes, handler: str, at: dt.datetime) -> bool:
        """Claim ``key`` for ``handler`` in the open transaction: True if this transaction
        won it, False if taken (a duplicate)."""
        params = {"message_id": key, "handler": handler, "processed_at": at}
        name = connection.dialect.name
        if name == "postgresql":
            return won(connection.execute(self.marked_claim, params).rowcount)
        if name == "sqlite":
            return won(connection.execute(self._sqlite_one, params).rowcount)
        # Not INSERT IGNORE: it also downgrades truncation, NOT NULL and foreign-key errors
        # to warnings, so a bad row could be "ignored" and read as a duplicate. Not ON
        # DUPLICATE KEY UPDATE either: with CLIENT_FOUND_ROWS (which SQLAlchemy's MySQL
        # drivers set) a no-op update reports one row, exactly like an insert. A plain INSERT
        # reports the duplicate as error 1062; InnoDB rolls back only that statement, and we
        # confirm the key is ours.
        try:
            connection.execute(self._mysql_one, params)
        except IntegrityError as exc:
            if is_primary_key_duplicate(exc):
                return False
            raise
        return True

    def claim_many(
        self, connection: Connection, keys: Sequence[bytes], handler: str, at: dt.datetime
    ) -> Collection[bytes]:
        """Claim distinct ``keys`` (sorted, so that concurrent batches take their row locks
        in the same order instead of deadlocking) for ``handler`` at once; return the keys
        won.

        PostgreSQL gets ONE statement with ONE array parameter (``unnest``), whose
        ``RETURNING`` says which keys this transaction won; SQLite (3.35+) one multi-row
        ``INSERT ... ON CONFLICT DO NOTHING RETURNING``. MySQL/MariaDB cannot say which rows
        of a multi-row insert-or-ignore were inserted (and ``INSERT IGNORE`` would hide
        other errors), so there each key gets the single-row claim, all in the same
        transaction: still one commit for the batch.
        """
        if not keys:
            return frozenset()
        name = connection.dialect.name
        if name == "postgresql":
            params: Any = {"keys": list(keys), "handler": handler, "processed_at": at}
            rows = connection.execute(self._postgresql_many, params).scalars()
            taken = {bytes(key) for key in rows}
        elif name == "sqlite" and sqlite3.sqlite_version_info >= _SQLITE_RETURNING:
            # One parameter set per key: SQLAlchemy's "insertmanyvalues" sends them as a
            # single multi-row INSERT ... RETURNING (in pages of 1,000 rows).
            params = [{"message_id": k, "handler": handler, "processed_at": at} for k in keys]
            taken = {uuid.bytes for uuid in connection.execute(self._sqlite_many, params).scalars()}
        else:
            return {key for key in keys if self.claim(connection, key, handler, at)}
        if not taken <= set(keys):
            raise InboxError("the claim insert returned a key it was not given")
        return taken

    def held(self, connection: Connection, key: bytes, handler: str) -> bool:
        """Whether the claim row ``(key, handler)`` is visible on ``connection`` now."""
        params = {"message_id": key, "handler": handler}
        return bool(connection.execute(self._held, params).scalar_one())

    def claimed_at(self, connection: Connection, key: bytes, handler: str) -> dt.datetime | None:
        """The ``processed_at`` of the claim row ``(key, handler)``, if any: which claim of a
        key this is (each transaction stamps its own instant, to the microsecond)."""
        params = {"message_id": key, "handler": handler}
        stamp: dt.datetime | None = connection.execute(self._claimed_at, params).scalar()
        return stamp


def won(rowcount: int) -> bool:
    """A claim's row count as "won"; anything but 0 or 1 is an error, never a duplicate."""
    if rowcount not in (0, 1):
        # Reading an unknown count as "duplicate" would silently drop the message.
        raise InboxError(f"the driver reported rowcount {rowcount} for the claim insert")
    return rowcount == 1


def is_primary_key_duplicate(exc: IntegrityError) -> bool:
    """Whether a MySQL/MariaDB error is the duplicate-key error of the claim's primary key."""
    args: tuple[object, ...] = getattr(exc.orig, "args", ())
    return (
        len(args) >= 2
        and args[0] == _MYSQL_DUPLICATE_ENTRY
        and isinstance(args[1], str)
        # MariaDB says "for key 'PRIMARY'", MySQL 8 "for key '<table>.PRIMARY'".
        and "PRIMARY'" in args[1]
    )


def _marked_claim(table: Table) -> Insert:
    # INSERT ... SELECT so that the row can carry a WHERE: the marker (MARKER) is set by the
    # claim statement itself, once, in the claim's round trip. set_config() returns the value
    # it set, so the WHERE always holds: the row count still says won (1) or duplicate (0).
    c = table.c
    row = select(
        cast(bindparam("message_id", type_=LargeBinary), LargeBinary),
        cast(bindparam("handler", type_=c.handler.type), c.handler.type),
        cast(bindparam("processed_at", type_=c.processed_at.type), c.processed_at.type),
    ).where(_MARKS_ITS_TRANSACTION)
    return (
        postgresql.insert(table)
        .from_select(["message_id", "handler", "processed_at"], row)
        .on_conflict_do_nothing(index_elements=[c.message_id, c.handler])
        .execution_options(preserve_rowcount=True)
    )


def _array_claim(table: Table) -> Insert:
    # One bytea[] parameter instead of one parameter set per key: the server gets a short
    # statement and one array to unnest, not a 300-parameter VALUES list that SQLAlchemy
    # renders and binds key by key. Every PostgreSQL driver the inbox supports (psycopg,
    # psycopg2, pg8000, asyncpg) binds the array as bytea[] (tests/test_claim_many_array.py).
    c = table.c
    keys = func.unnest(bindparam("keys", type_=postgresql.ARRAY(LargeBinary))).column_valued("k")
    claimed = (
        select(
            keys,
            bindparam("handler", type_=c.handler.type),
            bindparam("processed_at", type_=c.processed_at.type),
        )
        .where(_MARKS_ITS_TRANSACTION)
        .order_by(keys)
    )
    return (
        postgresql.insert(table)
        .from_select(["message_id", "handler", "processed_at"], claimed)
        .on_conflict_do_nothing(index_elements=[c.message_id, c.handler])
        # The raw bytes back: no uuid.UUID made per row only to take its .bytes again.
        .returning(type_coerce(c.message_id, LargeBinary))
    )
