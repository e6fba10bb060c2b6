"""A1: what the async inbox costs per message — ``await AsyncInbox.process`` vs the same
handler in a plain ``AsyncSession`` transaction, on PostgreSQL through psycopg (async) and
asyncpg.

    .venv/bin/python benchmarks/aio_overhead.py [--drivers psycopg asyncpg]
        [--messages N] [--rounds R] [--profile]

In one fresh schema, per driver, alternating the variants round by round (the order flips
each round) and reporting the median and spread over the rounds:

* plain-3: ``async with sessions() as session, session.begin():`` the 3-statement handler
  of S1 (read a balance, insert an order, update the balance), awaited;
* inbox-3: ``await inbox.process(message)`` with the same handler (claim + handler +
  claim check + commit, one transaction);
* select-1: one ``SELECT 1`` through an AsyncSession, the price of one round trip.

One message at a time (no concurrency): this is the per-message price. ``--profile`` runs
pyinstrument over one extra inbox-3 pass per driver and prints where its time goes.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from aio_profile import profiled
from common import (
    DEFAULT_DATABASE,
    Figure,
    ScenarioReport,
    alternate,
    at_least,
    fresh_schema,
    median_spread,
    scenario_main,
    server_version,
)
from s1_overhead import (
    ACCOUNTS,
    ADD_TO_BALANCE,
    INSERT_ORDER,
    READ_BALANCE,
    SELECT_ONE,
    accounts,
    business,
)
from sqlalchemy import Engine, insert
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import (
    AsyncEngine,
    AsyncSession,
    async_sessionmaker,
    create_async_engine,
)

from inbox import Message, Outcome
from inbox.aio import AsyncInbox

SCENARIO = "A1"
TITLE = "per-message overhead of AsyncInbox.process vs a plain AsyncSession transaction"
QUICK: dict[str, Any] = {"messages": 500, "rounds": 2}
VARIANTS = ("plain-3", "inbox-3", "select-1")


async def three_statements(message: Message, session: AsyncSession) -> None:
    """S1's 3-statement handler, awaited: read a balance, insert an order, update it."""
    account = message.body["ref"] % ACCOUNTS
    (await session.execute(READ_BALANCE, {"account": account})).scalar_one()
    await session.execute(
        INSERT_ORDER, {"ref": message.body["ref"], "amount": message.body["amount"]}
    )
    await session.execute(ADD_TO_BALANCE, {"account": account, "amount": message.body["amount"]})


def async_engine(engine: Engine, driver: str, **options: Any) -> AsyncEngine:
    """An async engine through ``driver`` on the schema ``engine`` (a blocking psycopg engine
    from :func:`common.fresh_schema`) is bound to."""
    url = engine.url
    connect_args: dict[str, Any] = {}
    if driver == "asyncpg":
        # asyncpg takes server settings as a keyword, not libpq's "options" parameter.
        found = str(url.query.get("options", ""))
        url = url.difference_update_query(["options"])
        if found.startswith("-csearch_path="):
            connect_args["server_settings"] = {"search_path": found.split("=", 1)[1]}
    url = url.set(drivername=f"{url.get_backend_name()}+{driver}")
    return create_async_engine(make_url(url), connect_args=connect_args, **options)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """A1's options."""
    parser.add_argument("--database-url", default=DEFAULT_DATABASE, help="PostgreSQL")
    parser.add_argument("--drivers", nargs="+", default=["psycopg", "asyncpg"])
    parser.add_argument("--messages", type=int, default=5000, help="messages per variant")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--profile", action="store_true", help="pyinstrument over inbox-3")


async def measure(
    engine: Engine, driver: str, messages: int, rounds: int
) -> dict[str, list[float]]:
    """µs per message of every variant on ``driver``, one sample per round."""
    aengine = async_engine(engine, driver)
    try:
        sessions = async_sessionmaker(aengine)
        inbox = AsyncInbox(sessions)
        inbox.handler("bench", name=f"bench.aio.{driver}")(three_statements)
        refs = iter(range(10**12))

        def batch(n: int = messages) -> list[Message]:
            return [Message.new("bench", {"ref": next(refs), "amount": 7}) for _ in range(n)]

        async def plain(batch: list[Message]) -> None:
            for message in batch:
                async with sessions() as session, session.begin():
                    await three_statements(message, session)

        async def through(batch: list[Message]) -> None:
            for message in batch:
                if (await inbox.process(message)).outcome is not Outcome.PROCESSED:
                    raise AssertionError(f"{message.id}: not processed")

        async def select_one() -> None:
            async with sessions() as session, session.begin():
                for _ in range(messages):
                    (await session.execute(SELECT_ONE)).scalar_one()

        async def timed(step: Callable[[], Awaitable[None]]) -> float:
            started = asyncio.get_running_loop().time()
            await step()
            return (asyncio.get_running_loop().time() - started) / messages * 1e6

        await plain(batch(500))  # warm the pool, the statement caches and the plans
        await through(batch(500))
        samples: dict[str, list[float]] = {k: [] for k in VARIANTS}
        for round_number in range(rounds):
            plain_batch, inbox_batch = batch(), batch()
            pair: list[tuple[str, Callable[[], Awaitable[None]]]] = [
                ("plain-3", lambda b=plain_batch: plain(b)),  # type: ignore[misc]
                ("inbox-3", lambda b=inbox_batch: through(b)),  # type: ignore[misc]
            ]
            for name, step in alternate(round_number, pair):
                samples[name].append(await timed(step))
            samples["select-1"].append(await timed(select_one))
            print(
                f"  {driver} round {round_number + 1}: "
                + "  ".join(f"{k} {v[-1]:7.1f} us" for k, v in samples.items())
            )
        return samples
    finally:
        await aengine.dispose()


async def profile_inbox(engine: Engine, driver: str, messages: int, out: Path) -> dict[str, float]:
    """pyinstrument over ``messages`` inbox-3 calls; the per-layer seconds."""
    aengine = async_engine(engine, driver)
    totals: dict[str, float] = {}
    try:
        inbox = AsyncInbox(async_sessionmaker(aengine))
        inbox.handler("bench", name=f"bench.aio.profile.{driver}")(three_statements)
        batch = [Message.new("bench", {"ref": i, "amount": 7}) for i in range(messages + 200)]
        for message in batch[:200]:
            await inbox.process(message)
        with profiled(True, out, f"inbox-3 on {driver}", totals.update):
            for message in batch[200:]:
                await inbox.process(message)
    finally:
        await aengine.dispose()
    return totals


def run(options: argparse.Namespace, out_dir: Path) -> ScenarioReport:
    """Every variant on every driver; figures per driver."""
    figures: list[Figure] = []
    data: dict[str, Any] = {}
    with fresh_schema(options.database_url, business) as engine:
        with engine.begin() as connection:
            connection.execute(insert(accounts), [{"id": i, "balance": 0} for i in range(ACCOUNTS)])
        data["server"] = f"postgresql {server_version(engine)}"
        for driver in options.drivers:
            print(f"A1 on {driver}: {options.messages} messages x {options.rounds} rounds")
            samples = asyncio.run(measure(engine, driver, options.messages, options.rounds))
            data[driver] = {"samples_us_per_message": samples}
            ratio = [p / i for p, i in zip(samples["plain-3"], samples["inbox-3"], strict=True)]
            value, spread = median_spread(ratio)
            target, met = at_least(value, 0.85)
            figures.append(
                Figure(
                    f"{driver}: inbox / plain rate, 3 statements",
                    value,
                    "ratio",
                    target,
                    met,
                    spread,
                )
            )
            for name in VARIANTS:
                value, spread = median_spread(samples[name])
                figures.append(Figure(f"{driver}: {name} per message", value, "us", spread=spread))
            if options.profile:
                out = out_dir / f"a1-inbox-3-{driver}-profile.txt"
                data[driver]["profile_seconds_by_layer"] = asyncio.run(
                    profile_inbox(engine, driver, options.messages, out)
                )
    return ScenarioReport(
        SCENARIO,
        TITLE,
        {
            "messages": options.messages,
            "rounds": options.rounds,
            "drivers": options.drivers,
            "handler": "3 statements: read balance, insert order, update balance",
        },
        figures,
        data,
    )


if __name__ == "__main__":
    sys.exit(scenario_main(sys.modules[__name__]))
