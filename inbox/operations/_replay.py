"""Moving dead letters: ``replay`` copies them back to their queue, ``purge`` deletes them.
Both take at most ``limit`` of the dead letters that pass their filters, reading at most
the messages the dead-letter queue held when they began (or ``max_read``), so nothing they
put back or that is dead-lettered meanwhile is read twice in one run; both leave what they
do not take in its place (see :func:`inbox.operations._dead_letters.hold`).

A replayed copy is confirmed by the broker before its dead letter is acked: a crash loses
nothing, and at most the one message in flight is then in both queues, whose second delivery
the inbox skips for every handler that committed."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

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
    hold,
    publish_confirmed,
)
from inbox.operations._filters import Filters

__all__ = ["TAKEN_KEPT", "MoveReport", "purge", "replay"]


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

    @property
    def limit_reached(self) -> bool:
        """Whether it stopped at ``limit`` moved, leaving the rest unread."""
        return self.limit is not None and self.moved >= self.limit

    def take(self, letter: DeadLetterRecord) -> None:
        """Count ``letter`` as moved (and list it, up to :data:`TAKEN_KEPT`)."""
        self.moved += 1
        if len(self.taken) < TAKEN_KEPT:
            self.taken.append(letter)


def replay(
    channel: amqp.Channel,
    queue: str,
    filters: Filters,
    *,
    limit: int | None = None,
    max_read: int | None = None,
    max_replays: int = 3,
    keep_tries: bool = False,
    dry_run: bool = False,
    progress: Callable[[MoveReport], None] | None = None,
) -> MoveReport:
    """Copy at most ``limit`` dead letters of ``queue`` that pass ``filters`` back to it,
    reading at most ``max_read`` (and never more than were present at the start): tries
    reset (the worker's failure headers removed, unless ``keep_tries``), :data:`REPLAYS`
    incremented. Those replayed ``max_replays`` times already stay. Broker errors propagate;
    whatever was not acked yet then stays in the dead-letter queue."""
    depth(channel, queue)  # the queue must exist, or every copy would be returned
    report = _report(channel, queue, limit, max_read, dry_run)
    for message, letter in _bounded(channel, report, filters, progress):
        if letter.replays >= max_replays:
            report.replayed_too_often.append(letter)
            hold(channel, message, report.dead_letter_queue)
            continue
        report.take(letter)
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
    max_read: int | None = None,
    dry_run: bool = False,
    progress: Callable[[MoveReport], None] | None = None,
) -> MoveReport:
    """Delete at most ``limit`` dead letters of ``queue`` that pass ``filters`` (ack them,
    one by one), reading at most ``max_read``."""
    report = _report(channel, queue, limit, max_read, dry_run)
    for message, letter in _bounded(channel, report, filters, progress):
        report.take(letter)
        if dry_run:
            hold(channel, message, report.dead_letter_queue)
        else:
            channel.basic_ack(message.delivery_tag)
    return report


def _report(
    channel: amqp.Channel, queue: str, limit: int | None, max_read: int | None, dry_run: bool
) -> MoveReport:
    dlq = dead_letter_queue(queue)
    present = depth(channel, dlq)
    to_read = present if max_read is None else min(present, max_read)
    return MoveReport(queue, dlq, present, to_read, dry_run, limit)


def _bounded(
    channel: amqp.Channel,
    report: MoveReport,
    filters: Filters,
    progress: Callable[[MoveReport], None] | None,
) -> Iterator[tuple[amqp.Message, DeadLetterRecord]]:
    """The dead letters present at the start (at most ``report.to_read``) that pass
    ``filters``, until ``report.limit`` are moved; the others read are held in place."""
    now = dt.datetime.now(dt.UTC)
    for _ in range(report.to_read):
        if report.limit_reached:
            break
        message = channel.basic_get(report.dead_letter_queue, no_ack=False)
        if message is None:
            break
        report.examined += 1
        letter = DeadLetterRecord.read(message)
        if filters.take(letter, now):
            report.matched += 1
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
    headers = dict(copied.get("application_headers") or {})
    first = h.earliest_failure(headers)
    if first is not None:  # what the retention guard dates it by, after any replay
        headers[h.ORIGINAL_FIRST_FAILURE] = first.isoformat(timespec="milliseconds")
    if not keep_tries:
        for name in FAILURE_HEADERS:
            headers.pop(name, None)
    headers[REPLAYS] = letter.replays + 1
    headers[REPLAYED_AT] = h.now_utc()
    copied["application_headers"] = headers
    copied["delivery_mode"] = 2  # persistent, as the worker's copies
    return copied
