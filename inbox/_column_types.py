"""The column types of the inbox's tables: 16-byte keys and UTC timestamps on every family.
:mod:`inbox.schema` re-exports them."""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any

from sqlalchemy import DateTime, Dialect, LargeBinary
from sqlalchemy.types import TypeDecorator

from inbox._backends import families, with_family_types
from inbox.errors import ConfigurationError

__all__ = ["BinaryUUID", "UTCDateTime"]


class BinaryUUID(TypeDecorator[uuid.UUID]):
    """A UUID stored as its 16 raw bytes: ``BYTEA``, ``BINARY(16)`` or ``BLOB`` by dialect.

    Binds a :class:`uuid.UUID` or exactly 16 bytes (a derived business key); reads a UUID.
    """

    impl = with_family_types(LargeBinary(16), "key")
    cache_ok = True

    def process_bind_param(self, value: Any, dialect: Dialect) -> bytes | None:
        """Turn a UUID (or 16 bytes, passed through) into the stored 16 bytes."""
        if value is None or isinstance(value, bytes):
            return value
        if isinstance(value, uuid.UUID):
            return value.bytes
        raise ConfigurationError(f"BinaryUUID binds a UUID or 16 bytes, got {type(value).__name__}")

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

    impl = with_family_types(DateTime(timezone=True), "instant")
    cache_ok = True

    def process_bind_param(self, value: Any, dialect: Dialect) -> dt.datetime | None:
        """Normalise an aware datetime to UTC (naive UTC where the dialect has no zones)."""
        if value is None:
            return None
        if not isinstance(value, dt.datetime) or value.tzinfo is None:
            raise ConfigurationError("UTCDateTime binds a timezone-aware datetime")
        utc: dt.datetime = value.astimezone(dt.UTC)
        # A subscript, no call: this runs for every timestamp bound.
        return utc if families[type(dialect)].keeps_time_zones else utc.replace(tzinfo=None)

    def process_result_value(self, value: Any, dialect: Dialect) -> dt.datetime | None:
        """Return the stored time as an aware UTC datetime."""
        if value is None:
            return None
        if not isinstance(value, dt.datetime):
            raise ConfigurationError(
                f"expected a datetime from the driver, got {type(value).__name__}"
            )
        if value.tzinfo is None:
            return value.replace(tzinfo=dt.UTC)
        return value.astimezone(dt.UTC)
