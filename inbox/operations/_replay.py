"""Moving dead letters: ``replay`` copies them back to their queue, ``purge`` deletes them,
from any :class:`DeadLetterSource`: RabbitMQ's ``<queue>.dlq`` queues
(:class:`RabbitDeadLetters`) or the Redis lists of Celery's dead letters
(:class:`inbox.operations._redis_dead_letters.RedisDeadLetters`). Both take at most
``limit`` of the dead letters that pass their filters, reading at most the messages the
dead-letter queue held when they began (or ``max_read``), so nothing they put back or that
is dead-lettered meanwhile is read twice in one run; both leave what they do not take in its
place (see :func:`inbox.operations._dead_letters.hold`).

On RabbitMQ a replayed copy is confirmed by the broker before its dead letter is acked: a
crash loses nothing, and at most the one message in flight is then in both queues, whose
second delivery the inbox skips for every handler that committed."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

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

__all__ = [
    "TAKEN_KEPT",
    "DeadLetterSource",
    "HeldLetter",
    "MoveReport",
    "PreviewBound",
    "RabbitDeadLetters",
    "purge",
    "replay",
    "replayed_headers",
]


TAKEN_KEPT: Final = 1000
"""The dead letters a report lists (:attr:`MoveReport.taken`), at most: a preview shows them."""


@dataclass(slots=True)
class MoveReport:
    """What a replay or purge did: ``present`` dead letters at the start, ``to_read`` of them
    to read at most (``max_read``), ``examined`` read, ``matched`` passing the filters,
    ``moved`` replayed or purged (or that would be, on a dry run; at most ``limit``), and
    the first :data:`TAKEN_KEPT` of those moved in ``taken``."""

    queue: str
    dead_letter_queue: str
    present: int
    to_read: int
    dry_run: bool
    limit: int | None = None
    examined: int = 0
    matched: int = 0
    moved: int = 0
    not_matching: int = 0
    replayed_too_often: list[DeadLetterRecord] = field(default_factory=list)
    taken: list[DeadLetterRecord] = field(default_factory=list)
    after_preview: bool = False
    """A confirmed run bounded to its preview (:class:`PreviewBound`): ``to_read`` is what the
    preview read, ``limit`` what it would have taken; letters that came later are not read."""

    @property
    def limit_reached(self) -> bool:
        """Whether it stopped at ``limit`` moved, leaving the rest unread."""
        return self.limit is not None and self.moved >= self.limit

    def take(self, letter: DeadLetterRecord) -> None:
        """Count ``letter`` as moved (and list it, up to :data:`TAKEN_KEPT`)."""
        self.moved += 1
        if len(self.taken) < TAKEN_KEPT:
            self.taken.append(letter)


@dataclass(frozen=True, slots=True)
class PreviewBound:
    """What a preview (a dry run) read and would have taken: its confirmed run reads no
    more than ``read`` letters and takes no more than ``taken``. Dead letters that arrive
    while the operator reads the preview sit behind those it read (a dead-letter queue is
    first in, first out), so the confirmed run never reaches them."""

    read: int
    taken: int

    @classmethod
    def of(cls, preview: MoveReport) -> PreviewBound:
        """The bound of ``preview``'s confirmed run."""
        return cls(preview.examined, preview.moved)


class HeldLetter(Protocol):
    """One dead letter a move has read, until it leaves, replays or deletes it."""

    @property
    def letter(self) -> DeadLetterRecord:
        """What its headers say."""

    def leave(self) -> None:
        """Keep it in its place in the dead-letter queue."""

    def replay(self, *, keep_tries: bool) -> bool:
        """Put it back on its queue with :func:`replayed_headers` and take it from the
        dead-letter queue; False when it was gone already (taken meanwhile)."""

    def delete(self) -> bool:
        """Take it from the dead-letter queue for good; False when it was gone already."""

    def contents(self) -> tuple[dict[str, Any], dict[str, Any], bytes]:
        """Its headers, its other properties and its body, as an archive keeps them (on
        Redis the body is kombu's whole envelope, which a restore pushes back)."""


class DeadLetterSource(Protocol):
    """Where a replay or purge reads dead letters."""

    def depth(self, queue: str) -> int:
        """The messages ``queue`` holds now (RabbitMQ: the broker's error when there is no
        such queue)."""

    def read(self, queue: str, count: int) -> Iterator[HeldLetter]:
        """The oldest ``count`` dead letters of ``queue`` at most, oldest first, each read
        only when the one before is left, replayed or deleted."""


def replay(
    source: DeadLetterSource,
    queue: str,
    filters: Filters,
    *,
    limit: int | None = None,
    max_read: int | None = None,
    max_replays: int = 3,
    keep_tries: bool = False,
    dry_run: bool = False,
    progress: Callable[[MoveReport], None] | None = None,
    preview: PreviewBound | None = None,
) -> MoveReport:
    """Copy at most ``limit`` dead letters of ``queue`` that pass ``filters`` back to it,
    reading at most ``max_read`` (and never more than were present at the start): tries
    reset (the worker's failure headers removed, unless ``keep_tries``), :data:`REPLAYS`
    incremented. Those replayed ``max_replays`` times already stay. With ``preview``, the
    confirmation of a dry run: bounded to what it read and took. Broker errors propagate;
    whatever was not taken yet then stays in the dead-letter queue."""
    source.depth(queue)  # RabbitMQ: the queue must exist, or every copy would be returned
    report = _report(source, queue, limit, max_read, dry_run, preview=preview)
    for held in _bounded(source, report, filters, progress):
        letter = held.letter
        if letter.replays >= max_replays:
            report.replayed_too_often.append(letter)
            held.leave()
        elif dry_run:
            report.take(letter)
            held.leave()
        elif held.replay(keep_tries=keep_tries):
            report.take(letter)
    return report


def purge(
    source: DeadLetterSource,
    queue: str,
    filters: Filters,
    *,
    limit: int | None = None,
    max_read: int | None = None,
    dry_run: bool = False,
    progress: Callable[[MoveReport], None] | None = None,
    preview: PreviewBound | None = None,
    keep: Callable[[HeldLetter], None] | None = None,
) -> MoveReport:
    """Delete at most ``limit`` dead letters of ``queue`` that pass ``filters`` (one by
    one), reading at most ``max_read``; with ``preview``, bounded as :func:`replay`. With
    ``keep`` (an archive), each is kept by it before it is deleted: when ``keep`` raises,
    that dead letter stays where it is and the error propagates."""
    report = _report(source, queue, limit, max_read, dry_run, preview=preview)
    for held in _bounded(source, report, filters, progress):
        if dry_run:
            report.take(held.letter)
            held.leave()
            continue
        if keep is not None:
            keep(held)
        if held.delete():
            report.take(held.letter)
    return report


def _report(
    source: DeadLetterSource,
    queue: str,
    limit: int | None,
    max_read: int | None,
    dry_run: bool,
    *,
    preview: PreviewBound | None,
) -> MoveReport:
    dlq = dead_letter_queue(queue)
    present = source.depth(dlq)
    if preview is not None:
        max_read = preview.read if max_read is None else min(max_read, preview.read)
        limit = preview.taken if limit is None else min(limit, preview.taken)
    to_read = present if max_read is None else min(present, max_read)
    return MoveReport(
        queue, dlq, present, to_read, dry_run, limit, after_preview=preview is not None
    )


def _bounded(
    source: DeadLetterSource,
    report: MoveReport,
    filters: Filters,
    progress: Callable[[MoveReport], None] | None,
) -> Iterator[HeldLetter]:
    """The dead letters present at the start (at most ``report.to_read``) that pass
    ``filters``, until ``report.limit`` are moved; the others read are left in place."""
    now = dt.datetime.now(dt.UTC)
    letters = source.read(report.queue, report.to_read)
    while not report.limit_reached:  # checked before reading the next one
        held = next(letters, None)
        if held is None:
            break
        report.examined += 1
        if filters.take(held.letter, now):
            report.matched += 1
            yield held
        else:
            report.not_matching += 1
            held.leave()
        if progress is not None:
            progress(report)


class RabbitDeadLetters:
    """``inbox dlq``'s operations on the ``<queue>.dlq`` queues of RabbitMQ, on one channel
    (the Redis ones: :class:`inbox.operations._redis_dead_letters.RedisDeadLetters`): a
    message read and not taken is held unacked until the channel closes."""

    kind: Final = "amqp"
    """Where an archived letter of it can be restored."""

    def __init__(self, channel: amqp.Channel) -> None:
        self._channel = channel

    def peek(self, queue: str, limit: int) -> tuple[int, list[DeadLetterRecord]]:
        """:func:`~inbox.operations._dead_letters.peek` on this channel."""
        return peek(self._channel, queue, limit)

    def find(self, queue: str, message_id: str) -> tuple[Mapping[str, Any], bytes] | None:
        """The properties and body of the dead letter :func:`find` finds, or None."""
        message = find(self._channel, queue, message_id)
        return None if message is None else (message.properties, message.body)

    def depth(self, queue: str) -> int:
        """:func:`~inbox.operations._dead_letters.depth` on this channel."""
        return depth(self._channel, queue)

    def restore(
        self, queue: str, headers: Mapping[str, Any], properties: Mapping[str, Any], body: bytes
    ) -> None:
        """Publish an archived dead letter back to ``queue`` (confirmed), as a replay
        copies one (:func:`replayed_headers`, tries reset)."""
        letter = DeadLetterRecord.of(properties, headers, body)
        message = {**properties, "application_headers": dict(headers)}
        publish_confirmed(self._channel, body, _replayed(message, letter, keep_tries=False), queue)

    def read(self, queue: str, count: int) -> Iterator[HeldLetter]:
        """The first ``count`` messages of ``queue``'s dead-letter queue at most, one
        ``basic_get`` each."""
        dlq = dead_letter_queue(queue)
        for _ in range(count):
            message = self._channel.basic_get(dlq, no_ack=False)
            if message is None:
                return
            yield _RabbitLetter(self._channel, message, queue, dlq)


class _RabbitLetter:
    """A dead letter got unacked from RabbitMQ."""

    def __init__(self, channel: amqp.Channel, message: amqp.Message, queue: str, dlq: str):
        self._channel = channel
        self._message = message
        self._queue = queue
        self._dlq = dlq
        self.letter = DeadLetterRecord.read(message)

    def leave(self) -> None:
        hold(self._channel, self._message, self._dlq)

    def replay(self, *, keep_tries: bool) -> bool:
        properties = _replayed(self._message.properties, self.letter, keep_tries=keep_tries)
        publish_confirmed(self._channel, self._message.body, properties, self._queue)
        # Acked only after the broker confirmed the copy: a crash before this line leaves
        # the dead letter where it was (and maybe the copy too), never neither.
        self._channel.basic_ack(self._message.delivery_tag)
        return True

    def delete(self) -> bool:
        self._channel.basic_ack(self._message.delivery_tag)
        return True

    def contents(self) -> tuple[dict[str, Any], dict[str, Any], bytes]:
        properties = dict(self._message.properties)
        headers = dict(properties.pop("application_headers", None) or {})
        return headers, properties, bytes(self._message.body)


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
