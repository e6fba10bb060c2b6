"""The outbox row format: headers round-trip through their JSON column with every type an
AMQP table carries, and what AMQP cannot carry is refused before it is stored."""

from __future__ import annotations

import datetime as dt
import json
import math
import uuid
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from inbox import InvalidMessage
from inbox.outbox._amqp_limits import MAX_HEADER_DEPTH, MAX_HEADERS_BYTES, check_headers
from inbox.outbox._row import (
    OutboxRow,
    headers_from_json,
    headers_to_json,
    row_from_mapping,
    row_values,
)

EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)

amqp_decimals = st.builds(
    lambda unscaled, places: Decimal(unscaled).scaleb(-places),
    st.integers(-(2**31), 2**31 - 1),
    st.integers(0, 255),
)
amqp_datetimes = st.datetimes(
    min_value=dt.datetime(1970, 1, 2), timezones=st.one_of(st.none(), st.timezones())
)
amqp_scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats()
    | st.text(st.characters(codec=None), max_size=20)
    | st.binary(max_size=20)
    | amqp_decimals
    | amqp_datetimes
)
header_names = st.text(st.characters(codec=None), max_size=12) | st.sampled_from(
    ["$bytes", "$table", "$float", "$decimal", "$datetime", "$other"]
)
amqp_values = st.recursive(
    amqp_scalars,
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.tuples(inner, inner)
        | st.dictionaries(header_names, inner, max_size=3)
    ),
    max_leaves=10,
)


def same(left: Any, right: Any) -> bool:
    """Equal as AMQP sees it: NaN equals NaN, a tuple arrives as a list, a datetime with the
    same wall time and offset, a decimal with the same digits and places."""
    if isinstance(left, float) and isinstance(right, float):
        return (math.isnan(left) and math.isnan(right)) or (
            left == right and math.copysign(1, left) == math.copysign(1, right)
        )
    if isinstance(left, tuple | list):
        return (
            isinstance(right, list)
            and len(left) == len(right)
            and all(same(a, b) for a, b in zip(left, right, strict=True))
        )
    if isinstance(left, dict):
        return (
            isinstance(right, dict)
            and left.keys() == right.keys()
            and all(same(left[k], right[k]) for k in left)
        )
    if isinstance(left, Decimal):
        return isinstance(right, Decimal) and left.as_tuple() == right.as_tuple()
    if isinstance(left, dt.datetime):
        # Wall time and offset: the instant py-amqp sends, even for an ambiguous local
        # time (which never compares equal across zones).
        return (
            isinstance(right, dt.datetime)
            and left.replace(tzinfo=None) == right.replace(tzinfo=None)
            and left.utcoffset() == right.utcoffset()
        )
    return type(left) is type(right) and left == right


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(header_names, amqp_values, max_size=5))
def test_every_value_an_amqp_table_carries_round_trips_through_the_column(
    headers: dict[str, Any],
) -> None:
    text = headers_to_json(headers)
    assert text.isascii()  # independent of the column's character set
    json.loads(text)  # plain JSON, readable by an operator's tools
    assert same(headers, headers_from_json(text))


def test_the_tagged_forms_are_readable_json() -> None:
    headers = {
        "raw": b"\x00\xff",
        "at": dt.datetime(2026, 1, 2, 3, 4, 5, 6, tzinfo=dt.UTC),
        "amount": Decimal("9.90"),
        "nan": math.nan,
        "tagged-looking": {"$bytes": "not bytes"},
    }
    assert json.loads(headers_to_json(headers)) == {
        "raw": {"$bytes": "AP8="},
        "at": {"$datetime": "2026-01-02T03:04:05.000006+00:00"},
        "amount": {"$decimal": "9.90"},
        "nan": {"$float": "nan"},
        "tagged-looking": {"$table": {"$bytes": "not bytes"}},
    }


def test_a_top_level_name_that_looks_like_a_tag_is_just_a_name() -> None:
    assert headers_from_json(headers_to_json({"$bytes": "x"})) == {"$bytes": "x"}


@pytest.mark.parametrize(
    ("headers", "reason"),
    [
        ({"n": 2**63}, "signed 64-bit"),
        ({"n": -(2**63) - 1}, "signed 64-bit"),
        ({"d": Decimal("1E+3")}, "decimal"),
        ({"d": Decimal("NaN")}, "decimal"),
        ({"d": Decimal("Infinity")}, "decimal"),
        ({"d": Decimal(2**31)}, "32-bit"),
        ({"d": Decimal(1).scaleb(-256)}, "255 decimal places"),
        ({"when": dt.datetime(1969, 12, 31, 23, 59, 59)}, "before 1970"),
        ({"when": dt.date(2026, 1, 1)}, "date"),
        ({"b": bytearray(b"x")}, "use bytes"),
        ({"b": memoryview(b"x")}, "use bytes"),
        ({"s": {1, 2}}, "set"),
        ({"o": object()}, "object"),
        ({"u": uuid.UUID(int=1)}, "UUID"),
        ({"c": 1j}, "complex"),
        ({1: "x"}, "names must be str"),
        ({b"k": "x"}, "names must be str"),
        ({"x" * 256: 1}, "256 UTF-8 bytes"),
        ({"é" * 128: 1}, "256 UTF-8 bytes"),
        ({"nested": {"deep": {2: 1}}}, "names must be str"),
        ({"list": [1, [2, {3}]]}, r"\['list'\]\[1\]\[1\]"),
        ({"big": "x" * MAX_HEADERS_BYTES}, "bytes on the wire"),
        ({"many": ["x" * 1000] * 70}, "bytes on the wire"),
    ],
)
def test_what_amqp_cannot_carry_is_refused_naming_it(headers: Any, reason: str) -> None:
    with pytest.raises(InvalidMessage, match=reason):
        headers_to_json(headers)
    with pytest.raises(InvalidMessage, match=reason):
        check_headers(headers)


def test_nesting_is_bounded() -> None:
    deep: Any = 1
    for _ in range(MAX_HEADER_DEPTH):
        deep = [deep]
    assert headers_from_json(headers_to_json({"d": deep})) == {"d": deep}
    with pytest.raises(InvalidMessage, match="levels deep"):
        headers_to_json({"d": [deep]})
    table: Any = 1
    for _ in range(MAX_HEADER_DEPTH + 1):
        table = {"t": table}
    with pytest.raises(InvalidMessage, match="levels deep"):
        headers_to_json({"d": table})


def test_headers_must_be_a_mapping() -> None:
    with pytest.raises(InvalidMessage, match="mapping"):
        headers_to_json([("a", 1)])  # type: ignore[arg-type]


def test_the_limits_are_inclusive() -> None:
    at_epoch = {"when": EPOCH, "n": 2**63 - 1, "name" + "x" * 251: Decimal("-2147483648")}
    assert same(at_epoch, headers_from_json(headers_to_json(at_epoch)))


def test_a_row_round_trips_through_its_column_values() -> None:
    row = OutboxRow(
        id=uuid.UUID(int=7),
        type="order.created",
        exchange="",
        routing_key="orders",
        content_type="application/json",
        content_encoding="utf-8",
        headers={"idempotency-key": "order-7", "raw": b"\x01"},
        body=b'{"order_id":7}',
    )
    values = row_values(row)
    assert isinstance(values["headers"], str)
    assert row_from_mapping(values) == row
    stored = values | {"id": row.id.bytes, "body": memoryview(row.body), "attempts": 0}
    assert row_from_mapping(stored) == row


def test_a_mapping_without_the_message_columns_is_refused() -> None:
    with pytest.raises(KeyError, match="body"):
        row_from_mapping(
            {
                "id": uuid.UUID(int=1),
                "type": "t",
                "exchange": "",
                "routing_key": "q",
                "content_type": "c",
                "content_encoding": None,
                "headers": "{}",
            }
        )


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(header_names, amqp_values, max_size=5))
def test_what_is_accepted_is_what_py_amqp_encodes_at_the_size_counted(
    headers: dict[str, Any],
) -> None:
    from amqp.basic_message import Message as AMQPMessage

    from inbox.outbox._amqp_limits import _table_size

    check_headers(headers)
    flags = 2  # the property flags before the table
    sent = AMQPMessage(application_headers=headers)._serialize_properties()
    assert len(sent) - flags == _table_size(headers, "headers", 0)


@pytest.mark.parametrize(
    "text",
    [
        "not json",
        "[1, 2]",
        '{"x": {"$bytes": 5}}',
        '{"x": {"$bytes": "not base64!"}}',
        '{"x": {"$float": "bogus"}}',
        '{"x": {"$decimal": "one"}}',
        '{"x": {"$datetime": "yesterday"}}',
        '{"x": {"$table": [1]}}',
        "[" * 100_000 + "]" * 100_000,
    ],
)
def test_headers_the_outbox_did_not_write_raise_value_error(text: str) -> None:
    with pytest.raises(ValueError, match="stored headers are not readable"):
        headers_from_json(text)
