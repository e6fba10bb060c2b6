"""The NATS edge where JetStream or the bucket answers something unexpected, on a real
``nats-server -js`` the test starts (tools/cluster/jetstream.py): a retry history that is
not a JSON object is ignored with a warning, a consumer check that fails is tried again on
the next delivery while the deliveries go on, a dead letter whose body alone passes
``max_payload`` goes with its body dropped, and only the errors the transport expects are
taken for "not connected" or "not from JetStream"."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from faststream.nats import NatsBroker
from nats.aio.client import Client
from nats.aio.msg import Msg
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from support.aio import async_engine, record_effect, run
from support.databases import Database
from support.nats import jetstream_url

from inbox import Message
from inbox.aio import AsyncInbox
from inbox.broker import RetryPolicy
from inbox.faststream import subscribe_nats_stream
from inbox.faststream._nats_consumer import RetryHistory
from inbox.faststream._nats_transport import NatsTransport, _metadata

HANDLER = "ops.apply"
WAIT = 60.0


@pytest.fixture(scope="module")
def nats_url() -> Iterator[str]:
    """One JetStream server for the module; a missing nats-server skips locally, fails in CI."""
    with jetstream_url(first_port=4901) as url:
        yield url


def test_only_not_connected_and_not_from_jetstream_are_taken_as_such(
    nats_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A broker not connected has no ``max_payload`` and is not closed; a core NATS message
    has no JetStream metadata. Anything else raised there is a bug and comes out: taken for
    "not connected", it would turn the trimming of dead letters off."""

    def broken(self: object) -> Any:
        raise ZeroDivisionError("a bug")

    async def main() -> Any:
        broker = NatsBroker(nats_url, logger=None)
        history = RetryHistory(broker, "orders", "inbox", 1)
        transport = NatsTransport(broker, "orders", "orders_dlq", history)
        before = transport.max_payload(), transport.closed()
        async with broker:
            await broker.connect()
            during = transport.max_payload(), transport.closed()
            subscription = await broker.connection.subscribe("core")
            await broker.connection.publish("core", b"{}")
            core = await subscription.next_msg(timeout=WAIT)
            delivered = SimpleNamespace(raw_message=core)
            found = _metadata(delivered)  # type: ignore[arg-type]
            with monkeypatch.context() as patch:
                patch.setattr(Client, "max_payload", property(broken))
                patch.setattr(Client, "is_closed", property(broken))
                patch.setattr(Msg, "metadata", property(broken))
                with pytest.raises(ZeroDivisionError):
                    transport.max_payload()
                with pytest.raises(ZeroDivisionError):
                    transport.closed()
                with pytest.raises(ZeroDivisionError):
                    _metadata(delivered)  # type: ignore[arg-type]
        return before, during, found

    before, during, found = run(main())

    assert before == (None, False)
    assert during == (1024 * 1024, False)
    assert found is None


async def until(condition: Callable[[], bool], what: str) -> None:
    deadline = asyncio.get_running_loop().time() + WAIT
    while not condition():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out after {WAIT:g} s waiting for {what}")
        await asyncio.sleep(0.02)


def test_a_retry_history_that_is_not_a_json_object_is_ignored_with_a_warning(
    nats_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Whatever else wrote to the bucket (not JSON, not UTF-8, a JSON list or number) costs
    the dead letter its first-failure headers, not the delivery: recall raised out of the
    edge's handle, and JetStream delivered the message again until max_deliver dropped it."""
    stream = f"orders_{uuid.uuid4().hex[:8]}"
    written = {1: b"not json", 2: b"\xff\xfe", 3: b"[1, 2]", 4: b"42", 5: b'{"x-inbox-error": "e"}'}

    async def main() -> dict[int, dict[str, str]]:
        broker = NatsBroker(nats_url, logger=None)
        history = RetryHistory(broker, stream, "inbox", 1)
        async with broker:
            await broker.connect()
            kv = await broker.key_value(f"{stream}_inbox_retries")
            for sequence, value in written.items():
                await kv.put(f"inbox.{sequence}", value)
            return {sequence: await history.recall(sequence) for sequence in written}

    with caplog.at_level(logging.WARNING, logger="inbox.faststream"):
        recalled = run(main())

    assert recalled == {1: {}, 2: {}, 3: {}, 4: {}, 5: {"x-inbox-error": "e"}}
    warned = [r.getMessage() for r in caplog.records if "not a JSON object" in r.getMessage()]
    assert [line.split(":")[0] for line in warned] == [f"stream sequence {n}" for n in range(1, 5)]
    assert "JSONDecodeError" in warned[0]
    assert "a JSON list" in warned[2]


def test_a_consumer_check_jetstream_does_not_answer_is_made_again_and_deliveries_go_on(
    pg_db: Database, nats_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The consumer's max_deliver cannot be looked up (here: the edge asks for a consumer
    JetStream does not have): each delivery is processed and acked, each logs the check
    that failed, and the check stays due. The lookup's error used to escape the edge: no
    delivery processed, each one back after ack_wait until max_deliver dropped it."""
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
                broker, inbox, subject, stream=stream, durable="inbox", retry=RetryPolicy()
            )
            edge: Any = subscription.edge
            edge.consumer = (stream, "not-there", 7)
            async with broker:
                await broker.start()
                for ref in ("a", "b"):
                    headers = {"message_id": str(uuid.uuid4()), "type": "op"}
                    await broker.publish({"ref": ref}, subject, headers=headers, stream=stream)
                await until(lambda: subscription.stats.acked == 2, "2 acked")
            return subscription, edge.consumer

    with caplog.at_level(logging.WARNING, logger="inbox.faststream"):
        subscription, due = run(main())

    assert pg_db.effect_counts() == {("a", HANDLER): 1, ("b", HANDLER): 1}
    assert subscription.halted_by is None
    assert due == (stream, "not-there", 7)
    warned = [r.getMessage() for r in caplog.records if "could not be checked" in r.getMessage()]
    assert len(warned) == 2
    assert warned[0].startswith(f"consumer 'not-there' of stream '{stream}'")
    assert "NotFoundError" in warned[0]


@pytest.fixture(scope="module")
def small_nats_url() -> Iterator[str]:
    """A JetStream server whose ``max_payload`` (headers and body) is 8 KiB."""
    with jetstream_url(first_port=4951, max_payload=8192) as url:
        yield url


def test_a_dead_letter_whose_body_leaves_no_room_for_its_headers_goes_without_the_body(
    pg_db: Database, small_nats_url: str
) -> None:
    """The message fits the 8 KiB limit with its own few headers; its dead letter, even
    trimmed to the bookkeeping, does not. It goes to the dead letters without its body,
    named in the error, the message itself still in its stream at the sequence the dead
    letter's Nats-Msg-Id gives. It used to be refused as a copy: the delivery held, tried
    again and again, until JetStream dropped it at max_deliver with no dead letter."""
    tag = uuid.uuid4().hex[:8]
    subject, stream = f"orders-{tag}", f"orders_{tag}"
    pad = "x" * 7900

    async def handler(message: Message, session: AsyncSession) -> None:
        await record_effect(message, session, HANDLER)
        if message.body["ref"] == "full":
            raise RuntimeError("full fails: " + "e" * 900)

    async def main() -> Any:
        async with async_engine(pg_db, "asyncpg") as engine:
            inbox = AsyncInbox(async_sessionmaker(engine))
            inbox.handler("op", name=HANDLER)(handler)
            broker = NatsBroker(small_nats_url, logger=None)
            subscription = subscribe_nats_stream(
                broker,
                inbox,
                subject,
                stream=stream,
                durable="inbox",
                retry=RetryPolicy(delays=(0.05,), max_tries=1),
            )
            async with broker:
                await broker.start()
                for body in ({"ref": "full", "pad": pad}, {"ref": "after"}):
                    headers = {"message_id": str(uuid.uuid4()), "type": "op"}
                    await broker.publish(body, subject, headers=headers, stream=stream)
                await until(lambda: subscription.stats.acked == 2, "2 settled")
                js = broker.connection.jetstream()
                dead = await js.get_msg(f"{stream}_dlq", 1)
                original = await js.get_msg(stream, 1)
            return subscription.stats, dead, original

    stats, dead, original = run(main())

    assert pg_db.effect_counts() == {("after", HANDLER): 1}
    assert stats.dead_letter_reasons["copy-too-large"] == 1
    headers = {k: str(v) for k, v in (dead.headers or {}).items()}
    assert not dead.data
    assert headers["x-inbox-reason"] == "copy-too-large"
    assert headers["x-inbox-tries"] == "1"
    error = headers["x-inbox-error"]
    assert error.startswith(f"the body ({len(original.data)} bytes) was dropped")
    assert "the copy did not fit" in error
    assert headers["Nats-Msg-Id"] == f"{stream}:1:dead-letter"
    assert b'"ref": "full"' in original.data or b'"ref":"full"' in original.data
