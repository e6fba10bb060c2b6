"""The FastStream edge on a real ``nats-server -js`` the test starts (tools/cluster/jetstream.py),
with an AsyncInbox on PostgreSQL (asyncpg): duplicates acked, a failed try redelivered by
JetStream (NAK with delay) and counted by it, the last one and bad ids in the dead-letter
stream with the ``x-inbox-*`` headers, nothing left pending; a delivery whose ack never
reached the server comes again after ``ack_wait`` and is a duplicate. On a server with an
8 KiB ``max_payload``, dead letters that would pass it go trimmed instead of closing the
connection; a durable made with a lower ``max_deliver`` is raised (or, for a user who may
not change it, the subscriber halts naming it); the retry history survives the NAKs; a
closed connection stops the subscriber."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import nats
import pytest
from faststream.nats import JStream, NatsBroker, TestNatsBroker
from nats.errors import ConnectionClosedError
from nats.js.api import ConsumerConfig
from nats.js.errors import NoKeysError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from support.aio import async_engine, record_effect, run
from support.databases import Database, cannot_run
from support.nats import jetstream_url

from inbox import Message
from inbox.aio import AsyncInbox
from inbox.broker import RetryPolicy
from inbox.delivery.headers import parse_time
from inbox.faststream import subscribe_nats_stream

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tools.cluster.jetstream import NATS_SERVER, NatsCluster

HANDLER = "ops.apply"
WAIT = 60.0


@pytest.fixture(scope="module")
def nats_url() -> Iterator[str]:
    """One JetStream server for the module; a missing nats-server skips locally, fails in CI."""
    with jetstream_url() as url:
        yield url


@pytest.fixture(scope="module")
def small_nats_url() -> Iterator[str]:
    """A JetStream server whose ``max_payload`` (headers and body) is 8 KiB."""
    with jetstream_url(first_port=4601, max_payload=8192) as url:
        yield url


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
            # str(): nats-py's get_msg parses a header with non-ASCII text (an error cut
            # with "…") into an email Header object.
            headers = {k: str(v) for k, v in (stored.headers or {}).items()}
            found.append((stored.data or b"", headers))
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


def _failing_edge_run(
    pg_db: Database,
    url: str,
    *,
    subject: str,
    stream: str,
    policy: RetryPolicy,
    published: list[tuple[str, dict[str, Any], dict[str, str]]],
    settled: int,
    calls: dict[str, list[dict[str, str]]],
    before: Callable[[], Any] | None = None,
) -> Any:
    """Publish ``published`` (ref, body, extra headers) to an edge whose handler fails for
    every ref in ``calls`` (recording the headers it saw), until ``settled`` acks."""

    async def handler(message: Message, session: AsyncSession) -> None:
        ref = message.body["ref"]
        await record_effect(message, session, HANDLER)
        if ref in calls:
            calls[ref].append({k: str(v) for k, v in message.headers.items()})
            if ref != "flaky" or len(calls[ref]) == 1:
                raise RuntimeError(f"{ref} fails: " + "e" * 900)

    async def main() -> Any:
        if before is not None:
            await before()
        async with async_engine(pg_db, "asyncpg") as engine:
            inbox = AsyncInbox(async_sessionmaker(engine))
            inbox.handler("op", name=HANDLER)(handler)
            broker = NatsBroker(url, logger=None)
            subscription = subscribe_nats_stream(
                broker, inbox, subject, stream=stream, durable="inbox", retry=policy
            )
            async with broker:
                await broker.start()
                for ref, body, extra in published:
                    headers = {"message_id": _id(ref), "type": "op", **extra}
                    await broker.publish(body, subject, headers=headers, stream=stream)
                await until(lambda: subscription.stats.acked == settled, f"{settled} settled")
            return subscription.stats

    return run(main())


def test_a_dead_letter_over_max_payload_goes_trimmed_and_the_consumer_goes_on(
    pg_db: Database, small_nats_url: str
) -> None:
    """Both poison messages fit the 8 KiB limit, their dead letters with the x-inbox-*
    headers do not: one has a large header of its own (trimmed away), the other a large
    body (its error is cut). Published anyway, the server would close the connection and
    the edge would retry the copy for ever, the message behind them never processed."""
    tag = uuid.uuid4().hex[:8]
    subject, stream = f"orders-{tag}", f"orders_{tag}"
    published = [
        ("wide", {"ref": "wide", "pad": "w" * 5000}, {"trace": "t" * 2500}),
        ("tall", {"ref": "tall", "pad": "x" * 7300}, {}),
        ("after", {"ref": "after"}, {}),
    ]
    calls: dict[str, list[dict[str, str]]] = {"wide": [], "tall": []}

    stats = _failing_edge_run(
        pg_db,
        small_nats_url,
        subject=subject,
        stream=stream,
        policy=RetryPolicy(delays=(0.05,), max_tries=1),
        published=published,
        settled=3,
        calls=calls,
    )

    assert pg_db.effect_counts() == {("after", HANDLER): 1}
    assert stats.dead_lettered == 2
    assert stats.dead_letter_reasons["copy-too-large"] == 2
    dead = {
        json.loads(body)["ref"]: headers
        for body, headers in run(dead_letters(small_nats_url, f"{stream}_dlq"))
    }
    assert set(dead) == {"wide", "tall"}
    assert {headers["x-inbox-reason"] for headers in dead.values()} == {"copy-too-large"}
    assert "trace" not in dead["wide"]
    assert "trace" in dead["wide"]["x-inbox-error"]  # named among the dropped headers
    assert "wide fails" in dead["wide"]["x-inbox-error"]
    # Its error cut to fit: shorter than the one the wide message's trimmed copy kept.
    assert dead["tall"]["x-inbox-error"].startswith("the copy did not fit")
    assert len(dead["tall"]["x-inbox-error"]) < len(dead["wide"]["x-inbox-error"])
    assert dead["tall"]["x-inbox-tries"] == "1"
    assert run(consumer_state(small_nats_url, stream, "inbox"))[:2] == (0, 0)


def test_an_existing_durable_with_a_lower_max_deliver_is_raised_before_the_first_delivery(
    pg_db: Database, nats_url: str
) -> None:
    """A durable made by an earlier deployment (max_tries=1, max_deliver=2): with
    max_tries=4 now, JetStream would stop after 2 deliveries and the message would be gone,
    neither dead-lettered nor pending."""
    tag = uuid.uuid4().hex[:8]
    subject, stream = f"orders-{tag}", f"orders_{tag}"

    async def old_deployment() -> None:
        client = await nats.connect(nats_url)
        try:
            js = client.jetstream()
            await js.add_stream(name=stream, subjects=[subject])
            config = ConsumerConfig(durable_name="inbox", max_deliver=2, filter_subject=subject)
            await js.add_consumer(stream, config)
        finally:
            await client.close()

    calls: dict[str, list[dict[str, str]]] = {"poison": []}
    _failing_edge_run(
        pg_db,
        nats_url,
        subject=subject,
        stream=stream,
        policy=RetryPolicy(delays=(0.05,), max_tries=4),
        published=[("poison", {"ref": "poison"}, {})],
        settled=4,
        calls=calls,
        before=old_deployment,
    )

    assert [seen["x-inbox-tries"] for seen in calls["poison"]] == ["0", "1", "2", "3"]
    (dead,) = run(dead_letters(nats_url, f"{stream}_dlq"))
    assert (dead[1]["x-inbox-reason"], dead[1]["x-inbox-tries"]) == ("handler-failed", "4")
    assert run(consumer_state(nats_url, stream, "inbox")) == (0, 0, 4 + 3)


def test_the_retry_history_survives_the_naks_into_the_dead_letter(
    pg_db: Database, nats_url: str
) -> None:
    """A retry is a NAK, which carries no headers: the first failure, the error and the
    failed handlers are kept in the stream's key-value bucket and read back on the next
    delivery, so a dead letter dates its first failure as on RabbitMQ; once a message is
    settled its history is purged."""
    tag = uuid.uuid4().hex[:8]
    subject, stream = f"orders-{tag}", f"orders_{tag}"
    calls: dict[str, list[dict[str, str]]] = {"poison": [], "flaky": []}
    published = [("poison", {"ref": "poison"}, {}), ("flaky", {"ref": "flaky"}, {})]

    _failing_edge_run(
        pg_db,
        nats_url,
        subject=subject,
        stream=stream,
        policy=RetryPolicy(delays=(0.3,), max_tries=3),
        published=published,
        settled=5,
        calls=calls,
    )

    (dead,) = run(dead_letters(nats_url, f"{stream}_dlq"))
    headers = dead[1]
    first = parse_time(headers["x-inbox-first-failure"])
    last = parse_time(headers["x-inbox-last-failure"])
    assert first is not None
    assert last is not None
    assert (last - first).total_seconds() >= 0.5  # two delays of 0.3 s between them
    # The handlers see what a RabbitMQ retry copy would carry.
    assert "x-inbox-first-failure" not in calls["poison"][0]
    assert {seen["x-inbox-first-failure"] for seen in calls["poison"][1:]} == {
        headers["x-inbox-first-failure"]
    }
    assert calls["poison"][2]["x-inbox-failed-handlers"] == HANDLER
    assert calls["flaky"][1]["x-inbox-error"].startswith(f"{HANDLER}: RuntimeError: flaky fails")
    assert run(retry_history_keys(nats_url, stream)) == []


async def retry_history_keys(url: str, stream: str) -> list[str]:
    """The live keys of ``stream``'s retry-history bucket."""
    client = await nats.connect(url)
    try:
        kv = await client.jetstream().key_value(f"{stream}_inbox_retries")
        try:
            return list(await kv.keys())
        except NoKeysError:
            return []
    finally:
        await client.close()


def test_a_closed_connection_stops_the_subscriber_instead_of_retrying_the_copy_for_ever(
    pg_db: Database, nats_url: str
) -> None:
    """nats-py does not reopen a client the server (or anything else) closed: a copy
    refused with "connection closed" can never succeed. The edge stops the subscriber
    (FastStream's pull loop would spin on the closed client), says why in ``halted_by``,
    and the broker answers its ping with False; the message stays with JetStream."""
    tag = uuid.uuid4().hex[:8]
    subject, stream = f"orders-{tag}", f"orders_{tag}"
    seen: list[str] = []

    async def main() -> Any:
        async with async_engine(pg_db, "asyncpg") as engine:
            inbox = AsyncInbox(async_sessionmaker(engine))
            broker = NatsBroker(nats_url, logger=None)

            @inbox.handler("op", name=HANDLER)
            async def handler(message: Message, session: AsyncSession) -> None:
                seen.append(message.body["ref"])
                await broker.connection.close()  # the server's close, as after -ERR
                raise RuntimeError("fails with the connection gone")

            subscription = subscribe_nats_stream(
                broker,
                inbox,
                subject,
                stream=stream,
                durable="inbox",
                retry=RetryPolicy(delays=(0.05,), max_tries=1),
            )
            await broker.start()
            try:
                headers = {"message_id": _id("gone"), "type": "op"}
                await broker.publish({"ref": "gone"}, subject, headers=headers, stream=stream)
                await until(lambda: subscription.halted_by is not None, "the subscriber to stop")
                ready = await broker.ping(0.5)
            finally:
                # FastStream's stop unsubscribes on the closed client, which raises.
                with contextlib.suppress(ConnectionClosedError, ExceptionGroup):
                    await broker.stop()
            return subscription, ready

    subscription, ready = run(main())

    assert seen == ["gone"]
    assert "connection closed" in str(subscription.halted_by)
    assert not subscription.subscriber.running
    assert ready is False
    assert subscription.stats.acked == 0
    # Not acked: JetStream still holds it for the next worker.
    assert run(consumer_state(nats_url, stream, "inbox"))[:2] in {(0, 1), (1, 0)}


def test_under_faststream_s_test_broker_the_edge_processes_without_jetstream(
    pg_db: Database,
) -> None:
    """TestNatsBroker's deliveries carry no JetStream metadata and its connection is a
    mock: no consumer check, no retry history, no closed-connection stop."""
    seen: list[str] = []

    async def handler(message: Message, session: AsyncSession) -> None:
        seen.append(message.body["ref"])
        await record_effect(message, session, HANDLER)

    async def main() -> Any:
        async with async_engine(pg_db, "asyncpg") as engine:
            inbox = AsyncInbox(async_sessionmaker(engine))
            inbox.handler("op", name=HANDLER)(handler)
            broker = NatsBroker(logger=None)
            subscription = subscribe_nats_stream(
                broker, inbox, "orders", stream="orders", durable="inbox"
            )
            async with TestNatsBroker(broker) as testing:
                headers = {"message_id": _id("test-broker"), "type": "op"}
                await testing.publish({"ref": "t"}, "orders", headers=headers, stream="orders")
            return subscription

    subscription = run(main())

    assert seen == ["t"]
    assert subscription.halted_by is None
    assert (subscription.stats.processed, subscription.stats.acked) == (1, 1)


_NO_CONSUMER_CHANGES = """
authorization {
  users = [
    {user: admin, password: admin}
    {user: app, password: app, permissions: {publish: {allow: ">", deny: [
      "$JS.API.CONSUMER.CREATE.>", "$JS.API.CONSUMER.DURABLE.CREATE.>"
    ]}}}
  ]
}
"""


def test_a_durable_whose_max_deliver_cannot_be_raised_halts_the_subscriber_naming_it(
    pg_db: Database,
) -> None:
    """The worker's user may not change consumers: the durable (max_deliver=2, made by an
    operator) cannot be raised to what max_tries=4 needs, so nothing is processed; the
    subscriber halts with one line naming the consumer and both settings, and the message
    stays with JetStream."""
    if not Path(NATS_SERVER).exists():
        cannot_run(f"nats-server not installed ({NATS_SERVER})")
    subject, stream = "orders", "orders"
    seen: list[str] = []

    async def handler(message: Message, session: AsyncSession) -> None:
        seen.append(message.body["ref"])

    async def main(port: int) -> Any:
        admin = await nats.connect(f"nats://admin:admin@127.0.0.1:{port}")
        js = admin.jetstream()
        await js.add_stream(name=stream, subjects=[subject])
        config = ConsumerConfig(durable_name="billing", max_deliver=2, filter_subject=subject)
        await js.add_consumer(stream, config)
        await js.publish(subject, b'{"ref": "kept"}', headers={"message_id": _id("kept")})
        await admin.close()
        async with async_engine(pg_db, "asyncpg") as engine:
            inbox = AsyncInbox(async_sessionmaker(engine))
            inbox.handler("op", name=HANDLER)(handler)
            broker = NatsBroker(f"nats://app:app@127.0.0.1:{port}", logger=None)
            subscription = subscribe_nats_stream(
                broker,
                inbox,
                subject,
                stream=stream,
                durable="billing",
                retry=RetryPolicy(delays=(0.05,), max_tries=4),
            )
            async with broker:
                await broker.start()
                await until(lambda: subscription.halted_by is not None, "the halt")
            return subscription

    with NatsCluster(1, first_port=4801, config=_NO_CONSUMER_CHANGES) as server:
        subscription = run(main(server.nodes[0].client_port))
        url = f"nats://admin:admin@127.0.0.1:{server.nodes[0].client_port}"
        pending, unacked, max_deliver = run(consumer_state(url, stream, "billing"))

    assert seen == []
    error = str(subscription.halted_by)
    assert "consumer 'billing' of stream 'orders' has max_deliver=2" in error
    assert "max_tries=4" in error
    assert "raised to 7" in error
    assert "\n" not in error
    assert max_deliver == 2
    assert pending + unacked == 1  # given back: still JetStream's
