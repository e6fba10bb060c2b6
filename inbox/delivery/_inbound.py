"""A delivery becomes an :class:`inbox.Message`, or the reason it must be dead-lettered.

The written policy for what cannot be a message (retrying cannot help any of these):
properties that do not decode, no ``message_id``, an id that is not a UUID, a body that does
not decompress or decode under its content type, a body that decompresses past
:data:`MAX_BODY_BYTES`, a malformed header.
"""

from __future__ import annotations

import bz2
import lzma
import uuid
import zlib
from collections.abc import Mapping
from typing import Any, Final, NamedTuple, Protocol

from inbox.delivery._policy import DeadLetter, DeadLetterReason
from inbox.delivery.codec import decode_body
from inbox.errors import InvalidMessage, UndecodableBody
from inbox.message import Message, parse_message_id

UNREADABLE: Final = "x-inbox-unreadable"
"""Property key: why the delivery's properties could not be decoded."""
RAW_PROPERTIES: Final = "x-inbox-raw-properties"
"""Property key: the content-header frame's property bytes as received."""
DEFERRED_COMPRESSION: Final = "x-inbox-compression"
"""Property key: the delivery's ``compression`` header, left for the worker to apply."""


__all__ = [
    "DEFERRED_COMPRESSION",
    "MAX_BODY_BYTES",
    "RAW_PROPERTIES",
    "UNREADABLE",
    "Delivery",
    "Inbound",
    "body_bytes",
    "inbound_of",
    "read_delivery",
    "read_id",
    "read_inbound",
    "read_message",
    "sent_headers",
]

MAX_BODY_BYTES: Final = 64 * 1024 * 1024
"""The most a compressed body may decompress to; a larger one is dead-lettered as it came."""
_CHUNK: Final = 1024 * 1024


class Delivery(Protocol):
    """A delivery as an edge received it (a kombu ``Message`` is one): read, never acked
    here, so that this module needs no broker library."""

    @property
    def body(self) -> bytes | str: ...

    @property
    def properties(self) -> Mapping[str, Any] | None: ...

    @property
    def headers(self) -> Mapping[str, Any] | None: ...

    @property
    def content_type(self) -> str | None: ...

    @property
    def content_encoding(self) -> str | None: ...


class Inbound(NamedTuple):
    """What an edge reads from one delivery, as the broker handed it over (a tuple: it is
    made once per delivery, on the hot path)."""

    raw_id: object
    """The delivery's message id as it came (a UUID once read, else a dead letter)."""
    message_type: object
    headers: Mapping[str, Any]
    """The headers as the producer sent them: the base of every copy's headers."""
    data: bytes
    """The body as it came off the wire."""
    content_type: str | None
    content_encoding: str | None
    compression: str | None = None
    """How ``data`` is compressed (the ``compression`` header), None when it is not (or
    the broker library decompressed it already)."""
    unreadable: DeadLetter | None = None
    """Set when the broker library could not read the delivery at all: the dead letter."""


class _Decompressor(Protocol):
    def decompress(self, data: bytes, max_length: int = ..., /) -> bytes: ...

    @property
    def eof(self) -> bool: ...


class _TooLarge(UndecodableBody):
    pass


def _decompressor(name: str) -> _Decompressor | None:
    # The names kombu's compression registry gives zlib, bz2 and lzma, with its aliases.
    if name in ("application/x-gzip", "zlib", "gzip"):
        return zlib.decompressobj()
    if name in ("application/x-bz2", "bzip2", "bz2"):
        return bz2.BZ2Decompressor()
    if name in ("application/x-lzma", "lzma", "xz"):
        return lzma.LZMADecompressor()
    return None


def decompress(data: bytes, compression: str, limit: int = MAX_BODY_BYTES) -> bytes:
    """``data`` decompressed, never holding more than ``limit`` bytes of output.

    Raises ``_TooLarge`` past the limit, :class:`~inbox.errors.UndecodableBody` for an unknown
    method or bad data.
    """
    decompressor = _decompressor(compression)
    if decompressor is None:
        raise UndecodableBody(f"unsupported compression {compression!r} (zlib, bz2, lzma)")
    out = bytearray()
    pending = data
    try:
        while True:
            chunk = decompressor.decompress(pending, _CHUNK)
            out += chunk
            if len(out) > limit:
                raise _TooLarge(f"body decompresses to more than {limit} bytes")
            pending = getattr(decompressor, "unconsumed_tail", b"")
            if decompressor.eof or (not chunk and not pending):
                break
    except (zlib.error, OSError, lzma.LZMAError, EOFError) as exc:
        raise UndecodableBody(f"cannot decompress ({compression!r}): {exc}") from exc
    if not decompressor.eof:
        raise UndecodableBody(f"cannot decompress ({compression!r}): the stream is truncated")
    return bytes(out)


def body_bytes(delivery: Delivery) -> bytes:
    """The body as it came off the wire (compressed, when it was sent compressed)."""
    body = delivery.body
    if isinstance(body, str):  # py-amqp decodes bodies whose content_encoding names a codec
        return body.encode(delivery.content_encoding or "utf-8")
    return bytes(body)


def sent_headers(delivery: Delivery) -> dict[str, Any]:
    """The headers as the producer sent them (a deferred ``compression`` header put back)."""
    headers = dict(delivery.headers or {})
    compression = (delivery.properties or {}).get(DEFERRED_COMPRESSION)
    if compression is not None:
        headers["compression"] = compression
    return headers


def inbound_of(delivery: Delivery) -> Inbound:
    """A kombu-style ``delivery`` (AMQP properties, headers) as an :class:`Inbound`."""
    properties: Mapping[str, Any] = delivery.properties or {}
    compression = properties.get(DEFERRED_COMPRESSION)
    unreadable = None
    if UNREADABLE in properties:
        detail = f"the delivery's properties do not decode: {properties[UNREADABLE]}"
        unreadable = DeadLetter(DeadLetterReason.UNREADABLE_PROPERTIES, detail)
    return Inbound(
        properties.get("message_id"),
        properties.get("type"),
        sent_headers(delivery),
        body_bytes(delivery),
        delivery.content_type,
        delivery.content_encoding,
        None if compression is None else str(compression),
        unreadable,
    )


def read_delivery(
    delivery: Delivery, decode_error: BaseException | None, default_content_type: str | None
) -> Message | DeadLetter:
    """The delivery as a :class:`Message`, or the :class:`DeadLetter` it calls for.

    ``decode_error`` is the error kombu met decompressing the body itself (on transports
    whose frames the worker does not read).
    """
    return read_inbound(inbound_of(delivery), default_content_type, decode_error)


def read_inbound(
    inbound: Inbound,
    default_content_type: str | None,
    decode_error: BaseException | None = None,
) -> Message | DeadLetter:
    """The delivery read as ``inbound`` as a :class:`Message`, or the :class:`DeadLetter`
    it calls for. ``decode_error``: the error the broker library met decompressing the body
    itself. Shared by every broker edge."""
    if inbound.unreadable is not None:
        return inbound.unreadable
    message_id = read_id(inbound.raw_id)
    if isinstance(message_id, DeadLetter):
        return message_id
    if decode_error is not None:
        detail = f"cannot decompress ({inbound.headers.get('compression')!r}): {decode_error}"
        return DeadLetter(DeadLetterReason.UNDECODABLE_BODY, detail)
    return read_message(
        message_id,
        inbound.message_type,
        inbound.headers,
        inbound.data,
        content_type=inbound.content_type,
        content_encoding=inbound.content_encoding,
        compression=inbound.compression,
        default_content_type=default_content_type,
    )


def read_id(raw_id: object) -> uuid.UUID | DeadLetter:
    """A delivery's ``message_id`` as a UUID, or the :class:`DeadLetter` it calls for."""
    if raw_id is None or raw_id == "":
        return DeadLetter(DeadLetterReason.MISSING_ID, "delivery has no message_id property")
    try:
        return parse_message_id(raw_id)
    except InvalidMessage as exc:
        return DeadLetter(DeadLetterReason.INVALID_ID, str(exc))


def read_message(
    message_id: uuid.UUID,
    message_type: Any,
    headers: Mapping[str, Any],
    data: bytes,
    *,
    content_type: str | None,
    content_encoding: str | None,
    compression: str | None,
    default_content_type: str | None,
) -> Message | DeadLetter:
    """A delivery's parts, its id already parsed, as a :class:`Message` or the
    :class:`DeadLetter` they call for: the body decompressed (``compression``), decoded under
    its content type, and the message built. Shared by every broker edge."""
    if compression is not None:
        try:
            data = decompress(data, compression)
        except _TooLarge as exc:
            return DeadLetter(DeadLetterReason.BODY_TOO_LARGE, str(exc))
        except UndecodableBody as exc:
            return DeadLetter(DeadLetterReason.UNDECODABLE_BODY, str(exc))
    try:
        body = decode_body(data, content_type, content_encoding, default_content_type)
    except UndecodableBody as exc:
        return DeadLetter(DeadLetterReason.UNDECODABLE_BODY, str(exc))
    try:
        return Message(id=message_id, type=message_type, body=body, headers=headers)
    except (InvalidMessage, TypeError, ValueError) as exc:
        return DeadLetter(DeadLetterReason.INVALID_MESSAGE, str(exc))
