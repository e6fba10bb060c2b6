"""M1: what the middleware chain and the delivery hooks cost per message.

    .venv/bin/python benchmarks/middleware_overhead.py [--messages N] [--rounds R]

``inbox.process`` on an in-memory SQLite database (one connection, StaticPool: the cheapest
claim there is, so the layers' cost is not hidden by a server round trip), a handler that
inserts one row, alternating the variants round by round and printing the median µs per
message and its spread:

* none: no middleware, no hook (the handler transaction calls the handler itself);
* mw-1 / mw-3: one / three no-op middlewares (``return call_next(message)``);
* hook-1: one no-op ``around_delivery`` hook;
* shipped: ``around_delivery=[log_context]``, ``middleware=[Timing(report)]`` (a report that
  keeps nothing).

Then the layers alone, without the database: the registered chain
(``inbox.handlers[0].func``) called a million times with a handler that does nothing, in ns
per call: what a middleware layer adds, free of the database's noise.

Run it against an older tree (``PYTHONPATH=<tree>``) to compare "none" across versions: the
variants an older inbox cannot build are skipped.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

from sqlalchemy import Column, Integer, MetaData, String, Table, create_engine, insert
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import StaticPool

from inbox import Inbox, Message
from inbox.schema import metadata as inbox_metadata

rows = MetaData()
orders = Table(
    "bench_order",
    rows,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("ref", String(40), nullable=False),
)


def noop(message: Message, session: Session, call_next: Callable[[Message], object]) -> object:
    return call_next(message)


def noop_hook(message: Message, call_next: Callable[[Message], Any]) -> Any:
    return call_next(message)


def variants() -> dict[str, dict[str, Any]]:
    try:
        from inbox.middleware import Timing, log_context
    except ImportError:  # an inbox without middleware: only the baseline
        return {"none": {}}
    timing = Timing(lambda handler, message, seconds, error: None)
    return {
        "none": {},
        "mw-1": {"middleware": [noop]},
        "mw-3": {"middleware": [noop, noop, noop]},
        "hook-1": {"around_delivery": [noop_hook]},
        "shipped": {"around_delivery": [log_context], "middleware": [timing]},
    }


def build(options: dict[str, Any]) -> Inbox:
    engine = create_engine(
        "sqlite://", poolclass=StaticPool, connect_args={"check_same_thread": False}
    )
    inbox_metadata.create_all(engine)
    rows.create_all(engine)
    inbox = Inbox(sessionmaker(engine), **options)

    @inbox.handler("order.created", name="orders")
    def handle(message: Message, session: Session) -> None:
        session.execute(insert(orders).values(ref="x"))

    return inbox


def per_message(inbox: Inbox, count: int) -> float:
    messages = [Message.new("order.created", {}) for _ in range(count)]
    started = time.perf_counter()
    for message in messages:
        inbox.process(message)
    return (time.perf_counter() - started) / count * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    inboxes = {name: build(options) for name, options in variants().items()}
    samples: dict[str, list[float]] = {name: [] for name in inboxes}
    for inbox in inboxes.values():
        per_message(inbox, 200)  # warm the statement caches
    for round_number in range(args.rounds):
        names = list(inboxes)
        for name in names if round_number % 2 == 0 else reversed(names):
            samples[name].append(per_message(inboxes[name], args.messages))
    baseline = statistics.median(samples["none"])
    for name, values in samples.items():
        median = statistics.median(values)
        print(
            f"{name:8} {median:7.1f} µs/message (spread {min(values):.1f}..{max(values):.1f}), "
            f"{median - baseline:+.1f} µs vs none"
        )
    print("the registered chain alone, a handler doing nothing:")
    for name, options in variants().items():
        if "middleware" in options or name == "none":
            print(f"{name:8} {chain_ns(options):7.0f} ns/call")


def chain_ns(options: dict[str, Any], calls: int = 1_000_000) -> float:
    inbox = Inbox(sessionmaker(), middleware=options.get("middleware", ()))
    inbox.handler("order.created", name="orders")(lambda message, session: None)
    chain = inbox.handlers[0].func
    message = Message.new("order.created", {})
    session = Session()
    best = float("inf")
    for _ in range(5):
        started = time.perf_counter_ns()
        for _ in range(calls // 5):
            chain(message, session)
        best = min(best, (time.perf_counter_ns() - started) / (calls // 5))
    return best


if __name__ == "__main__":
    main()
