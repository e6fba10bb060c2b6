"""The message envelope, id parsing and the mapping of business keys to 16 bytes."""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Final, Generic

import uuid6

from inbox.errors import InvalidMessage

__all__ = ["IDEMPOTENCY_KEY_HEADER", "KEY_NAMESPACE", "Message", "uuid7"]

KEY_NAMESPACE: Final = uuid.UUID("8aab2b60-68a4-4999-8d5c-14d0fb80cbe2")
"""UUIDv5 namespace under which string keys become 16 bytes: ``uuid5(KEY_NAMESPACE, key)``.

Published so that producers in other languages compute the same key. Never change it: every
stored business-key claim depends on it.
"""

IDEMPOTENCY_KEY_HEADER: Final = "idempotency-key"
"""Header through which a producer names the business operation a message performs."""

_HEX32 = re.compile(r"[0-9a-fA-F]{32}")
_CANONICAL = re.compile(
    r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
)
_EMPTY_HEADERS: Final[Mapping[str, Any]] = MappingProxyType({})

if TYPE_CHECKING:
    from typing_extensions import TypeVar

    # Bare ``Message`` means ``Message[Any]``: a body of any shape, as decoded.
    B = TypeVar("B", default=Any)
else:
    from typing import TypeVar

    B = TypeVar("B")  # the default above is for type checkers; the runtime needs none

T = TypeVar("T")


def uuid7() -> uuid.UUID:
    """Return a new time-ordered UUIDv7, the id producers should stamp on every message."""
    return uuid.UUID(bytes=uuid6.uuid7().bytes)


def _describe(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else f"{text[:40]}... ({len(text)} characters)"


def parse_message_id(value: object) -> uuid.UUID:
    """Return ``value`` as a UUID, or raise :class:`InvalidMessage` naming what was wrong.

    Accepted: a :class:`uuid.UUID`, the canonical hyphenated string (any case), 32 hex digits,
    or exactly 16 bytes. Nothing else: not an int, not a braced or ``urn:`` string.
    """
    if isinstance(value, uuid.UUID):
        return value
    if value is None:
        raise InvalidMessage("message has no id")
    if isinstance(value, str):
        if _CANONICAL.fullmatch(value) or _HEX32.fullmatch(value):
            return uuid.UUID(value)
        raise InvalidMessage(
            "message id must be a canonical UUID string or 32 hex digits, "
            f"got str {_describe(value)}"
        )
    if isinstance(value, bytes | bytearray | memoryview):
        raw = bytes(value)
        if len(raw) == 16:
            return uuid.UUID(bytes=raw)
        raise InvalidMessage(f"message id given as bytes must be exactly 16 bytes, got {len(raw)}")
    raise InvalidMessage(f"message id must be a UUID, str or 16 bytes, got {type(value).__name__}")


def key_bytes(value: object) -> bytes:
    """Map a key to the 16 bytes stored in ``inbox_message.message_id``.

    A UUID gives its bytes, 16 bytes are taken as they are, and a non-empty string gives
    ``uuid5(KEY_NAMESPACE, value).bytes``. Anything else raises :class:`ValueError`.
    """
    if isinstance(value, uuid.UUID):
        return value.bytes
    if isinstance(value, str):
        if not value:
            raise InvalidMessage("key is an empty string")
        if not _is_utf8(value):
            raise InvalidMessage("key is not valid Unicode text (it holds a lone surrogate)")
        return uuid.uuid5(KEY_NAMESPACE, value).bytes
    if isinstance(value, bytes):
        if len(value) != 16:
            raise InvalidMessage(f"key given as bytes must be exactly 16 bytes, got {len(value)}")
        return value
    raise InvalidMessage(
        f"key must be a non-empty str, a UUID or 16 bytes, got {type(value).__name__}"
    )


def _is_utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


@dataclass(frozen=True, slots=True, init=False)
class Message(Generic[B]):
    """An immutable message envelope: what a broker delivered, decoded.

    ``id`` is validated and normalised at construction (see :func:`parse_message_id`);
    ``headers`` is a read-only copy. An ``idempotency-key`` header, when present, must be a
    non-empty string: it is the producer's key for the business operation and deduplicates
    retried sends that carry fresh ids.

    ``Message[OrderCreated]`` is a message whose body is an ``OrderCreated``: what a handler
    registered with ``body=OrderCreated`` receives. Bare ``Message`` is ``Message[Any]``.
    """

    id: uuid.UUID
    type: str | None
    body: B
    headers: Mapping[str, Any]

    def __init__(
        self,
        id: uuid.UUID | str | bytes | None,
        type: str | None,
        body: B,
        headers: Mapping[str, Any] | None = None,
    ) -> None:
        message_id = parse_message_id(id)
        if type is not None and not isinstance(type, str):
            raise InvalidMessage(
                f"message {message_id}: type must be a str or None, got {_describe_type(type)}"
            )
        if headers is None:
            frozen_headers = _EMPTY_HEADERS
        elif isinstance(headers, Mapping):
            frozen_headers = MappingProxyType(dict(headers))
        else:
            raise InvalidMessage(
                f"message {message_id}: headers must be a mapping, got {_describe_type(headers)}"
            )
        key = frozen_headers.get(IDEMPOTENCY_KEY_HEADER)
        if key is not None and (not isinstance(key, str) or not key):
            raise InvalidMessage(
                f"message {message_id}: header {IDEMPOTENCY_KEY_HEADER!r} must be a non-empty "
                f"string, got {_describe_type(key) if not isinstance(key, str) else 'empty str'}"
            )
        if key is not None and not _is_utf8(key):
            raise InvalidMessage(
                f"message {message_id}: header {IDEMPOTENCY_KEY_HEADER!r} is not valid Unicode "
                "text (it holds a lone surrogate)"
            )
        object.__setattr__(self, "id", message_id)
        object.__setattr__(self, "type", type)
        object.__setattr__(self, "body", body)
        object.__setattr__(self, "headers", frozen_headers)

    def __reduce__(self) -> tuple[Callable[..., Message[B]], tuple[Any, ...]]:
        # Picklable (for process pools) although headers are a read-only mapping proxy.
        return (Message, (self.id, self.type, self.body, dict(self.headers)))

    @classmethod
    def new(
        cls,
        type: str | None,
        body: B,
        headers: Mapping[str, Any] | None = None,
    ) -> Message[B]:
        """Return a new message stamped with a fresh UUIDv7 id."""
        return cls(id=uuid7(), type=type, body=body, headers=headers)

    def with_body(self, body: T) -> Message[T]:
        """This message (same id, type and headers) carrying ``body`` instead: how a
        handler registered with ``body=`` receives its validated body."""
        typed: Message[T] = object.__new__(Message)
        object.__setattr__(typed, "id", self.id)
        object.__setattr__(typed, "type", self.type)
        object.__setattr__(typed, "body", body)
        object.__setattr__(typed, "headers", self.headers)
        return typed

    @property
    def idempotency_key(self) -> str | None:
        """The producer's ``idempotency-key`` header, or None when the message has none."""
        key: str | None = self.headers.get(IDEMPOTENCY_KEY_HEADER)
        return key


def _describe_type(value: object) -> str:
    return type(value).__name__
