"""The middleware chain and the delivery hooks of AsyncInbox on aiosqlite, psycopg (async)
and asyncmy: the same promises as the blocking inbox's (tests/test_middleware.py), awaited."""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, insert
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker
from support.aio import AsyncDatabase, fresh_async_database, run
from support.databases import effects
from support.ledger import Provider

from inbox import HandlerFailed, Message, Outcome, ProcessResult, TransactionControlError
from inbox.aio import AsyncInbox
from inbox.errors import RegistrationError
from inbox.middleware import AsyncTiming, async_log_context, current_handler, log_context
from inbox.schema import inbox_effect, inbox_message

Next = Callable[[Message], Awaitable[object]]
Deliver = Callable[[Message], Awaitable[ProcessResult]]


@pytest.fixture(params=["aiosqlite", "psycopg-async", "asyncmy"])
def adb(
    request: pytest.FixtureRequest, admin_engines: dict[str, Engine], tmp_path: Path
) -> Iterator[AsyncDatabase]:
    """A fresh database through one async driver per backend."""
    yield from fresh_async_database(request.param, admin_engines, tmp_path)


async def write(session: AsyncSession, ref: str, handler: str) -> None:
    await session.execute(insert(effects).values(ref=ref, handler=handler))


def tracing(events: list[str], name: str) -> Callable[[Message, AsyncSession, Next], Any]:
    async def middleware(message: Message, session: AsyncSession, call_next: Next) -> object:
        events.append(f"{name} in {current_handler()}")
        returned = await call_next(message)
        events.append(f"{name} out")
        return returned

    return middleware


def test_order_hooks_and_duplicates_awaited(adb: AsyncDatabase) -> None:
    events: list[str] = []

    async def hook(message: Message, call_next: Deliver) -> ProcessResult:
        events.append(f"hook in, claims={adb.db.count(inbox_message)}")
        result = await call_next(message)
        events.append(f"hook out {result.outcome.value}, claims={adb.db.count(inbox_message)}")
        return result

    async def main() -> None:
        async with adb.engine() as engine:
            inbox = AsyncInbox(
                async_sessionmaker(engine),
                middleware=[tracing(events, "first"), tracing(events, "second")],
                around_delivery=[async_log_context, hook],
            )

            @inbox.handler("order.created", name="orders")
            async def handle(message: Message, session: AsyncSession) -> None:
                events.append("handler")
                await write(session, "o-1", "orders")

            message = Message.new("order.created", {})
            assert (await inbox.process(message)).outcome is Outcome.PROCESSED
            assert (await inbox.process(message)).outcome is Outcome.DUPLICATE

    run(main())
    assert events == [
        "hook in, claims=0",
        "first in orders",
        "second in orders",
        "handler",
        "second out",
        "first out",
        "hook out processed, claims=1",
        "hook in, claims=1",
        "hook out duplicate, claims=1",
    ]
    assert adb.db.effect_counts() == {("o-1", "orders"): 1}


def test_a_raising_middleware_rolls_back_and_guards_hold_awaited(adb: AsyncDatabase) -> None:
    mode = ["raise"]

    async def audit(message: Message, session: AsyncSession, call_next: Next) -> object:
        await write(session, "audit", "audit")
        returned = await call_next(message)
        if mode[0] == "raise":
            raise RuntimeError("audit refused")
        if mode[0] == "commit":
            await session.commit()
        return returned

    async def main() -> list[BaseException]:
        failures: list[BaseException] = []
        async with adb.engine() as engine:
            inbox = AsyncInbox(async_sessionmaker(engine), middleware=[audit])

            @inbox.handler(name="orders")
            async def handle(message: Message, session: AsyncSession) -> None:
                await write(session, "o-1", "orders")

            message = Message.new("order.created", {})
            for attempt in ("raise", "commit"):
                mode[0] = attempt
                try:
                    await inbox.process(message)
                except HandlerFailed as failed:
                    failures.append(failed.failures["orders"])
            assert adb.db.count(inbox_message) == 0
            assert adb.db.effect_counts() == {}
            mode[0] = "pass"
            assert (await inbox.process(message)).outcome is Outcome.PROCESSED
        return failures

    failures = run(main())
    assert [type(f) for f in failures] == [RuntimeError, TransactionControlError]
    assert adb.db.effect_counts() == {("audit", "audit"): 1, ("o-1", "orders"): 1}


def test_effects_in_a_wrapped_handler_and_timing_awaited(
    adb: AsyncDatabase, tmp_path: Path
) -> None:
    provider = Provider()
    timings: list[tuple[str, str | None]] = []

    def report(handler: str, message: Message, seconds: float, error: BaseException | None) -> None:
        timings.append((handler, None if error is None else type(error).__name__))

    async def main() -> None:
        store: AsyncEngine | None = None
        if adb.db.backend == "sqlite":
            from sqlalchemy.ext.asyncio import create_async_engine

            store = create_async_engine(f"sqlite+aiosqlite:///{tmp_path / 'effects.db'}")
            async with store.begin() as connection:
                await connection.run_sync(inbox_effect.create)
        async with adb.engine() as engine:
            inbox = AsyncInbox(
                async_sessionmaker(engine), middleware=[AsyncTiming(report)], effect_store=store
            )
            fail_after = [True]

            @inbox.handler(name="payments")
            async def pay(message: Message, session: AsyncSession) -> None:
                async def charge(key: uuid.UUID) -> dict[str, Any]:
                    return provider.send(key, "charged")

                await inbox.effect("charge", charge)
                await write(session, "p-1", "payments")
                if fail_after[0]:
                    fail_after[0] = False
                    raise RuntimeError("failed after the charge")

            message = Message.new("payment.requested", {})
            with pytest.raises(HandlerFailed):
                await inbox.process(message)
            assert (await inbox.process(message)).outcome is Outcome.PROCESSED
        if store is not None:
            await store.dispose()

    run(main())
    assert list(provider.per_key().values()) == [1]
    assert timings == [("payments", "RuntimeError"), ("payments", None)]
    assert adb.db.effect_counts() == {("p-1", "payments"): 1}


def test_blocking_layers_are_refused_by_the_async_inbox(adb: AsyncDatabase) -> None:
    async def main() -> None:
        async with adb.engine() as engine:
            with pytest.raises(RegistrationError, match="not a coroutine function"):
                AsyncInbox(async_sessionmaker(engine), around_delivery=[log_context])

    run(main())
