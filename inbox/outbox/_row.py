"""One outbox row: the message as it will be sent, and its columns.

Headers are stored as JSON text. JSON has no bytes, timestamps, decimals or non-finite
floats, all of which an AMQP table carries, so those are written as one-key objects naming
their type::

    {"$bytes": "<base64>"}    {"$datetime": "<ISO 8601>"}    {"$decimal": "<str>"}
    {"$float": "nan" | "inf" | "-inf"}    {"$table": {...}}

``$table`` wraps a nested header table that would otherwise read as one of these (a table
with a single key such as ``"$bytes"``); the top-level object is always the table itself.
Text is written with ``\\u`` escapes only (``ensure_ascii``), so the column never depends
on the database's character set and lone surrogates survive. Reading gives back exactly
what was written: tuples come back as lists, the one change that AMQP makes as well.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import math
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Final

from inbox.errors import InvalidMessage
from inbox.outbox._amqp_limits import check_headers

__all__ = [
    "PROPERTY_HEADERS",
    "OutboxRow",
    "headers_from_json",
    "headers_to_json",
    "row_from_mapping",
    "row_values",
]

PROPERTY_HEADERS: Final = {
    "x-inbox-correlation-id": "correlation_id",
    "x-inbox-reply-to": "reply_to",
}
"""Stored headers the relay sends as the AMQP property they name, not as headers: a row has
no column for them (``Outbox.send_task`` sets them for Celery's ``rpc://`` result backend)."""

_BYTES: Final = "$bytes"
_DATETIME: Final = "$datetime"
_DECIMAL: Final = "$decimal"
_FLOAT: Final = "$float"
_TABLE: Final = "$table"
_TAGS: Final = frozenset({_BYTES, _DATETIME, _DECIMAL, _FLOAT, _TABLE})
_NON_FINITE: Final = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}
_COLUMNS: Final = (
    "id",
    "type",
    "exchange",
    "routing_key",
    "content_type",
    "content_encoding",
    "headers",
    "body",
)


@dataclass(frozen=True, slots=True)
class OutboxRow:
    """A message waiting in the outbox, exactly as the relay will publish it.

    ``id`` is the AMQP ``message_id``; ``type``, ``content_type``, ``content_encoding`` and
    ``headers`` are its properties; ``body`` is sent as it is.
    """

    id: uuid.UUID
    type: str
    exchange: str
    routing_key: str
    content_type: str
    content_encoding: str | None
    headers: dict[str, Any]
    body: bytes


def row_values(row: OutboxRow) -> dict[str, Any]:
    """The message columns of ``row`` (``id`` … ``body``, headers as JSON text), for an
    INSERT; the bookkeeping columns (``created_at``, ``attempts``, ``available_at``,
    ``last_error``) are the writer's."""
    return {
        "id": row.id,
        "type": row.type,
        "exchange": row.exchange,
        "routing_key": row.routing_key,
        "content_type": row.content_type,
        "content_encoding": row.content_encoding,
        "headers": headers_to_json(row.headers),
        "body": row.body,
    }


def row_from_mapping(mapping: Mapping[Any, Any]) -> OutboxRow:
    """The :class:`OutboxRow` of a row read from the outbox table (``Row._mapping`` or any
    mapping with the message columns; other keys are ignored)."""
    missing = [column for column in _COLUMNS if column not in mapping]
    if missing:
        raise KeyError(f"an outbox row needs the columns {', '.join(missing)}")
    raw_id = mapping["id"]
    body = mapping["body"]
    return OutboxRow(
        id=raw_id if isinstance(raw_id, uuid.UUID) else uuid.UUID(bytes=bytes(raw_id)),
        type=mapping["type"],
        exchange=mapping["exchange"],
        routing_key=mapping["routing_key"],
        content_type=mapping["content_type"],
        content_encoding=mapping["content_encoding"],
        headers=headers_from_json(mapping["headers"]),
        body=body if isinstance(body, bytes) else bytes(body),
    )


def headers_to_json(headers: Mapping[str, Any]) -> str:
    """``headers`` as JSON text for the ``headers`` column; :class:`~inbox.InvalidMessage`
    for a name or value an AMQP table cannot carry (see :mod:`inbox.outbox._amqp_limits`)."""
    return encoded_headers(check_headers(headers))


def encoded_headers(checked: Mapping[str, Any]) -> str:
    """:func:`headers_to_json` for headers that
    :func:`inbox.outbox._amqp_limits.check_headers` passed."""
    return json.dumps(
        # A plain str is written as it is: no call for the commonest header.
        {
            name: value if value.__class__ is str else _encode(value)
            for name, value in checked.items()
        },
        ensure_ascii=True,
        allow_nan=False,
        separators=(",", ":"),
    )


def headers_from_json(text: str) -> dict[str, Any]:
    """The headers stored by :func:`headers_to_json`, with every value's type restored;
    ``ValueError`` for text that it did not write (a row written by hand)."""
    try:
        decoded = json.loads(text)
        if not isinstance(decoded, dict):
            raise InvalidMessage(f"a JSON object was expected, got {type(decoded).__name__}")
        return {name: _decode(value) for name, value in decoded.items()}
    except (
        ValueError,
        TypeError,
        KeyError,
        AttributeError,
        ArithmeticError,
        RecursionError,
    ) as exc:
        raise InvalidMessage(
            f"stored headers are not readable: {type(exc).__name__}: {exc}"
        ) from exc


def _encode(value: Any) -> Any:
    # Called on checked headers only: every value is one check_headers() accepted.
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, int):
        return int(value)  # an IntEnum goes out as the number, as py-amqp sends it
    if isinstance(value, float):
        return float(value) if math.isfinite(value) else {_FLOAT: _non_finite_name(value)}
    if isinstance(value, bytes):
        return {_BYTES: base64.b64encode(value).decode("ascii")}
    if isinstance(value, Decimal):
        return {_DECIMAL: str(value)}
    if isinstance(value, dt.datetime):
        return {_DATETIME: value.isoformat()}
    if isinstance(value, Mapping):
        table = {str(name): _encode(item) for name, item in value.items()}
        return {_TABLE: table} if len(table) == 1 and next(iter(table)) in _TAGS else table
    if isinstance(value, list | tuple):
        return [_encode(item) for item in value]
    raise InvalidMessage(f"AMQP headers cannot carry a {type(value).__name__}")  # unreachable


def _non_finite_name(value: float) -> str:
    if math.isnan(value):
        return "nan"
    return "inf" if value > 0 else "-inf"


def _decode(value: Any) -> Any:
    if isinstance(value, list):
        return [_decode(item) for item in value]
    if not isinstance(value, dict):
        return value
    if len(value) == 1:
        [(tag, payload)] = value.items()
        if tag == _BYTES:
            return base64.b64decode(payload, validate=True)
        if tag == _DATETIME:
            return dt.datetime.fromisoformat(payload)
        if tag == _DECIMAL:
            return Decimal(payload)
        if tag == _FLOAT:
            return _NON_FINITE[payload]
        if tag == _TABLE:
            return {name: _decode(item) for name, item in payload.items()}
    return {name: _decode(item) for name, item in value.items()}
