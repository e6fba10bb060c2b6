"""SQLite: its knowledge (``_family``) and its backend (``_backend``: a statement an exit
exception cut short closed at once), sqlite3 and aiosqlite alike."""

from inbox._backends.sqlite._family import SQLiteFamily

__all__ = ["FAMILY"]

FAMILY = SQLiteFamily()
"""The SQLite family, as registered in :mod:`inbox._backends._registry`."""
