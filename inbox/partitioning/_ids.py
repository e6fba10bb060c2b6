"""Id/time arithmetic of the partition layout: UUIDv7 ids start with their 48-bit
big-endian Unix time in milliseconds, so a range of ids is a range of time."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from typing import Final

from inbox.errors import ConfigurationError

__all__ = [
    "KEYS_BOUND",
    "LAST_DAY",
    "date_of",
    "day_name",
    "day_ranges",
    "first_id_at",
    "id_floor",
    "today",
]

_KEYS_BOUND_MS: Final = 3 * 2**40
KEYS_BOUND: Final = _KEYS_BOUND_MS.to_bytes(6, "big") + bytes(10)
"""The lowest id of ``T_keys``: the first UUIDv7 of millisecond ``3 * 2**40`` (in 2074)."""

_EPOCH: Final = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_MILLISECOND: Final = dt.timedelta(milliseconds=1)
LAST_DAY: Final = (_EPOCH + _KEYS_BOUND_MS * _MILLISECOND).date()
"""The day of :data:`KEYS_BOUND`: day partitions end before it."""


def id_floor(moment: dt.datetime | dt.date) -> bytes:
    """The lowest 16-byte UUIDv7 of ``moment``'s millisecond (a date means its midnight UTC).

    Every UUIDv7 minted at or after ``moment`` compares greater than or equal to it (bytes
    compare like their big-endian timestamp), every one minted before compares less.
    """
    if not isinstance(moment, dt.datetime):
        moment = dt.datetime.combine(moment, dt.time(), tzinfo=dt.UTC)
    if moment.tzinfo is None:
        raise ConfigurationError("moment must be timezone-aware")
    milliseconds = (moment - _EPOCH) // _MILLISECOND
    if not 0 <= milliseconds < 2**48:
        raise ConfigurationError(f"{moment.isoformat()} is outside the UUIDv7 time range")
    return milliseconds.to_bytes(6, "big") + bytes(10)


def first_id_at(moment: dt.datetime) -> bytes:
    """The lowest id a UUIDv7 minted at or after ``moment`` can have: :func:`id_floor`, or
    the lowest id of all for a moment before 1970 (no UUIDv7 is older)."""
    return id_floor(max(moment, _EPOCH))


def date_of(bound: bytes) -> dt.date:
    """The UTC day of the millisecond an id bound starts with."""
    milliseconds = int.from_bytes(bound[:6], "big")
    return (_EPOCH + milliseconds * _MILLISECOND).date()


def day_ranges(
    first: dt.date, horizon: dt.date, interval_days: int
) -> Iterator[tuple[dt.date, dt.date]]:
    """``[lower, upper)`` day ranges of ``interval_days`` from ``first`` until one reaches
    ``horizon``."""
    step = dt.timedelta(days=interval_days)
    lower = first
    while lower < horizon:
        yield lower, lower + step
        lower += step


def day_name(table_name: str, day: dt.date) -> str:
    """The name of the day partition of ``table_name`` starting on ``day``."""
    return f"{table_name}_p{day:%Y%m%d}"


def today(now: dt.datetime | None) -> dt.date:
    """The UTC day of ``now`` (default: the current time)."""
    moment = dt.datetime.now(dt.UTC) if now is None else now
    if moment.tzinfo is None:
        raise ConfigurationError("now must be timezone-aware")
    return moment.astimezone(dt.UTC).date()
