"""A2: RabbitMQ -> consumer -> PostgreSQL throughput: FastStream subscribers behind an
AsyncInbox with 1, 8 and 32 deliveries in flight, against the kombu worker per message and
in batch mode, the same 3-statement handler, in the same run.

    .venv/bin/python benchmarks/aio_throughput.py [--messages N] [--rounds R]
        [--concurrency 1 8 32] [--driver asyncpg] [--batch-size 100] [--profile]

For each round, each variant consumes its own N freshly published messages (UUIDv7 ids,
JSON bodies; publishing is not timed), the variants in alternating order:

* faststream-inbox-C: :func:`inbox.faststream.subscribe_rabbit` with ``prefetch=C``: up to
  C deliveries run at once as asyncio tasks, each ``await inbox.process()`` on its own
  pooled connection (``--driver``), acked after the commit;
* faststream-plain-C (at the largest C only): a plain FastStream subscriber running the same
  handler in an ``AsyncSession`` transaction, acked after it (no inbox), for scale;
* kombu-inbox: :class:`inbox.broker.Worker` (blocking psycopg), one delivery at a time,
  prefetch ``--kombu-prefetch``;
* kombu-batch-B: the same worker with ``batch_size=B``: one transaction per batch.

The rate is taken between the first and the last handler call, as in S2. ``--profile`` runs
pyinstrument over one extra faststream-inbox run (largest C) and one kombu-inbox run and
prints where each one's time goes, by layer.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import sys
import uuid
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

from aio_overhead import async_engine, three_statements
from aio_profile import profiled
from common import (
    DEFAULT_BROKER,
    DEFAULT_DATABASE,
    Figure,
    ScenarioReport,
    alternate,
    fresh_schema,
    median_spread,
    scenario_main,
)
from faststream.rabbit import Channel, RabbitBroker, RabbitMessage, RabbitQueue
from kombu import Connection
from s1_overhead import ACCOUNTS, accounts, business
from s1_overhead import three_statements as blocking_three_statements
from s2_end_to_end import Clock, fill
from sqlalchemy import Engine, insert
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from sqlalchemy.orm import Session, sessionmaker

from inbox import Inbox, Message
from inbox.aio import AsyncInbox
from inbox.broker import Worker
from inbox.broker._idle import delete_queues, run_until_idle
from inbox.faststream import subscribe_rabbit

SCENARIO = "A2"
TITLE = "throughput: FastStream + AsyncInbox at 1/8/32 in flight vs the kombu worker"
QUICK: dict[str, Any] = {"messages": 500, "rounds": 1}
TIMEOUT = 600.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """A2's options."""
    parser.add_argument("--database-url", default=DEFAULT_DATABASE)
    parser.add_argument("--broker", default=DEFAULT_BROKER)
    parser.add_argument("--messages", type=int, default=3000, help="messages per run")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--driver", default="asyncpg", choices=["asyncpg", "psycopg"])
    parser.add_argument("--kombu-prefetch", type=int, default=100)
    parser.add_argument("--batch-size", type=int, default=100)
    parser.add_argument("--profile", action="store_true", help="pyinstrument, per layer")


def prepared_queue(broker: str, messages: int) -> str:
    """A new queue declared as FastStream declares it, holding ``messages`` orders."""
    name = f"bench-aio-{uuid.uuid4().hex[:8]}"
    with Connection(broker) as connection, connection.channel() as channel:
        channel.queue_declare(
            name, durable=True, auto_delete=False, arguments={"x-queue-type": "classic"}
        )
    fill(broker, name, messages)
    return name


def delete_queue(broker: str, name: str) -> None:
    with Connection(broker) as connection, connection.channel() as channel:
        channel.queue_delete(name)


async def consume_with_faststream(
    engine: Engine, options: argparse.Namespace, queue: str, concurrency: int, *, inbox: bool
) -> Clock:
    """Run ``queue`` through a FastStream subscriber until every message was handled."""
    clock = Clock()
    done = asyncio.Event()
    aengine = async_engine(engine, options.driver, pool_size=concurrency, max_overflow=4)
    sessions = async_sessionmaker(aengine)
    broker = RabbitBroker(options.broker, logger=None)

    async def handle(message: Message, session: AsyncSession) -> None:
        await three_statements(message, session)
        clock.tick()
        if clock.count == options.messages:
            done.set()

    if inbox:
        async_inbox = AsyncInbox(sessions)
        async_inbox.handler("order.created", name=f"bench.aio.{concurrency}")(handle)
        subscribe_rabbit(broker, async_inbox, queue, prefetch=concurrency)
    else:

        @broker.subscriber(
            RabbitQueue(queue, durable=True),
            channel=Channel(prefetch_count=concurrency),
            no_reply=True,
        )
        async def plain(body: dict[str, Any], msg: RabbitMessage) -> None:
            message = Message(msg.message_id, "order.created", body)
            async with sessions() as session, session.begin():
                await handle(message, session)

    try:
        await broker.start()
        await asyncio.wait_for(done.wait(), TIMEOUT)
    finally:
        await broker.stop()
        await aengine.dispose()
    return clock


def faststream_rate(
    engine: Engine,
    options: argparse.Namespace,
    concurrency: int,
    *,
    inbox: bool,
    around: Callable[[], AbstractContextManager[object]] = nullcontext,
) -> float:
    """msg/s of one FastStream run (the queue filled first, not timed; ``around`` wraps
    the consuming only)."""
    queue = prepared_queue(options.broker, options.messages)
    try:
        with around():
            clock = asyncio.run(
                consume_with_faststream(engine, options, queue, concurrency, inbox=inbox)
            )
    finally:
        delete_queue(options.broker, queue)
    return clock.rate()


def kombu_rate(
    engine: Engine,
    options: argparse.Namespace,
    batch_size: int,
    *,
    around: Callable[[], AbstractContextManager[object]] = nullcontext,
) -> float:
    """msg/s of one kombu worker run: S2's worker and handler on blocking psycopg."""
    clock = Clock()
    inbox = Inbox(sessionmaker(engine))

    @inbox.handler("order.created", name="bench.kombu")
    def handle(message: Message, session: Session) -> None:
        blocking_three_statements(message, session)
        clock.tick()

    queue = prepared_queue(options.broker, options.messages)
    worker = Worker(
        inbox,
        options.broker,
        [queue],
        prefetch=options.kombu_prefetch,
        batch_size=batch_size,
        stats_interval=None,
    )
    try:
        worker.prepare()
        with around():
            run_until_idle(worker, 1.0)
    finally:
        delete_queues(worker)
    if worker.stats.processed != options.messages:
        raise SystemExit(f"kombu worker processed {worker.stats.processed}/{options.messages}")
    return clock.rate()


def run(options: argparse.Namespace, out_dir: Path) -> ScenarioReport:
    """Every variant, alternated, repeated; figures; optional profiles."""
    top = max(options.concurrency)
    variants: list[tuple[str, Any]] = []
    for c in options.concurrency:
        variants.append(
            (f"faststream-inbox-{c}", lambda e, c=c: faststream_rate(e, options, c, inbox=True))
        )
    variants.append(
        (f"faststream-plain-{top}", lambda e: faststream_rate(e, options, top, inbox=False))
    )
    variants.append(("kombu-inbox", lambda e: kombu_rate(e, options, 1)))
    variants.append(
        (f"kombu-batch-{options.batch_size}", lambda e: kombu_rate(e, options, options.batch_size))
    )
    samples: dict[str, list[float]] = {name: [] for name, _ in variants}
    profiles: dict[str, dict[str, float]] = {}
    with fresh_schema(options.database_url, business) as engine:
        with engine.begin() as connection:
            connection.execute(insert(accounts), [{"id": i, "balance": 0} for i in range(ACCOUNTS)])
        for round_number in range(options.rounds):
            for name, measure in alternate(round_number, variants):
                rate = measure(engine)
                samples[name].append(rate)
                print(f"  round {round_number + 1}: {name:<22} {rate:8.0f} msg/s")
        if options.profile:
            for name in (f"faststream-inbox-{top}", "kombu-inbox"):
                out = out_dir / f"a2-{name}-profile.txt"
                around = functools.partial(
                    profiled, True, out, name, functools.partial(profiles.__setitem__, name)
                )
                if name == "kombu-inbox":
                    kombu_rate(engine, options, 1, around=around)
                else:
                    faststream_rate(engine, options, top, inbox=True, around=around)
    figures: list[Figure] = []
    for name, values in samples.items():
        value, spread = median_spread(values)
        figures.append(Figure(name, value, "msg/s", spread=spread))
    kombu = samples["kombu-inbox"]
    for c in options.concurrency:
        ratios = [f / k for f, k in zip(samples[f"faststream-inbox-{c}"], kombu, strict=True)]
        value, spread = median_spread(ratios)
        figures.append(Figure(f"faststream-inbox-{c} / kombu-inbox", value, "x", spread=spread))
    batch = samples[f"kombu-batch-{options.batch_size}"]
    ratios = [f / b for f, b in zip(samples[f"faststream-inbox-{top}"], batch, strict=True)]
    value, spread = median_spread(ratios)
    figures.append(Figure(f"faststream-inbox-{top} / kombu-batch", value, "x", spread=spread))
    ratios = [
        i / p
        for i, p in zip(
            samples[f"faststream-inbox-{top}"], samples[f"faststream-plain-{top}"], strict=True
        )
    ]
    value, spread = median_spread(ratios)
    figures.append(Figure(f"faststream inbox / plain at {top}", value, "ratio", spread=spread))
    return ScenarioReport(
        SCENARIO,
        TITLE,
        {
            "messages": options.messages,
            "rounds": options.rounds,
            "concurrency": options.concurrency,
            "driver": options.driver,
            "kombu_prefetch": options.kombu_prefetch,
            "batch_size": options.batch_size,
            "handler": "3 statements: read balance, insert order, update balance",
        },
        figures,
        {"samples_msg_per_s": samples, "profile_seconds_by_layer": profiles},
    )


if __name__ == "__main__":
    sys.exit(scenario_main(sys.modules[__name__]))
