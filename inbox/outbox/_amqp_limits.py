"""Message headers a publish may carry: what an AMQP 0-9-1 field table can hold, checked
before anything is sent or stored.

The rules are those of py-amqp's table writer (the one kombu uses), so a header that passes
here is one the broker connection can encode: ``str``, ``bytes``, ``bool``, ``int`` (signed
64 bits), ``float``, ``decimal.Decimal`` (at most 255 decimal places and a 32-bit unscaled
value), ``datetime.datetime`` (from 1970 on: it goes out as whole seconds), ``None``, and
lists, tuples and dicts of them. Names are ``str`` of at most 255 UTF-8 bytes. The whole
table is bounded too (:data:`MAX_HEADERS_BYTES`), so that it fits in one AMQP frame with
room to spare. Anything else raises :class:`inbox.InvalidMessage` naming the header.
"""

from __future__ import annotations

import calendar
import datetime as dt
from collections.abc import Mapping
from decimal import Decimal
from typing import Any, Final

from inbox.errors import InvalidMessage

__all__ = ["MAX_HEADERS_BYTES", "MAX_HEADER_DEPTH", "check_headers"]

MAX_HEADERS_BYTES: Final = 64 * 1024
"""The largest header table a publish takes, as encoded on the wire: half of RabbitMQ's
default ``frame_max`` (131072), leaving room for the other properties and for headers the
worker adds to retried and dead-lettered copies."""

MAX_HEADER_DEPTH: Final = 32
"""How deeply lists and tables may nest inside the headers."""

_SHORT_STRING: Final = 255
_INT64: Final = (-(2**63), 2**63 - 1)
_INT32: Final = (-(2**31), 2**31 - 1)
_SURROGATES: Final = "surrogatepass"  # py-amqp encodes text this way; lone surrogates pass


def check_headers(
    headers: Mapping[str, Any] | None, *, max_bytes: int | None = MAX_HEADERS_BYTES
) -> dict[str, Any]:
    """Return ``headers`` as a new plain dict after checking that AMQP can carry every
    name and value; raise :class:`~inbox.InvalidMessage` naming the first that cannot.
    ``max_bytes`` bounds the whole table (None: only what the encoding itself allows)."""
    if headers is None:
        return {}
    if not isinstance(headers, Mapping):
        raise InvalidMessage(f"headers must be a mapping, got {type(headers).__name__}")
    size = _table_size(headers, "headers", 0)
    if max_bytes is not None and size > max_bytes:
        raise InvalidMessage(
            f"headers take {size} bytes on the wire, more than the {max_bytes} a "
            "message may carry (large data belongs in the body)"
        )
    return dict(headers)


def _table_size(table: Mapping[Any, Any], where: str, depth: int) -> int:
    if depth > MAX_HEADER_DEPTH:
        raise InvalidMessage(f"{where}: nested more than {MAX_HEADER_DEPTH} levels deep")
    size = 4
    for name, value in table.items():
        if not isinstance(name, str):
            raise InvalidMessage(f"{where}: header names must be str, got {type(name).__name__}")
        encoded = len(name.encode("utf-8", _SURROGATES))
        if encoded > _SHORT_STRING:
            raise InvalidMessage(
                f"{where}: header name {name[:40]!r}... is {encoded} UTF-8 bytes, "
                f"more than AMQP's {_SHORT_STRING}"
            )
        size += 1 + encoded + _value_size(value, f"{where}[{name!r}]", depth)
    return size


def _value_size(value: object, where: str, depth: int) -> int:
    """The encoded size of one table value (its type tag included), or InvalidMessage."""
    if isinstance(value, str):
        return 5 + len(value.encode("utf-8", _SURROGATES))
    if isinstance(value, bytes):
        return 5 + len(value)
    if isinstance(value, bool) or value is None:
        return 2 if value is not None else 1
    if isinstance(value, int):
        if not _INT64[0] <= value <= _INT64[1]:
            raise InvalidMessage(f"{where}: {value} does not fit AMQP's signed 64-bit integer")
        return 5 if -_INT32[1] <= value <= _INT32[1] else 9
    if isinstance(value, float):
        return 9
    if isinstance(value, Decimal):
        _check_decimal(value, where)
        return 6
    if isinstance(value, dt.datetime):
        if calendar.timegm(value.utctimetuple()) < 0:
            raise InvalidMessage(f"{where}: AMQP timestamps cannot be before 1970, got {value}")
        return 9
    if isinstance(value, Mapping):
        return 1 + _table_size(value, where, depth + 1)
    if isinstance(value, list | tuple):
        if depth + 1 > MAX_HEADER_DEPTH:
            raise InvalidMessage(f"{where}: nested more than {MAX_HEADER_DEPTH} levels deep")
        return 5 + sum(
            _value_size(item, f"{where}[{index}]", depth + 1) for index, item in enumerate(value)
        )
    hint = " (use bytes)" if isinstance(value, bytearray | memoryview) else ""
    raise InvalidMessage(f"{where}: AMQP headers cannot carry a {type(value).__name__}{hint}")


def _check_decimal(value: Decimal, where: str) -> None:
    # AMQP's decimal is one unsigned byte of decimal places and a signed 32-bit value.
    sign, digits, exponent = value.as_tuple()
    if not isinstance(exponent, int):
        raise InvalidMessage(f"{where}: AMQP cannot carry the decimal {value}")
    unscaled = int("".join(map(str, digits)) or "0") * (-1 if sign else 1)
    if not -_SHORT_STRING <= exponent <= 0 or not _INT32[0] <= unscaled <= _INT32[1]:
        raise InvalidMessage(
            f"{where}: AMQP decimals hold a 32-bit value with 0 to 255 decimal places, got {value}"
        )
