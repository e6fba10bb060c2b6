"""PostgreSQL through psycopg2: the claim sets the marker, and the client reads it back.

The claim statement sets :data:`~inbox._backends.postgresql._claims.MARKER` for its own
transaction; PostgreSQL 14+ reports each change of it, and libpq keeps the latest report. Before the
COMMIT, the transaction is known to be the claim's own when libpq says a healthy transaction
is open and the marker still reads ``on``: any COMMIT or ROLLBACK under the handler would
have reverted it, even one after which the driver silently began a new transaction. Both
reads are public psycopg2 API and local: no round trip.

pg8000 keeps the base class's answer ("unknown": read the claim row), because it does not
tell publicly whether the open transaction is aborted, and a COMMIT of an aborted
transaction silently rolls back (asyncpg: ``_asyncpg``).
"""

from __future__ import annotations

from typing import Any, Final

from sqlalchemy import Connection

from inbox._backends._base import Backend, Claimed, ClaimRow, TransactionState
from inbox._backends._claims import Claims
from inbox._backends.postgresql._claims import MARKER

__all__ = ["LIBPQ_IDLE", "LIBPQ_IN_ERROR", "LIBPQ_IN_TRANSACTION", "Psycopg2Backend"]

LIBPQ_IDLE: Final = 0
"""PQTRANS_IDLE: no transaction open."""
LIBPQ_IN_TRANSACTION: Final = 2
"""PQTRANS_INTRANS: idle in a healthy transaction."""
LIBPQ_IN_ERROR: Final = 3
"""PQTRANS_INERROR: a statement failed, the transaction is aborted."""


def state_from(status: int, marker: object, marked: bool, on: object) -> TransactionState:
    """The transaction state from libpq's transaction ``status`` and the ``marker``'s value
    now (``on`` is what it reads while set)."""
    if status == LIBPQ_IN_ERROR:
        return TransactionState.ABORTED
    if status == LIBPQ_IDLE:
        return TransactionState.ENDED
    if marked and status == LIBPQ_IN_TRANSACTION and marker == on:
        return TransactionState.OPEN
    return TransactionState.UNKNOWN


class Psycopg2Backend(Backend):
    """psycopg2: the claim through SQLAlchemy, its transaction's state read from libpq."""

    def begin_and_claim(self, connection: Connection, claims: Claims, row: ClaimRow) -> Claimed:
        """The claim through SQLAlchemy; marked if it turned the marker ``on`` (a session
        whose default is already ``on`` cannot tell its transaction's end this way)."""
        driver: Any = connection.connection.driver_connection
        before = driver.get_parameter_status(MARKER)
        won = claims.claim(connection, *row)
        marked = before != "on" and driver.get_parameter_status(MARKER) == "on"
        return Claimed(won, marked, alone=False)

    def state(self, connection: Connection, claimed: Claimed) -> TransactionState:
        """From libpq's transaction status and the marker, both read client-side."""
        driver: Any = connection.connection.driver_connection
        return state_from(
            driver.get_transaction_status(),
            driver.get_parameter_status(MARKER),
            claimed.marked,
            "on",
        )
