"""The inbox table, defined once in SQLAlchemy metadata; the alembic revision creates exactly it."""

from __future__ import annotations

import datetime as dt
import hashlib
import re
import uuid
from typing import Any, Final

from sqlalchemy import Column, DateTime, Dialect, Index, LargeBinary, MetaData, String, Table
from sqlalchemy.dialects import mysql
from sqlalchemy.types import TypeDecorator

__all__ = [
    "DEFAULT_TABLE_NAME",
    "HANDLER_NAME_MAX_LENGTH",
    "BinaryUUID",
    "UTCDateTime",
    "inbox_message",
    "inbox_table",
    "metadata",
    "processed_at_index_name",
    "resolve_table",
]

DEFAULT_TABLE_NAME: Final = "inbox_message"
HANDLER_NAME_MAX_LENGTH: Final = 255
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")
# PostgreSQL's identifier limit (MySQL/MariaDB allow 64, SQLite has none).
_MAX_IDENTIFIER_LENGTH: Final = 63


class BinaryUUID(TypeDecorator[uuid.UUID]):
    """A UUID stored as its 16 raw bytes: ``BYTEA``, ``BINARY(16)`` or ``BLOB`` by dialect.

    Binds a :class:`uuid.UUID` or exactly 16 bytes (a derived business key); reads a UUID.
    """

    impl = LargeBinary(16).with_variant(mysql.BINARY(16), "mysql", "mariadb")
    cache_ok = True

    def process_bind_param(self, value: Any, dialect: Dialect) -> bytes | None:
        """Turn a UUID (or 16 bytes, passed through) into the stored 16 bytes."""
        if value is None or isinstance(value, bytes):
            return value
        if isinstance(value, uuid.UUID):
            return value.bytes
        raise TypeError(f"BinaryUUID binds a UUID or 16 bytes, got {type(value).__name__}")

    def process_result_value(self, value: Any, dialect: Dialect) -> uuid.UUID | None:
        """Turn the stored 16 bytes back into a UUID."""
        return None if value is None else uuid.UUID(bytes=bytes(value))


class UTCDateTime(TypeDecorator[dt.datetime]):
    """A timezone-aware UTC timestamp on every dialect.

    PostgreSQL stores ``TIMESTAMP WITH TIME ZONE``. MySQL/MariaDB and SQLite have no
    zone-aware type, so the value is stored as naive UTC (``DATETIME(6)`` on MySQL, so
    microseconds survive) and read back with ``tzinfo=UTC``. Naive datetimes are refused on
    bind: guessing their zone is how retention windows silently shift by hours.
    """

    impl = DateTime(timezone=True).with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")
    cache_ok = True

    def process_bind_param(self, value: Any, dialect: Dialect) -> dt.datetime | None:
        """Normalise an aware datetime to UTC (naive UTC where the dialect has no zones)."""
        if value is None:
            return None
        if not isinstance(value, dt.datetime) or value.tzinfo is None:
            raise TypeError("UTCDateTime binds a timezone-aware datetime")
        utc: dt.datetime = value.astimezone(dt.UTC)
        return utc if dialect.name == "postgresql" else utc.replace(tzinfo=None)

    def process_result_value(self, value: Any, dialect: Dialect) -> dt.datetime | None:
        """Return the stored time as an aware UTC datetime."""
        if value is None:
            return None
        if not isinstance(value, dt.datetime):
            raise TypeError(f"expected a datetime from the driver, got {type(value).__name__}")
        if value.tzinfo is None:
            return value.replace(tzinfo=dt.UTC)
        return value.astimezone(dt.UTC)


def _handler_name_type() -> String:
    # MySQL/MariaDB compare VARCHARs with the server's collation, usually case- and
    # accent-insensitive: "billing.Charge" and "billing.charge" would share one claim, and
    # the second handler would never run. A binary collation compares exact characters.
    # (Trailing spaces still compare equal under PAD SPACE; names with them are refused.)
    return String(HANDLER_NAME_MAX_LENGTH).with_variant(
        mysql.VARCHAR(HANDLER_NAME_MAX_LENGTH, charset="utf8mb4", collation="utf8mb4_bin"),
        "mysql",
        "mariadb",
    )


def inbox_table(
    metadata: MetaData, name: str = DEFAULT_TABLE_NAME, *, schema: str | None = None
) -> Table:
    """Define the inbox table on ``metadata`` under ``name`` (and optional ``schema``).

    Use this to put the inbox table into your own metadata, e.g. with another name.
    ``name`` and ``schema`` must be plain identifiers (letters, digits, underscores).
    """
    for label, value in (("table name", name), ("schema", schema)):
        if value is not None and not _IDENTIFIER.fullmatch(value):
            raise ValueError(
                f"inbox {label} must be a plain identifier (letters, digits, underscore; "
                f"at most 63 characters), got {value!r}"
            )
    return Table(
        name,
        metadata,
        Column("message_id", BinaryUUID(), primary_key=True),
        Column("handler", _handler_name_type(), primary_key=True),
        Column("processed_at", UTCDateTime(), nullable=False),
        Index(processed_at_index_name(name), "processed_at"),
        schema=schema,
    )


def processed_at_index_name(table_name: str) -> str:
    """The name of the ``processed_at`` index of the inbox table ``table_name``:
    ``ix_<table>_processed_at``, or, where that would pass 63 characters (PostgreSQL and
    MySQL/MariaDB refuse longer names), the table name cut short and a digest of it whole."""
    name = f"ix_{table_name}_processed_at"
    if len(name) <= _MAX_IDENTIFIER_LENGTH:
        return name
    digest = hashlib.sha256(table_name.encode()).hexdigest()[:8]
    keep = _MAX_IDENTIFIER_LENGTH - len(f"ix___{digest}_processed_at")
    return f"ix_{table_name[:keep]}_{digest}_processed_at"


def resolve_table(table: str | Table) -> Table:
    """Return ``table`` itself, or the inbox table named by ``"name"`` or ``"schema.name"``."""
    if isinstance(table, Table):
        return table
    if not isinstance(table, str):
        raise TypeError(f"table must be a str or a sqlalchemy Table, got {type(table).__name__}")
    if table == DEFAULT_TABLE_NAME:
        return inbox_message
    schema, dot, name = table.rpartition(".")
    if dot and not schema:
        raise ValueError(
            f"inbox table must be NAME or SCHEMA.NAME, each a plain identifier, got {table!r}"
        )
    return inbox_table(MetaData(), name, schema=schema or None)


metadata: Final = MetaData()
"""The metadata holding the default inbox table; include it in your autogenerate target."""

inbox_message: Final = inbox_table(metadata)
"""The default inbox table, ``inbox_message``."""
