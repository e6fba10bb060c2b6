"""The FastStream edge on a real ``nats-server -js`` the test starts (tools/cluster/jetstream.py),
with an AsyncInbox on PostgreSQL (asyncpg): duplicates acked, a failed try redelivered by
JetStream (NAK with delay) and counted by it, the last one and bad ids in the dead-letter
stream with the ``x-inbox-*`` headers, nothing left pending; a delivery whose ack never
reached the server comes again after ``ack_wait`` and is a duplicate."""

from __future__ import annotations

import asyncio
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import nats
import pytest
from faststream.nats import JStream, NatsBroker
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from support.aio import async_engine, record_effect, run
from support.databases import Database, cannot_run

from inbox import Message
from inbox.aio import AsyncInbox
from inbox.broker import RetryPolicy
from inbox.faststream import subscribe_nats_stream

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tools.cluster.jetstream import NATS_SERVER, NatsCluster

HANDLER = "ops.apply"
WAIT = 60.0


@pytest.fixture(scope="module")
def nats_url() -> Iterator[str]:
    """One JetStream server for the module; a missing nats-server skips locally, fails in CI."""
    if not Path(NATS_SERVER).exists():
        cannot_run(f"nats-server not installed ({NATS_SERVER})")
    with NatsCluster(1) as server:
        yield server.urls()[0]


def _id(ref: str) -> str:
    return str(uuid.uuid5(uuid.NAMESPACE_URL, ref))


async def until(condition: Callable[[], bool], what: str) -> None:
    deadline = asyncio.get_running_loop().time() + WAIT
    while not condition():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out after {WAIT:g} s waiting for {what}")
        await asyncio.sleep(0.02)


async def dead_letters(url: str, stream: str) -> list[tuple[bytes, dict[str, str]]]:
    """Every message of ``stream`` (the dead-letter stream): (body, headers)."""
    client = await nats.connect(url)
    try:
        js = client.jetstream()
        info = await js.stream_info(stream)
        found = []
        for seq in range(info.state.first_seq, info.state.last_seq + 1):
            stored = await js.get_msg(stream, seq)
            found.append((stored.data or b"", dict(stored.headers or {})))
        return found
    finally:
        await client.close()


async def consumer_state(url: str, stream: str, durable: str) -> tuple[int, int, int | None]:
    """(messages not yet delivered, delivered and not acked, the consumer's max_deliver)."""
    client = await nats.connect(url)
    try:
        info = await client.jetstream().consumer_info(stream, durable)
        return info.num_pending or 0, info.num_ack_pending or 0, info.config.max_deliver
    finally:
        await client.close()


def test_jetstream_process_once_redeliver_with_delay_and_dead_letter_to_the_dlq_stream(
    pg_db: Database, nats_url: str
) -> None:
    tag = uuid.uuid4().hex[:8]
    subject, stream = f"orders-{tag}", f"orders_{tag}"
    good = [f"g{i}" for i in range(10)]
    calls: dict[str, list[int]] = {"poison": [], "flaky": []}

    async def handler(message: Message, session: AsyncSession) -> None:
        ref = message.body["ref"]
        await record_effect(message, session, HANDLER)
        if ref in calls:
            calls[ref].append(int(message.headers["x-inbox-tries"]))
        if ref == "poison":
            raise RuntimeError("poison on purpose")
        if ref == "flaky" and len(calls["flaky"]) == 1:
            raise RuntimeError("fails once")

    async def main() -> Any:
        async with async_engine(pg_db, "asyncpg") as engine:
            inbox = AsyncInbox(async_sessionmaker(engine))
            inbox.handler("op", name=HANDLER)(handler)
            broker = NatsBroker(nats_url, logger=None)
            subscription = subscribe_nats_stream(
                broker,
                inbox,
                subject,
                stream=JStream(stream),
                durable="inbox",
                retry=RetryPolicy(delays=(0.05,), max_tries=3),
                max_workers=4,
            )
            async with broker:
                await broker.start()
                for ref in [*good, *good, "poison", "flaky"]:
                    headers = {"message_id": _id(ref), "type": "op"}
                    await broker.publish({"ref": ref}, subject, headers=headers, stream=stream)
                # JetStream's own dedup id is read when there is no message_id header.
                await broker.publish(
                    {"ref": "by-nats-id"},
                    subject,
                    headers={"Nats-Msg-Id": _id("by-nats-id"), "type": "op"},
                    stream=stream,
                )
                await broker.publish({"ref": "x"}, subject, headers={"type": "op"}, stream=stream)
                bad = {"message_id": "order-17", "type": "op"}
                await broker.publish({"ref": "y"}, subject, headers=bad, stream=stream)
                # 21 (ten twice, one by Nats-Msg-Id) + poison's 3 tries + flaky's 2 + two bad ids
                await until(lambda: subscription.stats.acked == 28, "28 deliveries settled")
            return subscription.stats

    stats = run(main())

    assert pg_db.effect_counts() == {(ref, HANDLER): 1 for ref in [*good, "flaky", "by-nats-id"]}
    assert (stats.processed, stats.duplicates, stats.retried) == (12, 10, 3)
    # The tries each delivery saw are JetStream's redelivery count, not a copy's header.
    assert calls == {"poison": [0, 1, 2], "flaky": [0, 1]}
    dead = {
        headers["x-inbox-reason"]: (body, headers)
        for body, headers in run(dead_letters(nats_url, f"{stream}_dlq"))
    }
    assert set(dead) == {"missing-message-id", "invalid-message-id", "handler-failed"}
    body, poison = dead["handler-failed"]
    assert body == b'{"ref":"poison"}'
    assert poison["x-inbox-tries"] == "3"
    assert poison["x-inbox-failed-handlers"] == HANDLER
    assert poison["x-inbox-queue"] == subject
    assert poison["message_id"] == _id("poison")
    assert "poison on purpose" in poison["x-inbox-error"]
    # Nothing undelivered, nothing unacked; JetStream's bound sits past the edge's.
    assert run(consumer_state(nats_url, stream, "inbox")) == (0, 0, 3 + 3)


def test_a_delivery_whose_ack_is_lost_comes_back_after_ack_wait_as_a_duplicate(
    pg_db: Database, nats_url: str
) -> None:
    """Ack after commit: the commit is durable before the ack is sent, so an ack that never
    arrives (a consumer that died between the two) costs a redelivery, which the inbox
    skips; never a second commit."""
    tag = uuid.uuid4().hex[:8]
    subject, stream = f"orders-{tag}", f"orders_{tag}"

    async def handler(message: Message, session: AsyncSession) -> None:
        await record_effect(message, session, HANDLER)

    async def main() -> Any:
        async with async_engine(pg_db, "asyncpg") as engine:
            inbox = AsyncInbox(async_sessionmaker(engine))
            inbox.handler("op", name=HANDLER)(handler)
            broker = NatsBroker(nats_url, logger=None)
            subscription = subscribe_nats_stream(
                broker, inbox, subject, stream=stream, durable="inbox", ack_wait=1.0
            )
            transport = subscription.edge.transport
            ack = transport.ack
            dropped: list[object] = []

            async def lose_the_first_ack(msg: Any) -> bool:
                if not dropped:
                    dropped.append(msg)
                    return True  # as if the process died after the commit, before the ack
                return await ack(msg)

            transport.ack = lose_the_first_ack  # type: ignore[method-assign]
            async with broker:
                await broker.start()
                headers = {"message_id": _id("once"), "type": "op"}
                await broker.publish({"ref": "once"}, subject, headers=headers, stream=stream)
                await until(lambda: subscription.stats.duplicates == 1, "the redelivery")
            return subscription.stats

    stats = run(main())

    assert pg_db.effect_counts() == {("once", HANDLER): 1}
    assert (stats.deliveries, stats.processed, stats.duplicates) == (2, 1, 1)
    assert run(consumer_state(nats_url, stream, "inbox"))[:2] == (0, 0)


def test_options_that_would_break_the_guarantee_are_refused() -> None:
    broker = NatsBroker("nats://127.0.0.1:1", logger=None)
    inbox = AsyncInbox(async_sessionmaker())
    with pytest.raises(ValueError, match="wildcard"):
        subscribe_nats_stream(broker, inbox, "orders.>", stream="orders", durable="d")
    with pytest.raises(ValueError, match="durable"):
        subscribe_nats_stream(broker, inbox, "orders", stream="orders", durable="")
    with pytest.raises(ValueError, match="max_deliver"):
        subscribe_nats_stream(
            broker,
            inbox,
            "orders",
            stream="orders",
            durable="d",
            retry=RetryPolicy(max_tries=5),
            max_deliver=4,
        )
