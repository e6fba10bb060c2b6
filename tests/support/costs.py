"""What one message costs on each path, as counts: round trips on the wire and Python calls,
beside the plain transaction that does the same work without the inbox.

Run in a process of its own (``python tests/support/costs.py POSTGRES_URL MARIADB_URL``,
one JSON object out), so that nothing another test set up (an OpenTelemetry SDK, logging
at DEBUG, a warm or cold cache) changes a count: counts are deterministic there, which is
what lets ``tests/test_cost_budgets.py`` hold each path to a budget of exact numbers.

``INBOX_COST_INJECT`` adds work to the inbox's per-message path, to show that the budgets
catch it: ``statement`` (one ``SELECT 1`` before the commit) or ``call`` (one more Python
function call per handler transaction).
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import sys
import uuid
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import Column, Integer, MetaData, String, Table, create_engine, insert, text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker, create_async_engine
from sqlalchemy.orm import Session, sessionmaker

from inbox import Inbox, Message, Outbox, Outcome
from inbox.aio import AsyncInbox
from inbox.schema import metadata as inbox_metadata
from inbox.testing.round_trips import RoundTripCounter

SAMPLES = 12  # messages measured one by one; the count is their minimum (see calls())
WARM_UP = 12  # psycopg prepares a statement on its 5th execution; caches fill
BATCH = 100

business = MetaData()
rows = Table(
    "cost_row",
    business,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("ref", String(64), nullable=False),
)
INSERT_ROW = insert(rows)


def _call_counter() -> tuple[Callable[[], None], Callable[[], int]]:
    count = [0]

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event in {"call", "c_call"}:
            count[0] += 1

    def start() -> None:
        count[0] = 0
        sys.setprofile(profile)

    def stop() -> int:
        sys.setprofile(None)
        return count[0] - 1  # the setprofile(None) call itself

    return start, stop


def calls(step: Callable[[], object], per: int = 1) -> int:
    """Python function calls (Python and C, as cProfile counts them) of one ``step``,
    divided by ``per``: the minimum over :data:`SAMPLES` steps, so that the rare step that
    also does once-a-second work (telemetry looking for a newly set provider) is not it."""
    start, stop = _call_counter()
    for _ in range(WARM_UP):
        step()
    seen = []
    gc.disable()
    try:
        for _ in range(SAMPLES):
            start()
            step()
            seen.append(stop())
    finally:
        gc.enable()
    return min(seen) // per


async def calls_async(step: Callable[[], Awaitable[object]], per: int = 1) -> int:
    """:func:`calls` of an awaited step (the event loop's own calls in between included)."""
    start, stop = _call_counter()
    for _ in range(WARM_UP):
        await step()
    seen = []
    gc.disable()
    try:
        for _ in range(SAMPLES):
            start()
            await step()
            seen.append(stop())
    finally:
        gc.enable()
    return min(seen) // per


def round_trips(counter: RoundTripCounter, step: Callable[[], object], per: int = 1) -> float:
    """Round trips per step (divided by ``per``), counted on the wire after a warm-up."""
    for _ in range(WARM_UP):
        step()
    counter.reset()
    for _ in range(SAMPLES):
        step()
    return counter.count / SAMPLES / per


async def round_trips_async(
    counter: RoundTripCounter, step: Callable[[], Awaitable[object]], per: int = 1
) -> float:
    """:func:`round_trips` of an awaited step."""
    for _ in range(WARM_UP):
        await step()
    counter.reset()
    for _ in range(SAMPLES):
        await step()
    return counter.count / SAMPLES / per


def new() -> Message:
    return Message.new("order.created", {"ref": uuid.uuid4().hex})


def write(message: Message, session: Session) -> None:
    session.execute(INSERT_ROW, {"ref": message.body["ref"]})


async def write_async(message: Message, session: AsyncSession) -> None:
    await session.execute(INSERT_ROW, {"ref": message.body["ref"]})


def fake_api(key: uuid.UUID) -> dict[str, str]:
    return {"id": str(key)}


def processed(result: object) -> None:
    assert getattr(result, "outcome", None) is Outcome.PROCESSED, result


@contextmanager
def injected() -> Iterator[None]:
    """The work ``INBOX_COST_INJECT`` asks for, added to the inbox's per-message path."""
    what = os.environ.get("INBOX_COST_INJECT")
    if not what:
        yield
        return
    from inbox.core._transaction import HandlerTransaction

    original = HandlerTransaction.check_and_commit

    def noop() -> None:
        return None

    def with_statement(self: HandlerTransaction) -> None:
        self.connection.execute(text("SELECT 1"))
        original(self)

    def with_call(self: HandlerTransaction) -> None:
        noop()
        original(self)

    HandlerTransaction.check_and_commit = with_statement if what == "statement" else with_call  # type: ignore[method-assign]
    try:
        yield
    finally:
        HandlerTransaction.check_and_commit = original  # type: ignore[method-assign]


def blocking_paths(url: str, counter: RoundTripCounter, out: dict[str, Any]) -> None:
    engine = create_engine(counter.url(url))
    sessions = sessionmaker(engine)

    def plain() -> None:
        with sessions() as session, session.begin():
            write(new(), session)

    def plain_batch() -> None:
        with sessions() as session, session.begin():
            for _ in range(BATCH):
                write(new(), session)

    def plain_effect() -> None:
        with sessions() as session, session.begin():
            message = new()
            fake_api(message.id)
            write(message, session)

    outbox = Outbox()

    def plain_outbox() -> None:
        with sessions() as session, session.begin():
            message = new()
            write(message, session)
            outbox.publish(session, "order.noted", {"ref": "r"}, routing_key="orders")

    inbox = Inbox(sessions)
    inbox.handler("order.created", name="writer")(write)
    effects = Inbox(sessions)

    @effects.handler("order.created", name="caller")
    def caller(message: Message, session: Session) -> None:
        effects.effect("api.call", fake_api)
        write(message, session)

    outboxed = Inbox(sessions)

    @outboxed.handler("order.created", name="publisher")
    def publisher(message: Message, session: Session) -> None:
        write(message, session)
        outbox.publish(session, "order.noted", {"ref": "r"}, routing_key="orders")

    layered = Inbox(sessions, middleware=[lambda message, session, call_next: call_next(message)])
    layered.handler("order.created", name="writer")(write)
    repeated = new()
    inbox.process(repeated)

    def first() -> None:
        processed(inbox.process(new()))

    def duplicate() -> None:
        assert inbox.process(repeated).outcome is Outcome.DUPLICATE

    def batch() -> None:
        for result in inbox.process_batch([new() for _ in range(BATCH)]):
            processed(result)

    with injected():
        cases: dict[str, tuple[Callable[[], object], Callable[[], object], int]] = {
            "first": (plain, first, 1),
            "duplicate": (plain, duplicate, 1),
            "batch": (plain_batch, batch, BATCH),
            "effect": (plain_effect, lambda: processed(effects.process(new())), 1),
            "outbox": (plain_outbox, lambda: processed(outboxed.process(new())), 1),
            "middleware": (plain, lambda: processed(layered.process(new())), 1),
        }
        for name, (baseline, step, per) in cases.items():
            out[f"blocking/{name}"] = {
                "plain": {"round_trips": round_trips(counter, baseline, per)},
                "inbox": {"round_trips": round_trips(counter, step, per)},
            }
            out[f"blocking/{name}"]["plain"]["calls"] = calls(baseline, per)
            out[f"blocking/{name}"]["inbox"]["calls"] = calls(step, per)
    engine.dispose()


def tenant_path(url: str, counter: RoundTripCounter, out: dict[str, Any]) -> None:
    """A tenant's schema through ``sessions_for`` and a ``schema_translate_map``."""
    tenant = f"tenant_{uuid.uuid4().hex[:8]}"
    admin = create_engine(url)
    with admin.begin() as connection:
        connection.execute(text(f"CREATE SCHEMA {tenant}"))
    engine = create_engine(counter.url(url)).execution_options(schema_translate_map={None: tenant})
    try:
        inbox_metadata.create_all(engine)
        business.create_all(engine)
        sessions = sessionmaker(engine)

        def plain() -> None:
            with sessions() as session, session.begin():
                write(new(), session)

        inbox = Inbox(sessions_for=lambda message: sessions())
        inbox.handler("order.created", name="writer")(write)

        def step() -> None:
            processed(inbox.process(new()))

        with injected():
            out["blocking/tenant"] = {
                "plain": {"round_trips": round_trips(counter, plain), "calls": calls(plain)},
                "inbox": {"round_trips": round_trips(counter, step), "calls": calls(step)},
            }
    finally:
        engine.dispose()
        with admin.begin() as connection:
            connection.execute(text(f"DROP SCHEMA {tenant} CASCADE"))
        admin.dispose()


def async_paths(
    url: str, counter: RoundTripCounter, out: dict[str, Any], driver: str = "psycopg"
) -> None:
    """The async paths through ``driver``: ``async/...`` for psycopg, ``asyncpg/...``."""
    async_url = make_url(counter.url(url))
    connect_args: dict[str, Any] = {}
    if driver == "asyncpg":
        # asyncpg takes server settings as a keyword, not libpq's "options" parameter.
        options = str(async_url.query.get("options", ""))
        async_url = async_url.difference_update_query(["options"])
        if options.startswith("-csearch_path="):
            connect_args["server_settings"] = {"search_path": options.split("=", 1)[1]}
    async_url = async_url.set(drivername=f"postgresql+{driver}")
    prefix = "async" if driver == "psycopg" else driver

    async def main() -> None:
        engine = create_async_engine(async_url, connect_args=connect_args)
        sessions = async_sessionmaker(engine)

        async def plain() -> None:
            async with sessions() as session, session.begin():
                await write_async(new(), session)

        async def plain_batch() -> None:
            async with sessions() as session, session.begin():
                for _ in range(BATCH):
                    await write_async(new(), session)

        inbox = AsyncInbox(sessions)
        inbox.handler("order.created", name="writer")(write_async)
        repeated = new()
        await inbox.process(repeated)

        async def first() -> None:
            processed(await inbox.process(new()))

        async def duplicate() -> None:
            assert (await inbox.process(repeated)).outcome is Outcome.DUPLICATE

        async def batch() -> None:
            for result in await inbox.process_batch([new() for _ in range(BATCH)]):
                processed(result)

        cases = {
            "first": (plain, first, 1),
            "duplicate": (plain, duplicate, 1),
            "batch": (plain_batch, batch, BATCH),
        }
        with injected():
            for name, (baseline, step, per) in cases.items():
                out[f"{prefix}/{name}"] = {
                    "plain": {
                        "round_trips": await round_trips_async(counter, baseline, per),
                        "calls": await calls_async(baseline, per),
                    },
                    "inbox": {
                        "round_trips": await round_trips_async(counter, step, per),
                        "calls": await calls_async(step, per),
                    },
                }
        await engine.dispose()

    asyncio.run(main())


def mariadb_paths(url: str, counter: RoundTripCounter, out: dict[str, Any]) -> None:
    engine = create_engine(counter.url(url))
    sessions = sessionmaker(engine)

    def plain() -> None:
        with sessions() as session, session.begin():
            write(new(), session)

    inbox = Inbox(sessions)
    inbox.handler("order.created", name="writer")(write)
    repeated = new()
    inbox.process(repeated)

    def first() -> None:
        processed(inbox.process(new()))

    def duplicate() -> None:
        assert inbox.process(repeated).outcome is Outcome.DUPLICATE

    with injected():
        for name, step in (("first", first), ("duplicate", duplicate)):
            out[f"mariadb/{name}"] = {
                "plain": {"round_trips": round_trips(counter, plain), "calls": calls(plain)},
                "inbox": {"round_trips": round_trips(counter, step), "calls": calls(step)},
            }
    engine.dispose()


def measure(postgres_url: str, mariadb_url: str) -> dict[str, Any]:
    """Every path's counts: ``{path: {"plain": {...}, "inbox": {...}}}``
    (``INBOX_COST_ONLY=blocking``: the blocking PostgreSQL paths only)."""
    out: dict[str, Any] = {}
    for url in (postgres_url, mariadb_url):
        engine = create_engine(url)
        business.create_all(engine)
        engine.dispose()
    only_blocking = os.environ.get("INBOX_COST_ONLY") == "blocking"
    pg = make_url(postgres_url)
    with RoundTripCounter(pg.host or "127.0.0.1", pg.port or 5432) as counter:
        blocking_paths(postgres_url, counter, out)
        if only_blocking:
            return out
        tenant_path(postgres_url, counter, out)
        async_paths(postgres_url, counter, out)
        async_paths(postgres_url, counter, out, "asyncpg")
    maria = make_url(mariadb_url)
    with RoundTripCounter(maria.host or "127.0.0.1", maria.port or 3306) as counter:
        mariadb_paths(mariadb_url, counter, out)
    return out


if __name__ == "__main__":
    print(json.dumps(measure(sys.argv[1], sys.argv[2]), sort_keys=True))
