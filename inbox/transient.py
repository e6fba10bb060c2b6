"""Recognise database errors after which re-running the whole transaction is the right answer."""

from __future__ import annotations

from typing import Final

from sqlalchemy.exc import DBAPIError

__all__ = ["is_transient"]

# SQLSTATEs: serialization_failure, deadlock_detected (PostgreSQL), lock_not_available.
_TRANSIENT_SQLSTATES: Final = frozenset({"40001", "40P01", "55P03"})
# MySQL/MariaDB error numbers: record changed since last read (MariaDB snapshot isolation),
# lock wait timeout, deadlock.
_MYSQL_TRANSIENT: Final = frozenset({1020, 1205, 1213})
# SQLite result codes: SQLITE_BUSY, SQLITE_LOCKED.
_SQLITE_TRANSIENT: Final = frozenset({5, 6})
_CHAIN_LIMIT: Final = 8


def is_transient(exc: BaseException) -> bool:
    """True if ``exc`` (or an exception it was raised from) is a transient database error.

    Transient means the transaction was aborted by the database for reasons of timing, not
    content: a deadlock, a serialization failure, a lock timeout, a busy SQLite file, or a
    lost connection. Re-running the transaction is safe here even after a lost COMMIT: if
    the commit did land, the claim is found and the re-run is a duplicate.
    """
    seen: BaseException | None = exc
    for _ in range(_CHAIN_LIMIT):
        if seen is None:
            return False
        if isinstance(seen, DBAPIError) and _is_transient_dbapi_error(seen):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _is_transient_dbapi_error(exc: DBAPIError) -> bool:
    if exc.connection_invalidated:
        return True
    orig = exc.orig
    # PyMySQL sets a SQLSTATE too (often the generic HY000), so a non-matching SQLSTATE does
    # not end the search: the MySQL error number below may still say "lock wait timeout".
    if getattr(orig, "sqlstate", None) in _TRANSIENT_SQLSTATES:
        return True
    sqlite_code = getattr(orig, "sqlite_errorcode", None)
    if isinstance(sqlite_code, int):
        return sqlite_code & 0xFF in _SQLITE_TRANSIENT
    args: tuple[object, ...] = getattr(orig, "args", ())
    return bool(args) and isinstance(args[0], int) and args[0] in _MYSQL_TRANSIENT
