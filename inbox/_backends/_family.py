"""What one database family knows, as one object: :class:`Family`.

The rest of the library never names a database. Where it must do something a family does its
own way (a claim, an insert-or-ignore, a row lock, a batched delete, a status query, an error
code), it asks the family of its engine or connection (``inbox._backends.family_of``),
found once per dialect. Each family's package (``postgresql/``, ``mysql/``, ``sqlite/``)
subclasses :class:`Family` and overrides what it does differently; the answers here are
those of a database that can do none of it.
"""

from __future__ import annotations

import datetime as dt
from typing import Any, Final, NamedTuple

from sqlalchemy import Connection, Delete, Dialect, Insert, Table, TextClause
from sqlalchemy.engine import URL
from sqlalchemy.exc import IntegrityError
from sqlalchemy.types import TypeEngine

from inbox.errors import UnsupportedDialect

__all__ = [
    "ClaimStatements",
    "ColumnKind",
    "Family",
    "FamilyCache",
    "families",
    "family_named",
    "register",
]


ColumnKind = str
"""A column type the schema asks a family for by name: ``"key"`` (16 raw bytes),
``"instant"`` (a UTC timestamp to the microsecond), ``"text"`` (a bounded string compared
exactly), ``"long_text"``, ``"blob"``."""


class ClaimStatements(NamedTuple):
    """A family's claim statements on one inbox table."""

    one: Insert
    """The single-row claim (parameters ``message_id``, ``handler``, ``processed_at``)."""
    counts: bool
    """True: ``one`` is an insert-or-ignore whose row count says won (1) or duplicate (0).
    False: a duplicate raises an ``IntegrityError`` that :meth:`Family.is_duplicate_key`
    recognises."""
    many: Insert | None
    """The batch claim, returning the keys it inserted; None: each key claimed by ``one``."""
    many_takes_array: bool = False
    """``many`` takes one array parameter ``keys`` (else one parameter set per key)."""


class Family:
    """One database family (its dialect names, its supported drivers) and everything the
    inbox does its own way on it. Subclasses override what differs."""

    names: tuple[str, ...] = ()
    """The SQLAlchemy dialect names this family serves (``("mysql", "mariadb")``)."""
    drivers: frozenset[str] = frozenset()
    """The drivers the dedup suite runs on; any other is refused, not guessed at."""

    # -- the handler transaction ---------------------------------------------------------

    def backend(self, driver: str) -> object | None:
        """The handler transaction's backend for ``driver`` (a ``Backend``, made once per
        dialect class); None: the generic ``Backend``, all through SQLAlchemy."""
        return None

    def claim_statements(self, table: Table) -> ClaimStatements:
        """The claim statements on ``table``."""
        raise UnsupportedDialect(f"the inbox has no claim statement for {self.names}")

    def is_duplicate_key(self, exc: IntegrityError) -> bool:
        """Whether ``exc`` is the duplicate-key error of the table's primary key (for a
        family whose insert reports a duplicate as an error)."""
        return False

    autocommit_getter: str | None = None
    """The driver connection's method that says whether it is in autocommit mode (a
    handler's ``SET autocommit=1`` shows there), beyond the ``autocommit`` attribute every
    driver that has one sets. Data, not a method: the handler transaction reads it per
    message, without a call of its own."""
    autocommits_without_isolation_level: bool = False
    """A driver connection with ``isolation_level`` None and no transaction open commits
    every statement itself (sqlite3)."""

    # -- errors: a driver's exception (``DBAPIError.orig``) classified -------------------

    def is_transient(self, orig: BaseException | None) -> bool:
        """The database aborted the transaction for reasons of timing (deadlock,
        serialization failure, lock timeout, busy file): running it again may succeed."""
        return False

    def unreachable(self, orig: BaseException | None) -> bool | None:
        """Whether a failed connection says the server could not be reached (which waiting
        may cure); None when the error is not this family's to judge."""
        return None

    judges_any_connection: bool = False
    """:meth:`unreachable` answers for any error the other families leave alone (so it is
    asked last)."""

    def refuses_value(self, orig: BaseException | None) -> bool:
        """The database refused a value itself (too long, too large), not its timing."""
        return False

    def is_missing_table(self, orig: BaseException | None) -> bool:
        """The statement named a table that does not exist."""
        return False

    # -- the schema ------------------------------------------------------------------------

    keeps_time_zones: bool = False
    """The timestamp column stores the zone (else: naive UTC)."""

    def column_type(self, kind: ColumnKind, length: int | None = None) -> TypeEngine[Any] | None:
        """The family's own type for a column of ``kind``; None: SQLAlchemy's generic one."""
        return None

    # -- the effect ledger -----------------------------------------------------------------

    def insert_or_ignore(self, table: Table, key: str) -> Insert | None:
        """An insert that skips a row whose primary key ``key`` is taken, its row count
        saying which; None when the family has none that leaves other errors alone (then a
        plain insert, and :meth:`is_duplicate_key` tells a duplicate)."""
        return None

    commits_single_writes_itself: bool = False
    """A one-statement write is cheaper in autocommit mode (one round trip instead of
    BEGIN, statement, COMMIT)."""

    limits_statements: bool = False
    """The server drops a connection over a statement larger than a limit of its own,
    instead of answering (see :meth:`statement_limit`)."""

    def statement_limit(self, connection: Connection) -> int | None:
        """The most bytes one statement may take on ``connection``, if the server drops a
        connection over a larger one instead of answering (None: no such limit)."""
        return None

    # -- the outbox relay ------------------------------------------------------------------

    skips_locked_rows: bool = False
    """Relays take rows ``FOR UPDATE SKIP LOCKED`` (several relays at once)."""
    relay_isolation: TextClause | None = None
    """A statement run first in each relay transaction (its isolation level), if any."""
    deletes_rows_one_by_one: bool = False
    """Sent rows are deleted one statement per row (else one ``IN`` list)."""
    notifies: bool = False
    """The server can notify a relay of committed rows (``LISTEN`` / ``NOTIFY``)."""

    # -- retention -------------------------------------------------------------------------

    walks_by_key_range: bool = False
    """Cleanup deletes key range by key range behind an advisory lock (else plain batches
    from :meth:`batch_delete`)."""

    def batch_delete(self, table: Table, cutoff: dt.datetime, limit: int) -> Delete:
        """One cleanup batch: at most ``limit`` claims older than ``cutoff``."""
        raise UnsupportedDialect(
            f"inbox cleanup does not support dialect {self.names[0]!r}; "
            "supported: postgresql, sqlite, mysql/mariadb"
        )

    has_search_path: bool = False
    """An unqualified table name is looked up along a per-connection path of schemas (which
    connect options can set): the same name may be another table on another connection."""

    def searched_schema(self, connection: Connection, table: Table) -> str | None:
        """The schema ``connection``'s search path finds the unqualified ``table`` in, unless
        it is the database's default one (None: that, or no search path)."""
        return None

    schemas_query: TextClause | None = None
    """The schemas holding a table named ``:name`` (None: the family has no schemas)."""

    # -- operations and tests --------------------------------------------------------------

    def table_bytes(self, connection: Connection, table: Table) -> int | None:
        """Table and index bytes of ``table`` (its partitions included), if known."""
        return None

    one_writer_at_a_time: bool = False
    """One transaction writes at a time, in the whole database: effect records need a
    store of their own beside a claim that holds the write lock."""

    def counted_columns(self, connection: Connection, table: Table) -> list[str]:
        """The columns of ``table`` a counter fills that a rolled-back insert does not give
        back."""
        return []

    def reset_counters(self, connection: Connection, table: Table, columns: list[str]) -> None:
        """Set the counters of ``columns`` just above their highest value."""

    server: bool = False
    """The family runs as a server the test fixtures can create databases on."""

    def throwaway_url(self, base: URL, name: str) -> URL:
        """``base`` pointed at the schema or database ``name`` the fixtures created."""
        return base.set(database=name)

    drops_schemas_cascading: bool = False
    """Dropping a throwaway schema needs ``CASCADE``."""


_registered: dict[str, Family] = {}


def register(*registered: Family) -> None:
    """Make ``registered`` the families :func:`family_named` finds, by their dialect names
    (``inbox._backends._registry`` calls it with its ``FAMILIES``)."""
    for family in registered:
        for name in family.names:
            _registered[name] = family


def family_named(name: str) -> Family:
    """The registered family serving the dialect (or URL backend) ``name``;
    :class:`~inbox.UnsupportedDialect` for one the inbox does not know."""
    family = _registered.get(name)
    if family is None:
        raise UnsupportedDialect(
            f"the inbox has no claim statement for dialect {name!r}; "
            f"supported: {', '.join(sorted(_registered))}"
        )
    return family


class FamilyCache(dict[type[Dialect], Family]):
    """The family by dialect class, for a path that runs per message or per effect:
    ``families[type(connection.dialect)]`` is a subscript, no call, once the class is known
    (a miss asks :func:`family_named`)."""

    def __missing__(self, dialect_class: type[Dialect]) -> Family:
        found = self[dialect_class] = family_named(dialect_class.name)
        return found


families: Final = FamilyCache()
"""The one :class:`FamilyCache` (``family_of`` reads it too)."""
