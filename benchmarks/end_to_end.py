"""End to end: RabbitMQ -> inbox worker -> PostgreSQL vs a plain kombu consumer.

    .venv/bin/python benchmarks/end_to_end.py [--messages N] [--rounds R] [--prefetch 1 100]

For each prefetch and round, the same N messages are published to a fresh queue (not timed),
then consumed by one of two consumers, alternating which goes first:

* plain: a kombu ``Consumer`` whose callback inserts one row in a session transaction
  (``with session.begin()``) and acks;
* inbox: :class:`inbox.broker.Worker` with a handler that inserts the same row; the claim,
  the row and the commit in one transaction, then the ack.

The rate is taken between the first and the last insert (connection set-up and the idle
wait at the end are not counted). Prints a table and writes JSON to benchmarks/results/.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from kombu import Connection, Consumer, Queue
from overhead import INSERT_ORDER, fresh_schema, one_statement, write_report
from sqlalchemy import Engine
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker

from inbox import Inbox, Message
from inbox.broker import Publisher, Worker

DEFAULT_DATABASE = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
DEFAULT_BROKER = "amqp://guest:guest@127.0.0.1:5672//"


class Clock:
    """First and last insert times, and how many inserts, for one consumer run."""

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
    with Publisher(broker, routing_key=queue) as publisher:
        for ref in range(messages):
            publisher.publish("order.created", {"ref": ref, "amount": ref % 100})


def run_inbox(engine: Engine, broker: str, messages: int, prefetch: int) -> float:
    clock = Clock()
    inbox = Inbox(sessionmaker(engine))

    @inbox.handler("order.created", name="bench.insert")
    def insert_order(message: Message, session: Session) -> None:
        one_statement(message, session)
        clock.tick()

    queue = f"bench-e2e-{uuid.uuid4().hex[:8]}"
    worker = Worker(inbox, broker, [queue], prefetch=prefetch, stats_interval=None)
    worker.prepare()
    try:
        fill(broker, queue, messages)
        worker.run(idle_timeout=1.0)
    finally:
        worker.delete_queues()
    if clock.count != messages or worker.stats.acked != messages:
        raise SystemExit(f"inbox consumer processed {clock.count}/{messages}")
    return clock.rate()


def run_plain(engine: Engine, broker: str, messages: int, prefetch: int) -> float:
    clock = Clock()
    sessions = sessionmaker(engine)
    queue = Queue(f"bench-e2e-{uuid.uuid4().hex[:8]}", durable=True, auto_delete=False)

    def on_message(body: Any, message: Any) -> None:
        with sessions() as session, session.begin():
            session.execute(INSERT_ORDER, {"ref": body["ref"], "amount": body["amount"]})
        message.ack()
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--database-url", default=os.environ.get("INBOX_BENCH_URL", DEFAULT_DATABASE)
    )
    parser.add_argument("--broker", default=os.environ.get("INBOX_BENCH_BROKER", DEFAULT_BROKER))
    parser.add_argument("--messages", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--prefetch", type=int, nargs="+", default=[1, 100])
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    samples: dict[str, list[float]] = {}
    with fresh_schema(args.database_url) as engine:
        for prefetch in args.prefetch:
            for round_number in range(args.rounds):
                order = [("plain", run_plain), ("inbox", run_inbox)]
                if round_number % 2:
                    order.reverse()
                for name, consume in order:
                    rate = consume(engine, args.broker, args.messages, prefetch)
                    samples.setdefault(f"{name}/prefetch-{prefetch}", []).append(rate)
                    label = f"prefetch {prefetch:>3} round {round_number + 1}: {name:<5}"
                    print(f"  {label} {rate:8.0f} msg/s")
    median = {k: statistics.median(v) for k, v in samples.items()}
    ratios = {
        f"prefetch-{p}": median[f"inbox/prefetch-{p}"] / median[f"plain/prefetch-{p}"]
        for p in args.prefetch
    }
    print(f"\nend to end, RabbitMQ -> consumer -> PostgreSQL: {args.messages} msgs", end="")
    print(f" x {args.rounds} rounds")
    print(f"{'prefetch':>8} {'plain msg/s':>12} {'inbox msg/s':>12} {'inbox/plain':>12}")
    for p in args.prefetch:
        print(
            f"{p:>8} {median[f'plain/prefetch-{p}']:12.0f} {median[f'inbox/prefetch-{p}']:12.0f} "
            f"{ratios[f'prefetch-{p}']:12.3f}"
        )
    print("target: inbox/plain >= 0.80 at prefetch 100")
    write_report(
        "end_to_end",
        args.json,
        ("inbox", "SQLAlchemy", "psycopg", "kombu", "amqp"),
        {
            "database": make_url(args.database_url).render_as_string(hide_password=True),
            "broker": Connection(args.broker).as_uri(),
            "parameters": {
                "messages": args.messages,
                "rounds": args.rounds,
                "prefetch": args.prefetch,
            },
            "samples_msg_per_s": samples,
            "median_msg_per_s": median,
            "inbox_over_plain": ratios,
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
