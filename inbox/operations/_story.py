"""One message's story, for a person following it: its claims and effect records
(:mod:`inbox.operations._claims`), the messages it sent (the outbox rows whose
``x-inbox-causation-id`` is its id, while they wait for the relay), the message that caused
it and its conversation (its own outbox row's or dead letter's headers), and its dead
letters and those of the messages it sent, in the workers' dead-letter queues.

The relay deletes a row once the broker confirmed it, so a message it sent shows here while
its row waits (or was refused), and again when it is dead-lettered (its dead letter carries
the causation header); once processed, its own id is its story (its claims)."""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import amqp
from sqlalchemy import Engine, Table, inspect, select

from inbox.delivery import headers as h
from inbox.operations import _claims
from inbox.operations import _dead_letters as _dlq
from inbox.operations._tables import Tables
from inbox.outbox import headers_from_json

__all__ = ["SENT_SHOWN", "Letter", "Sent", "Story", "tell"]

SENT_SHOWN: Final = 100
"""The outbox rows a story lists at most."""


@dataclass(frozen=True, slots=True)
class Sent:
    """An outbox row: a message waiting for the relay (or refused, ``attempts`` > 0)."""

    id: uuid.UUID
    type: str
    routing_key: str
    created_at: dt.datetime
    attempts: int
    last_error: str | None
    causation: str | None
    conversation: str | None


@dataclass(frozen=True, slots=True)
class Letter:
    """A dead letter seen in a dead-letter queue, with the headers that link it."""

    queue: str
    """The worker's queue (its dead-letter queue is ``<queue>.dlq``)."""
    record: _dlq.DeadLetterRecord
    causation: str | None
    conversation: str | None
    replayed_at: str | None
    edited_at: str | None


@dataclass(slots=True)
class Story:
    """What :func:`tell` found for what the operator typed."""

    lookup: _claims.Lookup
    message_id: str | None
    """The message id typed (None for a business key)."""
    own_row: Sent | None = None
    sent: list[Sent] = field(default_factory=list)
    own_letters: list[Letter] = field(default_factory=list)
    sent_letters: list[Letter] = field(default_factory=list)
    read_in_part: list[tuple[str, int]] = field(default_factory=list)

    @property
    def cause(self) -> str | None:
        """The id of the message that caused this one (its causation header), if known."""
        return next((x.causation for x in self._linked() if x.causation), None)

    @property
    def conversation(self) -> str | None:
        """The conversation's correlation id, if known."""
        return next((x.conversation for x in self._linked() if x.conversation), None)

    def _linked(self) -> list[Sent | Letter]:
        own: list[Sent | Letter] = [self.own_row] if self.own_row else []
        return own + list(self.own_letters)


def tell(
    engine: Engine,
    tables: Tables,
    text: str,
    *,
    business_key: bool = False,
    broker: str | None = None,
    queues: Sequence[str] = (),
    letters_read: int = _claims.DEAD_LETTERS_READ,
) -> Story:
    """The story of the message ``text`` names (a message id or a business key, as
    :func:`inbox.operations._claims.lookup_keys`); ``ValueError`` for a text that cannot be
    one. The dead-letter queues of ``queues`` are read (their first ``letters_read``
    messages each, left in place) only with a ``broker``."""
    lookup = _claims.look_up(
        engine,
        tables.claims,
        tables.effects,
        text,
        business_key=business_key,
        broker=broker,
        queues=queues,
    )
    first = lookup.keys[0]
    message_id = str(first.key) if first.how == "message id" else None
    story = Story(lookup, message_id)
    if message_id is None:
        return story
    story.own_row, story.sent = _outbox_rows(engine, tables.outbox, first.key)
    if broker is not None:
        for queue in queues:
            _read_letters(story, broker, queue, message_id, letters_read)
    return story


def _outbox_rows(
    engine: Engine, outbox: Table, message_id: uuid.UUID
) -> tuple[Sent | None, list[Sent]]:
    """The message's own row (not sent yet) and the rows it caused, oldest first."""
    c = outbox.c
    columns = (c.id, c.type, c.routing_key, c.created_at, c.attempts, c.last_error, c.headers)
    # The headers column is JSON text written with no spaces (inbox.outbox._row): a LIKE
    # narrows the rows, the decoded headers decide.
    caused = f'"{h.CAUSATION_ID}":"{message_id}"'
    with engine.connect() as connection:
        if not inspect(connection).has_table(outbox.name, outbox.schema):
            return None, []
        own = connection.execute(select(*columns).where(c.id == message_id)).first()
        rows = connection.execute(
            select(*columns)
            .where(c.headers.contains(caused, autoescape=True))
            .order_by(c.id)
            .limit(SENT_SHOWN)
        ).all()
    sent = [row for row in map(_sent, rows) if row.causation == str(message_id)]
    return (None if own is None else _sent(own)), sent


def _sent(row: Any) -> Sent:
    raw_id, type_, routing_key, created_at, attempts, last_error, stored = row
    try:
        headers = headers_from_json(stored)
    except ValueError:  # a row written by hand: shown, with no links
        headers = {}
    return Sent(
        raw_id if isinstance(raw_id, uuid.UUID) else uuid.UUID(bytes=bytes(raw_id)),
        type_,
        routing_key,
        created_at,
        attempts,
        last_error,
        _text(headers.get(h.CAUSATION_ID)),
        _text(headers.get(h.CONVERSATION_ID)),
    )


def _read_letters(story: Story, broker: str, queue: str, message_id: str, limit: int) -> None:
    """The message's dead letters in ``queue``'s dead-letter queue, and those of messages it
    caused: one pass over its first ``limit`` letters, each left in its place."""
    dlq = _dlq.dead_letter_queue(queue)
    try:
        with _dlq.open_channel(broker) as channel:  # closed: every letter is back
            present = _dlq.depth(channel, dlq)
            for _ in range(min(present, limit)):
                message = channel.basic_get(dlq, no_ack=False)
                if message is None:
                    break
                _dlq.hold(channel, message, dlq)
                letter = _letter(queue, message)
                if letter.record.ref == message_id:
                    story.own_letters.append(letter)
                elif letter.causation == message_id:
                    story.sent_letters.append(letter)
    except amqp.exceptions.NotFound:
        return  # no dead-letter queue: nothing was dead-lettered there
    if present > limit:
        story.read_in_part.append((dlq, present))


def _letter(queue: str, message: amqp.Message) -> Letter:
    headers: Mapping[str, Any] = message.properties.get("application_headers") or {}
    return Letter(
        queue,
        _dlq.DeadLetterRecord.read(message),
        _text(headers.get(h.CAUSATION_ID)),
        _text(headers.get(h.CONVERSATION_ID)),
        _text(headers.get(_dlq.REPLAYED_AT)),
        _text(headers.get(h.EDITED_AT)),
    )


def _text(value: object) -> str | None:
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    return value[:300] if isinstance(value, str) and value else None
