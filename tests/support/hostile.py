"""The hostile-input model: what each input must become, spelled out independently of the
library (from the documented rules, with the standard library), for the hostile-input tests
and their strategies (:mod:`support.strategies`).

Ids: :func:`is_canonical_id`. Deliveries at the worker: :class:`Delivery`, the documented
dead-letter reasons, :func:`expected_reason` and :func:`claim_key`, and the tables of bodies,
content types, idempotency keys and compression headers the tests draw from.
"""

from __future__ import annotations

import json
import math
import string
import uuid
from dataclasses import dataclass, field
from typing import Any

from inbox import KEY_NAMESPACE
from inbox.message import IDEMPOTENCY_KEY_HEADER

SAMPLE = uuid.UUID("0191e5b4-3c2a-7d4e-9f10-123456789abc")
HEX_DIGITS = frozenset(string.hexdigits)


def is_canonical_id(value: object) -> bool:
    """The accepted string forms, spelled out independently of the library's regexes: 36
    characters with hyphens at 8, 13, 18, 23 and ASCII hex elsewhere, or 32 ASCII hex."""
    if not isinstance(value, str):
        return False
    if len(value) == 32:
        return all(c in HEX_DIGITS for c in value)
    return len(value) == 36 and all(
        (c == "-") if i in (8, 13, 18, 23) else (c in HEX_DIGITS) for i, c in enumerate(value)
    )


def is_text_key(value: object) -> bool:
    """A usable idempotency key: a non-empty string that is valid Unicode text."""
    if not isinstance(value, str) or not value:
        return False
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


# Headers the test worker's handler reads.
SEQ = "x-test-seq"  # which published delivery this is; kept on dead-letter copies
FAIL = "x-test-fail"  # the handler raises on deliveries that carry it

# The dead-letter reasons the worker documents.
MISSING = "missing-message-id"
INVALID_ID = "invalid-message-id"
UNDECODABLE = "undecodable-body"
INVALID_MESSAGE = "invalid-message"
UNHANDLED = "unhandled-type"
HANDLER_FAILED = "handler-failed"
DOCUMENTED_REASONS = {
    MISSING,
    INVALID_ID,
    UNDECODABLE,
    INVALID_MESSAGE,
    UNHANDLED,
    "invalid-key",
    HANDLER_FAILED,
}

_ABSENT: Any = object()


@dataclass
class Delivery:
    """One published delivery and what must become of it."""

    body: bytes
    content_type: str | None = "application/json"
    content_encoding: str | None = "utf-8"
    message_id: object = None
    type: object = "op"
    headers: dict[str, Any] = field(default_factory=dict)
    fail: bool = False
    expected: str | None = None
    """The dead-letter reason it must get; None: it must be acked."""
    key: bytes | None = None
    """When acked: the claim key, computed from the README's rules (not by the library)."""
    fragment: str = ""
    """Must appear in the dead letter's x-inbox-error."""
    seq: int = -1


def claim_key(message_id: object, headers: dict[str, Any]) -> bytes:
    """The claim key of an acked delivery, from the documented rules (not by the library)."""
    business = headers.get(IDEMPOTENCY_KEY_HEADER, _ABSENT)
    if isinstance(business, str):
        return uuid.uuid5(KEY_NAMESPACE, business).bytes
    assert isinstance(message_id, str)
    return uuid.UUID(message_id).bytes


# Bodies that are expensive to generate, built once.
DEEP_VALID = b"[" * 200 + b"]" * 200
DEEP_INVALID = b"[" * 100_000 + b"]" * 100_000
HUGE_JSON = json.dumps({"blob": "x" * 3_000_000}).encode()
HUGE_GARBAGE = bytes(range(256)) * 12_000  # 3 MB, not UTF-8
LONG_INT = b"1" * 5_000  # more digits than Python converts by default
SPECIAL_BODIES = [
    b"",
    b"\xff\xfe{}",
    b'{"a": "\xc3\x28"}',
    b'"\xed\xa0\x80"',  # a UTF-16 surrogate, UTF-8 encoded: not valid UTF-8
    b"NaN",
    b"[1, 2",
    "grüße".encode("latin-1"),
    DEEP_VALID,
    DEEP_INVALID,
    HUGE_JSON,
    HUGE_GARBAGE,
    LONG_INT,
]

# content type, content encoding, how the body is read (json/text/raw), charset.
CONTENT: list[tuple[str | None, str | None, str, str]] = [
    ("application/json", "utf-8", "json", "utf-8"),
    ("application/json; charset=utf-8", "binary", "json", "utf-8"),
    ('Application/JSON ; charset="latin-1"', "binary", "json", "latin-1"),
    ("application/cloudevents+json", "utf-8", "json", "utf-8"),
    ("application/json", "latin-1", "json", "latin-1"),
    ("application/json", "no-such-codec", "json", "no-such-codec"),
    ("text/plain", "utf-8", "text", "utf-8"),
    ("text/csv; charset=latin-1", "binary", "text", "latin-1"),
    ("text/plain; charset=no-such-codec", "binary", "text", "no-such-codec"),
    ("text/plain; charset=rot13", "binary", "text", "rot13"),
    ("text/plain; charset=base64", "binary", "text", "base64"),
    ("application/octet-stream", "binary", "raw", ""),
    ("application/x-python-serialize", "binary", "raw", ""),
    ("application/x-yaml", "utf-8", "raw", ""),
    ("image/png; charset=no-such-codec", "binary", "raw", ""),
    # Codecs that fail with a plain UnicodeError rather than UnicodeDecodeError.
    ("text/plain; charset=undefined", "binary", "text", "undefined"),
    ("application/json; charset=punycode", "binary", "json", "punycode"),
    ("text/plain; charset=idna", "binary", "text", "idna"),
    ("application/json", "undefined", "json", "undefined"),
    (None, None, "json", "utf-8"),  # no content type: the worker's default, JSON
]
BAD_IDEMPOTENCY_KEYS: list[object] = [
    "",
    0,
    7,
    2.5,
    math.nan,
    True,
    False,
    b"order-7",
    b"",
    [],
    ["order-7"],
    {},
    {"key": "order-7"},
    "order-\ud800",  # a lone surrogate: not text any encoder takes
]
BAD_COMPRESSION: list[object] = [
    "zlib",
    "gzip",
    "application/x-gzip",
    "bzip2",
    "no-such-compression",
    5,
    True,
    {"a": 1},
    ["zlib"],
    b"zlib",
]
NOT_COMPRESSED = b"not compressed at all \xff\x00"


def body_decodes(kind: str, charset: str, body: bytes) -> bool:
    """The README's decoding rule, applied with the standard library."""
    if kind == "raw":
        return True
    try:
        text = body.decode(charset)
    except (LookupError, UnicodeError):
        return False
    if kind == "text":
        return True
    try:
        json.loads(text)
    except (ValueError, RecursionError):
        return False
    return True


def expected_reason(delivery: Delivery, kind: str, charset: str) -> str | None:
    """What the worker must do, in the order its docstring gives: id, body, headers and
    type, then the handler. None: ack."""
    if delivery.message_id is None or delivery.message_id == "":
        return MISSING
    if not is_canonical_id(delivery.message_id):
        return INVALID_ID
    if delivery.headers.get("compression"):  # bodies under one never decompress here
        return UNDECODABLE
    if not body_decodes(kind, charset, delivery.body):
        return UNDECODABLE
    business = delivery.headers.get(IDEMPOTENCY_KEY_HEADER, _ABSENT)
    if business is not _ABSENT and not is_text_key(business):
        return INVALID_MESSAGE
    if delivery.type != "op":
        return UNHANDLED
    return HANDLER_FAILED if delivery.fail else None
