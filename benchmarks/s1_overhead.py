"""S1: what the inbox costs per message — ``inbox.process`` vs the same handler without it.

    .venv/bin/python benchmarks/s1_overhead.py [--databases postgresql mariadb sqlite]
        [--messages N] [--rounds R] [--profile]

On each database, in a fresh schema, alternating the variants round by round so that the
machine's noise hits them alike, and reporting the median and spread over the rounds:

* plain-1 / inbox-1: a handler that inserts one row, in a plain session transaction vs
  through ``inbox.process`` (claim + handler in one transaction);
* plain-3 / inbox-3: a handler with three statements (read a balance, insert, update);
* replay-1: the inbox-1 messages delivered again (all duplicates);
* select-1: one ``SELECT 1`` through a session, the price of one round trip (with
  ``--network-latency-ms``, every variant reaches the server through a proxy that adds that
  much to each round trip: the same code across a network instead of loopback);
* on PostgreSQL through psycopg, also inbox-1-serial / inbox-3-serial: the same inboxes on
  the engine with ``inbox_share_round_trips=False``, i.e. the claim and its check each in a
  round trip of their own instead of riding the BEGIN's and the COMMIT's
  (inbox/_backends/postgresql/_psycopg.py).

``--profile`` also runs pyinstrument over inbox-1 on the first database and saves the
profile (text) next to the JSON.
"""

from __future__ import annotations

import argparse
import functools
import sys
import tempfile
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from common import (
    DEFAULT_DATABASE,
    DEFAULT_MARIADB,
    Figure,
    ScenarioReport,
    alternate,
    at_least,
    at_most,
    fresh_schema,
    median_spread,
    scenario_main,
    server_version,
    timed,
)
from sqlalchemy import (
    BigInteger,
    Column,
    Integer,
    MetaData,
    Table,
    event,
    insert,
    select,
    text,
    update,
)
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker

from inbox import Inbox, Message, Outcome

SCENARIO = "S1"
TITLE = "per-message overhead of inbox.process vs a plain transaction"
QUICK: dict[str, Any] = {"messages": 500, "rounds": 2}
VARIANTS = ("plain-1", "inbox-1", "replay-1", "plain-3", "inbox-3", "select-1")
SERIAL = ("inbox-1-serial", "inbox-3-serial")  # PostgreSQL + psycopg: round trips not shared

ACCOUNTS = 1000

business = MetaData()
orders = Table(
    "bench_order",
    business,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("ref", BigInteger, nullable=False),
    Column("amount", Integer, nullable=False),
)
accounts = Table(
    "bench_account",
    business,
    Column("id", Integer, primary_key=True, autoincrement=False),
    Column("balance", BigInteger, nullable=False),
)

INSERT_ORDER = insert(orders)
READ_BALANCE = select(accounts.c.balance).where(accounts.c.id == text(":account"))
ADD_TO_BALANCE = (
    update(accounts)
    .where(accounts.c.id == text(":account"))
    .values(balance=accounts.c.balance + text(":amount"))
)
SELECT_ONE = text("SELECT 1")


def one_statement(message: Message, session: Session) -> None:
    """Insert one row."""
    session.execute(INSERT_ORDER, {"ref": message.body["ref"], "amount": message.body["amount"]})


def three_statements(message: Message, session: Session) -> None:
    """Read a balance, insert an order, update the balance."""
    account = message.body["ref"] % ACCOUNTS
    session.execute(READ_BALANCE, {"account": account}).scalar_one()
    session.execute(INSERT_ORDER, {"ref": message.body["ref"], "amount": message.body["amount"]})
    session.execute(ADD_TO_BALANCE, {"account": account, "amount": message.body["amount"]})


def through(inbox: Inbox, batch: list[Message]) -> None:
    """Process every message of ``batch``; each must be processed (not a duplicate)."""
    for message in batch:
        if inbox.process(message).outcome is not Outcome.PROCESSED:
            raise AssertionError(f"{message.id}: not processed")


def plain(sessions: sessionmaker[Session], batch: list[Message]) -> None:
    """The 3-statement handler in a plain session transaction per message, no inbox."""
    for message in batch:
        with sessions() as session, session.begin():
            three_statements(message, session)


def select_ones(sessions: sessionmaker[Session], count: int) -> None:
    """``count`` ``SELECT 1`` through one session."""
    with sessions() as session, session.begin():
        for _ in range(count):
            session.execute(SELECT_ONE).scalar_one()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """S1's options."""
    parser.add_argument(
        "--databases",
        nargs="+",
        default=["postgresql", "mariadb", "sqlite"],
        choices=["postgresql", "mariadb", "sqlite"],
    )
    parser.add_argument("--database-url", default=DEFAULT_DATABASE, help="the PostgreSQL URL")
    parser.add_argument("--mariadb-url", default=DEFAULT_MARIADB)
    parser.add_argument("--messages", type=int, default=20_000, help="messages per variant")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--profile", action="store_true", help="pyinstrument over inbox-1")
    parser.add_argument(
        "--network-latency-ms",
        type=float,
        default=0.0,
        help="reach the servers through inbox.testing.round_trips.RoundTripCounter adding this "
        "many ms to every round trip: what the variants cost across a network, not loopback",
    )
    parser.add_argument(
        "--synchronous-commit",
        choices=["on", "off"],
        default="on",
        help="PostgreSQL's synchronous_commit for the measured sessions: off takes the disk's "
        "flush (and a busy disk's noise) out of every variant alike, leaving the client, the "
        "round trips and the server's work",
    )


def urls(options: argparse.Namespace, sqlite_dir: str) -> dict[str, str]:
    """The URL of each database to measure."""
    return {
        "postgresql": options.database_url,
        "mariadb": options.mariadb_url,
        "sqlite": f"sqlite:///{sqlite_dir}/s1.db",
    }


def measure(
    url: str, messages: int, rounds: int, synchronous_commit: str = "on"
) -> tuple[str, dict[str, list[float]]]:
    """µs per message of every variant, one sample per round."""
    with fresh_schema(url, business) as engine:
        if synchronous_commit == "off" and engine.dialect.name == "postgresql":
            event.listen(engine, "connect", _without_synchronous_commit)
            engine.dispose()  # the pool's connections so far were made without it
        with engine.begin() as connection:
            connection.execute(insert(accounts), [{"id": i, "balance": 0} for i in range(ACCOUNTS)])
        sessions = sessionmaker(engine)
        inbox1 = Inbox(sessions)
        inbox1.handler("bench", name="bench.one_statement")(one_statement)
        inbox3 = Inbox(sessions)
        inbox3.handler("bench", name="bench.three_statements")(three_statements)
        shared = engine.dialect.driver == "psycopg"
        serial_sessions = sessionmaker(engine.execution_options(inbox_share_round_trips=False))
        serial1 = Inbox(serial_sessions)
        serial1.handler("bench", name="bench.one_statement")(one_statement)
        serial3 = Inbox(serial_sessions)
        serial3.handler("bench", name="bench.three_statements")(three_statements)
        next_ref = iter(range(10**12))

        def batch() -> list[Message]:
            return [
                Message.new("bench", {"ref": next(next_ref), "amount": 7}) for _ in range(messages)
            ]

        def plain(handler: Callable[[Message, Session], None], batch: list[Message]) -> None:
            for message in batch:
                with sessions() as session, session.begin():
                    handler(message, session)

        def through(inbox: Inbox, batch: list[Message], expected: Outcome) -> None:
            for message in batch:
                if inbox.process(message).outcome is not expected:
                    raise AssertionError(f"{message.id}: expected {expected}")

        def select_one() -> None:
            with sessions() as session, session.begin():
                for _ in range(messages):
                    session.execute(SELECT_ONE).scalar_one()

        # Warm up the pool, the statement caches and the server's plans.
        warm = batch()[:500]
        plain(one_statement, warm)
        plain(three_statements, batch()[:500])
        through(inbox1, warm, Outcome.PROCESSED)
        through(inbox3, batch()[:500], Outcome.PROCESSED)
        if shared:
            through(serial1, batch()[:500], Outcome.PROCESSED)
            through(serial3, batch()[:500], Outcome.PROCESSED)

        samples: dict[str, list[float]] = {k: [] for k in VARIANTS + (SERIAL if shared else ())}
        for round_number in range(rounds):
            first = batch()
            plain1, plain3, inbox3_batch = batch(), batch(), batch()
            pairs: list[list[tuple[str, Callable[[], None]]]] = [
                [
                    ("plain-1", functools.partial(plain, one_statement, plain1)),
                    ("inbox-1", functools.partial(through, inbox1, first, Outcome.PROCESSED)),
                ],
                [
                    ("plain-3", functools.partial(plain, three_statements, plain3)),
                    (
                        "inbox-3",
                        functools.partial(through, inbox3, inbox3_batch, Outcome.PROCESSED),
                    ),
                ],
            ]
            if shared:
                serial = (
                    ("inbox-1-serial", serial1, batch()),
                    ("inbox-3-serial", serial3, batch()),
                )
                for pair, (name, inbox, messages_) in zip(pairs, serial, strict=True):
                    pair.append(
                        (name, functools.partial(through, inbox, messages_, Outcome.PROCESSED))
                    )
            for pair in pairs:
                for name, step in alternate(round_number, pair):
                    samples[name].append(timed(step) / messages * 1e6)
            replay = functools.partial(through, inbox1, first, Outcome.DUPLICATE)
            samples["replay-1"].append(timed(replay) / messages * 1e6)
            samples["select-1"].append(timed(select_one) / messages * 1e6)
        version = f"{engine.dialect.name} {server_version(engine)}"
    return version, samples


def _without_synchronous_commit(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("SET synchronous_commit = off")
    cursor.close()
    dbapi_connection.commit()


def profile_inbox(url: str, messages: int, out_dir: Path) -> str | None:
    """pyinstrument over ``messages`` inbox-1 calls; the text profile's path."""
    try:
        from pyinstrument import Profiler
    except ImportError:
        print("  (pyinstrument not installed: no profile)")
        return None
    with fresh_schema(url, business) as engine:
        inbox = Inbox(sessionmaker(engine))
        inbox.handler("bench", name="bench.one_statement")(one_statement)
        batch = [Message.new("bench", {"ref": i, "amount": 7}) for i in range(messages + 500)]
        for message in batch[:500]:
            inbox.process(message)
        profiler = Profiler(interval=0.0002)
        profiler.start()
        for message in batch[500:]:
            inbox.process(message)
        profiler.stop()
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "s1-inbox-1-profile.txt"
    path.write_text(profiler.output_text(unicode=False, color=False, show_all=False))
    print(f"  profile: {path}")
    return str(path)


def summarise(database: str, samples: dict[str, list[float]], primary: bool) -> list[Figure]:
    """The headline figures for one database (targets on the primary one)."""
    overhead = [i - p for i, p in zip(samples["inbox-1"], samples["plain-1"], strict=True)]
    in_round_trips = [o / s for o, s in zip(overhead, samples["select-1"], strict=True)]
    ratio1 = [p / i for p, i in zip(samples["plain-1"], samples["inbox-1"], strict=True)]
    ratio3 = [p / i for p, i in zip(samples["plain-3"], samples["inbox-3"], strict=True)]
    replay = [i / r for i, r in zip(samples["inbox-1"], samples["replay-1"], strict=True)]
    figures = []
    for label, values, unit, check in (
        ("inbox - plain, in SELECT 1 round trips", in_round_trips, "x", (at_most, 0.5)),
        ("inbox / plain rate, 1-statement handler", ratio1, "ratio", (at_least, 0.85)),
        ("inbox / plain rate, 3-statement handler", ratio3, "ratio", (at_least, 0.92)),
        ("duplicate replay / first delivery rate", replay, "ratio", (at_least, 1.0)),
    ):
        value, spread = median_spread(values)
        target, met = ("", None)
        if primary and check is not None:
            target, met = check[0](value, check[1])
        figures.append(Figure(f"{database}: {label}", value, unit, target, met, spread))
    if "inbox-1-serial" in samples:
        for size in ("1", "3"):
            serial = [
                p / i
                for p, i in zip(
                    samples[f"plain-{size}"], samples[f"inbox-{size}-serial"], strict=True
                )
            ]
            value, spread = median_spread(serial)
            label = f"{database}: inbox / plain rate, {size}-statement, round trips not shared"
            figures.append(Figure(label, value, "ratio", spread=spread))
        serial_rt = [
            (i - p) / s
            for i, p, s in zip(
                samples["inbox-1-serial"], samples["plain-1"], samples["select-1"], strict=True
            )
        ]
        value, spread = median_spread(serial_rt)
        label = f"{database}: inbox - plain, in SELECT 1 round trips, round trips not shared"
        figures.append(Figure(label, value, "x", spread=spread))
    for name in ("plain-1", "inbox-1", "replay-1", "inbox-3", "select-1"):
        value, spread = median_spread(samples[name])
        figures.append(Figure(f"{database}: {name} per message", value, "us", spread=spread))
    return figures


def run(options: argparse.Namespace, out_dir: Path) -> ScenarioReport:
    """Measure every variant on every database; figures per database."""
    figures: list[Figure] = []
    data: dict[str, Any] = {}
    plots: list[str] = []
    with tempfile.TemporaryDirectory() as sqlite_dir:
        where = urls(options, sqlite_dir)
        for index, database in enumerate(options.databases):
            print(f"S1 on {database}: {options.messages} messages x {options.rounds} rounds")
            with ExitStack() as stack:
                url = where[database]
                if options.network_latency_ms and database != "sqlite":
                    # Imported here: s1_versions.py runs measure() on checkouts without it.
                    from inbox.testing.round_trips import RoundTripCounter

                    target = make_url(url)
                    proxy = RoundTripCounter(
                        target.host or "127.0.0.1",
                        target.port or (5432 if database == "postgresql" else 3306),
                        latency=options.network_latency_ms / 1000,
                    )
                    url = stack.enter_context(proxy).url(url)
                version, samples = measure(
                    url, options.messages, options.rounds, options.synchronous_commit
                )
            for name in samples:
                value, (low, high) = median_spread(samples[name])
                print(f"  {name:<9} {value:9.1f} us/msg  ({low:.1f}..{high:.1f})")
            data[database] = {"server": version, "samples_us_per_message": samples}
            figures += summarise(database, samples, primary=index == 0)
        if options.profile:
            path = profile_inbox(where[options.databases[0]], options.messages, out_dir)
            if path is not None:
                plots.append(path)
    return ScenarioReport(
        SCENARIO,
        TITLE,
        {
            "messages": options.messages,
            "rounds": options.rounds,
            "databases": options.databases,
            "synchronous_commit": options.synchronous_commit,
            "network_latency_ms": options.network_latency_ms,
        },
        figures,
        data,
        plots,
    )


if __name__ == "__main__":
    sys.exit(scenario_main(sys.modules[__name__]))
