"""The FastStream edge on the real Redis (Streams, a consumer group), with an AsyncInbox on
PostgreSQL (asyncpg): duplicates acked, bad ids and a poison message in ``<stream>.dlq``
with the ``x-inbox-*`` headers, retries added back to the stream, nothing left pending."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from faststream.redis import RedisBroker, StreamSub
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from support.aio import async_engine, record_effect, run
from support.databases import Database
from support.redis import RedisArea, redis_area

from inbox import Message
from inbox.aio import AsyncInbox
from inbox.broker import RetryPolicy
from inbox.faststream import subscribe_redis_stream

HANDLER = "ops.apply"
WAIT = 60.0


@pytest.fixture
def redis_streams() -> Iterator[RedisArea]:
    """Redis at INBOX_TEST_REDIS_URL; skipped locally if unreachable, a failure under CI."""
    with redis_area() as area:
        yield area


async def until(condition: Callable[[], bool], what: str) -> None:
    deadline = asyncio.get_running_loop().time() + WAIT
    while not condition():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out after {WAIT:g} s waiting for {what}")
        await asyncio.sleep(0.02)


def test_redis_streams_process_once_retry_in_the_stream_and_dead_letter_to_the_dlq(
    pg_db: Database, redis_streams: RedisArea
) -> None:
    stream = redis_streams.stream("orders")
    good = [f"g{i}" for i in range(10)]
    flaky_calls: list[str] = []

    async def handler(message: Message, session: AsyncSession) -> None:
        ref = message.body["ref"]
        await record_effect(message, session, HANDLER)
        if ref == "poison":
            raise RuntimeError("poison on purpose")
        if ref == "flaky":
            flaky_calls.append(ref)
            if len(flaky_calls) == 1:
                raise RuntimeError("fails once")

    async def main() -> Any:
        async with async_engine(pg_db, "asyncpg") as engine:
            inbox = AsyncInbox(async_sessionmaker(engine))
            inbox.handler("op", name=HANDLER)(handler)
            broker = RedisBroker(redis_streams.url, logger=None)
            subscription = subscribe_redis_stream(
                broker,
                inbox,
                StreamSub(stream, group="inbox", consumer="c1", polling_interval=20),
                retry=RetryPolicy(delays=(0.05,), max_tries=3),
                max_workers=4,
            )
            async with broker:
                await broker.start()
                for ref in [*good, *good, "poison", "flaky"]:
                    headers = {"message_id": str(uuid.uuid5(uuid.NAMESPACE_URL, ref)), "type": "op"}
                    await broker.publish({"ref": ref}, stream=stream, headers=headers)
                await broker.publish({"ref": "x"}, stream=stream, headers={"type": "op"})
                bad = {"message_id": "order-17", "type": "op"}
                await broker.publish({"ref": "y"}, stream=stream, headers=bad)
                # 20 + poison's 3 tries + flaky's 2 + the two bad ids
                await until(lambda: subscription.stats.acked == 27, "27 entries settled")
            return subscription.stats

    stats = run(main())

    assert pg_db.effect_counts() == {(ref, HANDLER): 1 for ref in [*good, "flaky"]}
    assert (stats.processed, stats.duplicates, stats.retried) == (11, 10, 3)
    dead = {
        headers["x-inbox-reason"]: (body, headers)
        for body, headers in redis_streams.entries(f"{stream}.dlq")
    }
    assert set(dead) == {"missing-message-id", "invalid-message-id", "handler-failed"}
    body, poison = dead["handler-failed"]
    assert body == b'{"ref":"poison"}'
    assert poison["x-inbox-tries"] == "3"
    assert poison["x-inbox-failed-handlers"] == HANDLER
    assert poison["x-inbox-queue"] == stream
    assert "poison on purpose" in poison["x-inbox-error"]
    assert redis_streams.pending(stream, "inbox") == 0


def test_entries_a_dead_consumer_held_are_reclaimed_by_an_autoclaim_subscription(
    pg_db: Database, redis_streams: RedisArea
) -> None:
    """The recipe of docs/faststream.md: a second subscription with ``min_idle_time``
    (XAUTOCLAIM) takes over what a crashed consumer left pending; one of them had committed
    before the crash and is acked as a duplicate."""
    stream = redis_streams.stream("orders")
    refs = ["a", "b", "c"]

    async def handler(message: Message, session: AsyncSession) -> None:
        await record_effect(message, session, HANDLER)

    async def main() -> Any:
        async with async_engine(pg_db, "asyncpg") as engine:
            inbox = AsyncInbox(async_sessionmaker(engine))
            inbox.handler("op", name=HANDLER)(handler)
            producer = RedisBroker(redis_streams.url, logger=None)
            async with producer:
                await producer.connect()
                for ref in refs:
                    headers = {"message_id": str(uuid.uuid5(uuid.NAMESPACE_URL, ref)), "type": "op"}
                    await producer.publish({"ref": ref}, stream=stream, headers=headers)
            with redis_streams.client() as client:
                # A consumer that read every entry and died before acking any of them; it
                # had committed "a" already.
                client.xgroup_create(stream, "inbox", id="0")
                client.xreadgroup("inbox", "crashed", {stream: ">"})
            await inbox.process(Message(uuid.uuid5(uuid.NAMESPACE_URL, "a"), "op", {"ref": "a"}))
            broker = RedisBroker(redis_streams.url, logger=None)
            reclaim = StreamSub(stream, group="inbox", consumer="reclaimer", min_idle_time=50)
            subscription = subscribe_redis_stream(broker, inbox, reclaim)
            async with broker:
                await broker.start()
                await until(lambda: subscription.stats.acked == 3, "3 reclaimed entries settled")
            return subscription.stats

    stats = run(main())

    assert pg_db.effect_counts() == {(ref, HANDLER): 1 for ref in refs}
    assert (stats.processed, stats.duplicates) == (2, 1)
    assert redis_streams.pending(stream, "inbox") == 0
