"""The FastStream edge under FastStream's in-memory test brokers, as users test their own
apps: TestRabbitBroker and TestRedisBroker, an AsyncInbox on SQLite (aiosqlite).

No RabbitMQ or Redis is needed here; the real brokers are in test_faststream_rabbit.py and
test_faststream_redis.py.
"""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from faststream.exceptions import StopConsume, SubscriberNotFound
from faststream.rabbit import RabbitBroker, RabbitMessage
from faststream.rabbit.testing import TestRabbitBroker
from faststream.redis import RedisBroker, RedisStreamMessage, StreamSub
from faststream.redis.testing import TestRedisBroker
from sqlalchemy import Engine
from sqlalchemy.ext.asyncio import async_sessionmaker
from support.aio import AsyncDatabase, AsyncRecorder, fresh_async_database, run

from inbox.aio import AsyncInbox
from inbox.broker import RetryPolicy
from inbox.errors import SessionConfigurationError
from inbox.faststream import subscribe_rabbit, subscribe_redis_stream

FAST_RETRIES = RetryPolicy(delays=(0.001,), max_tries=3)


@pytest.fixture
def sqlite(admin_engines: dict[str, Engine], tmp_path: Path) -> Iterator[AsyncDatabase]:
    yield from fresh_async_database("aiosqlite", admin_engines, tmp_path)


def test_rabbit_test_broker_processes_once_acks_duplicates_and_dead_letters_poison(
    sqlite: AsyncDatabase,
) -> None:
    async def main() -> tuple[list[dict[str, Any]], Any]:
        async with sqlite.engine() as engine:
            recorder = AsyncRecorder(async_sessionmaker(engine))
            recorder.add("orders.apply", "order.created")
            recorder.fail["orders.apply"] = 0
            broker = RabbitBroker()
            subscription = subscribe_rabbit(broker, recorder.inbox, "orders", retry=FAST_RETRIES)
            dead: list[dict[str, Any]] = []

            @broker.subscriber("orders.dlq")
            async def dead_letters(body: Any, message: RabbitMessage) -> None:
                dead.append(dict(message.headers))

            async with TestRabbitBroker(broker) as test_broker:
                first = str(uuid.uuid4())
                for message_id in (first, first):
                    await test_broker.publish(
                        {"ref": "a"}, "orders", message_id=message_id, message_type="order.created"
                    )
                await test_broker.publish({"ref": "b"}, "orders", message_id="not-a-uuid")
                recorder.fail["orders.apply"] = 99
                await test_broker.publish(
                    {"ref": "c"},
                    "orders",
                    message_id=str(uuid.uuid4()),
                    message_type="order.created",
                )
            return dead, subscription.stats

    dead, stats = run(main())
    assert sqlite.db.effect_counts() == {("a", "orders.apply"): 1}
    assert [d["x-inbox-reason"] for d in dead] == ["invalid-message-id", "handler-failed"]
    assert dead[1]["x-inbox-tries"] == 3
    assert dead[1]["x-inbox-failed-handlers"] == "orders.apply"
    assert dead[1]["x-inbox-queue"] == "orders"
    assert (stats.processed, stats.duplicates, stats.retried, stats.dead_lettered) == (1, 1, 2, 2)
    assert stats.acked == stats.deliveries == 6  # 3 published + 1 duplicate + 2 retry copies


def test_redis_test_broker_processes_once_and_dead_letters_to_the_dlq_stream(
    sqlite: AsyncDatabase,
) -> None:
    async def main() -> list[dict[str, Any]]:
        async with sqlite.engine() as engine:
            recorder = AsyncRecorder(async_sessionmaker(engine))
            recorder.add("orders.apply", "order.created")
            broker = RedisBroker()
            stream = StreamSub("orders", group="inbox", consumer="c1")
            subscribe_redis_stream(broker, recorder.inbox, stream, retry=FAST_RETRIES)
            dead: list[dict[str, Any]] = []

            @broker.subscriber(stream=StreamSub("orders.dlq", group="ops", consumer="o1"))
            async def dead_letters(body: Any, message: RedisStreamMessage) -> None:
                dead.append(dict(message.headers))

            async with TestRedisBroker(broker) as test_broker:
                headers = {"message_id": str(uuid.uuid4()), "type": "order.created"}
                await test_broker.publish({"ref": "a"}, stream="orders", headers=headers)
                await test_broker.publish({"ref": "a"}, stream="orders", headers=headers)
                await test_broker.publish({"ref": "x"}, stream="orders", headers={"type": "t"})
            return dead

    dead = run(main())
    assert sqlite.db.effect_counts() == {("a", "orders.apply"): 1}
    assert [d["x-inbox-reason"] for d in dead] == ["missing-message-id"]


def test_the_edge_refuses_what_it_cannot_honour() -> None:
    class Fake:
        def __call__(self) -> None: ...

    redis = RedisBroker()
    inbox = AsyncInbox.__new__(AsyncInbox)  # the stream checks come first
    with pytest.raises(TypeError, match="StreamSub"):
        subscribe_redis_stream(redis, inbox, "s")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="consumer group"):
        subscribe_redis_stream(redis, inbox, StreamSub("s"))
    with pytest.raises(ValueError, match="no_ack"):
        subscribe_redis_stream(redis, inbox, StreamSub("s", group="g", consumer="c", no_ack=True))
    with pytest.raises(ValueError, match="batch"):
        subscribe_redis_stream(redis, inbox, StreamSub("s", group="g", consumer="c", batch=True))
    with pytest.raises(TypeError, match="AsyncInbox"):
        subscribe_rabbit(RabbitBroker(), Fake(), "q")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="prefetch"):
        subscribe_rabbit(RabbitBroker(), inbox, "q", prefetch=0)
    with pytest.raises(ValueError, match="reserved"):
        subscribe_rabbit(RabbitBroker(), inbox, "amq.q")


def test_import_inbox_and_inbox_aio_load_no_faststream() -> None:
    code = (
        "import sys, inbox, inbox.aio\n"
        "assert 'faststream' not in sys.modules, 'import inbox loaded faststream'\n"
        "import inbox.faststream\n"
        "assert 'faststream' in sys.modules\n"
        "print('ok')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False, timeout=60
    )
    assert done.stdout.strip() == "ok", done.stderr


def test_a_configuration_error_gives_the_delivery_back_and_stops_the_subscriber(
    sqlite: AsyncDatabase,
) -> None:
    async def main() -> tuple[BaseException | None, Any, list[type[BaseException]]]:
        async with sqlite.engine() as engine:
            inbox = AsyncInbox(async_sessionmaker(engine))

            @inbox.handler("op", name="ops.misconfigured")
            async def misconfigured(message: Any, session: Any) -> None:
                raise SessionConfigurationError("the session factory is wrong")

            broker = RabbitBroker()
            subscription = subscribe_rabbit(broker, inbox, "orders")
            raised: list[type[BaseException]] = []
            async with TestRabbitBroker(broker) as test_broker:
                for _ in range(2):
                    try:
                        await test_broker.publish(
                            {"ref": "a"}, "orders", message_id=str(uuid.uuid4()), message_type="op"
                        )
                    except StopConsume:
                        raised.append(StopConsume)
            return subscription.halted_by, subscription.stats, raised

    halted_by, stats, raised = run(main())
    assert isinstance(halted_by, SessionConfigurationError)
    assert raised == [StopConsume]  # FastStream stops the subscriber on it
    # Neither delivery was retried, dead-lettered or acked: both were given back untouched.
    assert (stats.acked, stats.retried, stats.dead_lettered, stats.requeued) == (0, 0, 0, 2)
    assert sqlite.db.effect_counts() == {}


def test_under_test_rabbit_broker_a_dead_letter_needs_a_subscriber_on_the_dlq(
    sqlite: AsyncDatabase,
) -> None:
    async def main() -> None:
        async with sqlite.engine() as engine:
            recorder = AsyncRecorder(async_sessionmaker(engine))
            recorder.add("orders.apply", "order.created")
            broker = RabbitBroker()
            subscribe_rabbit(broker, recorder.inbox, "orders")
            async with TestRabbitBroker(broker) as test_broker:
                with pytest.raises(SubscriberNotFound):
                    await test_broker.publish({"ref": "a"}, "orders", message_id="not-a-uuid")

    run(main())
    assert sqlite.db.effect_counts() == {}
