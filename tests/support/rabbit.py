"""RabbitMQ for the suite: a per-test area of uniquely named queues, deleted afterwards."""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from kombu import Connection
from kombu.exceptions import ChannelError

from support.databases import unreachable

AMQP_URL = os.environ.get("INBOX_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672//")


@dataclass
class Rabbit:
    """A RabbitMQ test area: queue names unique to one test, deleted after it."""

    url: str
    prefix: str

    def queue(self, name: str = "q") -> str:
        """A queue name unique to this test."""
        return f"{self.prefix}.{name}"

    def connection(self) -> Connection:
        """A new (not yet connected) kombu connection to this broker."""
        return Connection(self.url)

    def depth(self, queue: str) -> int:
        """Ready messages in ``queue`` (0 if it does not exist)."""
        with self.connection() as connection, connection.channel() as channel:
            try:
                return int(channel.queue_declare(queue=queue, passive=True).message_count)
            except ChannelError:
                return 0

    def unsettled(self, queue: str) -> int:
        """Messages of ``queue`` not yet settled: ready plus delivered and not acked (the
        broker's own counts; AMQP's passive declare tells only the ready ones). A queue the
        broker does not list is an AssertionError, never a 0."""
        counts = ["name", "messages_ready", "messages_unacknowledged"]
        listed = subprocess.run(
            ["rabbitmqctl", "list_queues", "--quiet", "--no-table-headers", *counts],
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        )
        for line in listed.stdout.splitlines():
            name, ready, unacked = line.split("\t")
            if name == queue:
                return int(ready) + int(unacked)
        raise AssertionError(f"RabbitMQ lists no queue {queue!r}")

    def take_all(self, queue: str) -> list[Any]:
        """Remove and return every message in ``queue`` (kombu messages, acked)."""
        taken: list[Any] = []
        with self.connection() as connection, connection.channel() as channel:
            while (raw := channel.basic_get(queue, no_ack=False)) is not None:
                taken.append(channel.message_to_python(raw))
                channel.basic_ack(raw.delivery_tag)
        return taken

    def delete_queues(self) -> None:
        """Delete every queue whose name starts with this test's prefix."""
        listed = subprocess.run(
            ["rabbitmqctl", "list_queues", "--quiet", "--no-table-headers", "name"],
            capture_output=True,
            text=True,
            check=False,
            timeout=60,
        )
        names = [n for n in listed.stdout.split() if n.startswith(self.prefix)]
        with self.connection() as connection, connection.channel() as channel:
            for name in names:
                channel.queue_delete(queue=name)


@contextmanager
def rabbit_area(url: str = AMQP_URL) -> Iterator[Rabbit]:
    """A :class:`Rabbit` area on ``url``, its queues deleted on exit; an unreachable broker
    is :func:`~support.databases.cannot_run` (a skip locally, a failure under CI)."""
    try:
        with Connection(url, connect_timeout=5) as connection:
            connection.ensure_connection(max_retries=1)
    except Exception as exc:
        unreachable("rabbitmq", exc)
    area = Rabbit(url, f"t-{uuid.uuid4().hex[:12]}")
    try:
        yield area
    finally:
        area.delete_queues()
