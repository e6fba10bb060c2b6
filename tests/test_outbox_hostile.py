"""Outbox.publish refuses every argument that cannot be sent, at the call and before
anything is written: odd types, ids, bodies, short strings, header values and idempotency
keys, on every backend; and arbitrary arguments either fail that way or are stored so that
they read back exactly as given."""

from __future__ import annotations

import json
import math
import uuid
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from sqlalchemy import StaticPool, create_engine, select
from sqlalchemy.orm import Session
from support.databases import Database
from support.strategies import json_values, near_ids

from inbox import InvalidMessage, Outbox, SessionConfigurationError
from inbox.outbox._amqp_limits import MAX_HEADERS_BYTES
from inbox.outbox._row import row_from_mapping
from inbox.schema import metadata, outbox_message

GOOD: dict[str, Any] = {"type": "order.created", "body": {"order_id": 1}, "routing_key": "orders"}
DEEP: Any = []
for _ in range(100_000):
    DEEP = [DEEP]

# (what is wrong, the arguments that differ from GOOD, what the error says)
HOSTILE: list[tuple[str, dict[str, Any], str]] = [
    ("no type", {"type": None}, "needs a type"),
    ("empty type", {"type": ""}, "needs a type"),
    ("int type", {"type": 5}, "needs a type"),
    ("long type", {"type": "t" * 256}, "256 UTF-8 bytes"),
    ("wide type", {"type": "é" * 128}, "256 UTF-8 bytes"),
    ("NUL type", {"type": "a\x00b"}, "NUL"),
    ("surrogate type", {"type": "\ud800"}, "lone surrogate"),
    ("empty routing key", {"routing_key": ""}, "routing key"),
    ("None routing key", {"routing_key": None}, "routing_key must be a str"),
    ("long routing key", {"routing_key": "r" * 256}, "256 UTF-8 bytes"),
    ("huge routing key", {"routing_key": "r" * 10_000_000}, "10000000 UTF-8 bytes"),
    ("NUL routing key", {"routing_key": "\x00"}, "NUL"),
    ("surrogate routing key", {"routing_key": "q\udfff"}, "lone surrogate"),
    ("long exchange", {"exchange": "e" * 256}, "256 UTF-8 bytes"),
    ("None exchange", {"exchange": None}, "exchange must be a str"),
    ("bytes exchange", {"exchange": b"shop"}, "exchange must be a str"),
    ("NUL exchange", {"exchange": "shop\x00"}, "NUL"),
    ("text id", {"message_id": "not-a-uuid"}, "canonical UUID"),
    ("braced id", {"message_id": "{" + str(uuid.UUID(int=1)) + "}"}, "canonical UUID"),
    ("urn id", {"message_id": uuid.UUID(int=1).urn}, "canonical UUID"),
    ("int id", {"message_id": 12345}, "must be a UUID"),
    ("short bytes id", {"message_id": b"short"}, "exactly 16 bytes"),
    ("huge id", {"message_id": "x" * 1_000_000}, "canonical UUID"),
    ("object body", {"body": object()}, "not JSON-serializable"),
    ("set body", {"body": {1, 2}}, "not JSON-serializable"),
    ("NaN body", {"body": math.nan}, "not JSON-serializable"),
    ("infinite body", {"body": {"x": math.inf}}, "not JSON-serializable"),
    ("bytes keys body", {"body": {b"k": 1}}, "not JSON-serializable"),
    ("deep body", {"body": DEEP}, "not JSON-serializable"),
    ("surrogate body", {"body": {"x": "\ud800"}}, "lone surrogate"),
    ("surrogate text body", {"body": "\udc80", "content_type": "text/plain"}, "lone surrogate"),
    (
        "dict body with content type",
        {"body": {}, "content_type": "application/xml"},
        "bytes or str",
    ),
    ("empty content type", {"body": b"x", "content_type": ""}, "content_type"),
    ("blank content type", {"body": b"x", "content_type": "  "}, "content_type"),
    ("int content type", {"body": b"x", "content_type": 5}, "content_type must be a str"),
    ("long content type", {"body": b"x", "content_type": "c" * 256}, "256 UTF-8 bytes"),
    ("NUL content type", {"body": b"x", "content_type": "text/\x00"}, "NUL"),
    ("empty idempotency key", {"idempotency_key": ""}, "non-empty str"),
    ("int idempotency key", {"idempotency_key": 5}, "non-empty str"),
    ("bytes idempotency key", {"idempotency_key": b"k"}, "non-empty str"),
    ("surrogate idempotency key", {"idempotency_key": "\ud800"}, "lone surrogate"),
    (
        "contradicting idempotency key",
        {"idempotency_key": "a", "headers": {"idempotency-key": "b"}},
        "contradicts",
    ),
    ("empty idempotency-key header", {"headers": {"idempotency-key": ""}}, "non-empty str"),
    ("int idempotency-key header", {"headers": {"idempotency-key": 7}}, "non-empty str"),
    ("list headers", {"headers": [("a", 1)]}, "mapping"),
    ("object header", {"headers": {"k": object()}}, "cannot carry a object"),
    ("huge int header", {"headers": {"k": 2**64}}, "signed 64-bit"),
    ("bytearray header", {"headers": {"k": bytearray(b"x")}}, "use bytes"),
    ("int header name", {"headers": {1: "x"}}, "names must be str"),
    ("long header name", {"headers": {"n" * 256: "x"}}, "256 UTF-8 bytes"),
    ("huge header", {"headers": {"k": "v" * MAX_HEADERS_BYTES}}, "bytes on the wire"),
    ("huge idempotency key", {"idempotency_key": "k" * MAX_HEADERS_BYTES}, "bytes on the wire"),
    ("pre-1970 header", {"headers": {"k": __import__("datetime").datetime(1969, 7, 20)}}, "1970"),
]


@pytest.mark.parametrize(
    ("arguments", "reason"),
    [pytest.param(args, reason, id=name) for name, args, reason in HOSTILE],
)
def test_an_argument_that_cannot_be_sent_is_refused_before_anything_is_written(
    db: Database, arguments: dict[str, Any], reason: str
) -> None:
    call = GOOD | arguments
    outbox = Outbox()
    with Session(db.engine) as session:
        with pytest.raises(InvalidMessage, match=reason):
            outbox.publish(session, call.pop("type"), call.pop("body"), **call)
        assert not session.new
        session.commit()
    assert db.count(outbox_message) == 0


@pytest.mark.parametrize("not_a_session", [None, "session", object()])
def test_something_that_is_not_a_session_is_refused(db: Database, not_a_session: Any) -> None:
    with pytest.raises(SessionConfigurationError, match="takes the sqlalchemy Session"):
        Outbox().publish(not_a_session, "t", {}, routing_key="q")
    with pytest.raises(SessionConfigurationError, match="got Engine"):
        Outbox().publish(db.engine, "t", {}, routing_key="q")
    with db.engine.connect() as connection, pytest.raises(SessionConfigurationError):
        Outbox().publish(connection, "t", {}, routing_key="q")


def test_publish_message_refuses_what_is_no_message_or_has_no_type(db: Database) -> None:
    from inbox import Message

    outbox = Outbox()
    with Session(db.engine) as session:
        with pytest.raises(InvalidMessage, match=r"takes an inbox\.Message"):
            outbox.publish_message(session, {"id": 1}, routing_key="q")  # type: ignore[arg-type]
        with pytest.raises(InvalidMessage, match="has no type"):
            outbox.publish_message(session, Message.new(None, {}), routing_key="q")
        assert not session.new


scalar_headers = st.none() | st.booleans() | st.integers() | st.floats() | st.binary(max_size=8)
header_values = st.recursive(
    scalar_headers | st.text(st.characters(codec=None), max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner),
    max_leaves=6,
)
short_strings = st.text(st.characters(codec=None), max_size=8) | st.sampled_from(
    ["", "x" * 255, "x" * 256, "é" * 127, "é" * 128, "\x00"]
)

plain = st.from_regex(r"[a-z.]{1,8}", fullmatch=True)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.fixed_dictionaries(
        {
            "type": plain | short_strings,
            "body": json_values | st.binary(max_size=16) | st.sampled_from([object(), {1}]),
            "routing_key": plain | short_strings,
            "exchange": short_strings,
            "headers": st.none() | st.dictionaries(st.text(max_size=6), header_values, max_size=3),
            "idempotency_key": st.none() | plain | short_strings,
            "message_id": st.none() | st.uuids() | near_ids(),
        }
    )
)
def test_arguments_are_refused_at_the_call_or_read_back_exactly(call: dict[str, Any]) -> None:
    engine = create_engine("sqlite://", poolclass=StaticPool)
    metadata.create_all(engine)
    arguments = dict(call)
    try:
        with Session(engine) as session:
            try:
                sent_id = Outbox().publish(
                    session, arguments.pop("type"), arguments.pop("body"), **arguments
                )
            except InvalidMessage:
                assert not session.new
                event("refused")
                return
            event("stored")
            session.commit()
        with engine.connect() as connection:
            rows = connection.execute(select(outbox_message))
            [row] = [row_from_mapping(r._mapping) for r in rows]
    finally:
        engine.dispose()
    assert (row.id, row.type, row.routing_key, row.exchange) == (
        sent_id,
        call["type"],
        call["routing_key"],
        call["exchange"],
    )
    if call["message_id"] is not None:
        assert sent_id == uuid.UUID(str(call["message_id"]))
    expected = dict(call["headers"] or {})
    if call["idempotency_key"] is not None:
        expected["idempotency-key"] = call["idempotency_key"]
    assert json.dumps(row.headers, default=repr) == json.dumps(expected, default=repr)
    if isinstance(call["body"], bytes):
        assert (row.body, row.content_type) == (call["body"], "application/octet-stream")
    else:
        assert json.loads(row.body) == call["body"]


EDGE_VALUES: list[tuple[str, dict[str, Any]]] = [
    ("255-byte type", {"type": "t" * 255}),
    ("127 two-byte chars + 1", {"type": "é" * 127 + "x"}),
    ("emoji type", {"type": "order.✓.🎉"}),
    ("trailing space type", {"type": "order.created "}),
    ("spaces in routing key", {"routing_key": " orders  "}),
    ("255-byte routing key", {"routing_key": "r" * 255}),
    ("unicode exchange", {"exchange": "läden", "routing_key": ""}),
    ("control characters", {"type": "a\tb\nc", "routing_key": "\x01"}),
    ("lone surrogate header", {"headers": {"k": "\ud800", "\udfff": 1}}),
    ("NUL in header value", {"headers": {"k": "a\x00b", "raw": b"\x00"}}),
    ("emoji idempotency key", {"idempotency_key": "🎉-order-1"}),
    ("empty bytes body", {"body": b""}),
    ("NUL in text body", {"body": "a\x00b", "content_type": "text/plain"}),
    ("255-byte content type", {"body": b"x", "content_type": "c" * 255}),
]


@pytest.mark.parametrize("arguments", [pytest.param(args, id=name) for name, args in EDGE_VALUES])
def test_odd_but_valid_arguments_are_stored_exactly(
    db: Database, arguments: dict[str, Any]
) -> None:
    call = GOOD | arguments
    expected = dict(call)
    with Session(db.engine) as session, session.begin():
        Outbox().publish(session, call.pop("type"), call.pop("body"), **call)
    with db.engine.connect() as connection:
        [row] = [row_from_mapping(r._mapping) for r in connection.execute(select(outbox_message))]
    assert (row.type, row.routing_key, row.exchange) == (
        expected["type"],
        expected["routing_key"],
        expected.get("exchange", ""),
    )
    headers = dict(expected.get("headers") or {})
    if "idempotency_key" in expected:
        headers["idempotency-key"] = expected["idempotency_key"]
    assert row.headers == headers
    if "content_type" in expected:
        assert row.content_type == expected["content_type"]
    body = expected["body"]
    if isinstance(body, bytes):
        assert row.body == body
    elif isinstance(body, str):
        assert row.body == body.encode()
    else:
        assert json.loads(row.body) == body
