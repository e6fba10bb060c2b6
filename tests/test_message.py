"""Message construction, id validation and key mapping: everything that enters from outside."""

from __future__ import annotations

import dataclasses
import pickle
import time
import uuid
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from inbox import KEY_NAMESPACE, InvalidMessage, Message, uuid7
from inbox.message import key_bytes, parse_message_id

SAMPLE = uuid.UUID("0191e5b4-3c2a-7d4e-9f10-123456789abc")


@pytest.mark.parametrize(
    "given_id",
    [
        SAMPLE,
        str(SAMPLE),
        str(SAMPLE).upper(),
        SAMPLE.hex,
        SAMPLE.hex.upper(),
        SAMPLE.bytes,
        bytearray(SAMPLE.bytes),
    ],
    ids=["uuid", "canonical", "canonical-upper", "hex32", "hex32-upper", "bytes", "bytearray"],
)
def test_accepted_id_forms_normalise_to_the_same_uuid(given_id: Any) -> None:
    message = Message(id=given_id, type="t", body=None)
    assert message.id == SAMPLE
    assert isinstance(message.id, uuid.UUID)


@pytest.mark.parametrize(
    ("given_id", "fragment"),
    [
        (None, "no id"),
        (42, "got int"),
        (SAMPLE.int, "got int"),
        (1.5, "got float"),
        (True, "got bool"),
        ("not-a-uuid", "'not-a-uuid'"),
        ("", "canonical"),
        ("{" + str(SAMPLE) + "}", "canonical"),
        ("urn:uuid:" + str(SAMPLE), "canonical"),
        (str(SAMPLE)[:-1], "canonical"),
        (" " + str(SAMPLE), "canonical"),
        (b"\x00" * 15, "got 15"),
        (b"\x00" * 17, "got 17"),
        (str(SAMPLE).encode(), "got 36"),
        ([1, 2], "got list"),
    ],
)
def test_rejected_ids_raise_invalid_message_naming_the_problem(
    given_id: Any, fragment: str
) -> None:
    with pytest.raises(InvalidMessage, match=fragment.replace("{", r"\{")):
        Message(id=given_id, type="t", body=None)


def test_a_huge_bad_id_is_not_echoed_whole() -> None:
    with pytest.raises(InvalidMessage) as error:
        Message(id="x" * 1_000_000, type="t", body=None)
    assert len(str(error.value)) < 300
    assert "1000002 characters" in str(error.value)


@given(st.text())
def test_any_text_is_either_a_valid_id_or_invalid_message(value: str) -> None:
    try:
        parsed = parse_message_id(value)
    except InvalidMessage:
        return
    assert parsed.hex == value.replace("-", "").lower()


@given(st.binary(min_size=16, max_size=16))
def test_any_16_bytes_round_trip(raw: bytes) -> None:
    assert Message(id=raw, type=None, body=None).id.bytes == raw


@pytest.mark.parametrize("bad_type", [1, b"order.created", ["a"]])
def test_type_must_be_str_or_none(bad_type: Any) -> None:
    with pytest.raises(InvalidMessage, match="type must be a str"):
        Message(id=SAMPLE, type=bad_type, body=None)


def test_message_is_frozen_and_headers_are_a_read_only_copy() -> None:
    headers = {"trace": "abc"}
    message = Message(id=SAMPLE, type="t", body={"a": 1}, headers=headers)
    headers["trace"] = "changed"
    assert message.headers["trace"] == "abc"
    with pytest.raises(TypeError):
        message.headers["trace"] = "x"  # type: ignore[index]
    with pytest.raises(dataclasses.FrozenInstanceError):
        message.type = "other"  # type: ignore[misc]


def test_headers_must_be_a_mapping() -> None:
    with pytest.raises(InvalidMessage, match="headers must be a mapping"):
        Message(id=SAMPLE, type="t", body=None, headers=[("a", "b")])  # type: ignore[arg-type]


@pytest.mark.parametrize(("value", "fragment"), [("", "empty str"), (7, "int"), (b"k", "bytes")])
def test_idempotency_key_header_must_be_a_non_empty_string(value: Any, fragment: str) -> None:
    with pytest.raises(InvalidMessage, match=fragment):
        Message(id=SAMPLE, type="t", body=None, headers={"idempotency-key": value})


def test_new_stamps_time_ordered_uuid7_ids() -> None:
    ids = [Message.new("t", None).id for _ in range(50)]
    assert all(i.version == 7 for i in ids)
    assert ids == sorted(ids)
    assert len(set(ids)) == 50
    millis = int.from_bytes(ids[0].bytes[:6], "big")
    assert abs(millis / 1000 - time.time()) < 60


def test_uuid7_is_a_plain_uuid() -> None:
    value = uuid7()
    assert type(value) is uuid.UUID
    assert value.version == 7


def test_string_keys_map_through_the_published_namespace() -> None:
    # Pinned: producers in other languages compute these bytes; they must never change.
    assert uuid.UUID("8aab2b60-68a4-4999-8d5c-14d0fb80cbe2") == KEY_NAMESPACE
    assert key_bytes("order-created-42") == uuid.uuid5(KEY_NAMESPACE, "order-created-42").bytes
    assert (
        key_bytes("order-created-42").hex()
        == uuid.uuid5(
            uuid.UUID("8aab2b60-68a4-4999-8d5c-14d0fb80cbe2"), "order-created-42"
        ).bytes.hex()
    )


@pytest.mark.parametrize(
    ("value", "fragment"),
    [("", "empty"), (None, "NoneType"), (b"123", "16 bytes"), (12, "int"), (1.0, "float")],
)
def test_bad_keys_are_rejected(value: Any, fragment: str) -> None:
    with pytest.raises(ValueError, match=fragment):
        key_bytes(value)


@given(st.text(min_size=1))
def test_every_non_empty_string_key_maps_to_16_bytes_deterministically(value: str) -> None:
    assert key_bytes(value) == key_bytes(value)
    assert len(key_bytes(value)) == 16


def test_messages_pickle_for_process_pools() -> None:
    message = Message(id=SAMPLE, type="t", body={"a": [1, 2]}, headers={"idempotency-key": "k"})
    copy = pickle.loads(pickle.dumps(message))
    assert copy == message
    assert copy.idempotency_key == "k"
