"""PostgreSQL's claim statements: the single-row claim that marks its own transaction, and
the batch claim with one array parameter.

The marker: the claim sets :data:`MARKER` for its own transaction only. PostgreSQL (14 and
later) reports every change of it to the client, which keeps the latest value without
asking: ``on`` after the claim, back to the session's value the moment that transaction
ends, however it ends. Reading it before the COMMIT tells, without a round trip, whether the
transaction that holds the claim is still the open one (``_psycopg``, ``_psycopg2``).
"""

from __future__ import annotations

from typing import Final

from sqlalchemy import (
    Insert,
    LargeBinary,
    Table,
    bindparam,
    cast,
    func,
    literal_column,
    select,
    type_coerce,
)
from sqlalchemy.dialects import postgresql
from sqlalchemy.sql.elements import ColumnElement

from inbox._backends._family import ClaimStatements

__all__ = ["MARKER", "claim_statements", "marked_claim"]

MARKER: Final = "default_transaction_read_only"
"""The server parameter the PostgreSQL claim sets for its own transaction only. It changes
nothing for the transaction that sets it: a default applies to transactions that begin
later."""

_MARKS_ITS_TRANSACTION: Final[ColumnElement[bool]] = func.set_config(
    literal_column("'default_transaction_read_only'"),  # MARKER
    literal_column("'on'"),
    literal_column("true"),
) == literal_column("'on'")


def claim_statements(table: Table) -> ClaimStatements:
    """The marked single-row claim and the array batch claim on ``table``."""
    return ClaimStatements(marked_claim(table), True, _array_claim(table), many_takes_array=True)


def marked_claim(table: Table) -> Insert:
    """The single-row claim that sets :data:`MARKER` for its own transaction."""
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
