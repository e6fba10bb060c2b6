"""The hypothesis strategies of the hostile-input tests, in one place: message ids and their
neighbourhood, objects that are no id, handler names, and whole batches of broker deliveries
with what must become of each (:mod:`support.hostile` is the oracle)."""

from __future__ import annotations

import json
import uuid
from collections import Counter
from typing import Any

from hypothesis import strategies as st

from inbox.message import IDEMPOTENCY_KEY_HEADER
from support.hostile import (
    BAD_COMPRESSION,
    BAD_IDEMPOTENCY_KEYS,
    CONTENT,
    FAIL,
    NOT_COMPRESSED,
    SEQ,
    SPECIAL_BODIES,
    Delivery,
    claim_key,
    expected_reason,
    is_canonical_id,
)


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


# Every other kind of object a caller might pass as an id.
non_id_objects = st.one_of(
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

# Any text, long text around the limit, and text with lone surrogates (which st.text() never
# generates by default).
handler_names = (
    st.text(max_size=40)
    | st.text(min_size=250, max_size=260)
    | st.text(st.characters(codec=None, categories=["Cs", "Ll"]), min_size=1, max_size=5)
)

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


def render_id(value: uuid.UUID, form: int) -> str:
    """``value`` in one of the four accepted spellings."""
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
