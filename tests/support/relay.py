"""The outbox relay in tests: rows written as the publishing side writes them, relays made
for a test area, and what reached a queue as a foreign AMQP client (pika) sees it."""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import sys
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import pika
from kombu import Connection
from sqlalchemy import Engine, insert, select

from inbox.broker import Relay
from inbox.message import uuid7
from inbox.outbox._row import OutboxRow, row_values
from inbox.schema import outbox_message
from support.databases import Database
from support.rabbit import Rabbit

__all__ = [
    "JSON",
    "Received",
    "add_rows",
    "connections_of",
    "declare_queue",
    "make_relay",
    "op_row",
    "outbox_ids",
    "receive_all",
    "relay_command",
]

JSON: Final = "application/json"


def op_row(
    routing_key: str,
    ref: str,
    *,
    exchange: str = "",
    headers: dict[str, Any] | None = None,
    message_id: uuid.UUID | None = None,
) -> OutboxRow:
    """A row for an ``op`` message with body ``{"ref": ref}`` (what tests/broker_app.py's
    handler records as an effect)."""
    return OutboxRow(
        id=message_id or uuid7(),
        type="op",
        exchange=exchange,
        routing_key=routing_key,
        content_type=JSON,
        content_encoding="utf-8",
        headers=dict(headers or {}),
        body=json.dumps({"ref": ref}).encode(),
    )


def add_rows(
    engine: Engine, rows: Sequence[OutboxRow], *, raw: dict[str, Any] | None = None
) -> None:
    """Commit ``rows`` in one transaction, due now, as ``Outbox.publish`` writes them;
    ``raw`` overrides columns as stored (a row written by hand)."""
    now = dt.datetime.now(dt.UTC)
    values = [
        row_values(row) | {"created_at": now, "available_at": now, "attempts": 0} | (raw or {})
        for row in rows
    ]
    with engine.begin() as connection:
        connection.execute(insert(outbox_message), values)


def outbox_ids(engine: Engine) -> list[uuid.UUID]:
    """The ids of the rows still in the outbox, in id order."""
    with engine.connect() as connection:
        query = select(outbox_message.c.id).order_by(outbox_message.c.id)
        return list(connection.execute(query).scalars())


def make_relay(db: Database, rabbit: Rabbit, **options: Any) -> Relay:
    """A relay on the test database and broker; a short poll interval unless given."""
    options.setdefault("poll_interval", 0.2)
    options.setdefault("stats_interval", None)
    return Relay(db.engine, rabbit.url, **options)


def declare_queue(rabbit: Rabbit, name: str, arguments: dict[str, Any] | None = None) -> str:
    """Declare the durable queue ``rabbit.queue(name)`` and return its name."""
    queue = rabbit.queue(name)
    with rabbit.connection() as connection, connection.channel() as channel:
        channel.queue_declare(queue=queue, durable=True, auto_delete=False, arguments=arguments)
    return queue


@dataclass(frozen=True)
class Received:
    """One message as pika read it off a queue."""

    properties: pika.BasicProperties
    body: bytes

    @property
    def message_id(self) -> uuid.UUID:
        return uuid.UUID(self.properties.message_id)


def receive_all(rabbit: Rabbit, queue: str) -> list[Received]:
    """Take every message in ``queue`` with pika, in queue order."""
    with Connection(rabbit.url) as parsed:
        parameters = pika.ConnectionParameters(
            parsed.hostname,
            parsed.port or 5672,
            parsed.virtual_host or "/",
            pika.PlainCredentials(parsed.userid, parsed.password),
        )
    taken: list[Received] = []
    with pika.BlockingConnection(parameters) as connection:
        channel = connection.channel()
        while True:
            method, properties, body = channel.basic_get(queue, auto_ack=True)
            if method is None:
                return taken
            taken.append(Received(properties, body))


def connections_of(port: int) -> list[str]:
    """The broker's ids of the AMQP connections whose client port is ``port``."""
    listed = subprocess.run(
        ["rabbitmqctl", "list_connections", "--quiet", "--no-table-headers", "pid", "peer_port"],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    )
    return [
        parts[0]
        for parts in (line.split() for line in listed.stdout.splitlines())
        if len(parts) == 2 and parts[1] == str(port)
    ]


def relay_command() -> list[str]:
    """The ``inbox-relay`` console script next to this Python, else the same via ``-c``."""
    script = Path(sys.executable).with_name("inbox-relay")
    if script.exists():
        return [str(script)]
    return [
        sys.executable,
        "-c",
        "import sys; from inbox.outbox.relay.cli import relay_main; sys.exit(relay_main())",
    ]
