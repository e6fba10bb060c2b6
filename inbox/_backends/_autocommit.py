"""Whether a connection commits every statement itself: read client-side, per driver.

Where the driver keeps more than an ``autocommit`` attribute, its family says where
(``Family.autocommit_getter``, ``autocommits_without_isolation_level``).

A connection in autocommit mode would commit the claim on its own, so a failing handler
would leave it behind and its message would never run again: the handler transaction
refuses one before the first claim, and a handler that switches to it (MySQL's
``SET autocommit=1``) is caught before the commit.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection

from inbox._backends._family import families
from inbox.errors import SessionConfigurationError

__all__ = ["autocommits", "refuse_autocommit"]


def refuse_autocommit(connection: Connection) -> None:
    """Refuse a connection in autocommit mode: the claim would commit on its own, so a
    failing handler would leave it behind and its message would never run again."""
    if autocommits(connection):
        raise SessionConfigurationError(
            "the session's connection is in AUTOCOMMIT mode: the claim would commit without "
            "the handler's writes. Use an engine without isolation_level='AUTOCOMMIT'"
        )


def autocommits(connection: Connection) -> bool:
    """Whether the driver connection commits every statement itself (read client-side)."""
    if connection.get_execution_options().get("isolation_level") == "AUTOCOMMIT":
        return True
    driver: Any = connection.connection.dbapi_connection
    if getattr(driver, "autocommit", None) is True:  # psycopg; sqlite3 on Python >= 3.12
        return True
    family = families[type(connection.dialect)]
    if family.autocommit_getter is not None:
        get_autocommit = getattr(driver, family.autocommit_getter, None)
        return bool(get_autocommit()) if callable(get_autocommit) else False
    if family.autocommits_without_isolation_level:
        return getattr(driver, "isolation_level", "") is None and not driver.in_transaction
    return False
