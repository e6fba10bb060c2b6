"""Moving dead letters: ``replay`` copies them back to their queue, ``purge`` deletes them.
Both read at most the messages the dead-letter queue held when they began (or ``limit``), so
nothing they put back or that is dead-lettered meanwhile is read twice in one run; both
leave what they do not take in its place (see :func:`inbox.operations._dead_letters.hold`).

A replayed copy is confirmed by the broker before its dead letter is acked: a crash loses
nothing, and at most the one message in flight is then in both queues, whose second delivery
the inbox skips for every handler that committed."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import amqp

from inbox.delivery import headers as h
from inbox.operations._dead_letters import (
    DROPPED_PROPERTIES,
    FAILURE_HEADERS,
    REPLAYED_AT,
    REPLAYS,
    DeadLetterRecord,
    dead_letter_queue,
    depth,
    find,
    hold,
    peek,
    publish_confirmed,
)
from inbox.operations._filters import Filters

__all__ = ["MoveReport", "RabbitDeadLetters", "purge", "replay", "replayed_headers"]


@dataclass(slots=True)
class MoveReport:
    """What a replay or purge did: ``present`` dead letters at the start, ``to_read`` of them
    to read (``limit``), ``examined`` read, ``moved`` replayed or purged (or that would be, on
    a dry run)."""

    queue: str
    dead_letter_queue: str
    present: int
    to_read: int
    dry_run: bool
    examined: int = 0
    moved: int = 0
    not_matching: int = 0
    replayed_too_often: list[DeadLetterRecord] = field(default_factory=list)


class RabbitDeadLetters:
    """``inbox dlq``'s operations on the ``<queue>.dlq`` queues of RabbitMQ, on one channel
    (the Redis ones: :class:`inbox.operations._redis_dead_letters.RedisDeadLetters`)."""

    def __init__(self, channel: amqp.Channel) -> None:
        self._channel = channel

    def peek(self, queue: str, limit: int) -> tuple[int, list[DeadLetterRecord]]:
        """:func:`~inbox.operations._dead_letters.peek` on this channel."""
        return peek(self._channel, queue, limit)

    def find(self, queue: str, message_id: str) -> tuple[Mapping[str, Any], bytes] | None:
        """The properties and body of the dead letter :func:`find` finds, or None."""
        message = find(self._channel, queue, message_id)
        return None if message is None else (message.properties, message.body)

    def replay(self, queue: str, filters: Filters, **options: Any) -> MoveReport:
        """:func:`replay` on this channel."""
        return replay(self._channel, queue, filters, **options)

    def purge(self, queue: str, filters: Filters, **options: Any) -> MoveReport:
        """:func:`purge` on this channel."""
        return purge(self._channel, queue, filters, **options)


def replay(
    channel: amqp.Channel,
    queue: str,
    filters: Filters,
    *,
    limit: int | None = None,
    max_replays: int = 3,
    keep_tries: bool = False,
    dry_run: bool = False,
    progress: Callable[[MoveReport], None] | None = None,
) -> MoveReport:
    """Copy the dead letters of ``queue`` back to it: tries reset (the worker's failure
    headers removed, unless ``keep_tries``), :data:`REPLAYS` incremented. Those replayed
    ``max_replays`` times already stay. Broker errors propagate; whatever was not acked yet
    then stays in the dead-letter queue."""
    depth(channel, queue)  # the queue must exist, or every copy would be returned
    report = _report(channel, queue, limit, dry_run)
    for message, letter in _bounded(channel, report, filters, progress):
        if letter.replays >= max_replays:
            report.replayed_too_often.append(letter)
            hold(channel, message, report.dead_letter_queue)
            continue
        report.moved += 1
        if dry_run:
            hold(channel, message, report.dead_letter_queue)
            continue
        properties = _replayed(message.properties, letter, keep_tries=keep_tries)
        publish_confirmed(channel, message.body, properties, queue)
        # Acked only after the broker confirmed the copy: a crash before this line leaves
        # the dead letter where it was (and maybe the copy too), never neither.
        channel.basic_ack(message.delivery_tag)
    return report


def purge(
    channel: amqp.Channel,
    queue: str,
    filters: Filters,
    *,
    limit: int | None = None,
    dry_run: bool = False,
    progress: Callable[[MoveReport], None] | None = None,
) -> MoveReport:
    """Delete the dead letters of ``queue`` that pass ``filters`` (ack them, one by one)."""
    report = _report(channel, queue, limit, dry_run)
    for message, _ in _bounded(channel, report, filters, progress):
        report.moved += 1
        if dry_run:
            hold(channel, message, report.dead_letter_queue)
        else:
            channel.basic_ack(message.delivery_tag)
    return report


def _report(channel: amqp.Channel, queue: str, limit: int | None, dry_run: bool) -> MoveReport:
    dlq = dead_letter_queue(queue)
    present = depth(channel, dlq)
    return MoveReport(
        queue, dlq, present, present if limit is None else min(present, limit), dry_run
    )


def _bounded(
    channel: amqp.Channel,
    report: MoveReport,
    filters: Filters,
    progress: Callable[[MoveReport], None] | None,
) -> Iterator[tuple[amqp.Message, DeadLetterRecord]]:
    """The dead letters present at the start (at most ``report.to_read``) that pass
    ``filters``; the others are held in place."""
    now = dt.datetime.now(dt.UTC)
    for _ in range(report.to_read):
        message = channel.basic_get(report.dead_letter_queue, no_ack=False)
        if message is None:
            break
        report.examined += 1
        letter = DeadLetterRecord.read(message)
        if filters.take(letter, now):
            yield message, letter
        else:
            report.not_matching += 1
            hold(channel, message, report.dead_letter_queue)
        if progress is not None:
            progress(report)


def _replayed(
    properties: Mapping[str, Any], letter: DeadLetterRecord, *, keep_tries: bool
) -> dict[str, Any]:
    copied = {k: v for k, v in properties.items() if k not in DROPPED_PROPERTIES}
    headers = copied.get("application_headers") or {}
    copied["application_headers"] = replayed_headers(headers, letter, keep_tries=keep_tries)
    copied["delivery_mode"] = 2  # persistent, as the worker's copies
    return copied


def replayed_headers(
    headers: Mapping[str, Any], letter: DeadLetterRecord, *, keep_tries: bool
) -> dict[str, Any]:
    """A replayed copy's headers: the failure headers removed (unless ``keep_tries``), the
    first failure kept for the retention guard, the replays counted."""
    replayed = dict(headers)
    first = h.earliest_failure(replayed)
    if first is not None:  # what the retention guard dates it by, after any replay
        replayed[h.ORIGINAL_FIRST_FAILURE] = first.isoformat(timespec="milliseconds")
    if not keep_tries:
        for name in FAILURE_HEADERS:
            replayed.pop(name, None)
    replayed[REPLAYS] = letter.replays + 1
    replayed[REPLAYED_AT] = h.now_utc()
    return replayed
