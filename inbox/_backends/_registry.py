"""The registered database families, and the one lookup from an engine, a connection or a
dialect to its family (:func:`family_of`), made once per dialect class."""

from __future__ import annotations

from typing import Any, Final, TypeVar

from sqlalchemy import Connection, Dialect, Engine
from sqlalchemy.engine import URL
from sqlalchemy.types import TypeEngine

from inbox._backends import mysql, postgresql, sqlite
from inbox._backends._family import (
    ColumnKind,
    Family,
    FamilyCache,
    families,
    family_named,
    register,
)
from inbox.errors import UnsupportedDialect

__all__ = [
    "FAMILIES",
    "SUPPORTED_DRIVERS",
    "FamilyCache",
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

T = TypeVar("T", bound=TypeEngine[Any])

FAMILIES: Final[tuple[Family, ...]] = (
    # One line per family.
    postgresql.FAMILY,
    mysql.FAMILY,
    sqlite.FAMILY,
)

# A family that judges any failed connection (by its message) is asked last.
_UNREACHABLE_ORDER: Final = sorted(FAMILIES, key=lambda family: family.judges_any_connection)

register(*FAMILIES)

SUPPORTED_DRIVERS: Final[dict[str, frozenset[str]]] = {
    name: family.drivers for family in FAMILIES for name in family.names
}
"""The drivers the dedup suite runs on, per dialect; any other is refused, not guessed at."""


def family_of(bind: Engine | Connection | Dialect) -> Family:
    """The family of ``bind``'s dialect (found once per dialect class);
    :class:`~inbox.UnsupportedDialect` for a database the inbox does not know."""
    dialect = bind if isinstance(bind, Dialect) else bind.dialect
    return families[type(dialect)]


def server_families() -> dict[str, Family]:
    """The families that run as a server, by dialect name (the test fixtures' databases)."""
    return {name: family for family in FAMILIES if family.server for name in family.names}


def family_of_url(url: URL) -> Family:
    """The family of a database URL."""
    return family_named(url.get_backend_name())


def with_family_types(generic: T, kind: ColumnKind, length: int | None = None) -> T:
    """``generic``, with each family's own type for a column of ``kind`` as its variant on
    that family's dialects (``Family.column_type``)."""
    typed = generic
    for family in FAMILIES:
        own = family.column_type(kind, length)
        if own is not None:
            typed = typed.with_variant(own, *family.names)
    return typed


def check_supported(dialect: Dialect) -> None:
    """Raise :class:`~inbox.UnsupportedDialect` unless the inbox is tested on this dialect and
    driver: a driver that binds or counts differently could turn every claim into an error,
    or worse, into a silent duplicate."""
    drivers = family_named(dialect.name).drivers
    if dialect.driver not in drivers:
        raise UnsupportedDialect(
            f"the inbox is not tested with the {dialect.name}+{dialect.driver} driver; "
            f"use one of: {', '.join(f'{dialect.name}+{d}' for d in sorted(drivers))}"
        )


def is_transient_error(orig: BaseException | None) -> bool:
    """Whether a driver's exception says the transaction was aborted for reasons of timing."""
    return any(family.is_transient(orig) for family in FAMILIES)


def refuses_value(orig: BaseException | None) -> bool:
    """Whether a driver's exception says the database refused a value itself."""
    return any(family.refuses_value(orig) for family in FAMILIES)


def is_missing_table(orig: BaseException | None) -> bool:
    """Whether a driver's exception says a table does not exist."""
    return any(family.is_missing_table(orig) for family in FAMILIES)


def is_unreachable_error(orig: BaseException | None) -> bool:
    """Whether a driver's exception of a failed connection says the server could not be
    reached: the first family that judges it decides."""
    for family in _UNREACHABLE_ORDER:
        verdict = family.unreachable(orig)
        if verdict is not None:
            return verdict
    return False
