"""S2: RabbitMQ -> worker -> PostgreSQL: the inbox worker vs a plain kombu consumer.

    .venv/bin/python benchmarks/s2_end_to_end.py [--messages N] [--rounds R]
        [--prefetch 100 1] [--batch-size 100] [--profile]

For each prefetch and round, the same N messages (UUIDv7 ids, JSON bodies) are published to
a fresh queue (not timed), then consumed by each variant in turn, alternating the order:

* plain: a kombu ``Consumer`` whose callback runs the 3-statement handler (read a balance,
  insert an order, update the balance) in a session transaction, then acks;
* inbox: :class:`inbox.broker.Worker` with the same handler (claim + handler + commit, ack);
* batch (at the largest prefetch only): the same worker with ``batch_size``: one
  transaction and one claim statement per batch;
* batch-1stmt (at the largest prefetch only): batch mode with a handler that only inserts
  the order, the statements of S3's pgbench ceiling (claim + one-row insert), so the suite
  can state batch throughput as a multiple of the one-commit-per-message ceiling.

The rate is taken between the first and the last handler call (connection set-up and the
idle wait at the end are not counted). ``--profile`` runs pyinstrument over one extra
per-message inbox run and saves the text profile next to the JSON.
"""

from __future__ import annotations

import argparse
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from common import (
    DEFAULT_BROKER,
    DEFAULT_DATABASE,
    Figure,
    ScenarioReport,
    alternate,
    at_least,
    fresh_schema,
    median_spread,
    scenario_main,
)
from kombu import Connection, Consumer, Queue
from s1_overhead import ACCOUNTS, accounts, business, one_statement, three_statements
from sqlalchemy import Engine, insert
from sqlalchemy.orm import sessionmaker

from inbox import Inbox, Message
from inbox.broker import Publisher, Worker
from inbox.broker._idle import delete_queues, run_until_idle

SCENARIO = "S2"
TITLE = "end to end: RabbitMQ -> inbox worker -> PostgreSQL vs a plain kombu consumer"
QUICK: dict[str, Any] = {"messages": 600, "rounds": 2}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """S2's options."""
    parser.add_argument("--database-url", default=DEFAULT_DATABASE)
    parser.add_argument("--broker", default=DEFAULT_BROKER)
    parser.add_argument("--messages", type=int, default=5000, help="messages per run")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--prefetch", type=int, nargs="+", default=[100, 1])
    parser.add_argument("--batch-size", type=int, default=100)
    parser.add_argument("--profile", action="store_true", help="pyinstrument over the worker")


class Clock:
    """First and last handler-call times, and how many calls, for one consumer run."""

    def __init__(self) -> None:
        self.first = 0.0
        self.last = 0.0
        self.count = 0

    def tick(self) -> None:
        now = time.perf_counter()
        if self.count == 0:
            self.first = now
        self.last = now
        self.count += 1

    def rate(self) -> float:
        return (self.count - 1) / (self.last - self.first)


def fill(broker: str, queue: str, messages: int) -> None:
    """Publish ``messages`` order messages to ``queue`` (with confirms)."""
    with Publisher(broker, routing_key=queue) as publisher:
        for ref in range(messages):
            publisher.publish("order.created", {"ref": ref, "amount": ref % 100})


def run_worker(
    engine: Engine,
    broker: str,
    messages: int,
    prefetch: int,
    batch_size: int,
    *,
    statements: Callable[[Message, Any], None] = three_statements,
) -> float:
    """The inbox worker (per message, or in batches); msg/s."""
    clock = Clock()
    inbox = Inbox(sessionmaker(engine))

    @inbox.handler("order.created", name=f"bench.{statements.__name__}")
    def handle(message: Message, session: Any) -> None:
        statements(message, session)
        clock.tick()

    queue = f"bench-e2e-{uuid.uuid4().hex[:8]}"
    worker = Worker(
        inbox, broker, [queue], prefetch=prefetch, batch_size=batch_size, stats_interval=None
    )
    worker.prepare()
    try:
        fill(broker, queue, messages)
        run_until_idle(worker, 1.0)
    finally:
        delete_queues(worker)
    if worker.stats.processed != messages or worker.stats.acked != messages:
        raise SystemExit(f"inbox worker processed {worker.stats.processed}/{messages}")
    return clock.rate()


def run_plain(engine: Engine, broker: str, messages: int, prefetch: int) -> float:
    """A plain kombu consumer running the same handler; msg/s."""
    clock = Clock()
    sessions = sessionmaker(engine)
    queue = Queue(f"bench-e2e-{uuid.uuid4().hex[:8]}", durable=True, auto_delete=False)

    def on_message(body: Any, delivery: Any) -> None:
        message = Message(delivery.properties["message_id"], "order.created", body)
        with sessions() as session, session.begin():
            three_statements(message, session)
        delivery.ack()
        clock.tick()

    with Connection(broker) as connection:
        channel = connection.channel()
        queue(channel).declare()
        try:
            fill(broker, queue.name, messages)
            with Consumer(
                channel, [queue], callbacks=[on_message], prefetch_count=prefetch, accept=["json"]
            ):
                while clock.count < messages:
                    connection.drain_events(timeout=10)
        finally:
            queue(channel).delete()
    return clock.rate()


def profile_worker(engine: Engine, broker: str, messages: int, out_dir: Path) -> str | None:
    """pyinstrument over one per-message worker run at prefetch 100; the profile's path."""
    try:
        from pyinstrument import Profiler
    except ImportError:
        print("  (pyinstrument not installed: no profile)")
        return None
    profiler = Profiler(interval=0.0002)
    profiler.start()
    run_worker(engine, broker, messages, 100, 1)
    profiler.stop()
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "s2-worker-profile.txt"
    path.write_text(profiler.output_text(unicode=False, color=False, show_all=False))
    print(f"  profile: {path}")
    return str(path)


def run(options: argparse.Namespace, out_dir: Path) -> ScenarioReport:
    """Every variant at every prefetch, alternated, repeated."""
    samples: dict[str, list[float]] = {}
    top = max(options.prefetch)
    plots: list[str] = []
    with fresh_schema(options.database_url, business) as engine:
        with engine.begin() as connection:
            connection.execute(insert(accounts), [{"id": i, "balance": 0} for i in range(ACCOUNTS)])
        for prefetch in options.prefetch:
            variants: list[tuple[str, Callable[[], float]]] = [
                (
                    "plain",
                    lambda p=prefetch: run_plain(engine, options.broker, options.messages, p),
                ),
                (
                    "inbox",
                    lambda p=prefetch: run_worker(engine, options.broker, options.messages, p, 1),
                ),
            ]
            if prefetch == top and options.batch_size > 1:
                variants.append(
                    (
                        f"batch-{options.batch_size}",
                        lambda p=prefetch: run_worker(
                            engine, options.broker, options.messages, p, options.batch_size
                        ),
                    )
                )
                variants.append(
                    (
                        f"batch-{options.batch_size}-1stmt",
                        lambda p=prefetch: run_worker(
                            engine,
                            options.broker,
                            options.messages,
                            p,
                            options.batch_size,
                            statements=one_statement,
                        ),
                    )
                )
            for round_number in range(options.rounds):
                for name, consume in alternate(round_number, variants):
                    rate = consume()
                    samples.setdefault(f"{name}/prefetch-{prefetch}", []).append(rate)
                    label = f"prefetch {prefetch:>3} round {round_number + 1}: {name:<9}"
                    print(f"  {label} {rate:8.0f} msg/s")
        if options.profile:
            path = profile_worker(engine, options.broker, options.messages, out_dir)
            if path is not None:
                plots.append(path)
    figures: list[Figure] = []
    for prefetch in options.prefetch:
        plain = samples[f"plain/prefetch-{prefetch}"]
        inbox = samples[f"inbox/prefetch-{prefetch}"]
        for name, values in (("plain", plain), ("inbox", inbox)):
            value, spread = median_spread(values)
            figures.append(
                Figure(f"{name} consumer, prefetch {prefetch}", value, "msg/s", spread=spread)
            )
        ratios = [i / p for i, p in zip(inbox, plain, strict=True)]
        value, spread = median_spread(ratios)
        target, met = at_least(value, 0.80) if prefetch == top else ("", None)
        figures.append(
            Figure(f"inbox / plain, prefetch {prefetch}", value, "ratio", target, met, spread)
        )
    batch_key = f"batch-{options.batch_size}/prefetch-{top}"
    if batch_key in samples:
        batch = samples[batch_key]
        value, spread = median_spread(batch)
        figures.append(
            Figure(
                f"batch {options.batch_size} worker, prefetch {top}", value, "msg/s", spread=spread
            )
        )
        per_message = samples[f"inbox/prefetch-{top}"]
        ratios = [b / i for b, i in zip(batch, per_message, strict=True)]
        value, spread = median_spread(ratios)
        target, met = at_least(value, 4.0)
        figures.append(Figure("batch / per-message inbox worker", value, "x", target, met, spread))
        value, spread = median_spread(samples[f"batch-{options.batch_size}-1stmt/prefetch-{top}"])
        figures.append(
            Figure(
                f"batch {options.batch_size} worker, 1-statement handler, prefetch {top}",
                value,
                "msg/s",
                spread=spread,
            )
        )
    return ScenarioReport(
        SCENARIO,
        TITLE,
        {
            "messages": options.messages,
            "rounds": options.rounds,
            "prefetch": options.prefetch,
            "batch_size": options.batch_size,
            "handler": "3 statements: read balance, insert order, update balance",
        },
        figures,
        {"samples_msg_per_s": samples},
        plots,
    )


if __name__ == "__main__":
    sys.exit(scenario_main(sys.modules[__name__]))
