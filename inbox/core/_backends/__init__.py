"""One backend per database family and driver: what the handler transaction asks of the
database, behind one small interface (:class:`Backend`).

=========================  ===============================================================
dialect + driver           backend
=========================  ===============================================================
postgresql + psycopg       :class:`~inbox.core._backends._psycopg.PsycopgBackend`: BEGIN and the
                           prepared claim in one round trip; the end of the transaction
                           read from what the server reports
postgresql + psycopg2      :class:`~inbox.core._backends._postgresql.Psycopg2Backend`: the end
                           of the transaction read from what the server reports
postgresql + asyncpg,      :class:`Backend`: the claim row read before the COMMIT
pg8000
mysql/mariadb              :class:`~inbox.core._backends._mysql.MySQLBackend`: a deadlock that
                           rolled the transaction back remembered as it happens
sqlite                     :class:`~inbox.core._backends._sqlite.SQLiteBackend`
=========================  ===============================================================
"""

from __future__ import annotations

import threading

from sqlalchemy import Dialect

from inbox.core._backends._base import Backend, Claimed, ClaimRow, TransactionState
from inbox.core._backends._claims import SUPPORTED_DRIVERS, Claims, check_supported

__all__ = [
    "SUPPORTED_DRIVERS",
    "Backend",
    "ClaimRow",
    "Claimed",
    "Claims",
    "TransactionState",
    "backend_for",
    "check_supported",
]

_backends: dict[type[Dialect], Backend] = {}
_lock = threading.Lock()


def backend_for(dialect: Dialect) -> Backend:
    """The backend for ``dialect`` (its family and driver), made once per dialect class;
    :class:`~inbox.UnsupportedDialect` for a driver the inbox is not tested on."""
    backend = _backends.get(type(dialect))
    if backend is None:
        with _lock:
            backend = _backends.get(type(dialect))
            if backend is None:
                backend = _backends[type(dialect)] = _make(dialect)
    return backend


def _make(dialect: Dialect) -> Backend:
    check_supported(dialect)
    if dialect.name == "postgresql" and dialect.driver == "psycopg":
        from inbox.core._backends._psycopg import PsycopgBackend

        return PsycopgBackend()
    if dialect.name == "postgresql" and dialect.driver == "psycopg2":
        from inbox.core._backends._postgresql import Psycopg2Backend

        return Psycopg2Backend()
    if dialect.name in ("mysql", "mariadb"):
        from inbox.core._backends._mysql import MySQLBackend

        return MySQLBackend()
    if dialect.name == "sqlite":
        from inbox.core._backends._sqlite import SQLiteBackend

        return SQLiteBackend()
    return Backend()
