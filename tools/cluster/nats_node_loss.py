"""Node loss on a three-node JetStream cluster under the FastStream edge: every message
whose publish JetStream acknowledged is committed exactly once, whichever node dies.

    python tools/cluster/nats_node_loss.py --ops 2000 --consumers 2 --fault-interval 3

The stream is replicated on all three nodes (R3, file storage). A publisher sends ``--ops``
operations (10 % of them twice under the same ``message_id``, as a producer retrying after a
lost PubAck would), retrying each publish until JetStream acknowledges it. ``--consumers``
FastStream brokers, each given every node's URL, consume through ``subscribe_nats_stream``
into an ``AsyncInbox`` on a fresh PostgreSQL schema. Every ``--fault-interval`` seconds
(±50 %) a node is SIGKILLed, in turn the stream's leader and a follower, and started again
``--downtime`` seconds later (one node at a time: a quorum of two always remains).

At the end: operations (acknowledged publishes), faults, doubled (an operation committed
more than once) and lost (acknowledged, never committed, not dead-lettered). Exit status 0
only when nothing is doubled or lost and every consumer drained the stream.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import random
import sys
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import nats
from faststream.nats import JStream, NatsBroker
from nats.js.api import StorageType
from sqlalchemy import (
    Column,
    Engine,
    Integer,
    MetaData,
    String,
    Table,
    create_engine,
    func,
    select,
    text,
)
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import (
    AsyncEngine,
    AsyncSession,
    async_sessionmaker,
    create_async_engine,
)

from inbox import Message
from inbox.aio import AsyncInbox
from inbox.broker import RetryPolicy
from inbox.faststream import subscribe_nats_stream
from inbox.schema import metadata as inbox_metadata
from tools.cluster.jetstream import NatsCluster

__all__ = ["Figures", "main", "run"]

DATABASE_URL = os.environ.get(
    "INBOX_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)
SUBJECT = "ops"
_ACK_WAIT = 5.0  # seconds JetStream waits for an ack before it delivers again
STREAM = "ops"

metadata = MetaData()
effects = Table(
    "nats_effect", metadata, Column("ref", String(64), nullable=False), Column("n", Integer)
)


@dataclass
class Figures:
    """What one run measured."""

    operations: int = 0
    messages: int = 0
    faults: Counter[str] = field(default_factory=Counter)
    doubled: int = 0
    lost: int = 0
    dead_lettered: int = 0
    duplicates: int = 0
    wall: float = 0.0
    errors: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """Nothing doubled, nothing lost, nothing else wrong."""
        return not (self.doubled or self.lost or self.errors)

    def line(self) -> str:
        """The figures on one line."""
        faults = ", ".join(f"{k} {v}" for k, v in sorted(self.faults.items())) or "none"
        return (
            f"nats-jetstream R3: operations {self.operations} (messages {self.messages}), "
            f"faults: {faults}; doubled {self.doubled}, lost {self.lost}, "
            f"dead-lettered {self.dead_lettered}, duplicates skipped {self.duplicates}; "
            f"{self.wall:.0f} s" + (f"; errors: {'; '.join(self.errors)}" if self.errors else "")
        )


async def _publish_all(
    urls: list[str], ops: int, min_faults: int, figures: Figures, seed: int
) -> list[str]:
    rng = random.Random(seed)
    broker = NatsBroker(urls, logger=None, max_reconnect_attempts=-1, reconnect_time_wait=0.2)
    acknowledged: list[str] = []
    async with broker:
        await broker.connect()
        n = -1
        # At least ``ops``, and on until ``min_faults`` faults happened under the publishing.
        while (n := n + 1) < ops or figures.faults.total() < min_faults:
            ref = f"op-{n}"
            message_id = str(uuid.uuid5(uuid.NAMESPACE_URL, f"{seed}:{ref}"))
            for copy in range(2 if rng.random() < 0.1 else 1):
                headers = {"message_id": message_id, "type": "op"}
                for attempt in range(200):
                    try:
                        await broker.publish(
                            {"ref": ref, "n": n},
                            SUBJECT,
                            headers=headers,
                            stream=STREAM,
                            timeout=2.0,
                        )
                        break
                    except Exception:  # a node died under the publish: send it again
                        await asyncio.sleep(min(1.0, 0.05 * (attempt + 1)))
                else:
                    figures.errors.append(f"{ref}: never acknowledged by JetStream")
                    continue
                figures.messages += 1
                if copy == 0:
                    acknowledged.append(ref)
    return acknowledged


async def _pending(urls: list[str]) -> tuple[int, int]:
    client = await nats.connect(urls, max_reconnect_attempts=5)
    try:
        for _ in range(20):
            try:
                info = await client.jetstream().consumer_info(STREAM, "inbox", timeout=2.0)
            except Exception:  # no consumer leader elected yet after the last restart
                await asyncio.sleep(0.5)
                continue
            return info.num_pending or 0, info.num_ack_pending or 0
        return -1, -1
    finally:
        await client.close()


async def _faults(
    cluster: NatsCluster, interval: float, downtime: float, stop: asyncio.Event, figures: Figures
) -> None:
    rng = random.Random()
    turn = 0
    while not stop.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), interval * rng.uniform(0.5, 1.5))
        if stop.is_set():
            return
        leader = await asyncio.to_thread(cluster.stream_leader, STREAM)
        running = [n.name for n in cluster.nodes if n.running]
        if turn % 2 == 0 and leader in running:
            victim, kind = leader, "leader killed"
        else:
            followers = [name for name in running if name != leader]
            victim, kind = rng.choice(followers or running), "follower killed"
        turn += 1
        await asyncio.to_thread(cluster.kill_node, victim)
        figures.faults[kind] += 1
        await asyncio.sleep(downtime)
        await asyncio.to_thread(cluster.start_node, victim)


def _consumer(inbox: AsyncInbox, urls: list[str], first: int) -> tuple[NatsBroker, Any]:
    """One consumer process's broker (it starts on node ``first``) and subscription."""
    broker = NatsBroker(
        urls[first:] + urls[:first],
        logger=None,
        max_reconnect_attempts=-1,
        reconnect_time_wait=0.2,
        graceful_timeout=5.0,
    )
    subscription = subscribe_nats_stream(
        broker,
        inbox,
        SUBJECT,
        stream=JStream(STREAM, num_replicas=3, storage=StorageType.FILE),
        durable="inbox",
        retry=RetryPolicy(delays=(0.2,), max_tries=3),
        max_workers=4,
        ack_wait=_ACK_WAIT,
        max_deliver=20,
    )
    return broker, subscription


def _committed(blocking: Engine) -> Counter[str]:
    with blocking.connect() as connection:
        rows = connection.execute(select(effects.c.ref, func.count()).group_by(effects.c.ref))
        return Counter({str(ref): int(count) for ref, count in rows})


@asynccontextmanager
async def _database() -> AsyncIterator[tuple[Engine, AsyncEngine]]:
    """A fresh PostgreSQL schema with the inbox's and the effects' tables, dropped after."""
    schema = f"nats_{uuid.uuid4().hex[:10]}"
    base = make_url(DATABASE_URL)
    admin = create_engine(base, isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.execute(text(f"CREATE SCHEMA {schema}"))
    blocking = create_engine(base.update_query_dict({"options": f"-csearch_path={schema}"}))
    inbox_metadata.create_all(blocking)
    metadata.create_all(blocking)
    engine = create_async_engine(
        base.set(drivername="postgresql+asyncpg"),
        connect_args={"server_settings": {"search_path": schema}},
        pool_size=8,
    )
    try:
        yield blocking, engine
    finally:
        await engine.dispose()
        blocking.dispose()
        with admin.connect() as connection:
            connection.execute(text(f"DROP SCHEMA {schema} CASCADE"))
        admin.dispose()


async def run(
    ops: int,
    *,
    consumers: int,
    fault_interval: float,
    downtime: float,
    timeout: float,
    min_faults: int = 0,
) -> Figures:
    """One run (see the module doc)."""
    figures = Figures()
    started = time.monotonic()
    async with contextlib.AsyncExitStack() as stack:
        blocking, engine = await stack.enter_async_context(_database())
        cluster = stack.enter_context(NatsCluster(3))
        urls = cluster.urls()
        inbox = AsyncInbox(async_sessionmaker(engine))

        @inbox.handler("op", name="nats.apply")
        async def apply(message: Message, session: AsyncSession) -> None:
            await session.execute(
                effects.insert().values(ref=message.body["ref"], n=message.body["n"])
            )

        started_consumers = [_consumer(inbox, urls, i % len(urls)) for i in range(consumers)]
        brokers = [broker for broker, _ in started_consumers]
        subscriptions = [subscription for _, subscription in started_consumers]
        for broker in brokers:
            await broker.start()
        stop = asyncio.Event()
        faults = asyncio.create_task(_faults(cluster, fault_interval, downtime, stop, figures))
        acknowledged = await _publish_all(
            urls, ops, min_faults, figures, seed=random.randrange(1 << 30)
        )
        figures.operations = len(acknowledged)

        deadline = time.monotonic() + timeout
        while True:
            done = await asyncio.to_thread(_committed, blocking)
            if all(ref in done for ref in acknowledged) or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.5)
        stop.set()
        await faults
        for node in cluster.nodes:
            if not node.running:
                cluster.start_node(node.name)
        # An ack lost with a killed leader comes back after ack_wait (5 s) as a redelivery,
        # which the inbox skips as a duplicate and acks: wait for that, a few ack_waits at most.
        drain_deadline = time.monotonic() + 4 * _ACK_WAIT
        while True:
            await asyncio.sleep(1.0)
            pending = await _pending(urls)
            if pending == (0, 0) or time.monotonic() > drain_deadline:
                break
        if pending != (0, 0):
            figures.errors.append(f"consumer not drained: (undelivered, unacked) {pending}")
        figures.duplicates = sum(s.stats.duplicates for s in subscriptions)
        done = await asyncio.to_thread(_committed, blocking)
        figures.doubled = sum(1 for count in done.values() if count > 1)
        figures.dead_lettered = sum(s.stats.dead_lettered for s in subscriptions)
        figures.lost = sum(1 for ref in acknowledged if ref not in done)
        for broker in brokers:
            with contextlib.suppress(Exception):
                await broker.stop()
    figures.wall = time.monotonic() - started
    return figures


def main(argv: list[str] | None = None) -> int:
    """Run once, print the figures; 0 when nothing was doubled or lost."""
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=2000)
    parser.add_argument("--consumers", type=int, default=2)
    parser.add_argument("--fault-interval", type=float, default=3.0)
    parser.add_argument("--downtime", type=float, default=2.0)
    parser.add_argument(
        "--min-faults", type=int, default=2, help="publish on until this many faults (default 2)"
    )
    parser.add_argument("--timeout", type=float, default=120.0, help="drain deadline, seconds")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.CRITICAL)
    figures = asyncio.run(
        run(
            args.ops,
            consumers=args.consumers,
            fault_interval=args.fault_interval,
            downtime=args.downtime,
            timeout=args.timeout,
            min_faults=args.min_faults,
        )
    )
    print(figures.line(), flush=True)
    return 0 if figures.ok else 1


if __name__ == "__main__":
    sys.exit(main())
