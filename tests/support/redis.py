"""Redis for the suite: a per-test area of uniquely named streams, deleted afterwards."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import redis
from faststream.redis.parser.binary import BinaryMessageFormatV1

from support.databases import unreachable

REDIS_URL = os.environ.get("INBOX_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")


@dataclass
class RedisArea:
    """A Redis test area: stream names unique to one test, deleted after it."""

    url: str
    prefix: str

    def stream(self, name: str = "s") -> str:
        """A stream name unique to this test."""
        return f"{self.prefix}.{name}"

    def client(self) -> redis.Redis:
        return redis.Redis.from_url(self.url, socket_timeout=10)

    def entries(self, stream: str) -> list[tuple[bytes, dict[str, Any]]]:
        """Every entry of ``stream`` written by FastStream: (body, headers), oldest first."""
        with self.client() as client:
            raw = client.xrange(stream)
        return [BinaryMessageFormatV1.parse(fields[b"__data__"]) for _, fields in raw]

    def pending(self, stream: str, group: str) -> int:
        """Entries of ``stream`` delivered to ``group`` and not acked yet."""
        with self.client() as client:
            return int(client.xpending(stream, group)["pending"])

    def delete_streams(self) -> None:
        """Delete every key whose name starts with this test's prefix."""
        with self.client() as client:
            keys = list(client.scan_iter(match=f"{self.prefix}*"))
            if keys:
                client.delete(*keys)


@contextmanager
def redis_area(url: str = REDIS_URL) -> Iterator[RedisArea]:
    """A :class:`RedisArea` on ``url``, its streams deleted on exit; an unreachable server is
    :func:`~support.databases.cannot_run` (a skip locally, a failure under CI)."""
    try:
        with redis.Redis.from_url(url, socket_timeout=5) as client:
            client.ping()
    except Exception as exc:
        unreachable("redis", exc)
    area = RedisArea(url, f"t-{uuid.uuid4().hex[:12]}")
    try:
        yield area
    finally:
        area.delete_streams()
