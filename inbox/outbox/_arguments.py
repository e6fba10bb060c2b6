"""A message about to be published, checked once for every way of sending it.

:class:`inbox.broker.Publisher` (sent at once) and :class:`inbox.Outbox` (stored, sent by
the relay after the commit) take the same arguments under the same rules, here: the body's
encoding, the headers AMQP can carry, the ``idempotency-key`` header, the id, and the
short strings (type, exchange, routing key, content type). Nothing here imports kombu.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from inbox.core._bodies import plain_body
from inbox.delivery.codec import BINARY, JSON
from inbox.errors import InvalidMessage
from inbox.message import IDEMPOTENCY_KEY_HEADER, parse_message_id, uuid7
from inbox.outbox._amqp_limits import check_headers

__all__ = [
    "BINARY",
    "JSON",
    "EncodedBody",
    "InvalidArgumentType",
    "Outgoing",
    "encode_body",
    "outgoing",
    "short_string",
]

_SHORT_STRING: Final = 255


class InvalidArgumentType(InvalidMessage, TypeError):
    """An argument of the wrong type (a body JSON cannot encode, a type that is no str):
    an :class:`~inbox.InvalidMessage`, and a ``TypeError`` as the publisher has raised."""


@dataclass(frozen=True, slots=True)
class EncodedBody:
    """A body ready to publish: its bytes and the AMQP properties that describe them."""

    data: bytes
    content_type: str
    content_encoding: str


@dataclass(frozen=True, slots=True)
class Outgoing:
    """A message checked and encoded, as it goes on the wire."""

    id: uuid.UUID
    type: str | None
    exchange: str
    routing_key: str
    content_type: str
    content_encoding: str
    headers: dict[str, Any]
    body: bytes


def encode_body(body: object, content_type: str | None = None) -> EncodedBody:
    """Encode ``body`` for publishing.

    Without ``content_type``: ``bytes`` go out as ``application/octet-stream``, everything
    else as JSON (:class:`InvalidArgumentType`, a ``TypeError``, if it is not
    JSON-serializable; a dataclass or pydantic body as its JSON values, see
    :func:`inbox.core._bodies.plain_body`). With ``content_type``, the body must already be
    ``bytes`` or ``str`` (sent as UTF-8).
    """
    if content_type is not None:
        short_string("content_type", content_type)
        if not content_type.strip():
            raise InvalidMessage(f"content_type must be a non-empty string, got {content_type!r}")
        if isinstance(body, bytes):
            return EncodedBody(body, content_type, "binary")
        if isinstance(body, str):
            return EncodedBody(_utf8("body", body), content_type, "utf-8")
        raise InvalidArgumentType(
            f"with content_type={content_type!r} the body must be bytes or str, "
            f"got {type(body).__name__}"
        )
    if isinstance(body, bytes | bytearray | memoryview):
        return EncodedBody(bytes(body), BINARY, "binary")
    try:
        text = json.dumps(
            plain_body(body), ensure_ascii=False, allow_nan=False, separators=(",", ":")
        )
    except (TypeError, ValueError, RecursionError) as exc:
        raise InvalidArgumentType(f"body is not JSON-serializable: {exc}") from exc
    return EncodedBody(_utf8("body", text), JSON, "utf-8")


def outgoing(
    type: str | None,
    body: object,
    *,
    routing_key: str | None,
    exchange: str,
    idempotency_key: str | None = None,
    headers: Mapping[str, Any] | None = None,
    message_id: object = None,
    content_type: str | None = None,
) -> Outgoing:
    """Check every argument of a publish and encode the body; raise
    :class:`~inbox.InvalidMessage` (an :class:`InvalidArgumentType` for a wrong type) for
    the first one that cannot be sent as given."""
    if type is not None:
        if not isinstance(type, str):
            raise InvalidArgumentType(f"type must be a str or None, got {_name(type)}")
        short_string("type", type)
    chosen_id = uuid7() if message_id is None else parse_message_id(message_id)
    short_string("exchange", exchange)
    if routing_key is None or (not routing_key and not exchange):
        raise InvalidMessage("a routing key (the queue name, on the default exchange) is needed")
    short_string("routing_key", routing_key)
    if headers is not None and not isinstance(headers, Mapping):
        raise InvalidArgumentType(f"headers must be a mapping, got {_name(headers)}")
    merged = dict(headers or {})
    present = merged.get(IDEMPOTENCY_KEY_HEADER)
    if present is not None:
        _check_idempotency_key(f"the {IDEMPOTENCY_KEY_HEADER!r} header", present)
    if idempotency_key is not None:
        _check_idempotency_key("idempotency_key", idempotency_key)
        if present is not None and present != idempotency_key:
            raise InvalidMessage(
                f"idempotency_key={_short(idempotency_key)} contradicts the "
                f"{IDEMPOTENCY_KEY_HEADER!r} header {_short(present)}"
            )
        merged[IDEMPOTENCY_KEY_HEADER] = idempotency_key
    merged = check_headers(merged)
    encoded = encode_body(body, content_type)
    return Outgoing(
        id=chosen_id,
        type=type,
        exchange=exchange,
        routing_key=routing_key,
        content_type=encoded.content_type,
        content_encoding=encoded.content_encoding,
        headers=merged,
        body=encoded.data,
    )


def short_string(name: str, value: object) -> str:
    """``value`` if it is an AMQP short string a database column can hold too: a ``str`` of
    at most 255 UTF-8 bytes, without NUL characters or lone surrogates."""
    if not isinstance(value, str):
        raise InvalidArgumentType(f"{name} must be a str, got {_name(value)}")
    size = len(_utf8(name, value))
    if size > _SHORT_STRING:
        raise InvalidMessage(
            f"{name} is {size} UTF-8 bytes long, more than AMQP's {_SHORT_STRING}: "
            f"{value[:40]!r}..."
        )
    if "\x00" in value:
        raise InvalidMessage(f"{name} must not contain NUL characters, got {value!r}")
    return value


def _check_idempotency_key(name: str, value: object) -> None:
    if not isinstance(value, str) or not value:
        got = repr(value) if isinstance(value, str) else _name(value)
        raise InvalidMessage(f"{name} must be a non-empty str, got {got}")
    _utf8(name, value)


def _utf8(name: str, text: str) -> bytes:
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidMessage(
            f"{name} is not valid Unicode text (it holds a lone surrogate at {exc.start})"
        ) from exc


def _name(value: object) -> str:
    return type(value).__name__


def _short(text: str) -> str:
    shown = repr(text)
    return shown if len(shown) <= 60 else f"{shown[:40]}... ({len(text)} characters)"
