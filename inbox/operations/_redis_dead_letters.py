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
import json
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any, Final, cast

import redis

from inbox.operations._dead_letters import DeadLetterRecord, dead_letter_queue
from inbox.operations._replay import HeldLetter, replayed_headers

__all__ = ["PAGE", "RedisDeadLetters", "is_redis", "open_redis"]

PAGE: Final = 500
"""The entries one ``LRANGE`` of a replay, a purge or ``show`` reads at most: a long
dead-letter list is read a page at a time, never whole."""

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
    """``inbox dlq``'s operations on the dead-letter lists of one Redis server: a
    :class:`~inbox.operations._replay.DeadLetterSource` whose reading takes nothing."""

    kind: Final = "redis"
    """Where an archived letter of it can be restored."""

    def __init__(self, client: redis.Redis) -> None:
        self._client = client

    def peek(self, queue: str, limit: int) -> tuple[int, list[DeadLetterRecord]]:
        """The depth of ``queue``'s dead-letter list and its oldest ``limit`` letters."""
        dlq = dead_letter_queue(queue)
        present = self.depth(dlq)
        return present, [_record(_envelope(raw)) for raw in self._oldest(dlq, limit)]

    def find(self, queue: str, message_id: str) -> tuple[dict[str, Any], bytes] | None:
        """The properties (headers as ``application_headers``) and body of the oldest dead
        letter of ``queue`` with ``message_id`` (or that
        :attr:`~inbox.operations._dead_letters.DeadLetterRecord.ref`); None when there is
        none."""
        dlq = dead_letter_queue(queue)
        for raw in self._paged(dlq, self.depth(dlq)):
            envelope = _envelope(raw)
            if _record(envelope).ref == message_id:
                properties = {
                    "content_type": envelope.get("content-type"),
                    "content_encoding": envelope.get("content-encoding"),
                    **_properties(envelope),
                    **_named(envelope),
                    "application_headers": _headers(envelope),
                }
                return properties, _body(envelope)
        return None

    def depth(self, queue: str) -> int:
        """The length of the list ``queue`` (0 when there is none)."""
        return int(self._client.llen(queue))

    def restore(
        self, queue: str, headers: Mapping[str, Any], properties: Mapping[str, Any], body: bytes
    ) -> None:
        """Push an archived dead letter (``body``: kombu's envelope as it was in the list)
        back onto the list ``queue``, as a replay moves one (tries reset)."""
        envelope = _envelope(body)
        self._client.lpush(queue, json.dumps(_replayed(envelope, queue, keep_tries=False)))

    def read(self, queue: str, count: int) -> Iterator[HeldLetter]:
        """The oldest ``count`` entries of ``queue``'s dead-letter list at most, oldest
        first (read :data:`PAGE` at a time; each moved alone)."""
        dlq = dead_letter_queue(queue)
        tally = _Tally()
        for raw in self._paged(dlq, count, tally):
            yield _RedisLetter(self._client, raw, queue, dlq, tally)

    def _paged(self, dlq: str, count: int, tally: _Tally | None = None) -> Iterator[bytes]:
        """The oldest ``count`` entries of ``dlq`` at most, oldest first, one page at a
        time. The next page starts past the entries read that are still in the list (those
        read less those ``tally`` counts moved); entries pushed meanwhile go on the other
        end and do not shift it."""
        done = 0
        while done < count:
            wanted = min(PAGE, count - done)
            page = self._oldest(dlq, wanted, done - (0 if tally is None else tally.moved))
            yield from page  # resumed past a page's last entry once that one is dealt with
            done += len(page)
            if len(page) < wanted:
                return  # the list ended

    def _oldest(self, dlq: str, count: int, skip: int = 0) -> list[bytes]:
        """The ``count`` oldest entries after the ``skip`` oldest, oldest first."""
        if count <= 0:  # LRANGE -0 -1 would be the whole list
            return []
        raw = cast("list[bytes]", self._client.lrange(dlq, -(skip + count), -(skip + 1)))
        return raw[::-1]  # pushed on the left: the oldest is last


class _Tally:
    """The entries of one reading moved out of the list (replayed or deleted, or found gone)."""

    def __init__(self) -> None:
        self.moved = 0


class _RedisLetter:
    """One entry of a dead-letter list, as read (it stays in the list until moved)."""

    def __init__(self, client: redis.Redis, raw: bytes, queue: str, dlq: str, tally: _Tally):
        self._client = client
        self._tally = tally
        self._raw = raw
        self._queue = queue
        self._dlq = dlq
        self._envelope = _envelope(raw)
        self.letter = _record(self._envelope)

    def leave(self) -> None:
        """Nothing to do: reading took nothing."""

    def contents(self) -> tuple[dict[str, Any], dict[str, Any], bytes]:
        return _headers(self._envelope), dict(_properties(self._envelope)), self._raw

    def replay(self, *, keep_tries: bool) -> bool:
        copy = _replayed(self._envelope, self._queue, keep_tries=keep_tries)
        self._tally.moved += 1  # moved now, or taken by another run before: gone either way
        moved = self._client.eval(_MOVE, 2, self._dlq, self._queue, self._raw, json.dumps(copy))
        return bool(moved)

    def delete(self) -> bool:
        self._tally.moved += 1  # deleted now, or taken by another run before
        # redis-py sends bytes as they are (its annotation says str).
        return bool(self._client.lrem(self._dlq, -1, self._raw))  # type: ignore[arg-type]


def _replayed(envelope: Mapping[str, Any], queue: str, *, keep_tries: bool) -> dict[str, Any]:
    """The envelope a replay pushes onto ``queue``: the tries reset (unless ``keep_tries``),
    a delivery tag of its own."""
    copy = dict(envelope)
    copy["headers"] = replayed_headers(_headers(envelope), _record(envelope), keep_tries=keep_tries)
    properties = dict(_properties(envelope))
    properties["delivery_tag"] = str(uuid.uuid4())
    properties["delivery_info"] = {"exchange": "", "routing_key": queue}
    copy["properties"] = properties
    return copy


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
    return DeadLetterRecord.of(
        {**_properties(envelope), **_named(envelope)}, _headers(envelope), _body(envelope)
    )


def _named(envelope: Mapping[str, Any]) -> dict[str, Any]:
    """The message id and type: a Celery task message names its id and task in headers,
    not in AMQP properties."""
    properties = _properties(envelope)
    headers = _headers(envelope)
    return {
        "message_id": properties.get("message_id") or headers.get("id"),
        "type": properties.get("type") or headers.get("task"),
    }
