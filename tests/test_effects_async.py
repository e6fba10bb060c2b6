"""AsyncInbox.effect on every async driver: the blocking ledger through run_sync, the call
awaited between its writes, cancellation recorded."""

from __future__ import annotations

import asyncio
import datetime as dt
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, create_engine, insert, text
from sqlalchemy.ext.asyncio import (
    AsyncEngine,
    AsyncSession,
    async_sessionmaker,
    create_async_engine,
)
from support.aio import ASYNC_DRIVERS, AsyncDatabase, checked_out, fresh_async_database, run
from support.databases import effects
from support.effects import order
from support.ledger import Provider, records

from inbox import (
    KEY_NAMESPACE,
    EffectError,
    HandlerFailed,
    Message,
    Outcome,
    UncertainEffect,
    UnsupportedDialect,
)
from inbox.aio import AsyncInbox
from inbox.schema import inbox_effect, metadata


@pytest.fixture(params=list(ASYNC_DRIVERS))
def adb(
    request: pytest.FixtureRequest, admin_engines: dict[str, Engine], tmp_path: Path
) -> Iterator[AsyncDatabase]:
    """A fresh database reached through each async driver in turn."""
    yield from fresh_async_database(request.param, admin_engines, tmp_path)


async def store_for(adb: AsyncDatabase, tmp_path: Path) -> AsyncEngine | None:
    """aiosqlite needs a store of its own (a second file); the servers use their database."""
    if adb.db.backend != "sqlite":
        return None
    store = create_async_engine(f"sqlite+aiosqlite:///{tmp_path / 'effects.db'}")
    async with store.begin() as connection:
        await connection.run_sync(inbox_effect.create)
    return store


def blocking_records(adb: AsyncDatabase, tmp_path: Path) -> list[dict[str, Any]]:
    if adb.db.backend != "sqlite":
        return records(adb.db.engine)
    engine = create_engine(f"sqlite:///{tmp_path / 'effects.db'}")
    try:
        return records(engine)
    finally:
        engine.dispose()


async def deliver(inbox: AsyncInbox, message: Message) -> HandlerFailed | Outcome:
    try:
        return (await inbox.process(message)).outcome
    except HandlerFailed as failed:
        return failed


def test_the_timeline_awaited(adb: AsyncDatabase, tmp_path: Path) -> None:
    provider = Provider()
    seen: list[Any] = []

    async def main() -> None:
        store = await store_for(adb, tmp_path)
        async with adb.engine() as engine:
            inbox = AsyncInbox(async_sessionmaker(engine), effect_store=store)
            failing = [1]

            async def send(key: uuid.UUID) -> dict[str, Any]:
                await asyncio.sleep(0)
                return provider.send(key)

            @inbox.handler("sms.requested", name="sms.send")
            async def send_sms(message: Message, session: AsyncSession) -> None:
                receipt = await inbox.effect("provider.send", send)
                seen.append(receipt)
                await session.execute(insert(effects).values(ref=receipt["id"], handler="sms"))
                if failing[0]:
                    failing[0] -= 1
                    raise TimeoutError("follow-up timed out")

            message = order("m1", "sms.requested")
            assert isinstance(await deliver(inbox, message), HandlerFailed)
            assert await deliver(inbox, message) is Outcome.PROCESSED
            assert await deliver(inbox, message) is Outcome.DUPLICATE
            assert checked_out(engine) == 0
        if store is not None:
            await store.dispose()

    run(main())
    assert len(provider.calls) == 1
    assert seen[0] == seen[1]
    assert adb.db.effect_counts() == {("sms-1", "sms"): 1}
    [record] = blocking_records(adb, tmp_path)
    assert (record["status"], record["attempts"]) == ("done", 1)


def test_at_most_once_and_a_plain_function_call_awaited(adb: AsyncDatabase, tmp_path: Path) -> None:
    provider = Provider(failures=1)

    async def main() -> list[HandlerFailed | Outcome]:
        store = await store_for(adb, tmp_path)
        async with adb.engine() as engine:
            inbox = AsyncInbox(async_sessionmaker(engine), effect_store=store)

            @inbox.handler("sms.requested", name="sms.send")
            async def send_sms(message: Message, session: AsyncSession) -> None:
                await inbox.effect("provider.send", provider.send, mode="at-most-once")

            message = order("m1", "sms.requested")
            outcomes = [await deliver(inbox, message) for _ in range(2)]
        if store is not None:
            await store.dispose()
        return outcomes

    first, second = run(main())
    assert isinstance(first, HandlerFailed)
    assert isinstance(first.failures["sms.send"], TimeoutError)
    assert isinstance(second, HandlerFailed)
    assert isinstance(second.failures["sms.send"], UncertainEffect)
    assert len(provider.calls) == 1


def test_a_cancelled_call_is_recorded_failed_and_the_cancellation_propagates(
    adb: AsyncDatabase, tmp_path: Path
) -> None:
    async def main() -> None:
        store = await store_for(adb, tmp_path)
        async with adb.engine() as engine:
            inbox = AsyncInbox(async_sessionmaker(engine), effect_store=store)
            started = asyncio.Event()

            async def hang(key: uuid.UUID) -> None:
                started.set()
                await asyncio.sleep(60)

            @inbox.handler("sms.requested", name="sms.send")
            async def send_sms(message: Message, session: AsyncSession) -> None:
                await inbox.effect("provider.send", hang)

            task = asyncio.create_task(inbox.process(order("m1", "sms.requested")))
            await started.wait()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert checked_out(engine) == 0
        if store is not None:
            await store.dispose()

    run(main())
    [record] = blocking_records(adb, tmp_path)
    assert (record["status"], record["error"]) == ("failed", "CancelledError")


def test_effect_outside_a_handler_and_a_blocking_store_are_refused(adb: AsyncDatabase) -> None:
    async def main() -> None:
        async with adb.engine() as engine:
            inbox = AsyncInbox(async_sessionmaker(engine))
            with pytest.raises(EffectError, match="only while a handler"):
                await inbox.effect("provider.send", lambda key: None)
            with pytest.raises(TypeError, match="must be an AsyncEngine"):
                AsyncInbox(async_sessionmaker(engine), effect_store=adb.db.engine)  # type: ignore[arg-type]

    run(main())


def test_batches_awaited_return_stored_results(adb: AsyncDatabase, tmp_path: Path) -> None:
    provider = Provider()

    async def main() -> list[Any]:
        store = await store_for(adb, tmp_path)
        async with adb.engine() as engine:
            inbox = AsyncInbox(async_sessionmaker(engine), effect_store=store)

            @inbox.handler("sms.requested", name="sms.send")
            async def send_sms(message: Message, session: AsyncSession) -> None:
                await inbox.effect("provider.send", provider.send)
                if message.body["ref"] == "bad":
                    raise RuntimeError("this message fails")

            results = await inbox.process_batch(
                [order(ref, "sms.requested") for ref in ("a", "bad", "b", "c")]
            )
        if store is not None:
            await store.dispose()
        return results

    results = run(main())
    assert [isinstance(r, HandlerFailed) for r in results] == [False, True, False, False]
    assert len(provider.calls) == 4
    assert len(set(provider.calls)) == 4


def test_aiosqlite_without_an_effect_store_of_its_own_says_what_to_do(tmp_path: Path) -> None:
    async def main() -> None:
        engine = create_async_engine(f"sqlite+aiosqlite:///{tmp_path / 'inbox.db'}")
        async with engine.begin() as connection:
            await connection.run_sync(metadata.create_all)
        inbox = AsyncInbox(async_sessionmaker(engine))

        @inbox.handler("sms.requested", name="sms.send")
        async def send_sms(message: Message, session: AsyncSession) -> None:
            await inbox.effect("provider.send", lambda key: None)

        with pytest.raises(UnsupportedDialect, match="effect_store="):
            await inbox.process(order("m1", "sms.requested"))
        await engine.dispose()

    run(main())


def test_colon_names_are_two_effects_and_a_version_1_record_stays_valid_awaited(
    adb: AsyncDatabase, tmp_path: Path
) -> None:
    """The key encoding and the version-1 records through run_sync: handler 'notify' with
    step 'sms:customer' and handler 'notify:sms' with step 'customer' are two effects, and
    a record an earlier version wrote for the first is found by it alone."""
    provider = Provider()
    got: dict[str, Any] = {}
    message = order("m1", "sms.requested")
    v1 = uuid.uuid5(KEY_NAMESPACE, f"{message.id.bytes.hex()}:notify:sms:customer")

    async def main() -> None:
        store = await store_for(adb, tmp_path)
        async with adb.engine() as engine:
            target = engine if store is None else store
            async with target.begin() as connection:
                now = dt.datetime.now(dt.UTC)
                await connection.execute(
                    insert(inbox_effect).values(
                        effect_key=v1,
                        claim_key=message.id,
                        handler="notify",
                        step="sms:customer",
                        status="done",
                        attempts=1,
                        result='{"id": "old"}',
                        started_at=now,
                        updated_at=now,
                    )
                )
            inbox = AsyncInbox(async_sessionmaker(engine), effect_store=store)
            for handler, step in (("notify", "sms:customer"), ("notify:sms", "customer")):

                async def send(
                    message: Message,
                    session: AsyncSession,
                    handler: str = handler,
                    step: str = step,
                ) -> None:
                    got[handler] = await inbox.effect(step, provider.send)

                inbox.handler("sms.requested", name=handler)(send)
            assert await deliver(inbox, message) is Outcome.PROCESSED
        if store is not None:
            await store.dispose()

    run(main())
    assert got["notify"] == {"id": "old"}
    [key] = provider.calls
    assert key != v1
    assert got["notify:sms"]["key"] == str(key)


def test_a_pool_timeout_while_recording_done_keeps_the_result_awaited(
    adb: AsyncDatabase, tmp_path: Path
) -> None:
    """Regression (the FastStream report): a pool TimeoutError while 'done' was recorded
    left the record done without its result, so every redelivery raised UncertainEffect
    'could not be stored as JSON'. The effect stays retryable and its result is kept."""
    provider = Provider()
    seen: list[Any] = []

    async def main() -> tuple[HandlerFailed | Outcome, HandlerFailed | Outcome, str]:
        small: dict[str, Any] = {"pool_size": 1, "max_overflow": 0, "pool_timeout": 0.2}
        async with adb.engine() as engine, adb.engine(**small) as server_store:
            store = server_store
            if adb.db.backend == "sqlite":
                sqlite_url = f"sqlite+aiosqlite:///{tmp_path / 'effects.db'}"
                store = create_async_engine(sqlite_url, **small)
            async with store.begin() as connection:
                await connection.run_sync(inbox_effect.create, checkfirst=True)
            inbox = AsyncInbox(async_sessionmaker(engine), effect_store=store)
            held: list[Any] = []

            async def call(key: uuid.UUID) -> dict[str, Any]:
                receipt = provider.send(key)
                if len(provider.calls) == 1:
                    held.append(await store.connect())  # its only connection: 'done' waits
                return receipt

            @inbox.handler("sms.requested", name="sms.send")
            async def send_sms(message: Message, session: AsyncSession) -> None:
                seen.append(await inbox.effect("provider.send", call, mode="at-most-once"))

            message = order("m1", "sms.requested")
            try:
                first = await deliver(inbox, message)
                status = blocking_records(adb, tmp_path)[0]["status"]
                await held.pop().close()
                second = await deliver(inbox, message)
            finally:
                for connection in held:
                    await connection.close()
                await store.dispose()
        return first, second, status

    first, second, status_after_first = run(main())
    assert isinstance(first, HandlerFailed)
    assert not isinstance(first.failures["sms.send"], EffectError | UncertainEffect)
    assert status_after_first == "started"
    assert second is Outcome.PROCESSED
    assert len(provider.calls) == 1
    assert seen == [{"id": "sms-1", "key": str(provider.calls[0]), "text": "hello"}]
    [record] = blocking_records(adb, tmp_path)
    assert record["status"] == "done"


@pytest.mark.parametrize("driver", ["psycopg-async", "asyncpg", "asyncmy"])
def test_as_many_concurrent_effects_as_the_pool_holds_never_wedge_it(
    driver: str, admin_engines: dict[str, Engine], tmp_path: Path
) -> None:
    """Regression: each handler held its claim's connection and waited for a second one of
    the same pool to record its effect; with as many messages at once as the pool holds
    (pool 2, 4 messages), every one waited for the others until the pool's timeout."""
    provider = Provider()

    async def main(adb: AsyncDatabase) -> list[HandlerFailed | Outcome]:
        async with adb.engine(pool_size=2, max_overflow=0, pool_timeout=10) as engine:
            inbox = AsyncInbox(async_sessionmaker(engine))
            together = asyncio.Barrier(2)

            @inbox.handler("sms.requested", name="sms.send")
            async def send_sms(message: Message, session: AsyncSession) -> None:
                await session.execute(insert(effects).values(ref=str(message.id), handler="s"))
                await asyncio.wait_for(together.wait(), 30)  # both claims held: pool taken
                await inbox.effect("provider.send", provider.send)

            messages = [order(f"m{n}", "sms.requested") for n in range(4)]
            return list(await asyncio.gather(*(deliver(inbox, m) for m in messages)))

    for adb in fresh_async_database(driver, admin_engines, tmp_path):
        outcomes = run(main(adb))
        assert outcomes == [Outcome.PROCESSED] * 4
        assert len(set(provider.calls)) == 4
        assert sum(adb.db.effect_counts().values()) == 4


def test_a_result_over_mariadbs_max_allowed_packet_awaited(
    admin_engines: dict[str, Engine], tmp_path: Path
) -> None:
    """asyncmy: a result over max_allowed_packet is recorded done without it, once."""
    provider = Provider()

    async def main(adb: AsyncDatabase) -> list[HandlerFailed | Outcome]:
        async with adb.engine() as engine:
            async with engine.connect() as connection:
                limit = (await connection.execute(text("SELECT @@max_allowed_packet"))).scalar()
            blob = "x" * int(limit)
            inbox = AsyncInbox(async_sessionmaker(engine))

            @inbox.handler("report.requested", name="report.make")
            async def make(message: Message, session: AsyncSession) -> None:
                await inbox.effect("render", lambda key: {**provider.send(key), "pdf": blob})

            message = order("r1", "report.requested")
            return [await deliver(inbox, message) for _ in range(2)]

    for adb in fresh_async_database("asyncmy", admin_engines, tmp_path):
        first, second = run(main(adb))
        assert isinstance(first, HandlerFailed)
        assert isinstance(first.failures["report.make"], EffectError)
        assert "max_allowed_packet" in str(first.failures["report.make"])
        assert isinstance(second, HandlerFailed)
        assert isinstance(second.failures["report.make"], UncertainEffect)
        assert len(provider.calls) == 1
        [record] = records(adb.db.engine)
        assert (record["status"], record["result"]) == ("done", None)
