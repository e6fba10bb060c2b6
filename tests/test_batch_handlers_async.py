"""``AsyncInbox.batch_handler`` on every async driver: one awaited call per batch with the
messages the batch won, a one-element list from ``process()``, the poison message bisected
out, and a plain ``def`` refused."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine, insert
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker, create_async_engine
from support.aio import ASYNC_DRIVERS, AsyncDatabase, fresh_async_database, run
from support.databases import effects
from support.effects import order

from inbox import HandlerFailed, Message, Outcome, ProcessResult, RegistrationError
from inbox.aio import AsyncInbox

P = Outcome.PROCESSED
D = Outcome.DUPLICATE
NAME = "orders.bulk"


@pytest.fixture(params=list(ASYNC_DRIVERS))
def adb(
    request: pytest.FixtureRequest, admin_engines: dict[str, Engine], tmp_path: Path
) -> Iterator[AsyncDatabase]:
    """A fresh database reached through each async driver in turn."""
    yield from fresh_async_database(request.param, admin_engines, tmp_path)


def ref_of(message: Message) -> str:
    assert isinstance(message.body, dict)
    return str(message.body["ref"])


def test_one_awaited_call_per_batch_and_a_list_of_one_per_process(adb: AsyncDatabase) -> None:
    calls: list[list[str]] = []

    async def main() -> list[object]:
        async with adb.engine() as engine:
            inbox = AsyncInbox(async_sessionmaker(engine))

            @inbox.batch_handler("order.created", name=NAME)
            async def bulk(messages: list[Message], session: AsyncSession) -> None:
                refs = [ref_of(m) for m in messages]
                calls.append(refs)
                await session.execute(
                    insert(effects), [{"ref": ref, "handler": NAME} for ref in refs]
                )
                if "poison" in refs:
                    raise RuntimeError("poison")

            first = order("a0")
            assert (await inbox.process(first)).outcomes == {NAME: P}
            batch = [order(f"a{i}") for i in range(1, 5)]
            results = await inbox.process_batch([first, *batch, batch[1], order("poison")])
            return [r.outcomes[NAME] if isinstance(r, ProcessResult) else type(r) for r in results]

    assert run(main()) == [D, P, P, P, P, D, HandlerFailed]
    assert calls[0] == ["a0"]
    assert calls[1] == ["a1", "a2", "a3", "a4", "poison"]  # rolled back, then bisected
    assert ["poison"] in calls
    assert adb.db.effect_counts() == {(f"a{i}", NAME): 1 for i in range(5)}


def test_a_plain_function_is_refused() -> None:
    inbox = AsyncInbox(async_sessionmaker(create_async_engine("sqlite+aiosqlite://")))

    def blocking(messages: list[Message], session: AsyncSession) -> None: ...

    with pytest.raises(RegistrationError, match="not a coroutine function"):
        inbox.batch_handler("order.created", name="x")(blocking)  # type: ignore[arg-type]
