"""The retention guard of ``inbox cleanup --broker URL --queue Q``: a dead letter can still
be replayed, and its replay must find the claims of the handlers that already committed, or
they run again. So the window is widened to keep every claim younger than the oldest dead
letter of each queue (plus a day, for clocks that disagree): how old the dead letters of a
queue are, the earliest time any of them can have been first processed."""

from __future__ import annotations

import datetime as dt
import math
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import amqp

from inbox.delivery import headers as h
from inbox.operations._dead_letters import dead_letter_queue, depth, hold, open_channel

__all__ = ["MAX_SCANNED", "Oldest", "guarded_days", "oldest_dead_letter", "oldest_of"]

MAX_SCANNED: Final = 100_000
"""Dead letters read per queue, at most (each is held unacked until the scan ends)."""
_UUID7: Final = 7
_MARGIN: Final = dt.timedelta(days=1)


@dataclass(frozen=True, slots=True)
class Oldest:
    """The earliest a dead letter of ``dead_letter_queue`` can have been first processed."""

    dead_letter_queue: str
    at: dt.datetime
    message_id: str | None


def oldest_dead_letter(channel: amqp.Channel, queue: str) -> Oldest | None:
    """The oldest dead letter of ``queue`` by when it was first sent: the earliest of the
    time in its UUIDv7 id, its first failure (before any replay) and when it was
    dead-lettered. None for an empty queue."""
    dlq = dead_letter_queue(queue)
    oldest: Oldest | None = None
    for _ in range(min(depth(channel, dlq), MAX_SCANNED)):
        message = channel.basic_get(dlq, no_ack=False)
        if message is None:
            break
        hold(channel, message, dlq)
        born = _born(message.properties)
        if born is not None and (oldest is None or born < oldest.at):
            oldest = Oldest(dlq, born, _text(message.properties.get("message_id")))
    return oldest


def oldest_of(broker: str, queues: Sequence[str]) -> Oldest | None:
    """The oldest dead letter of all ``queues``, read on one channel of its own (every
    message read is back in its place when it closes); None when they are all empty."""
    with open_channel(broker) as channel:
        found = [oldest_dead_letter(channel, queue) for queue in queues]
    return min((o for o in found if o is not None), key=lambda o: o.at, default=None)


def guarded_days(days: int, oldest: dt.datetime | None, now: dt.datetime) -> int:
    """``days``, or more whole days so that claims processed since ``oldest`` (less a day's
    margin) are kept."""
    if oldest is None:
        return days
    needed = math.ceil((now - oldest + _MARGIN) / dt.timedelta(days=1))
    return max(days, needed)


def _born(properties: Mapping[str, Any]) -> dt.datetime | None:
    """The earliest of the time in a UUIDv7 id and the failures the headers record (a
    replayed dead letter's first delivery included): the id of a foreign producer may be
    no UUIDv7, and its clock may be off."""
    times: list[dt.datetime] = []
    message_id = _text(properties.get("message_id"))
    try:
        parsed = uuid.UUID(message_id) if message_id else None
    except ValueError:
        parsed = None
    if parsed is not None and parsed.version == _UUID7:
        millis = int.from_bytes(parsed.bytes[:6], "big")
        times.append(dt.datetime.fromtimestamp(millis / 1000, dt.UTC))
    headers: Mapping[str, Any] = properties.get("application_headers") or {}
    failed = h.earliest_failure(headers)
    if failed is not None:
        times.append(failed)
    return min(times, default=None)


def _text(value: object) -> str | None:
    if value is None:
        return None
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
