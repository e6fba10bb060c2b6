"""The claim statements of one inbox table: the insert-or-ignore that decides "new or
duplicate", the batch claim, and the two reads that tell whether a claim row is there. Each
family spells its claim itself (``ClaimStatements``, from its package); this module runs them.

Why one statement is safe: the primary key ``(message_id, handler)`` decides. A concurrent
transaction inserting the same key blocks on our uncommitted row and then sees our outcome:
if we commit it finds the row (duplicate); if we roll back, its insert goes through and it
runs the handler. There is no window between a check and an insert, because there is no
check. The conflict target is the claim key itself: a violation of any other constraint on
the table is an error, never mistaken for a duplicate.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Collection, Hashable, Mapping, Sequence
from typing import Any

from sqlalchemy import Connection, Dialect, Select, Table, bindparam, func, select
from sqlalchemy.exc import IntegrityError

from inbox._backends._family import ClaimStatements, Family, families
from inbox.errors import InboxError

__all__ = ["Claims", "translation_key", "won"]


def translation_key(translate: Mapping[str | None, str | None] | None) -> Hashable:
    """A ``schema_translate_map`` as a dictionary key (None without one)."""
    return tuple(sorted(translate.items(), key=repr)) if translate else None


class Claims:
    """The claim statements of one inbox table, built once per family, and run on a
    ``Connection`` through SQLAlchemy (the path every driver takes; psycopg 3 has a faster
    one of its own for the first claim of a transaction,
    :mod:`inbox._backends.postgresql._psycopg`)."""

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
        self._by_family: dict[Family, ClaimStatements] = {}
        # Per dialect (an engine's): no lookup but a subscript on the per-message path.
        self._by_dialect: dict[Dialect, tuple[ClaimStatements, Family]] = {}

    def statements(self, family: Family) -> ClaimStatements:
        """``family``'s claim statements on this table (built on first use)."""
        found = self._by_family.get(family)
        if found is None:
            found = self._by_family[family] = family.claim_statements(self.table)
        return found

    def _for(self, dialect: Dialect) -> tuple[ClaimStatements, Family]:
        family = families[type(dialect)]
        found = self._by_dialect[dialect] = (self.statements(family), family)
        return found

    def claim(self, connection: Connection, key: bytes, handler: str, at: dt.datetime) -> bool:
        """Claim ``key`` for ``handler`` in the open transaction: True if this transaction
        won it, False if taken (a duplicate)."""
        params = {"message_id": key, "handler": handler, "processed_at": at}
        try:
            statements, family = self._by_dialect[connection.dialect]
        except KeyError:
            statements, family = self._for(connection.dialect)
        if statements.counts:
            return won(connection.execute(statements.one, params).rowcount)
        try:
            connection.execute(statements.one, params)
        except IntegrityError as exc:
            if family.is_duplicate_key(exc):
                return False
            raise
        return True

    def claim_many(
        self, connection: Connection, keys: Sequence[bytes], handler: str, at: dt.datetime
    ) -> Collection[bytes]:
        """Claim distinct ``keys`` (sorted, so that concurrent batches take their row locks
        in the same order instead of deadlocking) for ``handler`` at once; return the keys
        won: with the family's batch claim where it has one (PostgreSQL: ONE statement with
        ONE array parameter; SQLite 3.35+: one multi-row insert-or-ignore returning the keys
        inserted), else key by key, all in the same transaction: still one commit."""
        if not keys:
            return frozenset()
        try:
            statements, _ = self._by_dialect[connection.dialect]
        except KeyError:
            statements, _ = self._for(connection.dialect)
        many = statements.many
        if many is None:
            return {key for key in keys if self.claim(connection, key, handler, at)}
        if statements.many_takes_array:
            params: Any = {"keys": list(keys), "handler": handler, "processed_at": at}
        else:
            params = [{"message_id": k, "handler": handler, "processed_at": at} for k in keys]
        taken = {bytes(key) for key in connection.execute(many, params).scalars()}
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
