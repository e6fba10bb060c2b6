"""Dead letters of a worker's queue (``<queue>.dlq`` on RabbitMQ): read them without taking
them, and replay them to their queue.

A replay is bounded: it takes at most the messages the dead-letter queue held when it began
(or ``limit``), so a replayed message that fails and is dead-lettered again is never read a
second time in the same run. Each message is copied to the queue with a confirmed publish
and only then acked; one it does not replay is held unacked until the run ends and then
returns to the dead-letter queue in its place. A crash at any point loses nothing: the
broker gives unacked messages back. At most the one message in flight at the crash can be
in both queues; the inbox skips its second delivery as a duplicate for every handler that
committed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Final

import amqp
from kombu.connection import Connection

from inbox.broker import headers as h
from inbox.broker.topology import QueueTopology, QueueType, RetryPolicy

__all__ = [
    "REPLAYED_AT",
    "REPLAYS",
    "DeadLetter",
    "ReplayOptions",
    "ReplayReport",
    "open_channel",
    "peek",
    "replay",
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
    h.FAILED_HANDLERS,
    h.REASON,
    h.SOURCE_QUEUE,
    h.DEAD_LETTERED_AT,
)
"""What a replay removes unless told to keep the tries: the worker's bookkeeping."""

# Properties a replayed copy does not carry: RabbitMQ refuses a user_id other than the
# connection's, and an expiration would let the broker drop the replayed message.
_DROPPED_PROPERTIES: Final = ("user_id", "expiration")
_CONFIRM_TIMEOUT: Final = 30.0
_DELIVERY_COUNT: Final = "x-delivery-count"  # a quorum queue's count of returns
_REFRESH_AT: Final = 10


@dataclass(frozen=True, slots=True)
class DeadLetter:
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

    @classmethod
    def read(cls, message: amqp.Message) -> DeadLetter:
        """The bookkeeping of a message as ``basic_get`` returned it."""
        headers: Mapping[str, Any] = message.properties.get("application_headers") or {}
        failed = headers.get(h.FAILED_HANDLERS)
        return cls(
            _text(message.properties.get("message_id")),
            _text(message.properties.get("type")),
            _text(headers.get(h.REASON)),
            h.tries_so_far(headers),
            replays_so_far(headers),
            _text(headers.get(h.DEAD_LETTERED_AT)),
            tuple(n for n in str(failed).split(",") if n) if failed else (),
            _text(headers.get(h.ERROR)),
            len(message.body) if isinstance(message.body, bytes | str) else 0,
        )


@dataclass(frozen=True, slots=True)
class ReplayOptions:
    """Which dead letters a replay moves, and how."""

    limit: int | None = None
    max_replays: int = 3
    reasons: frozenset[str] = frozenset()
    handlers: frozenset[str] = frozenset()
    keep_tries: bool = False
    dry_run: bool = False


@dataclass(slots=True)
class ReplayReport:
    """What a replay did: ``present`` dead letters at the start, ``examined`` of them read."""

    queue: str
    dead_letter_queue: str
    present: int
    examined: int = 0
    replayed: int = 0
    not_matching: int = 0
    replayed_too_often: list[DeadLetter] = field(default_factory=list)
    dry_run: bool = False


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
        raise ValueError(
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


def peek(channel: amqp.Channel, queue: str, limit: int) -> tuple[int, list[DeadLetter]]:
    """The dead-letter queue's depth and its first ``limit`` messages, read without taking
    them: each is held unacked until the channel closes, then returns to its place."""
    dlq = dead_letter_queue(queue)
    present = depth(channel, dlq)
    letters = []
    for _ in range(min(present, limit)):
        message = channel.basic_get(dlq, no_ack=False)
        if message is None:
            break
        letters.append(DeadLetter.read(message))
        hold(channel, message, dlq)
    return present, letters


def replay(
    channel: amqp.Channel,
    queue: str,
    options: ReplayOptions,
    progress: Callable[[ReplayReport], None] | None = None,
) -> ReplayReport:
    """Move the dead letters of ``queue`` back to it, bounded to those present at the start
    (or ``options.limit``). A replayed copy has its tries reset (the worker's failure
    headers removed, unless ``keep_tries``) and :data:`REPLAYS` incremented. Dead letters
    that do not match the filters, and those replayed ``max_replays`` times already, stay.
    Broker errors propagate; everything not yet acked then stays in the dead-letter queue."""
    dlq = dead_letter_queue(queue)
    depth(channel, queue)  # the queue must exist, or every copy would be returned
    present = depth(channel, dlq)
    report = ReplayReport(queue, dlq, present, dry_run=options.dry_run)
    bound = present if options.limit is None else min(present, options.limit)
    for _ in range(bound):
        message = channel.basic_get(dlq, no_ack=False)
        if message is None:
            break
        report.examined += 1
        letter = DeadLetter.read(message)
        if not _matches(letter, options):
            report.not_matching += 1
            hold(channel, message, dlq)
        elif letter.replays >= options.max_replays:
            report.replayed_too_often.append(letter)
            hold(channel, message, dlq)
        elif not options.dry_run:
            _publish(
                channel, message.body, _copy_properties(message.properties, letter, options), queue
            )
            # Acked only after the broker confirmed the copy: a crash before this line leaves
            # the dead letter where it was (and maybe the copy too), never neither.
            channel.basic_ack(message.delivery_tag)
            report.replayed += 1
        else:
            report.replayed += 1
            hold(channel, message, dlq)
        if progress is not None:
            progress(report)
    return report


def hold(channel: amqp.Channel, message: amqp.Message, dlq: str) -> None:
    """Keep ``message`` in the dead-letter queue: held unacked, it returns to its place when
    the channel closes. A quorum queue counts each such return as a delivery and, from
    RabbitMQ 4.0 on, drops a message past its delivery limit (20 by default) where no
    dead-letter target is set: a message returned :data:`_REFRESH_AT` times already is
    copied to the queue's tail instead (confirmed, then acked), which starts a new count."""
    headers: Mapping[str, Any] = message.properties.get("application_headers") or {}
    returned = headers.get(_DELIVERY_COUNT)
    if isinstance(returned, int) and not isinstance(returned, bool) and returned >= _REFRESH_AT:
        properties = dict(message.properties)
        properties["application_headers"] = {
            k: v for k, v in headers.items() if k != _DELIVERY_COUNT
        }
        _publish(channel, message.body, properties, dlq)
        channel.basic_ack(message.delivery_tag)


def _publish(channel: amqp.Channel, body: Any, properties: Mapping[str, Any], queue: str) -> None:
    """Publish a copy to ``queue`` and wait for the broker's confirm; an unroutable copy
    (the queue was deleted) raises the broker's NO_ROUTE."""
    channel.basic_publish_confirm(
        amqp.Message(body, **properties),
        exchange="",
        routing_key=queue,
        mandatory=True,
        confirm_timeout=_CONFIRM_TIMEOUT,
    )


def _matches(letter: DeadLetter, options: ReplayOptions) -> bool:
    if options.reasons and letter.reason not in options.reasons:
        return False
    return not options.handlers or bool(options.handlers & set(letter.failed_handlers))


def _copy_properties(
    properties: Mapping[str, Any], letter: DeadLetter, options: ReplayOptions
) -> dict[str, Any]:
    copied = {k: v for k, v in properties.items() if k not in _DROPPED_PROPERTIES}
    headers = dict(copied.get("application_headers") or {})
    if not options.keep_tries:
        for name in FAILURE_HEADERS:
            headers.pop(name, None)
    headers[REPLAYS] = letter.replays + 1
    headers[REPLAYED_AT] = h.now_utc()
    copied["application_headers"] = headers
    copied["delivery_mode"] = 2  # persistent, as the worker's copies
    return copied


def _text(value: object) -> str | None:
    if value is None:
        return None
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def summary_fields(letter: DeadLetter) -> Sequence[tuple[str, object]]:
    """The fields of one dead letter as ``inbox dlq list`` prints them, in order."""
    return (
        ("id", letter.message_id),
        ("type", letter.type),
        ("reason", letter.reason),
        ("tries", letter.tries),
        ("replays", letter.replays),
        ("at", letter.dead_lettered_at),
        ("handlers", ",".join(letter.failed_handlers) or None),
        ("error", letter.error),
    )
