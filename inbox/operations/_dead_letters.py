"""Dead letters of a worker's queue (``<queue>.dlq`` on RabbitMQ): what the worker's headers
say about them, and reading them without taking them.

A message read and not taken is held unacked on the channel and returns to its place in the
queue when the channel closes, also when the process dies: at every moment each message is
in one queue. Moving them is :mod:`inbox.operations._replay`; ``inbox dlq`` (:mod:`inbox.admin`)
is the command.
"""

from __future__ import annotations

import datetime as dt
import hashlib
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Final

import amqp
from kombu.connection import Connection

from inbox.delivery import headers as h
from inbox.delivery.topology import QueueTopology, QueueType, RetryPolicy
from inbox.errors import ConfigurationError
from inbox.message import IDEMPOTENCY_KEY_HEADER

__all__ = [
    "DROPPED_PROPERTIES",
    "FAILURE_HEADERS",
    "REPLAYED_AT",
    "REPLAYS",
    "DeadLetterRecord",
    "dead_letter_queue",
    "depth",
    "find",
    "fingerprint",
    "hold",
    "open_channel",
    "peek",
    "peek_if_present",
    "publish_confirmed",
    "replays_so_far",
    "summary_fields",
]

REPLAYS: Final = "x-inbox-replays"
"""How many times ``inbox dlq replay`` moved this message back to its queue (an int)."""
REPLAYED_AT: Final = "x-inbox-replayed-at"
"""UTC time of the latest replay, ISO 8601."""

FAILURE_HEADERS: Final = (
    h.TRIES,
    h.FIRST_FAILURE,
    h.LAST_FAILURE,
    h.ERROR,
    h.ERROR_FRAME,
    h.FAILED_HANDLERS,
    h.REASON,
    h.SOURCE_QUEUE,
    h.DEAD_LETTERED_AT,
)
"""What a replay removes unless told to keep the tries: the worker's bookkeeping."""

DROPPED_PROPERTIES: Final = ("user_id", "expiration")
"""Properties a replayed copy does not carry: RabbitMQ refuses a user_id other than the
connection's, and an expiration would let the broker drop the replayed message."""
_CONFIRM_TIMEOUT: Final = 30.0
_DELIVERY_COUNT: Final = "x-delivery-count"  # a quorum queue's count of returns
_REFRESH_AT: Final = 10


@dataclass(frozen=True, slots=True)
class DeadLetterRecord:
    """What the worker's headers say about one dead letter."""

    message_id: str | None
    type: str | None
    reason: str | None
    tries: int
    replays: int
    dead_lettered_at: str | None
    failed_handlers: tuple[str, ...]
    error: str | None
    body_bytes: int
    idempotency_key: str | None = None
    """The producer's ``idempotency-key`` header: a handler without ``key=`` claimed under it,
    not under the message id (``inbox show KEY``)."""
    ref: str = ""
    """What names this dead letter to ``--id``, ``inbox dlq show`` and the console's rows:
    its message id, or for one without (a producer that sets none) ``sha256:`` and 16 hex
    digits of its body and headers."""
    error_frame: str | None = None
    """Where in the application's code the handlers failed (``x-inbox-error-frame``), when
    the worker recorded it."""

    def dead_lettered(self) -> dt.datetime | None:
        """When it was dead-lettered, if the header says so readably."""
        if self.dead_lettered_at is None:
            return None
        try:
            at = dt.datetime.fromisoformat(self.dead_lettered_at)
        except ValueError:
            return None
        return at if at.tzinfo is not None else at.replace(tzinfo=dt.UTC)

    @classmethod
    def read(cls, message: amqp.Message) -> DeadLetterRecord:
        """The bookkeeping of a message as ``basic_get`` returned it."""
        headers: Mapping[str, Any] = message.properties.get("application_headers") or {}
        return cls.of(message.properties, headers, message.body)

    @classmethod
    def of(
        cls, properties: Mapping[str, Any], headers: Mapping[str, Any], body: bytes | str
    ) -> DeadLetterRecord:
        """The bookkeeping of a message from its properties, headers and body (RabbitMQ's,
        or those of a Redis dead letter's envelope)."""
        failed = headers.get(h.FAILED_HANDLERS)
        message_id = _text(properties.get("message_id"))
        return cls(
            message_id,
            _text(properties.get("type")),
            _text(headers.get(h.REASON)),
            h.tries_so_far(headers),
            replays_so_far(headers),
            _text(headers.get(h.DEAD_LETTERED_AT)),
            tuple(n for n in str(failed).split(",") if n) if failed else (),
            _text(headers.get(h.ERROR)),
            len(body) if isinstance(body, bytes | str) else 0,
            _text(headers.get(IDEMPOTENCY_KEY_HEADER)),
            message_id if message_id is not None else fingerprint(body, headers),
            _text(headers.get(h.ERROR_FRAME)),
        )


def fingerprint(body: bytes | str, headers: Mapping[str, Any]) -> str:
    """``sha256:`` and 16 hex digits of a message's body and headers (not the count of its
    returns, which changes as it is read): the name of a dead letter without a message id.
    Copies alike in every byte share it, and taking any of them is taking the same."""
    digest = hashlib.sha256()
    digest.update(body if isinstance(body, bytes) else str(body).encode())
    for name in sorted(headers):
        if name != _DELIVERY_COUNT:
            digest.update(f"\0{name}={headers[name]!r}".encode())
    return f"sha256:{digest.hexdigest()[:16]}"


def dead_letter_queue(queue: str) -> str:
    """The dead-letter queue of ``queue``, named as the worker names it."""
    return QueueTopology(queue, QueueType.CLASSIC, RetryPolicy()).dead_letter_queue


def replays_so_far(headers: Mapping[str, Any]) -> int:
    """The replays recorded on a message (0 when absent or not a count)."""
    value = headers.get(REPLAYS)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return 0
    return value


@contextmanager
def open_channel(broker: str) -> Iterator[amqp.Channel]:
    """A raw AMQP channel on ``broker`` that leaves bodies as bytes. Closing it gives every
    message still unacked back to its queue."""
    connection = Connection(broker)
    if connection.transport.driver_type != "amqp":
        raise ConfigurationError(
            "dead-letter queues are on RabbitMQ: --broker must be an amqp:// URL, got a "
            f"{connection.transport.driver_type} transport"
        )
    with connection:
        connection.ensure_connection(max_retries=1)
        channel = connection.connection.channel()
        channel.auto_decode = False  # a replay sends the body's bytes as they came
        try:
            yield channel
        finally:
            if channel.is_open:
                channel.close()


def depth(channel: amqp.Channel, queue: str) -> int:
    """Ready messages in ``queue``; the broker's NOT_FOUND error when it does not exist."""
    return int(channel.queue_declare(queue=queue, passive=True).message_count)


def depth_if_present(broker: str, queue: str) -> int | None:
    """Ready messages in ``queue`` on a channel of its own; None when the queue does not
    exist (the broker closes the channel that asked, so the next question needs another)."""
    try:
        with open_channel(broker) as channel:
            return depth(channel, queue)
    except amqp.exceptions.NotFound:
        return None


def peek_if_present(
    broker: str, queue: str, limit: int
) -> tuple[int | None, list[DeadLetterRecord]]:
    """:func:`peek` on a channel of its own (closed at the end: every message read is back
    in its place); ``(None, [])`` when the dead-letter queue does not exist; ``limit`` 0:
    the depth alone, reading no message."""
    try:
        with open_channel(broker) as channel:
            if limit == 0:
                return depth(channel, dead_letter_queue(queue)), []
            return peek(channel, queue, limit)
    except amqp.exceptions.NotFound:
        return None, []


def peek(channel: amqp.Channel, queue: str, limit: int) -> tuple[int, list[DeadLetterRecord]]:
    """The dead-letter queue's depth and its first ``limit`` messages, read without taking
    them: each is held unacked until the channel closes, then returns to its place."""
    dlq = dead_letter_queue(queue)
    present = depth(channel, dlq)
    letters = []
    for _ in range(min(present, limit)):
        message = channel.basic_get(dlq, no_ack=False)
        if message is None:
            break
        letters.append(DeadLetterRecord.read(message))
        hold(channel, message, dlq)
    return present, letters


def find(
    channel: amqp.Channel, queue: str, message_id: str, max_read: int | None = None
) -> amqp.Message | None:
    """The first dead letter of ``queue`` with ``message_id`` (or, for one without a message
    id, that :attr:`DeadLetterRecord.ref`) among those present now (the first ``max_read``
    of them at most), read without taking it (every message read is held until the channel
    closes)."""
    dlq = dead_letter_queue(queue)
    present = depth(channel, dlq)
    for _ in range(present if max_read is None else min(present, max_read)):
        message = channel.basic_get(dlq, no_ack=False)
        if message is None:
            break
        hold(channel, message, dlq)
        if DeadLetterRecord.read(message).ref == message_id:
            return message
    return None


def hold(channel: amqp.Channel, message: amqp.Message, dlq: str) -> None:
    """Keep ``message`` in the dead-letter queue: held unacked, it returns to its place when
    the channel closes. A quorum queue counts each such return as a delivery and, from
    RabbitMQ 4.0 on, drops a message past its delivery limit (20 by default) where no
    dead-letter target is set: a message returned :data:`_REFRESH_AT` times already is
    copied to the queue's tail instead (confirmed, then acked), which starts a new count."""
    headers: Mapping[str, Any] = message.properties.get("application_headers") or {}
    returned = headers.get(_DELIVERY_COUNT)
    if isinstance(returned, int) and not isinstance(returned, bool) and returned >= _REFRESH_AT:
        properties = {k: v for k, v in message.properties.items() if k not in DROPPED_PROPERTIES}
        properties["application_headers"] = {
            k: v for k, v in headers.items() if k != _DELIVERY_COUNT
        }
        publish_confirmed(channel, message.body, properties, dlq)
        channel.basic_ack(message.delivery_tag)


def publish_confirmed(
    channel: amqp.Channel, body: Any, properties: Mapping[str, Any], queue: str
) -> None:
    """Publish a message to ``queue`` and wait for the broker's confirm; an unroutable one
    (the queue was deleted) raises the broker's NO_ROUTE."""
    channel.basic_publish_confirm(
        amqp.Message(body, **properties),
        exchange="",
        routing_key=queue,
        mandatory=True,
        confirm_timeout=_CONFIRM_TIMEOUT,
    )


def _text(value: object) -> str | None:
    if value is None:
        return None
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def summary_fields(letter: DeadLetterRecord) -> Sequence[tuple[str, object]]:
    """The fields of one dead letter as ``inbox dlq list`` prints them, in order."""
    return (
        ("id", letter.message_id),
        ("ref", None if letter.message_id is not None else letter.ref),
        ("key", letter.idempotency_key),
        ("type", letter.type),
        ("reason", letter.reason),
        ("tries", letter.tries),
        ("replays", letter.replays),
        ("at", letter.dead_lettered_at),
        ("handlers", ",".join(letter.failed_handlers) or None),
        ("error", letter.error),
        ("frame", letter.error_frame),
    )
