"""Hostile input at every edge the library has: message ids, broker deliveries at the worker,
handler names, business keys, and the inbox-cleanup command line.

Every input gets a specific answer: the specific exception with a message that names the
problem or, at the worker, a dead letter with its reason. Nothing crashes the worker, and
nothing already accepted is lost. test_message.py, test_registration.py, test_process.py,
test_cleanup.py and test_broker*.py hold the common cases; this file covers what they leave
out, with property-based tests over whole input spaces and tables of named cases.

Tests whose comment starts "Regression:" reproduce library bugs this file found (at 5467c00);
each comment says what used to happen.
"""

from __future__ import annotations

import ast
import io
import json
import math
import string
import uuid
import zlib
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from fractions import Fraction
from pathlib import Path
from typing import Any

import pika
import pytest
from conftest import Database, Rabbit, effects, effects_metadata
from hypothesis import HealthCheck, given, settings
from hypothesis import event as note_event
from hypothesis import strategies as st
from kombu.connection import Connection
from kombu.message import Message as KombuMessage
from sqlalchemy import Engine, create_engine, event, insert, select
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import Pool

import inbox as inbox_package
from inbox import (
    KEY_NAMESPACE,
    Inbox,
    InvalidKey,
    InvalidMessage,
    Message,
    Outcome,
    RegistrationError,
)
from inbox.broker import RetryPolicy, Worker
from inbox.broker import headers as h
from inbox.cli import cleanup_main
from inbox.message import IDEMPOTENCY_KEY_HEADER, parse_message_id
from inbox.schema import HANDLER_NAME_MAX_LENGTH, inbox_message
from inbox.schema import metadata as inbox_metadata

SAMPLE = uuid.UUID("0191e5b4-3c2a-7d4e-9f10-123456789abc")
HEX_DIGITS = frozenset(string.hexdigits)

# ---------------------------------------------------------------------------------------------
# Message ids
# ---------------------------------------------------------------------------------------------


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


def fullwidth(text: str) -> str:
    return text.translate({ord(d): 0xFF10 + int(d) for d in string.digits})


def arabic_indic(text: str) -> str:
    return text.translate({ord(d): 0x0660 + int(d) for d in string.digits})


# Values uuid.UUID() itself accepts, which the inbox refuses: int() parses Unicode digits,
# underscores and a sign, and uuid.UUID strips braces and "urn:uuid:".
LOOSER_THAN_UUID = {
    "braces": "{" + str(SAMPLE) + "}",
    "urn": "urn:uuid:" + str(SAMPLE),
    "hyphens-moved": SAMPLE.hex[:4] + "-" + SAMPLE.hex[4:12] + "-" + SAMPLE.hex[12:],
    "hyphens-everywhere": "-".join(SAMPLE.hex),
    "underscore": SAMPLE.hex[1] + "_" + SAMPLE.hex[2:],  # the leading 0 makes room
    "plus-sign": "+" + SAMPLE.hex[1:],
    "fullwidth-digits": fullwidth(SAMPLE.hex),
    "arabic-indic-digits": arabic_indic(SAMPLE.hex),
}

BAD_IDS: dict[str, tuple[object, str]] = {
    "zero": (0, "got int"),
    "negative": (-1, "got int"),
    "int-2**128": (2**128, "got int"),
    "false": (False, "got bool"),
    "nan": (float("nan"), "got float"),
    "inf": (float("inf"), "got float"),
    "complex": (1j, "got complex"),
    "decimal": (Decimal(SAMPLE.int), "got Decimal"),
    "fraction": (Fraction(1, 3), "got Fraction"),
    "tuple-of-16-ints": (tuple(SAMPLE.bytes), "got tuple"),
    "list-of-16-ints": (list(SAMPLE.bytes), "got list"),
    "dict": ({"id": str(SAMPLE)}, "got dict"),
    "set": ({str(SAMPLE)}, "got set"),
    "uuid-class": (uuid.UUID, "got type"),
    "bytes-0": (b"", "got 0"),
    "bytes-1": (b"\x00", "got 1"),
    "bytes-hex32": (SAMPLE.hex.encode(), "got 32"),
    "bytes-1MiB": (bytes(2**20), "got 1048576"),
    "bytearray-15": (bytearray(15), "got 15"),
    "memoryview-17": (memoryview(bytes(17)), "got 17"),
    "trailing-space": (str(SAMPLE) + " ", "canonical"),
    "trailing-newline": (str(SAMPLE) + "\n", "canonical"),
    "leading-tab": ("\t" + str(SAMPLE), "canonical"),
    "nbsp": (str(SAMPLE) + "\u00a0", "canonical"),
    "uuid-prefix": ("uuid:" + str(SAMPLE), "canonical"),
    "hex32-braced": ("{" + SAMPLE.hex + "}", "canonical"),
    "hyphen-appended": (str(SAMPLE) + "-", "canonical"),
    "hex-33": (SAMPLE.hex + "0", "canonical"),
    "hex-31": (SAMPLE.hex[:-1], "canonical"),
    "non-hex-letter": ("g" + str(SAMPLE)[1:], "canonical"),
    "nul-inside": (str(SAMPLE)[:-1] + "\x00", "canonical"),
    "surrogate": (str(SAMPLE)[:-1] + "\ud800", "canonical"),
    "10-MB-string": ("a" * 10_000_000, "10000002 characters"),
}


@pytest.mark.parametrize(("value", "fragment"), BAD_IDS.values(), ids=BAD_IDS.keys())
def test_every_wrong_id_is_invalid_message_naming_the_problem(value: object, fragment: str) -> None:
    with pytest.raises(InvalidMessage) as error:
        Message(id=value, type="t", body=None)  # type: ignore[arg-type]
    assert fragment in str(error.value)
    assert len(str(error.value)) < 300  # a huge id is never echoed whole


@pytest.mark.parametrize("value", LOOSER_THAN_UUID.values(), ids=LOOSER_THAN_UUID.keys())
def test_the_inbox_is_stricter_than_uuid_uuid(value: str) -> None:
    assert uuid.UUID(value) == SAMPLE  # the standard library would take it...
    with pytest.raises(InvalidMessage, match="canonical UUID string or 32 hex digits"):
        parse_message_id(value)  # ...the inbox names it wrong


@st.composite
def near_ids(draw: st.DrawFn) -> str:
    """UUID strings in every form, then perhaps damaged: the neighbourhood of valid ids,
    which plain st.text() almost never reaches."""
    value = draw(st.uuids())
    text = draw(
        st.sampled_from(
            [
                str(value),
                str(value).upper(),
                value.hex,
                value.hex.upper(),
                "{" + str(value) + "}",
                "urn:uuid:" + str(value),
                " " + str(value),
                str(value) + "\n",
            ]
        )
    )
    for _ in range(draw(st.integers(0, 2))):
        at = draw(st.integers(0, len(text)))
        action = draw(st.sampled_from(["insert", "delete", "replace", "swapcase"]))
        char = draw(st.characters())
        if action == "insert":
            text = text[:at] + char + text[at:]
        elif action == "delete":
            text = text[:at] + text[at + 1 :]
        elif action == "replace":
            text = text[:at] + char + text[at + 1 :]
        else:
            text = text.swapcase()
    return text


@given(st.one_of(near_ids(), st.text()))
def test_any_text_is_the_uuid_uuid_would_read_or_invalid_message(value: str) -> None:
    if is_canonical_id(value):
        assert parse_message_id(value) == uuid.UUID(value)
    else:
        with pytest.raises(InvalidMessage, match="canonical UUID string or 32 hex digits"):
            parse_message_id(value)


@given(st.binary(max_size=40))
def test_any_bytes_are_a_16_byte_id_or_invalid_message_with_the_length(value: bytes) -> None:
    if len(value) == 16:
        assert parse_message_id(value) == uuid.UUID(bytes=value)
    else:
        with pytest.raises(InvalidMessage, match=f"exactly 16 bytes, got {len(value)}$"):
            parse_message_id(value)


@given(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(),
        st.floats(),
        st.complex_numbers(),
        st.decimals(),
        st.fractions(),
        st.lists(st.integers(0, 255), max_size=20),
        st.tuples(st.text()),
        st.dictionaries(st.text(max_size=5), st.integers(), max_size=3),
        st.sets(st.integers(), max_size=3),
        st.datetimes(),
    )
)
def test_any_other_object_is_invalid_message_naming_its_type(value: object) -> None:
    with pytest.raises(InvalidMessage) as error:
        parse_message_id(value)
    expected = "no id" if value is None else f"got {type(value).__name__}"
    assert expected in str(error.value)


# ---------------------------------------------------------------------------------------------
# Deliveries at the worker (kombu's in-memory transport, SQLite)
# ---------------------------------------------------------------------------------------------

MEMORY = "memory://"
HANDLER = "ops.apply"
SEQ = "x-test-seq"  # which published delivery this is; kept on dead-letter copies
FAIL = "x-test-fail"  # the handler raises on deliveries that carry it
IDLE = 0.3
POLICY = RetryPolicy((0.01,), max_tries=2)

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
    business = headers.get(IDEMPOTENCY_KEY_HEADER, _ABSENT)
    if isinstance(business, str):
        return uuid.uuid5(KEY_NAMESPACE, business).bytes
    assert isinstance(message_id, str)
    return uuid.UUID(message_id).bytes


def memory_inbox(path: Path) -> tuple[Engine, Inbox]:
    engine = create_engine(f"sqlite:///{path}")
    inbox_metadata.create_all(engine)
    effects_metadata.create_all(engine)
    inbox = Inbox(sessionmaker(engine))

    @inbox.handler("op", name=HANDLER)
    def apply(message: Message, session: Session) -> None:
        # The effect names the delivery (SEQ) and the id the handler was given.
        session.execute(
            insert(effects).values(ref=message.id.hex, handler=str(message.headers[SEQ]))
        )
        if message.headers.get(FAIL):
            raise RuntimeError("failing on purpose")

    return engine, inbox


def publish_all(queue: str, deliveries: Sequence[Delivery]) -> None:
    with Connection(MEMORY) as connection:
        producer = connection.Producer()
        channel = connection.default_channel
        for delivery in deliveries:
            headers = {**delivery.headers, SEQ: delivery.seq}
            if delivery.fail:
                headers[FAIL] = True
            properties = {
                name: value
                for name, value in (("message_id", delivery.message_id), ("type", delivery.type))
                if value is not None
            }
            if delivery.content_type is None:  # kombu's Producer would serialize the body
                raw = channel.prepare_message(delivery.body, None, None, None, headers, properties)
                channel.basic_publish(raw, exchange="", routing_key=queue)
            else:
                producer.publish(
                    delivery.body,
                    routing_key=queue,
                    content_type=delivery.content_type,
                    content_encoding=delivery.content_encoding,
                    headers=headers,
                    **properties,
                )


def take_all(queue: str) -> list[KombuMessage]:
    """Every message in ``queue``, each acked."""
    taken: list[KombuMessage] = []
    with Connection(MEMORY) as connection:
        simple = connection.SimpleQueue(queue)
        try:
            while True:
                try:
                    message = simple.get_nowait()
                except simple.Empty:
                    return taken
                message.ack()
                taken.append(message)
        finally:
            simple.close()
            connection.default_channel.exchange_delete(queue)  # SimpleQueue declared one


def depth(queue: str) -> int:
    with Connection(MEMORY) as connection:
        declared = connection.default_channel.queue_declare(queue=queue, passive=True)
        return int(declared.message_count)


@dataclass
class Run:
    """What became of a batch of deliveries: the worker's stats, the dead letters by SEQ,
    the committed effects as (message id hex, SEQ)."""

    worker: Worker
    queue: str
    dead: dict[int, KombuMessage]
    effects: list[tuple[str, int]]
    left_in_queue: int


def run_batch(deliveries: Sequence[Delivery], directory: Path) -> Run:
    """Publish ``deliveries`` (numbered in order), run a worker until it is idle — it must
    return normally — and collect what became of them."""
    for seq, delivery in enumerate(deliveries):
        delivery.seq = seq
    engine, inbox = memory_inbox(directory / "inbox.db")
    queue = f"hostile-{uuid.uuid4().hex[:12]}"
    worker = Worker(inbox, MEMORY, [queue], retry=POLICY, stats_interval=None)
    try:
        publish_all(queue, deliveries)
        worker.run(idle_timeout=IDLE)
        dead: dict[int, KombuMessage] = {}
        for message in take_all(f"{queue}.dlq"):
            seq = message.headers[SEQ]
            assert seq not in dead, f"delivery {seq} was dead-lettered twice"
            dead[seq] = message
        with engine.connect() as connection:
            rows = connection.execute(select(effects.c.ref, effects.c.handler)).all()
        return Run(worker, queue, dead, [(ref, int(seq)) for ref, seq in rows], depth(queue))
    finally:
        worker.delete_queues()
        engine.dispose()


def assert_dead_letter(delivery: Delivery, dead: KombuMessage, queue: str) -> None:
    """Dead-lettered with the expected reason and a readable error, and nothing of the
    message lost: body, properties and every header the producer set."""
    headers = dead.headers
    assert headers[h.REASON] == delivery.expected, headers[h.ERROR]
    assert headers[h.REASON] in DOCUMENTED_REASONS
    assert headers[h.SOURCE_QUEUE] == queue
    error = headers[h.ERROR]
    assert isinstance(error, str)
    assert 0 < len(error) <= 1000
    assert delivery.fragment in error
    assert bytes(dead.body) == delivery.body
    assert dead.content_type == delivery.content_type
    if delivery.message_id is not None:
        assert dead.properties["message_id"] == delivery.message_id
    if delivery.type is not None:
        assert dead.properties["type"] == delivery.type
    for name, value in delivery.headers.items():
        if name != "compression" and not name.startswith("x-inbox-"):
            assert repr(headers[name]) == repr(value), name
    if delivery.expected == HANDLER_FAILED:
        assert headers[h.TRIES] == POLICY.max_tries
        assert headers[h.FAILED_HANDLERS] == HANDLER
    elif h.TRIES not in delivery.headers:
        assert h.TRIES not in headers  # rejected at once, never tried


def assert_every_delivery_accounted_for(deliveries: Sequence[Delivery], run: Run) -> None:
    """Each delivery acked or dead-lettered (never both, never neither), as expected; and
    each claim key among the acked ones committed its effect exactly once."""
    stats = run.worker.stats
    assert run.left_in_queue == 0
    assert stats.acked + stats.dead_lettered == len(deliveries)
    assert len(run.dead) == stats.dead_lettered
    acked = [d for d in deliveries if d.seq not in run.dead]
    assert stats.acked == len(acked)
    for delivery in deliveries:
        dead = run.dead.get(delivery.seq)
        if delivery.expected is None:
            assert dead is None, (
                f"delivery {delivery.seq} was dead-lettered: "
                f"{dead.headers[h.REASON]}: {dead.headers[h.ERROR]}"
            )
        else:
            assert dead is not None, f"delivery {delivery.seq} was acked, not {delivery.expected}"
            assert_dead_letter(delivery, dead, run.queue)
    groups: dict[bytes | None, set[int]] = defaultdict(set)
    for delivery in acked:
        assert delivery.key is not None
        groups[delivery.key].add(delivery.seq)
    by_seq = {d.seq: d for d in deliveries}
    committed = Counter(by_seq[seq].key for _, seq in run.effects)
    assert committed == dict.fromkeys(groups, 1)
    for ref, seq in run.effects:
        assert seq in groups[by_seq[seq].key]
        assert ref == uuid.UUID(str(by_seq[seq].message_id)).hex  # the handler got its id
    assert stats.processed == len(groups)
    assert stats.duplicates == len(acked) - len(groups)


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
OTHER_MEDIA_TYPES = st.from_regex(
    r"(application|image|audio|x-[a-z]{1,5})/[a-z0-9.-]{1,15}", fullmatch=True
).filter(lambda media: media != "application/json")

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=12,
)
odd_header_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats()
    | st.binary(max_size=16)
    | st.text(max_size=16)
    | st.just("L" * 100_000),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner),
    max_leaves=6,
)
RESERVED_HEADERS = {IDEMPOTENCY_KEY_HEADER, "compression", SEQ, FAIL}
header_names = st.text(min_size=1, max_size=12).filter(
    lambda name: name not in RESERVED_HEADERS and not name.startswith("x-inbox-")
)
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


def is_text_key(value: object) -> bool:
    """A usable idempotency key: a non-empty string that is valid Unicode text."""
    if not isinstance(value, str) or not value:
        return False
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


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


def render_id(value: uuid.UUID, form: int) -> str:
    return [str(value), str(value).upper(), value.hex, value.hex.upper()][form]


@st.composite
def message_ids(draw: st.DrawFn, earlier: list[uuid.UUID]) -> object:
    """Mostly fresh ids and redeliveries of earlier ones (in any spelling), else any shape."""
    kind = draw(st.integers(0, 9))
    if kind <= 3 or (kind <= 5 and not earlier):
        earlier.append(draw(st.uuids()))
        return render_id(earlier[-1], draw(st.integers(0, 3)))
    if kind <= 5:
        return render_id(draw(st.sampled_from(earlier)), draw(st.integers(0, 3)))
    return draw(st.sampled_from([None, "", "x" * 1_000_000]) | st.text(max_size=50) | near_ids())


@st.composite
def bodies(draw: st.DrawFn) -> bytes:
    kind = draw(st.integers(0, 9))
    if kind <= 4:
        return json.dumps(draw(json_values), ensure_ascii=draw(st.booleans())).encode()
    if kind <= 7:
        return draw(st.binary(max_size=64))
    return draw(st.sampled_from(SPECIAL_BODIES))


@st.composite
def delivery_headers(draw: st.DrawFn) -> dict[str, Any]:
    """Odd values under any names, perhaps an idempotency key (good or bad), rarely a
    compression header (the body is then one that does not decompress)."""
    headers: dict[str, Any] = draw(st.dictionaries(header_names, odd_header_values, max_size=4))
    business = draw(st.integers(0, 9))
    if business in (6, 7):
        headers[IDEMPOTENCY_KEY_HEADER] = draw(
            st.sampled_from(["order-7", "order-8", "ключ-9", "  padded  "])
            | st.text(min_size=1, max_size=30)
        )
    elif business >= 8:
        headers[IDEMPOTENCY_KEY_HEADER] = draw(st.sampled_from(BAD_IDEMPOTENCY_KEYS))
    if draw(st.integers(0, 9)) == 9:
        headers["compression"] = draw(st.sampled_from(BAD_COMPRESSION))
    return headers


@st.composite
def delivery_batches(draw: st.DrawFn) -> list[Delivery]:
    """Up to ten deliveries, mostly plausible, each with something possibly wrong: ids of
    every shape (and redeliveries of earlier ids, in other spellings), bodies that do or do
    not decode under their content type, odd header values, bad idempotency keys, garbage
    compression headers, unknown types, and handlers that fail."""
    batch: list[tuple[Delivery, str, str]] = []
    earlier: list[uuid.UUID] = []
    for _ in range(draw(st.integers(1, 10))):
        message_id = draw(message_ids(earlier))
        content_type, content_encoding, kind, charset = draw(st.sampled_from(CONTENT))
        if draw(st.integers(0, 9)) == 9:
            content_type, content_encoding, kind, charset = draw(OTHER_MEDIA_TYPES), None, "raw", ""
        headers = draw(delivery_headers())
        body = NOT_COMPRESSED if "compression" in headers else draw(bodies())
        message_type = (
            "op"
            if draw(st.integers(0, 9)) <= 6
            else draw(st.sampled_from([None, "OP", "op ", ""]) | st.text(max_size=20))
        )
        delivery = Delivery(
            body=body,
            content_type=content_type,
            content_encoding=content_encoding,
            message_id=message_id,
            type=message_type,
            headers=headers,
            fail=draw(st.integers(0, 4)) == 4,
        )
        batch.append((delivery, kind, charset))
    # A failing handler must fail on every try: only for a delivery whose claim key no other
    # delivery shares (else a sibling may commit it first, and the retry is a duplicate).
    ids = Counter(
        uuid.UUID(str(d.message_id)) for d, _, _ in batch if is_canonical_id(d.message_id)
    )
    for delivery, kind, charset in batch:
        delivery.fail = (
            delivery.fail
            and is_canonical_id(delivery.message_id)
            and ids[uuid.UUID(str(delivery.message_id))] == 1
            and IDEMPOTENCY_KEY_HEADER not in delivery.headers
        )
        delivery.expected = expected_reason(delivery, kind, charset)
        if delivery.expected is None:
            delivery.key = claim_key(delivery.message_id, delivery.headers)
    return [delivery for delivery, _, _ in batch]


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(batch=delivery_batches())
def test_any_delivery_is_acked_once_or_dead_lettered_with_its_reason(
    tmp_path_factory: pytest.TempPathFactory, batch: list[Delivery]
) -> None:
    for delivery in batch:
        note_event(f"delivery: {delivery.expected or 'acked'}")
    run = run_batch(batch, tmp_path_factory.mktemp("hostile"))
    assert_every_delivery_accounted_for(batch, run)


def uid(name: str) -> str:
    return str(uuid.uuid5(SAMPLE, name))


ODD_HEADERS: dict[str, Any] = {
    "big-int": 2**70,
    "negative": -1,
    "float": 1.5,
    "nan": math.nan,
    "-inf": -math.inf,
    "true": True,
    "none": None,
    "bytes": b"\x00\xff",
    "nested": {"a": [1, {"b": None}], "c": {"d": [b"e", 2.5]}},
    "list": [1, "two", 3.0, None, [True]],
    "long": "L" * 100_000,
    "unicode": "grüße ✓",
    "empty": "",
}


def named_cases() -> dict[str, Delivery]:
    """Named hostile deliveries, each with what must become of it."""

    def ok(body: bytes = b'{"ref": 1}', **kwargs: Any) -> Delivery:
        delivery = Delivery(body, **kwargs)
        delivery.key = claim_key(delivery.message_id, delivery.headers)
        return delivery

    def dead(reason: str, fragment: str, body: bytes = b'{"ref": 1}', **kwargs: Any) -> Delivery:
        return Delivery(body, expected=reason, fragment=fragment, **kwargs)

    text, raw = "text/plain", "application/octet-stream"
    return {
        "valid-json": ok(message_id=uid("valid")),
        "valid-upper-case-id": ok(message_id=uid("upper").upper()),
        "valid-32-hex-id": ok(message_id=uuid.UUID(uid("hex")).hex),
        "redelivery-spelled-in-upper-case": ok(message_id=uid("valid").upper()),
        "no-message-id": dead(MISSING, "no message_id"),
        "empty-message-id": dead(MISSING, "no message_id", message_id=""),
        "blank-message-id": dead(INVALID_ID, "canonical", message_id=" "),
        "braced-message-id": dead(INVALID_ID, "canonical", message_id="{" + uid("b") + "}"),
        "urn-message-id": dead(INVALID_ID, "canonical", message_id="urn:uuid:" + uid("u")),
        "int-message-id": dead(INVALID_ID, "got int", message_id=42),
        "bytes-15-message-id": dead(INVALID_ID, "got 15", message_id=b"x" * 15),
        "huge-message-id": dead(INVALID_ID, "1000002 characters", message_id="x" * 1_000_000),
        "invalid-utf8-json": dead(
            UNDECODABLE, "not valid utf-8", b'{"ref": "\xff"}', message_id=uid("8j")
        ),
        "invalid-utf8-text": dead(
            UNDECODABLE, "not valid utf-8", b"caf\xe9", content_type=text, message_id=uid("8t")
        ),
        "utf8-encoded-surrogate": dead(
            UNDECODABLE, "not valid utf-8", b'"\xed\xa0\x80"', message_id=uid("su")
        ),
        "truncated-json": dead(UNDECODABLE, "not valid JSON", b'{"ref": ', message_id=uid("t")),
        "empty-json-body": dead(UNDECODABLE, "not valid JSON", b"", message_id=uid("e")),
        "no-content-type-garbage": dead(
            UNDECODABLE, "JSON assumed", b"\x00raw", content_type=None, message_id=uid("n")
        ),
        "no-content-type-json": ok(b'{"ref": 2}', content_type=None, message_id=uid("nj")),
        "json-nested-100000-deep": dead(
            UNDECODABLE, "nested too deeply", DEEP_INVALID, message_id=uid("deep")
        ),
        "json-nested-200-deep": ok(DEEP_VALID, message_id=uid("deep-ok")),
        "json-5000-digit-int": dead(UNDECODABLE, "digits", LONG_INT, message_id=uid("int")),
        "huge-valid-json-3MB": ok(HUGE_JSON, message_id=uid("huge")),
        "huge-garbage-json-3MB": dead(
            UNDECODABLE, "not valid utf-8", HUGE_GARBAGE, message_id=uid("garbage")
        ),
        "huge-raw-3MB": ok(HUGE_GARBAGE, content_type=raw, message_id=uid("raw")),
        "unknown-charset": dead(
            UNDECODABLE,
            "no-such-codec",
            b"x",
            content_type="text/plain; charset=no-such-codec",
            message_id=uid("cs"),
        ),
        "binary-to-binary-codec-as-charset": dead(
            UNDECODABLE,
            "rot13",
            b"x",
            content_type="text/plain; charset=rot13",
            message_id=uid("rot"),
        ),
        "unknown-content-encoding": dead(
            UNDECODABLE, "no-such-codec", content_encoding="no-such-codec", message_id=uid("ce")
        ),
        "pickle-stays-bytes": ok(
            b"\x80\x04K\x01.", content_type="application/x-python-serialize", message_id=uid("p")
        ),
        "garbage-compression": dead(
            UNDECODABLE,
            "cannot decompress",
            NOT_COMPRESSED,
            headers={"compression": "zlib"},
            message_id=uid("z"),
        ),
        "unhashable-compression": dead(
            UNDECODABLE,
            "cannot decompress",
            NOT_COMPRESSED,
            headers={"compression": {"a": 1}},
            message_id=uid("zu"),
        ),
        "zlib-compressed-json": ok(
            zlib.compress(b'{"ref": 3}'), headers={"compression": "zlib"}, message_id=uid("zok")
        ),
        **{
            f"idempotency-key-{label}": dead(
                INVALID_MESSAGE,
                IDEMPOTENCY_KEY_HEADER,
                headers={IDEMPOTENCY_KEY_HEADER: value},
                message_id=uid(f"idem-{label}"),
            )
            for label, value in {
                "int": 7,
                "empty": "",
                "nan": math.nan,
                "bool": True,
                "bytes": b"order-7",
                "list": ["order-7"],
                "dict": {"key": "order-7"},
            }.items()
        },
        "idempotency-key-1MB": ok(
            headers={IDEMPOTENCY_KEY_HEADER: "k" * 1_000_000}, message_id=uid("idem-huge")
        ),
        "idempotency-key-resent-1": ok(
            headers={IDEMPOTENCY_KEY_HEADER: "order-42"}, message_id=uid("resent-1")
        ),
        "idempotency-key-resent-2": ok(
            headers={IDEMPOTENCY_KEY_HEADER: "order-42"}, message_id=uid("resent-2")
        ),
        "type-int": dead(INVALID_MESSAGE, "type must be a str", type=5, message_id=uid("ti")),
        "type-bytes": dead(INVALID_MESSAGE, "type must be a str", type=b"op", message_id=uid("tb")),
        "type-missing": dead(UNHANDLED, "None", type=None, message_id=uid("tn")),
        "type-empty": dead(UNHANDLED, "no handler", type="", message_id=uid("te")),
        "type-other-case": dead(UNHANDLED, "'OP'", type="OP", message_id=uid("tc")),
        "type-100k": dead(UNHANDLED, "no handler", type="t" * 100_000, message_id=uid("th")),
        "odd-header-values": ok(headers=ODD_HEADERS, message_id=uid("odd")),
        "odd-header-values-failing": dead(
            HANDLER_FAILED,
            "failing on purpose",
            headers=ODD_HEADERS,
            fail=True,
            message_id=uid("odd-fail"),
        ),
        "forged-inbox-headers": dead(
            HANDLER_FAILED,
            "failing on purpose",
            headers={
                h.REASON: "forged",
                h.TRIES: "many",
                h.ERROR: 5,
                h.SOURCE_QUEUE: "elsewhere",
            },
            fail=True,
            message_id=uid("forged"),
        ),
    }


NAMED = list(named_cases())


@pytest.fixture(scope="module")
def named_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Delivery], Run]:
    cases = named_cases()
    return cases, run_batch(list(cases.values()), tmp_path_factory.mktemp("named"))


def test_named_hostile_deliveries_all_end_acked_once_or_dead_lettered(
    named_run: tuple[dict[str, Delivery], Run],
) -> None:
    cases, run = named_run
    assert_every_delivery_accounted_for(list(cases.values()), run)


@pytest.mark.parametrize("name", NAMED)
def test_named_hostile_delivery(name: str, named_run: tuple[dict[str, Delivery], Run]) -> None:
    cases, run = named_run
    delivery = cases[name]
    dead = run.dead.get(delivery.seq)
    if delivery.expected is None:
        assert dead is None, dead.headers[h.ERROR]
        committed = {cases_key(cases, seq) for _, seq in run.effects}
        assert delivery.key in committed
    else:
        assert dead is not None
        assert_dead_letter(delivery, dead, run.queue)


def cases_key(cases: dict[str, Delivery], seq: int) -> bytes | None:
    return next(d.key for d in cases.values() if d.seq == seq)


# --- Bugs at the worker --------------------------------------------------------------------

CRASHING_CHARSETS = {
    "charset-undefined": ("text/plain; charset=undefined", "binary", b"anything"),
    "charset-punycode": ("application/json; charset=punycode", "binary", b'"x"'),
    "charset-idna": ("text/plain; charset=idna", "binary", b"xn--zz"),
    "content-encoding-undefined": ("application/json", "undefined", b"{}"),
}


# Regression: decode_body caught (LookupError, UnicodeDecodeError) only, but the 'undefined',
# 'punycode' and 'idna' codecs raise a plain UnicodeError. It escaped Worker.run: on RabbitMQ
# the unacked delivery came back and crashed the next worker too; on memory:// it was lost.
@pytest.mark.parametrize(
    ("content_type", "content_encoding", "body"),
    CRASHING_CHARSETS.values(),
    ids=CRASHING_CHARSETS.keys(),
)
def test_a_charset_whose_codec_raises_unicode_error_is_dead_lettered_not_a_crash(
    tmp_path: Path, content_type: str, content_encoding: str, body: bytes
) -> None:
    bad = Delivery(
        body,
        content_type,
        content_encoding,
        message_id=uid(content_type + content_encoding),
        expected=UNDECODABLE,
    )
    good = Delivery(b'{"ref": 1}', message_id=uid("after-the-bad-one"))
    good.key = claim_key(good.message_id, good.headers)
    run = run_batch([bad, good], tmp_path)
    assert_every_delivery_accounted_for([bad, good], run)


# Regression: a lone surrogate in the idempotency-key header passed Message(), then uuid5()
# raised UnicodeEncodeError in Inbox.process: the worker retried it as a handler failure and
# dead-lettered it as handler-failed after max tries. py-amqp decodes header strings with
# surrogatepass, so RabbitMQ delivers such headers too.
def test_an_idempotency_key_with_a_lone_surrogate_is_dead_lettered_at_once(
    tmp_path: Path,
) -> None:
    bad = Delivery(
        b"{}",
        headers={IDEMPOTENCY_KEY_HEADER: "order-\ud800"},
        message_id=uid("surrogate-key"),
        expected=INVALID_MESSAGE,
    )
    run = run_batch([bad], tmp_path)
    assert_every_delivery_accounted_for([bad], run)


# Regression: a producer-set x-inbox-tries of 2**63 - 1 plus a failing handler made the worker
# write x-inbox-tries = 2**63, which py-amqp cannot encode: struct.error escaped Worker.run and
# the unacked delivery crashed every worker that received it. (memory:// encodes no headers.)
def test_a_forged_huge_try_count_does_not_crash_the_worker_on_rabbitmq(
    rabbit: Rabbit, tmp_path: Path
) -> None:
    engine, inbox = memory_inbox(tmp_path / "inbox.db")
    queue = rabbit.queue()
    worker = Worker(inbox, rabbit.url, [queue], retry=RetryPolicy((0.2,), max_tries=2))
    worker.prepare()
    try:
        with Connection(rabbit.url) as connection:
            connection.Producer().publish(
                b"{}",
                routing_key=queue,
                content_type="application/json",
                content_encoding="utf-8",
                message_id=uid("forged-tries"),
                type="op",
                headers={h.TRIES: 2**63 - 1, SEQ: 0, FAIL: True},
            )
        worker.run(idle_timeout=1.5)
    finally:
        engine.dispose()
    assert worker.stats.dead_lettered == 1
    assert rabbit.depth(queue) == 0


# Regression: py-amqp decodes a body whose content_encoding names a text codec and the worker
# encoded it back, which is not lossless (UTF-16 gained a BOM, unicode_escape lost its
# escapes): handlers and retry and dead-letter copies got other bytes than were sent.
def test_a_raw_body_reaches_the_handler_and_the_dead_letter_byte_for_byte_on_rabbitmq(
    rabbit: Rabbit, tmp_path: Path
) -> None:
    engine = create_engine(f"sqlite:///{tmp_path / 'inbox.db'}")
    inbox_metadata.create_all(engine)
    inbox = Inbox(sessionmaker(engine))
    seen: list[object] = []

    @inbox.handler("op", name=HANDLER)
    def keep(message: Message, session: Session) -> None:
        seen.append(message.body)
        raise RuntimeError("dead-letter it")

    queue = rabbit.queue()
    worker = Worker(inbox, rabbit.url, [queue], retry=RetryPolicy((0.2,), max_tries=1))
    worker.prepare()
    sent = {"utf-16": b"ab", "unicode_escape": b"\\x41"}
    try:
        with Connection(rabbit.url) as connection:
            for encoding, body in sent.items():
                connection.Producer().publish(
                    body,
                    routing_key=queue,
                    content_type="application/octet-stream",
                    content_encoding=encoding,
                    message_id=uid(encoding),
                    type="op",
                )
        worker.run(idle_timeout=1.5)
    finally:
        engine.dispose()
    assert seen == list(sent.values())
    # Read the dead letters with pika, which hands bodies over undecoded.
    parameters = pika.URLParameters(rabbit.url.rstrip("/") + "/%2F")
    with pika.BlockingConnection(parameters) as connection:
        channel = connection.channel()
        dead: dict[str, bytes] = {}
        while True:
            method, properties, body = channel.basic_get(f"{queue}.dlq", auto_ack=True)
            if method is None:
                break
            dead[properties.content_encoding] = body
    assert dead == sent


# ---------------------------------------------------------------------------------------------
# Handler names
# ---------------------------------------------------------------------------------------------


def noop(message: Message, session: Session) -> None:
    """A handler that writes nothing: only its claim commits."""


AT_THE_LIMIT = {
    "ascii": "n" * HANDLER_NAME_MAX_LENGTH,
    "two-byte-utf8": "é" * HANDLER_NAME_MAX_LENGTH,
    "four-byte-utf8": "\N{SLIGHTLY SMILING FACE}" * HANDLER_NAME_MAX_LENGTH,
    "inner-spaces": "a" + " " * (HANDLER_NAME_MAX_LENGTH - 2) + "b",
}


def test_names_at_the_column_limit_make_real_claims_on_every_backend(db: Database) -> None:
    inbox = Inbox(db.sessions)
    for name in AT_THE_LIMIT.values():
        inbox.handler("t", name=name)(noop)
    message = Message.new("t", None)

    assert inbox.process(message).outcomes == dict.fromkeys(AT_THE_LIMIT.values(), "processed")
    assert inbox.process(message).outcomes == dict.fromkeys(AT_THE_LIMIT.values(), "duplicate")
    with db.engine.connect() as connection:
        stored = connection.execute(select(inbox_message.c.handler)).scalars().all()
    assert sorted(stored) == sorted(AT_THE_LIMIT.values())  # stored exactly, not truncated


@pytest.mark.parametrize(
    "name",
    [name + name[-1] for name in AT_THE_LIMIT.values()],
    ids=list(AT_THE_LIMIT),
)
def test_one_character_over_the_limit_is_a_registration_error(name: str) -> None:
    inbox = Inbox(sessionmaker(create_engine("sqlite://")))
    with pytest.raises(RegistrationError, match="is 256 characters"):
        inbox.handler("t", name=name)(noop)
    assert inbox.handlers == ()


EDGE_NAMES = {
    "leading-space": (" billing", "whitespace"),
    "trailing-space": ("billing ", "whitespace"),
    "leading-tab": ("\tbilling", "whitespace"),
    "trailing-newline": ("billing\n", "whitespace"),
    "nbsp": ("\u00a0billing", "whitespace"),
    "ideographic-space": ("billing\u3000", "whitespace"),
    "leading-nul": ("\x00billing", "NUL"),
    "trailing-nul": ("billing\x00", "NUL"),
    "only-nul": ("\x00", "NUL"),
}


@pytest.mark.parametrize(("name", "fragment"), EDGE_NAMES.values(), ids=EDGE_NAMES.keys())
def test_names_with_edge_whitespace_or_nul_are_registration_errors(
    name: str, fragment: str
) -> None:
    inbox = Inbox(sessionmaker(create_engine("sqlite://")))
    with pytest.raises(RegistrationError, match=fragment):
        inbox.handler("t", name=name)(noop)
    assert inbox.handlers == ()


def must_refuse_name(name: str) -> bool:
    blank_or_padded = not name.strip() or name != name.strip()
    return blank_or_padded or len(name) > 255 or "\x00" in name or not is_text_key(name)


@settings(max_examples=150, deadline=None)
# Any text, long text around the limit, and text with lone surrogates (which st.text() never
# generates by default).
@given(
    st.text(max_size=40)
    | st.text(min_size=250, max_size=260)
    | st.text(st.characters(codec=None, categories=["Cs", "Ll"]), min_size=1, max_size=5)
)
def test_any_name_is_refused_with_a_reason_or_makes_an_exact_claim(name: str) -> None:
    engine = create_engine("sqlite://")
    inbox_metadata.create_all(engine)
    inbox = Inbox(sessionmaker(engine))
    if must_refuse_name(name):
        with pytest.raises(RegistrationError, match="handler name"):
            inbox.handler("t", name=name)(noop)
        return
    inbox.handler("t", name=name)(noop)
    message = Message.new("t", None)
    assert inbox.process(message).outcomes == {name: Outcome.PROCESSED}
    assert inbox.process(message).outcomes == {name: Outcome.DUPLICATE}
    with engine.connect() as connection:
        assert connection.execute(select(inbox_message.c.handler)).scalar_one() == name


# Regression: a name with a lone surrogate was accepted; no driver can encode it, so every
# message then failed that handler (HandlerFailed: UnicodeEncodeError).
def test_a_name_with_a_lone_surrogate_is_a_registration_error() -> None:
    inbox = Inbox(sessionmaker(create_engine("sqlite://")))
    with pytest.raises(RegistrationError):
        inbox.handler("t", name="billing.\ud800charge")(noop)


# ---------------------------------------------------------------------------------------------
# Business keys
# ---------------------------------------------------------------------------------------------


@dataclass
class KeyedInbox:
    engine: Engine
    inbox: Inbox
    ran: list[str]

    def count(self, table: Any) -> int:
        with self.engine.connect() as connection:
            return len(connection.execute(select(table)).all())


@pytest.fixture
def keyed(tmp_path: Path) -> Iterator[Callable[[Callable[[Message], object]], KeyedInbox]]:
    """An inbox on a SQLite file with a keyless handler and one whose key= is given."""
    engines: list[Engine] = []

    def make(key: Callable[[Message], object]) -> KeyedInbox:
        engine = create_engine(f"sqlite:///{tmp_path / f'keys-{len(engines)}.db'}")
        engines.append(engine)
        inbox_metadata.create_all(engine)
        effects_metadata.create_all(engine)
        made = KeyedInbox(engine, Inbox(sessionmaker(engine)), [])

        def write(name: str) -> Callable[[Message, Session], None]:
            def handler(message: Message, session: Session) -> None:
                made.ran.append(name)
                session.execute(insert(effects).values(ref=message.id.hex, handler=name))

            return handler

        made.inbox.handler("t", name="a.keyless")(write("a.keyless"))
        made.inbox.handler("t", name="b.keyed", key=key)(write("b.keyed"))  # type: ignore[arg-type]
        return made

    yield make
    for engine in engines:
        engine.dispose()


class Opaque:
    """An object with no key meaning."""


BAD_KEYS: dict[str, tuple[object, str]] = {
    "float": (1.5, "got float"),
    "nan": (math.nan, "got float"),
    "bool": (True, "got bool"),
    "object": (Opaque(), "got Opaque"),
    "bytes-0": (b"", "got 0"),
    "bytes-15": (bytes(15), "got 15"),
    "bytes-17": (bytes(17), "got 17"),
    "bytearray-16": (bytearray(16), "got bytearray"),
    "memoryview-16": (memoryview(bytes(16)), "got memoryview"),
    "list": ([1, 2], "got list"),
    "uuid-string-of-the-wrong-kind": (str(SAMPLE).encode(), "got 36"),
    "lone-surrogate": ("order-\ud800", "surrogate"),
}


@pytest.mark.parametrize(("value", "fragment"), BAD_KEYS.values(), ids=BAD_KEYS.keys())
def test_a_bad_business_key_is_invalid_key_and_nothing_runs_or_commits(
    keyed: Callable[[Callable[[Message], object]], KeyedInbox], value: object, fragment: str
) -> None:
    made = keyed(lambda message: value)
    message = Message.new("t", None)

    with pytest.raises(InvalidKey) as error:
        made.inbox.process(message)

    assert fragment in str(error.value)
    assert (error.value.handler, error.value.message_id) == ("b.keyed", message.id)
    assert made.ran == []  # not even the keyless handler registered before it
    assert made.count(inbox_message) == 0
    assert made.count(effects) == 0


def test_a_huge_string_key_works_and_maps_to_the_same_claim_every_time(
    keyed: Callable[[Callable[[Message], object]], KeyedInbox],
) -> None:
    huge = "order-" + "9" * 10_000_000
    made = keyed(lambda message: huge if message.body == "first" else huge[:-1] + "8")
    again = Inbox(sessionmaker(made.engine))  # another process would build its own inbox
    again.handler("t", name="b.keyed", key=lambda message: huge)(noop)

    assert made.inbox.process(Message.new("t", "first")).outcomes["b.keyed"] == "processed"
    assert again.process(Message.new("t", "resent")).outcome is Outcome.DUPLICATE
    assert made.inbox.process(Message.new("t", "other")).outcomes["b.keyed"] == "processed"
    with made.engine.connect() as connection:
        keys = connection.execute(
            select(inbox_message.c.message_id).where(inbox_message.c.handler == "b.keyed")
        ).scalars()
        assert set(keys) == {
            uuid.uuid5(KEY_NAMESPACE, huge),
            uuid.uuid5(KEY_NAMESPACE, huge[:-1] + "8"),
        }


# Regression: Inbox.process raised a bare UnicodeEncodeError (from uuid5) for this header.
def test_an_idempotency_key_header_with_a_lone_surrogate_is_a_specific_error(
    keyed: Callable[[Callable[[Message], object]], KeyedInbox],
) -> None:
    made = keyed(lambda message: "fine")
    with pytest.raises((InvalidMessage, InvalidKey)):
        made.inbox.process(Message.new("t", None, {IDEMPOTENCY_KEY_HEADER: "order-\ud800"}))
    assert made.count(inbox_message) == 0


# ---------------------------------------------------------------------------------------------
# inbox-cleanup arguments
# ---------------------------------------------------------------------------------------------

SECRET = "s3cr3t-pw"
URL_WITH_PASSWORD = f"postgresql+psycopg://app:{SECRET}@127.0.0.1:1/app"


@dataclass
class CliResult:
    code: int
    out: str
    err: str


@pytest.fixture
def cli(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Callable[[list[str]], CliResult]]:
    """Run inbox-cleanup in-process and fail the test if it connected to any database or
    executed any SQL (listeners on every Pool and Engine) or created its SQLite file."""
    monkeypatch.delenv("INBOX_DATABASE_URL", raising=False)
    never = tmp_path / "never.db"
    touched: list[str] = []

    def on_connect(dbapi_connection: object, record: object) -> None:
        touched.append("connect")

    def on_execute(connection: object, cursor: object, statement: str, *args: object) -> None:
        touched.append(statement)

    event.listen(Pool, "connect", on_connect)
    event.listen(Engine, "before_cursor_execute", on_execute)

    def run(argv: list[str]) -> CliResult:
        if not any(arg.startswith("--database-url") or "://" in arg for arg in argv):
            argv = [*argv, "--database-url", f"sqlite:///{never}"]
        out, err = io.StringIO(), io.StringIO()
        code = cleanup_main(argv, stdout=out, stderr=err)
        return CliResult(code, out.getvalue(), err.getvalue())

    try:
        yield run
    finally:
        event.remove(Pool, "connect", on_connect)
        event.remove(Engine, "before_cursor_execute", on_execute)
    assert touched == [], "a usage error must be reported before any SQL"
    assert not never.exists()


def assert_usage_error(result: CliResult, fragment: str) -> None:
    assert result.code == 2
    assert result.out == ""
    assert "Traceback" not in result.err
    errors = [line for line in result.err.splitlines() if line.startswith("inbox-cleanup: error:")]
    assert len(errors) == 1, result.err
    assert fragment in errors[0]


BAD_ARGUMENTS = {
    "days-10**9": (["--days", str(10**9)], "before year 1"),
    "days-timedelta-max": (["--days", "999999999"], "before year 1"),
    "days-800000": (["--days", "800000"], "before year 1"),
    "days-5000-digits": (["--days", "9" * 5000], "whole number"),
    "days-hugely-negative": (["--days", "-" + "9" * 30], "at least 1"),
    "days-equals-negative": (["--days=-5"], "at least 1"),
    "days-minus-zero": (["--days", "-0"], "at least 1"),
    "days-exponent": (["--days", "1e3"], "whole number"),
    "days-hex": (["--days", "0x10"], "whole number"),
    "days-inf": (["--days", "inf"], "whole number"),
    "days-nan": (["--days", "nan"], "whole number"),
    "days-empty": (["--days", ""], "whole number"),
    "days-decimal-comma": (["--days", "1,5"], "whole number"),
    "days-without-value": (["--days"], "expected one argument"),
    "batch-size-10**30": (["--days", "30", "--batch-size", str(10**30)], "between 1 and"),
    "batch-size-negative": (["--days", "30", "--batch-size", "-1"], "between 1 and"),
    "batch-size-float": (["--days", "30", "--batch-size", "2.5"], "whole number"),
}


@pytest.mark.parametrize(("argv", "fragment"), BAD_ARGUMENTS.values(), ids=BAD_ARGUMENTS.keys())
def test_bad_numbers_are_one_line_usage_errors_before_any_sql(
    cli: Callable[[list[str]], CliResult], argv: list[str], fragment: str
) -> None:
    assert_usage_error(cli(argv), fragment)


BAD_TABLES = {
    "sql-injection": "x; drop table y",
    "schema-injection": "public; drop table y.inbox_message",
    "three-parts": "a.b.c",
    "empty": "",
    "double-quoted": '"inbox_message"',
    "backticks": "`inbox_message`",
    "brackets": "[inbox_message]",
    "single-quote": "inbox'message",
    "comment": "inbox_message--",
    "space": "inbox message",
    "unicode": "inbox_méssage",
    "leading-digit": "1inbox",
    "64-characters": "x" * 64,
    "trailing-dot": "inbox.",
    "double-dot": "a..b",
    "newline": "inbox_message\n",
    "nul": "inbox\x00message",
}


@pytest.mark.parametrize("table", BAD_TABLES.values(), ids=BAD_TABLES.keys())
def test_table_names_that_are_not_plain_identifiers_exit_2_before_any_sql(
    cli: Callable[[list[str]], CliResult], table: str
) -> None:
    result = cli(["--days", "30", "--table", table])
    assert_usage_error(result, "must be a plain identifier")


# Regression: '.inbox_message' was read as "no schema" and ran against inbox_message.
def test_a_table_name_with_an_empty_schema_part_is_refused(
    cli: Callable[[list[str]], CliResult],
) -> None:
    assert_usage_error(cli(["--days", "30", "--table", ".inbox_message"]), "plain identifier")


@pytest.mark.parametrize(
    "argv",
    [
        ["--days", "0", "--database-url", URL_WITH_PASSWORD],
        ["--days", "30", "--batch-size", "0", "--database-url", URL_WITH_PASSWORD],
        ["--days", "30", "--table", "x;y", "--database-url", URL_WITH_PASSWORD],
        ["--database-url", URL_WITH_PASSWORD],
        [f"--database-url={URL_WITH_PASSWORD}", "--days", "x"],
    ],
    ids=["bad-days", "bad-batch-size", "bad-table", "no-days", "equals-form"],
)
def test_usage_errors_never_print_the_password(
    cli: Callable[[list[str]], CliResult], argv: list[str]
) -> None:
    result = cli(argv)
    assert result.code == 2
    assert SECRET not in result.out + result.err


# Regression: argparse's "unrecognized arguments: ..." echoed a URL given without
# --database-url, or under a mistyped flag, whole: password included.
@pytest.mark.parametrize(
    "argv",
    [["--days", "30", URL_WITH_PASSWORD], ["--days", "30", "--db-url", URL_WITH_PASSWORD]],
    ids=["positional-url", "mistyped-flag"],
)
def test_a_misplaced_url_is_not_echoed_with_its_password(
    cli: Callable[[list[str]], CliResult], argv: list[str]
) -> None:
    result = cli(argv)
    assert result.code == 2
    assert SECRET not in result.err


# Regression: a URL without '@host' (postgresql://app:PASSWORD/db) made make_url raise a bare
# ValueError for the "port", printed as it was: "invalid literal for int() with base 10:
# 'PASSWORD'" — the password, and no word of --database-url.
def test_a_url_without_host_is_reported_without_echoing_what_sits_in_the_port(
    cli: Callable[[list[str]], CliResult],
) -> None:
    result = cli(["--days", "30", "--database-url", f"postgresql://app:{SECRET}/app"])
    assert_usage_error(result, "--database-url")
    assert SECRET not in result.err


# ---------------------------------------------------------------------------------------------
# No SQL from string formatting
# ---------------------------------------------------------------------------------------------

RAW_SQL_CALLS = {"text", "literal_column", "exec_driver_sql", "DDL", "TextClause"}
EXECUTING_CALLS = {"execute", "exec_driver_sql", "executemany", "executescript"}


def is_built_string(node: ast.expr) -> bool:
    """An f-string, a %- or +-formatted string, a .format() or .join() call."""
    if isinstance(node, ast.JoinedStr):
        return True
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod | ast.Add):
        return any(
            (isinstance(side, ast.Constant) and isinstance(side.value, str))
            or is_built_string(side)
            for side in (node.left, node.right)
        )
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in ("format", "join")
    )


def is_compiled_construct(node: ast.expr) -> bool:
    """``str(<construct>.compile(...))``: SQL that SQLAlchemy rendered from a statement."""
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "str"
        and len(node.args) == 1
        and isinstance(node.args[0], ast.Call)
        and isinstance(node.args[0].func, ast.Attribute)
        and node.args[0].func.attr == "compile"
    )


def raw_sql_findings(source: str) -> tuple[list[str], list[str]]:
    """(every raw-SQL call with its first argument, the ones whose SQL text is computed).

    A name bound to ``str(<construct>.compile(...))`` counts as safe SQL: SQLAlchemy
    rendered it from a statement, with bound parameters, and no string was formatted.
    """
    found: list[str] = []
    bad: list[str] = []
    tree = ast.parse(source)
    rendered = {
        target.id
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign) and is_compiled_construct(node.value)
        for target in node.targets
        if isinstance(target, ast.Name)
    }
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        first = node.args[0] if node.args else None
        if name in RAW_SQL_CALLS:
            found.append(f"{name}({ast.unparse(first) if first else ''})")
            literal = isinstance(first, ast.Constant) and isinstance(first.value, str)
            compiled = isinstance(first, ast.Name) and first.id in rendered
            if not literal and not compiled:
                bad.append(f"line {node.lineno}: {name}() of a computed string")
        if name in EXECUTING_CALLS and first is not None and is_built_string(first):
            bad.append(f"line {node.lineno}: {name}() of a formatted string")
    return found, bad


def test_the_checker_catches_formatted_sql() -> None:
    for snippet in [
        'text(f"DELETE FROM {table}")',
        'text("DELETE FROM %s" % table)',
        'text("DELETE FROM {}".format(table))',
        'literal_column("x" + name)',
        'connection.exec_driver_sql(f"SELECT {x}")',
        'connection.execute("SELECT " + x)',
        "text(sql)",
        "sql = str(name)\nconnection.exec_driver_sql(sql)",
        "sql = str(query).format(x)\nconnection.exec_driver_sql(sql)",
    ]:
        assert raw_sql_findings(snippet)[1], snippet
    assert raw_sql_findings('text("SELECT 1"); connection.execute(select(t))')[1] == []
    rendered = "sql = str(insert(t).compile(dialect=d))\nconnection.exec_driver_sql(sql, params)"
    assert raw_sql_findings(rendered)[1] == []


def test_no_sql_in_the_library_is_built_by_string_formatting() -> None:
    library = Path(inbox_package.__file__).parent
    found: dict[str, list[str]] = {}
    for path in sorted(library.rglob("*.py")):
        calls, bad = raw_sql_findings(path.read_text(encoding="utf-8"))
        assert bad == [], f"{path.relative_to(library)}: {bad}"
        if calls:
            found[path.relative_to(library).as_posix()] = calls
    # The library's only raw SQL: two constant pseudo-column names, and the PostgreSQL claim
    # that SQLAlchemy rendered once from the insert construct. Table and schema names reach
    # SQL as sqlalchemy Table objects (quoted by the dialect) after resolve_table() has
    # refused anything but plain identifiers; values are always bound parameters.
    assert found == {
        "claim.py": ["exec_driver_sql(sql)"],
        "retention.py": ["literal_column('ctid')", "literal_column('rowid')"],
    }
