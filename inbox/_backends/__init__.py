"""What each database family and driver knows, one package per family (as SQLAlchemy's own
``dialects/``), behind two objects: the family's :class:`Family` (its claim statements, error
codes, column types, row locks, batched deletes, catalog queries) and the handler
transaction's :class:`Backend` for its driver.

=========================  ===============================================================
family (package)           backend per driver
=========================  ===============================================================
``postgresql/``            psycopg: :class:`~.postgresql._psycopg.PsycopgBackend` (BEGIN and
                           the prepared claim in one round trip, ``_libpq``); psycopg2:
                           :class:`~.postgresql._psycopg2.Psycopg2Backend` (the end of the
                           transaction read from what the server reports); asyncpg, pg8000:
                           :class:`Backend` (the claim row read before the COMMIT)
``mysql/``                 :class:`~.mysql._backend.MySQLBackend`: a deadlock that rolled the
                           transaction back remembered as it happens
``sqlite/``                :class:`~.sqlite._backend.SQLiteBackend`
=========================  ===============================================================

A new family is a package with a :class:`Family` subclass, and one line in
:data:`~inbox._backends._registry.FAMILIES`. Callers outside find their family with
:func:`family_of` (once per dialect class), never by the dialect's name.
"""

from __future__ import annotations

import threading
from typing import cast

from sqlalchemy import Dialect

from inbox._backends._base import Backend, Claimed, ClaimRow, TransactionState
from inbox._backends._claims import Claims
from inbox._backends._family import ClaimStatements, Family
from inbox._backends._registry import (
    FAMILIES,
    SUPPORTED_DRIVERS,
    FamilyCache,
    check_supported,
    families,
    family_named,
    family_of,
    family_of_url,
    is_missing_table,
    is_transient_error,
    is_unreachable_error,
    refuses_value,
    server_families,
    with_family_types,
)

__all__ = [
    "FAMILIES",
    "SUPPORTED_DRIVERS",
    "Backend",
    "ClaimRow",
    "ClaimStatements",
    "Claimed",
    "Claims",
    "Family",
    "FamilyCache",
    "TransactionState",
    "backend_for",
    "check_supported",
    "families",
    "family_named",
    "family_of",
    "family_of_url",
    "is_missing_table",
    "is_transient_error",
    "is_unreachable_error",
    "refuses_value",
    "server_families",
    "with_family_types",
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
                check_supported(dialect)
                backend = _backends[type(dialect)] = _made(family_of(dialect), dialect.driver)
    return backend


def _made(family: Family, driver: str) -> Backend:
    # Family.backend() is typed loosely (object) so that _family.py needs nothing of _base.py
    # (whose backends use the claims, which use the families): its contract is a Backend.
    made = family.backend(driver)
    return Backend() if made is None else cast(Backend, made)
