"""Round trips per message, counted on the wire, for every path: what a message costs on your
network, whatever your hardware (issue 17, goal 5).

    .venv/bin/python benchmarks/round_trips.py [--messages 20] [--warm-up 30] [--quick]
    .venv/bin/python benchmarks/round_trips.py --explain   # one message per variant, traced

Every engine connects through :class:`inbox.testing.round_trips.RoundTripCounter`, a TCP
proxy in front of the real server that counts each time the client sends after the server
answered: statements sent together without waiting (psycopg's pipeline mode) count once.
Each variant runs ``--warm-up`` messages first (psycopg prepares a statement on a
connection's 5th execution of it, one extra round trip once per connection; a path holding
two pooled connections at once, as ``inbox.effect`` does, rotates them, hence 30), then
``--messages`` messages counted; the figure is the count divided by the messages. The counts
do not depend on the machine's load: the same code gives the same integers anywhere.
Per-message time on your machine is about ``round trips x your network round trip + the
server's work`` (a COMMIT's fsync above all).

Paths, each beside the plain transaction it is compared with:

* PostgreSQL, psycopg 3 (blocking): a plain session transaction with a 1- and a 3-statement
  handler vs ``Inbox.process``; the same with sharing off
  (``engine.execution_options(inbox_share_round_trips=False)``); a duplicate delivery;
  ``process_batch`` of ``--batch-size`` messages with a per-message handler (vs a plain
  transaction inserting as many rows one by one) and with ``@inbox.batch_handler`` (vs a
  plain transaction with one executemany); one ``inbox.effect``; one ``Outbox.publish``.
* PostgreSQL async: ``AsyncInbox.process`` vs a plain ``AsyncSession`` transaction, through
  psycopg (async) and asyncpg (no shared round trips).
* PostgreSQL, psycopg2 (no shared round trips).
* MariaDB, PyMySQL: plain vs ``Inbox.process`` (1 and 3 statements), duplicate.

SQLite is left out: it has no network, a "round trip" is a call inside the process.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common import (
    DEFAULT_DATABASE,
    DEFAULT_MARIADB,
    Figure,
    ScenarioReport,
    fresh_schema,
    scenario_main,
)
from sqlalchemy import Column, Engine, Integer, MetaData, String, Table, create_engine, event
from sqlalchemy import insert as sql_insert
from sqlalchemy.engine import URL, make_url
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker, create_async_engine
from sqlalchemy.orm import Session, sessionmaker

from inbox import Inbox, Message, Outbox, Outcome
from inbox._backends.postgresql._psycopg import OPTION as SHARING_OPTION
from inbox.aio import AsyncInbox
from inbox.testing.round_trips import RoundTripCounter

SCENARIO = "ROUND_TRIPS"
TITLE = "round trips per message, counted on the wire, every path"
QUICK: dict[str, Any] = {"messages": 10}
WARM_UP = 30
TYPE = "rt.order"

bench = MetaData()
rows = Table(
    "rt_row",
    bench,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("ref", String(64), nullable=False),
    Column("step", String(16), nullable=False),
)
outbox = Outbox()


@dataclass(frozen=True)
class Pair:
    """One comparison: the inbox variant and the plain variant it is set beside."""

    path: str
    what: str
    plain: str
    inbox: str


@dataclass
class Options:
    """How many messages are warmed up and counted per variant."""

    warm_up: int
    messages: int
    batch_size: int
    explain: bool


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """This benchmark's options."""
    parser.add_argument("--postgres", default=DEFAULT_DATABASE, help="PostgreSQL URL")
    parser.add_argument("--mariadb", default=DEFAULT_MARIADB, help="MariaDB URL")
    parser.add_argument(
        "--messages", type=int, default=20, help="messages (batches) counted per variant"
    )
    parser.add_argument(
        "--warm-up",
        type=int,
        default=WARM_UP,
        help="messages (batches) run first, not counted (>= 8; 30 by default: a path that "
        "holds two pooled connections at once rotates them, and psycopg prepares a "
        "statement on each connection's 5th execution)",
    )
    parser.add_argument("--batch-size", type=int, default=100, help="process_batch size")
    parser.add_argument(
        "--explain",
        action="store_true",
        help="print each statement, begin, commit, rollback and pool reset of one counted "
        "message per variant with the round-trip count at that moment",
    )


# -- the handlers ----------------------------------------------------------------------------


def write(statements: int) -> Callable[[Message, Session], None]:
    """A handler sending ``statements`` one-row INSERTs, one round trip each."""

    def handler(message: Message, session: Session) -> None:
        for n in range(statements):
            session.execute(sql_insert(rows).values(ref=str(message.id), step=f"s{n}"))

    return handler


def write_async(statements: int) -> Callable[[Message, AsyncSession], Awaitable[None]]:
    """The same, awaited."""

    async def handler(message: Message, session: AsyncSession) -> None:
        for n in range(statements):
            await session.execute(sql_insert(rows).values(ref=str(message.id), step=f"s{n}"))

    return handler


def new_message() -> Message:
    """A fresh message of the benchmark's type."""
    return Message.new(TYPE, {})


def deliver(inbox: Inbox) -> Callable[[], object]:
    """A step: ``inbox.process`` of a fresh message."""
    return lambda: inbox.process(new_message())


def deliver_async(inbox: AsyncInbox) -> Callable[[], Awaitable[object]]:
    """A step: ``await inbox.process`` of a fresh message."""
    return lambda: inbox.process(new_message())


# -- counting --------------------------------------------------------------------------------


class Meter:
    """Counts one variant's round trips per message on one counter (and explains one)."""

    def __init__(self, counter: RoundTripCounter, options: Options) -> None:
        self.counter = counter
        self.options = options
        self.tracing = False
        self.results: dict[str, float] = {}

    def count(self, name: str, step: Callable[[], object], per_step: int = 1) -> float:
        """Round trips per message of ``step`` (``per_step`` messages each call)."""
        for _ in range(self.options.warm_up):
            step()
        self.counter.reset()
        for _ in range(self.options.messages):
            step()
        value = self.counter.count / (self.options.messages * per_step)
        self.results[name] = value
        print(f"  {name:<44} {value:8.2f}", flush=True)
        if self.options.explain:
            self.explain(step)
        return value

    async def count_async(self, name: str, step: Callable[[], Awaitable[object]]) -> float:
        """The same for an awaited step."""
        for _ in range(self.options.warm_up):
            await step()
        self.counter.reset()
        for _ in range(self.options.messages):
            await step()
        value = self.counter.count / self.options.messages
        self.results[name] = value
        print(f"  {name:<44} {value:8.2f}", flush=True)
        if self.options.explain:
            self.counter.reset()
            self.tracing = True
            try:
                await step()
            finally:
                self.tracing = False
            print(f"      = {self.counter.count} round trips")
        return value

    def explain(self, step: Callable[[], object]) -> None:
        """Run ``step`` once more, printing what the engine does as it happens."""
        self.counter.reset()
        self.tracing = True
        try:
            step()
        finally:
            self.tracing = False
        print(f"      = {self.counter.count} round trips")

    def watch(self, engine: Engine) -> None:
        """Print ``engine``'s statements, transaction ends and pool returns while tracing,
        each with the round trips counted so far (the count BEFORE the event's own I/O)."""

        def say(what: str) -> None:
            if self.tracing:
                print(f"      [{self.counter.count}] {what}")

        def statement(_conn: Any, _cursor: Any, sql: str, *_: Any) -> None:
            say(" ".join(sql.split())[:110])

        event.listen(engine, "before_cursor_execute", statement)
        event.listen(engine, "begin", lambda _conn: say("begin (SQLAlchemy)"))
        event.listen(engine, "commit", lambda _conn: say("commit"))
        event.listen(engine, "rollback", lambda _conn: say("rollback"))
        event.listen(engine.pool, "reset", lambda *_: say("pool reset"))
        event.listen(engine.pool, "checkin", lambda *_: say("pool checkin"))


@contextmanager
def counted(url: URL, options: Options) -> Iterator[tuple[RoundTripCounter, Meter]]:
    """A counter in front of ``url``'s server and a meter on it."""
    with RoundTripCounter(url.host or "127.0.0.1", url.port or 0) as counter:
        yield counter, Meter(counter, options)


def through(counter: RoundTripCounter, url: URL, driver: str) -> tuple[URL, dict[str, Any]]:
    """``url`` through the counter with ``driver``, and the connect_args it needs."""
    proxied = make_url(counter.url(url)).set(drivername=f"{url.get_backend_name()}+{driver}")
    connect_args: dict[str, Any] = {}
    if driver == "asyncpg":
        # asyncpg takes server settings as a keyword, not libpq's "options" parameter.
        found = str(proxied.query.get("options", ""))
        proxied = proxied.difference_update_query(["options"])
        if found.startswith("-csearch_path="):
            connect_args["server_settings"] = {"search_path": found.split("=", 1)[1]}
    return proxied, connect_args


# -- the paths -------------------------------------------------------------------------------


def blocking_path(
    path: str, url: URL, driver: str, options: Options, full: bool
) -> dict[str, float]:
    """Plain vs ``Inbox.process`` (1 and 3 statements) and a duplicate on a blocking driver;
    with ``full`` (psycopg) also sharing off, batches, an effect and an outbox row."""
    print(f"{path}:")
    with counted(url, options) as (counter, meter):
        proxied, _ = through(counter, url, driver)
        engine = create_engine(proxied)
        meter.watch(engine)
        sessions = sessionmaker(engine)
        try:
            for statements in (1, 3):
                handler = write(statements)

                def plain(handler: Callable[[Message, Session], None] = handler) -> None:
                    with sessions() as session, session.begin():
                        handler(new_message(), session)

                inbox = Inbox(sessions)
                inbox.handler(TYPE, name=f"w{statements}")(handler)
                meter.count(f"plain-{statements}", plain)
                meter.count(f"inbox-{statements}", deliver(inbox))
                if full:
                    off = Inbox(sessionmaker(engine.execution_options(**{SHARING_OPTION: False})))
                    off.handler(TYPE, name=f"off{statements}")(handler)
                    meter.count(f"inbox-{statements}, sharing off", deliver(off))
            duplicate_of(meter, sessions)
            if full:
                batches(meter, sessions, options.batch_size)
                extras(meter, sessions)
        finally:
            engine.dispose()
    return meter.results


def duplicate_of(meter: Meter, sessions: sessionmaker[Session]) -> None:
    """A message delivered again: claim found taken, rolled back."""
    inbox = Inbox(sessions)
    inbox.handler(TYPE, name="dup")(write(1))
    repeated = new_message()
    inbox.process(repeated)

    def again() -> None:
        if inbox.process(repeated).outcome is not Outcome.DUPLICATE:
            raise AssertionError("the repeated message was not a duplicate")

    meter.count("duplicate", again)


def batches(meter: Meter, sessions: sessionmaker[Session], size: int) -> None:
    """``process_batch`` with a per-message and a batch handler, and their plain twins."""

    def plain_rows() -> None:
        with sessions() as session, session.begin():
            for message in [new_message() for _ in range(size)]:
                write(1)(message, session)

    def plain_many() -> None:
        with sessions() as session, session.begin():
            session.execute(
                sql_insert(rows), [{"ref": str(new_message().id), "step": "b"} for _ in range(size)]
            )

    per_message = Inbox(sessions)
    per_message.handler(TYPE, name="batch.rows")(write(1))
    batched = Inbox(sessions)

    @batched.batch_handler(TYPE, name="batch.many")
    def many(messages: list[Message], session: Session) -> None:
        session.execute(sql_insert(rows), [{"ref": str(m.id), "step": "b"} for m in messages])

    def run(inbox: Inbox) -> None:
        for result in inbox.process_batch([new_message() for _ in range(size)]):
            if not hasattr(result, "outcome"):
                raise AssertionError(f"a batch message failed: {result!r}")

    meter.count(f"plain, {size} rows one by one", plain_rows, size)
    meter.count(f"process_batch({size}), per-message handler", lambda: run(per_message), size)
    meter.count(f"plain, {size} rows in one executemany", plain_many, size)
    meter.count(f"process_batch({size}), batch handler", lambda: run(batched), size)


def extras(meter: Meter, sessions: sessionmaker[Session]) -> None:
    """One ``inbox.effect`` and one ``Outbox.publish`` in a 1-statement handler."""
    with_effect = Inbox(sessions)

    @with_effect.handler(TYPE, name="effect")
    def effect(message: Message, session: Session) -> None:
        write(1)(message, session)
        with_effect.effect("noop", lambda key: None)

    publishing = Inbox(sessions)

    @publishing.handler(TYPE, name="publish")
    def publish(message: Message, session: Session) -> None:
        write(1)(message, session)
        outbox.publish(session, "rt.done", {"ref": str(message.id)}, routing_key="rt")

    def plain_publish() -> None:
        with sessions() as session, session.begin():
            message = new_message()
            write(1)(message, session)
            outbox.publish(session, "rt.done", {"ref": str(message.id)}, routing_key="rt")

    meter.count("inbox-1 + one inbox.effect", lambda: with_effect.process(new_message()))
    meter.count("plain-1 + one Outbox.publish", plain_publish)
    meter.count("inbox-1 + one Outbox.publish", lambda: publishing.process(new_message()))


def async_path(path: str, url: URL, driver: str, options: Options) -> dict[str, float]:
    """``AsyncInbox.process`` vs a plain ``AsyncSession`` transaction (1 and 3 statements)."""
    print(f"{path}:")

    async def main(counter: RoundTripCounter, meter: Meter) -> None:
        proxied, connect_args = through(counter, url, driver)
        engine = create_async_engine(proxied, connect_args=connect_args)
        meter.watch(engine.sync_engine)
        sessions = async_sessionmaker(engine)
        try:
            for statements in (1, 3):
                handler = write_async(statements)
                inbox = AsyncInbox(sessions)
                inbox.handler(TYPE, name=f"w{statements}")(handler)

                async def plain(handler: Any = handler) -> None:
                    async with sessions() as session, session.begin():
                        await handler(new_message(), session)

                await meter.count_async(f"plain-{statements}", plain)
                await meter.count_async(f"inbox-{statements}", deliver_async(inbox))
            inbox = AsyncInbox(sessions)
            inbox.handler(TYPE, name="dup")(write_async(1))
            repeated = new_message()
            await inbox.process(repeated)
            await meter.count_async("duplicate", lambda: inbox.process(repeated))
        finally:
            await engine.dispose()

    with counted(url, options) as (counter, meter):
        asyncio.run(main(counter, meter))
    return meter.results


# -- the report ------------------------------------------------------------------------------


def pairs(batch_size: int) -> list[Pair]:
    """What is compared with what, per path."""
    out: list[Pair] = []
    for path in (
        "PostgreSQL psycopg",
        "PostgreSQL psycopg async",
        "PostgreSQL asyncpg",
        "PostgreSQL psycopg2",
        "MariaDB PyMySQL",
    ):
        for n in (1, 3):
            out.append(Pair(path, f"{n}-statement handler", f"plain-{n}", f"inbox-{n}"))
        if path == "PostgreSQL psycopg":
            for n in (1, 3):
                out.append(
                    Pair(
                        path,
                        f"{n}-statement handler, sharing off",
                        f"plain-{n}",
                        f"inbox-{n}, sharing off",
                    )
                )
            out += [
                Pair(
                    path,
                    f"process_batch({batch_size}), per-message handler",
                    f"plain, {batch_size} rows one by one",
                    f"process_batch({batch_size}), per-message handler",
                ),
                Pair(
                    path,
                    f"process_batch({batch_size}), batch handler",
                    f"plain, {batch_size} rows in one executemany",
                    f"process_batch({batch_size}), batch handler",
                ),
                Pair(
                    path, "one inbox.effect (vs inbox-1)", "inbox-1", "inbox-1 + one inbox.effect"
                ),
                Pair(
                    path,
                    "one Outbox.publish (vs inbox-1)",
                    "inbox-1",
                    "inbox-1 + one Outbox.publish",
                ),
                Pair(
                    path,
                    "one Outbox.publish, inbox vs plain",
                    "plain-1 + one Outbox.publish",
                    "inbox-1 + one Outbox.publish",
                ),
            ]
    return out


def print_tables(results: dict[str, dict[str, float]], comparisons: list[Pair]) -> None:
    """Every count, then inbox - plain per path."""
    print("\nround trips per message, counted on the wire")
    header = f"{'path':<26} {'variant':<46} {'round trips':>11}"
    print(header)
    print("-" * len(header))
    for path, measured in results.items():
        for variant, value in measured.items():
            print(f"{path:<26} {variant:<46} {value:>11.2f}")
    print("\ninbox - plain, per message")
    header = f"{'path':<26} {'what':<46} {'plain':>7} {'inbox':>7} {'inbox - plain':>14}"
    print(header)
    print("-" * len(header))
    for pair in comparisons:
        measured = results.get(pair.path, {})
        if pair.plain in measured and pair.inbox in measured:
            plain, inbox = measured[pair.plain], measured[pair.inbox]
            print(
                f"{pair.path:<26} {pair.what:<46} {plain:>7.2f} {inbox:>7.2f} "
                f"{inbox - plain:>+14.2f}"
            )


def run(options: argparse.Namespace, out_dir: Path) -> ScenarioReport:
    """Count every path; the figures are the per-message counts and the differences."""
    if options.warm_up < 8:
        sys.exit("--warm-up must be >= 8: psycopg prepares a statement on its 5th execution")
    settings = Options(options.warm_up, options.messages, options.batch_size, options.explain)
    results: dict[str, dict[str, float]] = {}
    with fresh_schema(options.postgres, bench) as engine:
        pg = engine.url
        results["PostgreSQL psycopg"] = blocking_path(
            "PostgreSQL psycopg", pg, "psycopg", settings, full=True
        )
        results["PostgreSQL psycopg async"] = async_path(
            "PostgreSQL psycopg async", pg, "psycopg", settings
        )
        results["PostgreSQL asyncpg"] = async_path("PostgreSQL asyncpg", pg, "asyncpg", settings)
        results["PostgreSQL psycopg2"] = blocking_path(
            "PostgreSQL psycopg2", pg, "psycopg2", settings, full=False
        )
    with fresh_schema(options.mariadb, bench) as engine:
        results["MariaDB PyMySQL"] = blocking_path(
            "MariaDB PyMySQL", engine.url, "pymysql", settings, full=False
        )
    comparisons = pairs(options.batch_size)
    print_tables(results, comparisons)
    figures = [
        Figure(f"{path} / {variant}", value, "")
        for path, measured in results.items()
        for variant, value in measured.items()
    ]
    differences = []
    for pair in comparisons:
        measured = results[pair.path]
        plain, inbox = measured[pair.plain], measured[pair.inbox]
        figures.append(Figure(f"{pair.path} / {pair.what}: inbox - plain", inbox - plain, ""))
        differences.append(
            {"path": pair.path, "what": pair.what, "plain": plain, "inbox": inbox}
            | {"plain_variant": pair.plain, "inbox_variant": pair.inbox}
        )
    return ScenarioReport(
        scenario=SCENARIO,
        title=TITLE,
        parameters={
            "messages": options.messages,
            "warm_up": options.warm_up,
            "batch_size": options.batch_size,
            "sqlite": "left out: no network, nothing to count",
        },
        figures=figures,
        data={"round_trips": results, "comparisons": differences},
    )


def main(argv: list[str] | None = None) -> int:
    """Run alone: print the tables, write the JSON report."""
    return scenario_main(sys.modules[__name__], argv)


if __name__ == "__main__":
    sys.exit(main())
