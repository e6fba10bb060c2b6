"""Dead letters on Redis: the list ``<queue>.dlq`` of kombu's Redis transport (what Celery's
Redis broker uses), read, replayed and purged by ``inbox dlq``.

Each entry is kombu's JSON envelope (``body``, ``headers``, ``properties``...), pushed on
the left and consumed from the right: the oldest is last. Reading takes nothing. A replay
moves one entry in one Lua script (remove it from the dead-letter list, push the replayed
envelope onto the queue's list, or neither), so a crash leaves each message in exactly one
list; a replayed envelope is the one kombu pushed with the tries reset, which a Celery
worker consuming the queue runs as any task message. Messages sent with a priority (a list
per priority step) and kombu's ``global_keyprefix`` are not looked at.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, Final, cast

import redis

from inbox.operations._dead_letters import DeadLetterRecord, dead_letter_queue
from inbox.operations._filters import Filters
from inbox.operations._replay import MoveReport, replayed_headers

__all__ = ["RedisDeadLetters", "is_redis", "open_redis"]

# Remove one entry from the dead-letter list and push its replayed copy, atomically; 0 when
# the entry is gone already (taken by another replay or purge): nothing pushed.
_MOVE: Final = """
if redis.call('LREM', KEYS[1], -1, ARGV[1]) == 1 then
    redis.call('LPUSH', KEYS[2], ARGV[2])
    return 1
end
return 0
"""


def is_redis(broker: str) -> bool:
    """Whether ``broker`` names a Redis server (``redis://``, ``rediss://``)."""
    return broker.partition("://")[0] in {"redis", "rediss"}


@contextmanager
def open_redis(broker: str) -> Iterator[RedisDeadLetters]:
    """The dead letters on the Redis server of ``broker`` (one client, closed on exit)."""
    with redis.Redis.from_url(broker, socket_timeout=30) as client:
        client.ping()
        yield RedisDeadLetters(client)


class RedisDeadLetters:
    """``inbox dlq``'s operations on the dead-letter lists of one Redis server."""

    def __init__(self, client: redis.Redis) -> None:
        self._client = client

    def peek(self, queue: str, limit: int) -> tuple[int, list[DeadLetterRecord]]:
        """The depth of ``queue``'s dead-letter list and its oldest ``limit`` letters."""
        entries = self._entries(dead_letter_queue(queue))
        return len(entries), [_record(envelope) for _, envelope in entries[:limit]]

    def find(self, queue: str, message_id: str) -> tuple[dict[str, Any], bytes] | None:
        """The properties (headers as ``application_headers``) and body of the oldest dead
        letter of ``queue`` with ``message_id``; None when there is none."""
        for _, envelope in self._entries(dead_letter_queue(queue)):
            if _record(envelope).message_id == message_id:
                properties = {
                    "content_type": envelope.get("content-type"),
                    "content_encoding": envelope.get("content-encoding"),
                    **_properties(envelope),
                    "application_headers": _headers(envelope),
                }
                return properties, _body(envelope)
        return None

    def replay(
        self,
        queue: str,
        filters: Filters,
        *,
        limit: int | None = None,
        max_replays: int = 3,
        keep_tries: bool = False,
        dry_run: bool = False,
        progress: Callable[[MoveReport], None] | None = None,
    ) -> MoveReport:
        """Move the dead letters of ``queue`` back to it, as
        :func:`inbox.operations._replay.replay` does on RabbitMQ."""
        report = self._report(queue, limit, dry_run)
        for raw, envelope, letter in self._bounded(report, filters, progress):
            if letter.replays >= max_replays:
                report.replayed_too_often.append(letter)
                continue
            if dry_run:
                report.moved += 1
                continue
            copy = dict(envelope)
            copy["headers"] = replayed_headers(_headers(envelope), letter, keep_tries=keep_tries)
            properties = dict(_properties(envelope))
            properties["delivery_tag"] = str(uuid.uuid4())
            properties["delivery_info"] = {"exchange": "", "routing_key": queue}
            copy["properties"] = properties
            moved = self._client.eval(
                _MOVE, 2, report.dead_letter_queue, queue, raw, json.dumps(copy)
            )
            report.moved += int(moved)
        return report

    def purge(
        self,
        queue: str,
        filters: Filters,
        *,
        limit: int | None = None,
        dry_run: bool = False,
        progress: Callable[[MoveReport], None] | None = None,
    ) -> MoveReport:
        """Delete the dead letters of ``queue`` that pass ``filters``."""
        report = self._report(queue, limit, dry_run)
        for raw, _, _ in self._bounded(report, filters, progress):
            if dry_run:
                report.moved += 1
            else:
                # redis-py sends bytes as they are (its annotation says str).
                removed = self._client.lrem(report.dead_letter_queue, -1, raw)  # type: ignore[arg-type]
                report.moved += int(removed)
        return report

    def _entries(self, dlq: str) -> list[tuple[bytes, dict[str, Any]]]:
        raw = cast("list[bytes]", self._client.lrange(dlq, 0, -1))
        return [(entry, _envelope(entry)) for entry in reversed(raw)]  # oldest first

    def _report(self, queue: str, limit: int | None, dry_run: bool) -> MoveReport:
        dlq = dead_letter_queue(queue)
        present = int(self._client.llen(dlq))
        to_read = present if limit is None else min(present, limit)
        return MoveReport(queue, dlq, present, to_read, dry_run)

    def _bounded(
        self,
        report: MoveReport,
        filters: Filters,
        progress: Callable[[MoveReport], None] | None,
    ) -> Iterator[tuple[bytes, dict[str, Any], DeadLetterRecord]]:
        now = dt.datetime.now(dt.UTC)
        for raw, envelope in self._entries(report.dead_letter_queue)[: report.to_read]:
            report.examined += 1
            letter = _record(envelope)
            if filters.take(letter, now):
                yield raw, envelope, letter
            else:
                report.not_matching += 1
            if progress is not None:
                progress(report)


def _envelope(raw: bytes) -> dict[str, Any]:
    try:
        envelope = json.loads(raw)
    except ValueError:
        envelope = None
    # Not kombu's: shown as a body of its own, never moved by a filter on its headers.
    return envelope if isinstance(envelope, dict) else {"body": raw.decode("utf-8", "replace")}


def _headers(envelope: Mapping[str, Any]) -> dict[str, Any]:
    headers = envelope.get("headers")
    return dict(headers) if isinstance(headers, Mapping) else {}


def _properties(envelope: Mapping[str, Any]) -> Mapping[str, Any]:
    properties = envelope.get("properties")
    return properties if isinstance(properties, Mapping) else {}


def _body(envelope: Mapping[str, Any]) -> bytes:
    body = envelope.get("body", "")
    data = body.encode("utf-8") if isinstance(body, str) else json.dumps(body).encode("utf-8")
    if _properties(envelope).get("body_encoding") == "base64":
        return base64.b64decode(data)
    return data


def _record(envelope: Mapping[str, Any]) -> DeadLetterRecord:
    properties = _properties(envelope)
    headers = _headers(envelope)
    # A Celery task message names its id and task in headers, not in AMQP properties.
    return DeadLetterRecord.of(
        {
            **properties,
            "message_id": properties.get("message_id") or headers.get("id"),
            "type": properties.get("type") or headers.get("task"),
        },
        headers,
        len(_body(envelope)),
    )
