"""Outbox relay: committed rows → confirmed on RabbitMQ → deleted, against two baselines, and
the publish → relay → broker latency with LISTEN/NOTIFY.

    .venv/bin/python benchmarks/outbox_relay.py [--rows 20000] [--rounds 3]
        [--batch-size 100] [--latency-messages 500] [--database URL] [--broker URL]

In a fresh PostgreSQL schema, round by round alternating which goes first, each over
``--rows`` committed outbox rows (written before the clock starts, 1 kB JSON bodies):

* relay: ``Relay.drain()`` (``--batch-size`` rows per SKIP LOCKED batch, published together,
  confirms awaited together, one DELETE);
* naive loop: per row, one transaction: take one row ``FOR UPDATE SKIP LOCKED``, a kombu
  publish that blocks on its confirm, delete it, commit;
* kombu publish loop: the same messages published persistent with kombu, no database and no
  confirms: what the broker takes from one plain publisher (the ceiling).

Then latency: a relay runs (``run()``, woken by NOTIFY, poll interval 5 s) while
``--latency-messages`` rows are committed one per transaction, 10 ms apart; a kombu consumer
in this process timestamps each arrival; latency = arrival - the publishing COMMIT's return.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from common import (
    DEFAULT_BROKER,
    DEFAULT_DATABASE,
    Figure,
    ScenarioReport,
    alternate,
    at_least,
    at_most,
    fresh_schema,
    median_spread,
    percentile,
    scenario_main,
    server_version,
)
from kombu import Connection, Consumer, Exchange, Producer, Queue
from sqlalchemy import Engine, delete, insert, select

from inbox.broker import Relay
from inbox.message import uuid7
from inbox.outbox._row import OutboxRow, row_from_mapping, row_values
from inbox.schema import outbox_message

SCENARIO = "RELAY"
TITLE = "outbox relay: committed rows → confirmed → deleted; publish → broker latency"
QUICK: dict[str, Any] = {"rows": 2000, "rounds": 2, "latency_messages": 100}

_BODY = json.dumps({"order_id": 42, "note": "x" * 1000}).encode()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The scenario's options."""
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=100)
    parser.add_argument("--latency-messages", type=int, default=500)
    parser.add_argument("--database", default=DEFAULT_DATABASE)
    parser.add_argument("--broker", default=DEFAULT_BROKER)


def _rows(queue: str, count: int) -> list[dict[str, Any]]:
    now = dt.datetime.now(dt.UTC)
    return [
        row_values(
            OutboxRow(uuid7(), "order.created", "", queue, "application/json", None, {}, _BODY)
        )
        | {"created_at": now, "available_at": now, "attempts": 0}
        for _ in range(count)
    ]


def _fill(engine: Engine, queue: str, count: int) -> None:
    with engine.begin() as connection:
        for start in range(0, count, 5000):
            connection.execute(insert(outbox_message), _rows(queue, min(5000, count - start)))


def _purge(broker: str, queue: str) -> int:
    with Connection(broker) as connection, connection.channel() as channel:
        return int(channel.queue_purge(queue) or 0)


def _relay(engine: Engine, broker: str, queue: str, rows: int, batch_size: int) -> float:
    _fill(engine, queue, rows)
    with Relay(engine, broker, batch_size=batch_size, stats_interval=None) as relay:
        relay.prepare()
        started = time.perf_counter()
        sent = relay.drain()
        seconds = time.perf_counter() - started
    if sent != rows or _purge(broker, queue) != rows:
        raise RuntimeError(f"the relay sent {sent} of {rows} rows")
    return rows / seconds


def _naive(engine: Engine, broker: str, queue: str, rows: int) -> float:
    _fill(engine, queue, rows)
    table = outbox_message
    take = select(table).order_by(table.c.id).limit(1).with_for_update(skip_locked=True)
    with Connection(broker, transport_options={"confirm_publish": True}) as connection:
        producer = Producer(connection)
        started = time.perf_counter()
        while True:
            with engine.begin() as db:
                found = db.execute(take).first()
                if found is None:
                    break
                row = row_from_mapping(found._asdict())
                producer.publish(
                    row.body,
                    routing_key=row.routing_key,
                    exchange=row.exchange,
                    content_type=row.content_type,
                    content_encoding=row.content_encoding or "binary",
                    headers=row.headers,
                    message_id=str(row.id),
                    type=row.type,
                    delivery_mode=2,
                    mandatory=True,
                )
                db.execute(delete(table).where(table.c.id == row.id))
        seconds = time.perf_counter() - started
    if _purge(broker, queue) != rows:
        raise RuntimeError("the naive loop lost messages")
    return rows / seconds


def _kombu(broker: str, queue: str, rows: int) -> float:
    with Connection(broker) as connection:
        producer = Producer(connection)
        started = time.perf_counter()
        for _ in range(rows):
            producer.publish(
                _BODY,
                routing_key=queue,
                content_type="application/json",
                content_encoding="binary",
                headers={},
                message_id=str(uuid7()),
                type="order.created",
                delivery_mode=2,
            )
        seconds = time.perf_counter() - started
    deadline = time.monotonic() + 30
    purged = 0
    while purged < rows and time.monotonic() < deadline:
        purged += _purge(broker, queue)
    if purged != rows:
        raise RuntimeError("the kombu loop lost messages")
    return rows / seconds


def _latency(engine: Engine, broker: str, queue: str, messages: int) -> list[float]:
    committed: dict[str, float] = {}
    arrived: dict[str, float] = {}
    relay = Relay(engine, broker, poll_interval=5.0, stats_interval=None)
    relay.prepare()
    relay_thread = threading.Thread(target=relay.run, daemon=True)
    stop = threading.Event()
    ready = threading.Event()

    def consume() -> None:
        with Connection(broker) as connection:

            def on_message(body: object, message: Any) -> None:
                arrived[message.properties["message_id"]] = time.perf_counter()
                message.ack()

            with Consumer(connection, [Queue(queue, Exchange(""), no_declare=True)],
                          callbacks=[on_message], accept=["json"]):  # fmt: skip
                ready.set()
                while not stop.is_set():
                    try:
                        connection.drain_events(timeout=0.2)
                    except TimeoutError:
                        continue

    consumer = threading.Thread(target=consume, daemon=True)
    consumer.start()
    ready.wait(10)
    relay_thread.start()
    time.sleep(0.5)
    for _ in range(messages):
        [values] = _rows(queue, 1)
        with engine.begin() as connection:
            connection.execute(insert(outbox_message), values)
        committed[str(values["id"])] = time.perf_counter()
        time.sleep(0.01)
    deadline = time.monotonic() + 30
    while len(arrived) < messages and time.monotonic() < deadline:
        time.sleep(0.05)
    stop.set()
    relay.stop()
    relay_thread.join(30)
    consumer.join(30)
    relay.close()
    if len(arrived) != messages:
        raise RuntimeError(f"{len(arrived)} of {messages} messages arrived")
    return [(arrived[key] - committed[key]) * 1000 for key in committed]


def run(options: argparse.Namespace, out_dir: Path) -> ScenarioReport:
    """Measure, alternating the variants round by round."""
    queue = f"bench-relay-{uuid.uuid4().hex[:8]}"
    samples: dict[str, list[float]] = {"relay": [], "naive": [], "kombu": []}
    with Connection(options.broker) as connection, connection.channel() as channel:
        channel.queue_declare(queue=queue, durable=True, auto_delete=False)
    try:
        with fresh_schema(options.database) as engine:
            version = server_version(engine)
            variants = {
                "relay": lambda: _relay(
                    engine, options.broker, queue, options.rows, options.batch_size
                ),
                "naive": lambda: _naive(engine, options.broker, queue, options.rows),
                "kombu": lambda: _kombu(options.broker, queue, options.rows),
            }
            for round_number in range(options.rounds):
                for name in alternate(round_number, list(variants)):
                    rate = variants[name]()
                    samples[name].append(rate)
                    print(f"round {round_number + 1}: {name:6} {rate:9.0f} msg/s", flush=True)
            latencies = _latency(engine, options.broker, queue, options.latency_messages)
    finally:
        with Connection(options.broker) as connection, connection.channel() as channel:
            channel.queue_delete(queue=queue)
    relay, relay_spread = median_spread(samples["relay"])
    naive, naive_spread = median_spread(samples["naive"])
    kombu, kombu_spread = median_spread(samples["kombu"])
    ratios = [r / n for r, n in zip(samples["relay"], samples["naive"], strict=True)]
    ratio, ratio_spread = median_spread(ratios)
    ceilings = [r / k for r, k in zip(samples["relay"], samples["kombu"], strict=True)]
    ceiling, ceiling_spread = median_spread(ceilings)
    p50, p99 = percentile(latencies, 0.5), percentile(latencies, 0.99)
    figures = [
        Figure("relay msg/s (rows → confirmed → deleted)", relay, "msg/s",
               *at_least(relay, 5000), spread=relay_spread),
        Figure("naive loop msg/s (blocking confirm, delete per row)", naive, "msg/s",
               spread=naive_spread),
        Figure("kombu publish loop msg/s (no database, no confirms)", kombu, "msg/s",
               spread=kombu_spread),
        Figure("relay / naive loop", ratio, "x", *at_least(ratio, 3.0), spread=ratio_spread),
        Figure("relay / kombu publish loop", ceiling, "x", spread=ceiling_spread),
        Figure("publish → relay → broker latency p50 (NOTIFY)", p50, "ms", *at_most(p50, 20)),
        Figure("publish → relay → broker latency p99 (NOTIFY)", p99, "ms"),
    ]  # fmt: skip
    return ScenarioReport(
        SCENARIO,
        TITLE,
        {**vars(options), "postgresql": version, "json": None},
        figures,
        data={"samples_msg_per_s": samples, "latencies_ms": latencies},
    )


def main() -> int:
    """Run this scenario alone."""
    import outbox_relay

    return scenario_main(outbox_relay)


if __name__ == "__main__":
    raise SystemExit(main())
