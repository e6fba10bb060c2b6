"""Hostile input at the message-id edge: every wrong id is InvalidMessage naming the problem,
and the inbox is stricter than uuid.UUID. test_message.py holds the common cases; this file
covers what it leaves out, with property-based tests over whole input spaces and tables of
named cases (strategies in support/strategies.py, the oracle in support/hostile.py).

Tests whose comment starts "Regression:" reproduce library bugs the hostile-input suite found
(at 5467c00); each comment says what used to happen.
"""

from __future__ import annotations

import string
import uuid
from decimal import Decimal
from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st
from support.hostile import SAMPLE, is_canonical_id
from support.strategies import near_ids, non_id_objects

from inbox import InvalidMessage, Message
from inbox.message import parse_message_id


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


@given(non_id_objects)
def test_any_other_object_is_invalid_message_naming_its_type(value: object) -> None:
    with pytest.raises(InvalidMessage) as error:
        parse_message_id(value)
    expected = "no id" if value is None else f"got {type(value).__name__}"
    assert expected in str(error.value)
