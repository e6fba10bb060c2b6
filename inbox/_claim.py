"""The claim: one insert-or-ignore statement that decides "new or duplicate"."""

from __future__ import annotations

import datetime as dt
import sqlite3
from collections.abc import Callable, Collection, Hashable, Mapping, Sequence
from typing import Any, Final

from sqlalchemy import (
    Connection,
    Dialect,
    Executable,
    Insert,
    Integer,
    LargeBinary,
    Table,
    bindparam,
    func,
    insert,
    literal_column,
    select,
    type_coerce,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import IntegrityError

from inbox._shared_round_trips import BEGIN_WITH, COMMIT_WITH, shares_round_trips
from inbox.errors import InboxError, UnsupportedDialect
from inbox.telemetry._core import timed_claim

__all__ = [
    "SUPPORTED_DRIVERS",
    "BatchClaimer",
    "Claimer",
    "Claims",
    "batch_claimer_for",
    "check_supported",
    "claimer_for",
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


class Claims:
    """The claim statements of one inbox table, each built once per dialect and paramstyle
    (the two things their SQL is rendered for)."""

    def __init__(self, table: Table) -> None:
        self.table = table
        # What a session's get_bind() sees, so that binds={inbox_table: engine} route it.
        self.bind_clause = table.insert()
        self._one: dict[tuple[type[Dialect], str], Claimer] = {}
        self._many: dict[tuple[type[Dialect], str], BatchClaimer] = {}
        this_claim = (
            table.c.message_id == bindparam("message_id"),
            table.c.handler == bindparam("handler"),
        )
        self._held = select(func.count()).where(*this_claim)
        # Fails in the database (division by zero) unless the claim row is there, so that a
        # COMMIT sent behind it in the same round trip is skipped: inbox/_shared_round_trips.py.
        self._held_or_fail = (
            select(literal_column("1", Integer) // func.count())
            .where(*this_claim)
            .execution_options(**COMMIT_WITH)
        )
        self._held_or_fail_sql: dict[tuple[Hashable, Hashable], str] = {}
        self._claimed_at = select(table.c.processed_at).where(*this_claim)

    def claim(self, connection: Connection, key: bytes, handler: str, at: dt.datetime) -> bool:
        """Claim ``key`` for ``handler``: True if this transaction won it, False if taken."""
        claim = self._one.get(_cache_key(connection.dialect))
        if claim is None:
            claim = self._one[_cache_key(connection.dialect)] = claimer_for(
                self.table, connection.dialect
            )
        if timed_claim is not None:
            return timed_claim(handler, claim, connection, key, handler, at)
        return claim(connection, key, handler, at)

    def claim_many(
        self, connection: Connection, keys: Sequence[bytes], handler: str, at: dt.datetime
    ) -> Collection[bytes]:
        """Claim distinct ``keys`` (sorted) for ``handler`` at once; return the keys won."""
        claim_many = self._many.get(_cache_key(connection.dialect))
        if claim_many is None:
            claim_many = self._many[_cache_key(connection.dialect)] = batch_claimer_for(
                self.table, connection.dialect
            )
        if timed_claim is not None:
            return timed_claim(handler, claim_many, connection, keys, handler, at)
        return claim_many(connection, keys, handler, at)

    def held(self, connection: Connection, key: bytes, handler: str) -> bool:
        """Whether the claim row ``(key, handler)`` is visible on ``connection`` now."""
        params = {"message_id": key, "handler": handler}
        return bool(connection.execute(self._held, params).scalar_one())

    def commit_if_held(self, connection: Connection, key: bytes, handler: str) -> None:
        """Check that the claim row ``(key, handler)`` is visible and COMMIT, in one round
        trip (only where ``shares_round_trips``, inbox/_shared_round_trips.py); a missing
        claim raises the database's division by zero (SQLSTATE 22012), nothing committed."""
        params = {"message_id": key, "handler": handler}
        # Rendered once per schema translation, like the claim: no per-call cache lookup.
        dialect = connection.dialect
        translate = connection.get_execution_options().get("schema_translate_map")
        cache_key = (_cache_key(dialect), _translation_key(translate))
        check = self._held_or_fail_sql.get(cache_key)
        if check is None:
            check = str(self._held_or_fail.compile(dialect=dialect, **_translating(translate)))
            self._held_or_fail_sql[cache_key] = check
        connection.exec_driver_sql(check, params, execution_options=COMMIT_WITH)

    def claimed_at(self, connection: Connection, key: bytes, handler: str) -> dt.datetime | None:
        """The ``processed_at`` of the committed claim row ``(key, handler)``, if any: which
        claim of a key this is (each transaction stamps its own instant, to the microsecond)."""
        params = {"message_id": key, "handler": handler}
        stamp: dt.datetime | None = connection.execute(self._claimed_at, params).scalar()
        return stamp


def _cache_key(dialect: Dialect) -> tuple[type[Dialect], str]:
    return (type(dialect), dialect.paramstyle)


def claimer_for(table: Table, dialect: Dialect) -> Claimer:
    """Return the claim function for ``table`` on a dialect; the statement is built once.

    Why one statement is safe: the primary key decides. A concurrent transaction inserting
    the same key blocks on our uncommitted row and then sees our outcome: if we commit it
    finds the row (duplicate); if we roll back, its insert goes through and it runs the
    handler. There is no window between a check and an insert because there is no check.
    """
    # The conflict target is the claim key itself: a violation of any other constraint on
    # the table is an error, never mistaken for a duplicate.
    check_supported(dialect)
    key = [table.c.message_id, table.c.handler]
    dialect_name = dialect.name
    if dialect_name == "postgresql":
        statement = postgresql.insert(table).on_conflict_do_nothing(index_elements=key)
        if dialect.paramstyle == "pyformat":  # psycopg, psycopg2: bound by name
            return _postgresql_claimer(statement, dialect)
        return _rowcount_claimer(statement)
    if dialect_name == "sqlite":
        return _rowcount_claimer(sqlite.insert(table).on_conflict_do_nothing(index_elements=key))
    return _mysql_claimer(table)


def _postgresql_claimer(statement: Insert, dialect: Dialect) -> Claimer:
    # The claim runs once per handler transaction, so its SQL is rendered once (per schema
    # translation) and sent with exec_driver_sql: no per-call compile-cache lookup or bind
    # processing (the values are already what psycopg takes: bytes, str, an aware UTC
    # datetime), but the same connection events, error wrapping, pool invalidation and
    # logging as any statement. psycopg prepares the unchanging text after a few executions.
    # With psycopg 3, BEGIN goes in the claim's round trip (inbox/_shared_round_trips.py).
    rendered: dict[Hashable, str] = {}
    options = {"preserve_rowcount": True}
    with_begin_options = {**options, **BEGIN_WITH}

    def claim(connection: Connection, key: bytes, handler: str, at: dt.datetime) -> bool:
        translate = connection.get_execution_options().get("schema_translate_map")
        sql = rendered.get(_translation_key(translate))
        if sql is None:
            sql = str(statement.compile(dialect=dialect, **_translating(translate)))
            rendered[_translation_key(translate)] = sql
        params = {"message_id": key, "handler": handler, "processed_at": at}
        with_begin = shares_round_trips(connection)
        result = connection.exec_driver_sql(
            sql, params, execution_options=with_begin_options if with_begin else options
        )
        return _won(result.rowcount)

    return claim


def _translation_key(translate: Mapping[str | None, str | None] | None) -> Hashable:
    return tuple(sorted(translate.items(), key=repr)) if translate else None


def _translating(translate: Mapping[str | None, str | None] | None) -> dict[str, Any]:
    # SQL rendered for one schema_translate_map: the tenant's schema written in, quoted by the
    # dialect, as SQLAlchemy writes it in at execution.
    if not translate:
        return {}
    return {"schema_translate_map": translate, "render_schema_translate": True}


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

    PostgreSQL gets ONE statement with ONE array parameter, ``INSERT ... SELECT k, :handler,
    :at FROM unnest(:keys) AS k ORDER BY k ON CONFLICT DO NOTHING RETURNING message_id``:
    the returned keys are the ones this transaction won. SQLite (3.35+) sends ``INSERT ...
    VALUES (...), (...) ON CONFLICT DO NOTHING RETURNING message_id`` (one parameter set per
    key). MySQL/MariaDB cannot say which rows of a multi-row insert-or-ignore were inserted
    (and ``INSERT IGNORE`` would hide other errors), so there each key gets the single-row
    claim, all in the same transaction: still one commit for the batch. Keys are claimed in
    sorted order (callers pass them sorted; PostgreSQL's ``ORDER BY k`` sorts bytes as Python
    does), so concurrent batches that share keys take their row locks in the same order
    instead of deadlocking.
    """
    check_supported(dialect)
    key = [table.c.message_id, table.c.handler]
    dialect_name = dialect.name
    if dialect_name == "postgresql":
        return _array_claimer(table)
    if dialect_name == "sqlite" and sqlite3.sqlite_version_info >= _SQLITE_RETURNING:
        returning = sqlite.insert(table).on_conflict_do_nothing(index_elements=key)
        return _returning_claimer(returning.returning(table.c.message_id))
    return _one_by_one(claimer_for(table, dialect))


def _array_claimer(table: Table) -> BatchClaimer:
    # One bytea[] parameter instead of one parameter set per key: the server gets a short
    # statement and one array to unnest, not a 300-parameter VALUES list that SQLAlchemy
    # renders and binds key by key. Built from the Table, so schema_translate_map applies;
    # every PostgreSQL driver the inbox supports (psycopg, psycopg2, pg8000, asyncpg) binds
    # the array as bytea[] (tests/test_claim_many_array.py).
    keys = func.unnest(bindparam("keys", type_=postgresql.ARRAY(LargeBinary))).column_valued("k")
    claimed = select(
        keys,
        bindparam("handler", type_=table.c.handler.type),
        bindparam("processed_at", type_=table.c.processed_at.type),
    ).order_by(keys)
    statement = (
        postgresql.insert(table)
        .from_select(["message_id", "handler", "processed_at"], claimed)
        .on_conflict_do_nothing(index_elements=[table.c.message_id, table.c.handler])
        # The raw bytes back: no uuid.UUID made per row only to take its .bytes again.
        .returning(type_coerce(table.c.message_id, LargeBinary))
    )

    def claim_many(
        connection: Connection, keys: Sequence[bytes], handler: str, at: dt.datetime
    ) -> Collection[bytes]:
        if not keys:
            return frozenset()
        params = {"keys": list(keys), "handler": handler, "processed_at": at}
        won = {bytes(key) for key in connection.execute(statement, params).scalars()}
        if not won <= set(keys):
            raise InboxError("the claim insert returned a key it was not given")
        return won

    return claim_many


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
