"""PostgreSQL through asyncpg: the claim sets the marker, and asyncpg keeps what the server
reported of it.

The claim statement sets :data:`~inbox._backends.postgresql._claims.MARKER` for its own
transaction; PostgreSQL 14+ reports each change of it, and asyncpg keeps the latest report
in the connection's settings (``Connection.get_settings()``, public). Before the COMMIT, the
transaction is known to be the claim's own when ``Connection.is_in_transaction()`` (public)
says a transaction is open and the marker still reads ``on``:

* a COMMIT or ROLLBACK under the handler reverts the marker (and a new transaction begun
  after it does not set it again);
* a failed statement aborts the transaction, and PostgreSQL reverts the transaction's
  settings when it aborts it, reporting the marker back to its old value before the
  failed statement's answer ends: an aborted transaction never reads ``on``.

asyncpg alone cannot tell an aborted transaction from a healthy one (its public
``is_in_transaction()`` says True for both), which is why the generic backend read the claim
row before every COMMIT (one round trip per message); the marker makes that read needless
whenever it reads ``on``, and anything else keeps it ("unknown").
"""

from __future__ import annotations

from typing import Any, Final

from sqlalchemy import Connection

from inbox._backends._base import Backend, Claimed, ClaimRow, TransactionState
from inbox._backends._claims import Claims
from inbox._backends.postgresql._claims import MARKER

__all__ = ["AsyncpgBackend"]

_ON: Final = "on"


class AsyncpgBackend(Backend):
    """asyncpg: the claim through SQLAlchemy, its transaction's state read from what asyncpg
    keeps of the server's reports (no round trip)."""

    def begin_and_claim(self, connection: Connection, claims: Claims, row: ClaimRow) -> Claimed:
        """The claim through SQLAlchemy; marked if it turned the marker ``on`` (a session
        whose default is already ``on`` cannot tell its transaction's end this way)."""
        driver: Any = connection.connection.driver_connection  # asyncpg.Connection
        settings = driver.get_settings()
        before = getattr(settings, MARKER, None)
        won = claims.claim(connection, *row)
        marked = before != _ON and getattr(settings, MARKER, None) == _ON
        return Claimed(won, marked, alone=False, handle=driver)

    def state(self, connection: Connection, claimed: Claimed) -> TransactionState:
        """ENDED when asyncpg says no transaction is open; OPEN when one is and the marker
        still reads ``on``; else UNKNOWN (aborted, or another transaction: read the row)."""
        driver: Any = claimed.handle
        if driver is None:
            return TransactionState.UNKNOWN
        if not driver.is_in_transaction():
            return TransactionState.ENDED
        if claimed.marked and getattr(driver.get_settings(), MARKER, None) == _ON:
            return TransactionState.OPEN
        return TransactionState.UNKNOWN
