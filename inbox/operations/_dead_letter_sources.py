"""Where a broker URL's dead letters are read and moved: RabbitMQ's ``<queue>.dlq`` queues
for an ``amqp://`` URL, the Redis lists of a Celery app's dead letters for ``redis://`` or
``rediss://`` (:mod:`inbox.operations._redis_dead_letters`). ``inbox dlq``, ``inbox status
--queue`` and the console pick the source here, so each works on either broker."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any, Protocol

from inbox.operations import _dead_letters as _dlq
from inbox.operations import _replay
from inbox.operations._dead_letters import DeadLetterRecord

__all__ = ["DeadLetters", "depth_if_present", "is_redis", "open_dead_letters", "peek_if_present"]


class DeadLetters(_replay.DeadLetterSource, Protocol):
    """The dead letters of one broker: read without taking (``list``, ``show``, the console's
    pages), and moved by :func:`_replay.replay` and :func:`_replay.purge`."""

    @property
    def kind(self) -> str:
        """``amqp`` or ``redis``: where an archived letter of it can be restored."""

    def peek(self, queue: str, limit: int) -> tuple[int, list[DeadLetterRecord]]:
        """The dead-letter queue's depth and its first ``limit`` letters."""

    def find(self, queue: str, message_id: str) -> tuple[Mapping[str, Any], bytes] | None:
        """The properties and body of the dead letter with that id or ref, or None."""

    def restore(
        self, queue: str, headers: Mapping[str, Any], properties: Mapping[str, Any], body: bytes
    ) -> None:
        """Put an archived dead letter back on ``queue`` as a replay would."""


def is_redis(broker: str) -> bool:
    """Whether ``broker`` names a Redis server (``redis://``, ``rediss://``): a Celery app's
    dead letters, kept in lists."""
    return broker.partition("://")[0] in {"redis", "rediss"}


@contextmanager
def open_dead_letters(broker: str) -> Iterator[DeadLetters]:
    """The dead letters on ``broker``: one channel to RabbitMQ (every letter read and not
    taken is back in its place when it closes), or one Redis client."""
    if is_redis(broker):
        # Imported here: redis-py comes with the celery extra, not with the inbox command.
        from inbox.operations import _redis_dead_letters

        with _redis_dead_letters.open_redis(broker) as letters:
            yield letters
    else:
        with _dlq.open_channel(broker) as channel:
            yield _replay.RabbitDeadLetters(channel)


def depth_if_present(broker: str, dead_letter_queue: str) -> int | None:
    """The messages in ``dead_letter_queue`` now; None when RabbitMQ has no such queue. On
    Redis a list that is not there is an empty one: 0."""
    if is_redis(broker):
        with open_dead_letters(broker) as letters:
            return letters.depth(dead_letter_queue)
    return _dlq.depth_if_present(broker, dead_letter_queue)


def peek_if_present(
    broker: str, queue: str, limit: int
) -> tuple[int | None, list[DeadLetterRecord]]:
    """The depth of ``queue``'s dead-letter queue and its first ``limit`` letters, read
    without taking them; ``(None, [])`` when RabbitMQ has no such queue; ``limit`` 0: the
    depth alone, reading no message."""
    if not is_redis(broker):
        return _dlq.peek_if_present(broker, queue, limit)
    with open_dead_letters(broker) as letters:
        if limit == 0:
            return letters.depth(_dlq.dead_letter_queue(queue)), []
        return letters.peek(queue, limit)
