"""Hostile input at registration and claim: handler names (at and over the column limit, edge
whitespace, NUL, lone surrogates, any text) and business keys (every wrong type and length,
huge keys, bad idempotency-key headers). Each is refused with a specific error before anything
runs, or makes an exact claim. test_registration.py and test_process.py hold the common
cases; this file covers what they leave out (strategies in support/strategies.py).

Tests whose comment starts "Regression:" reproduce library bugs the hostile-input suite found
(at 5467c00); each comment says what used to happen.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from sqlalchemy import Engine, create_engine, insert, select
from sqlalchemy.orm import Session, sessionmaker
from support.databases import Database, effects, effects_metadata
from support.hostile import SAMPLE, is_text_key
from support.strategies import handler_names

from inbox import (
    KEY_NAMESPACE,
    Inbox,
    InvalidKey,
    InvalidMessage,
    Message,
    Outcome,
    RegistrationError,
)
from inbox.message import IDEMPOTENCY_KEY_HEADER
from inbox.schema import HANDLER_NAME_MAX_LENGTH, inbox_message
from inbox.schema import metadata as inbox_metadata

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
@given(handler_names)
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
