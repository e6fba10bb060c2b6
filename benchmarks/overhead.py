"""What the inbox costs per message: inbox.process vs the same handler with no inbox.

    .venv/bin/python benchmarks/overhead.py [--database-url URL] [--messages N] [--rounds R]

Runs in one process, on a fresh schema, alternating the variants round by round so that the
machine's noise hits them alike, and reports the median over the rounds:

* plain-1 / inbox-1: a handler that inserts one row, in a plain session transaction vs
  through ``inbox.process`` (claim + handler in one transaction);
* plain-3 / inbox-3: a handler with three statements (read a balance, insert, update);
* replay-1: the inbox-1 messages delivered again (all duplicates);
* select-1: one ``SELECT 1`` through a session, the price of one round trip.

Prints a table and writes JSON (machine, versions, parameters, every round) to
benchmarks/results/ (or --json PATH).
"""

from __future__ import annotations

import argparse
import datetime as dt
import functools
import json
import os
import platform
import statistics
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from sqlalchemy import (
    BigInteger,
    Column,
    Engine,
    Integer,
    MetaData,
    Table,
    create_engine,
    insert,
    select,
    text,
    update,
)
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker

from inbox import Inbox, Message, Outcome
from inbox.schema import metadata as inbox_metadata

DEFAULT_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
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


@contextmanager
def fresh_schema(url: str) -> Iterator[Engine]:
    """A new schema (PostgreSQL) or database (MariaDB), dropped afterwards; SQLite as given."""
    base = make_url(url)
    name = f"bench_{uuid.uuid4().hex[:12]}"
    if base.get_backend_name() == "sqlite":
        engine = create_engine(url)
        drop = None
    else:
        admin = create_engine(url, isolation_level="AUTOCOMMIT")
        with admin.connect() as connection:
            kind = "SCHEMA" if base.get_backend_name() == "postgresql" else "DATABASE"
            connection.execute(text(f"CREATE {kind} {name}"))
            drop = f"DROP {kind} {name}" + (" CASCADE" if kind == "SCHEMA" else "")
        if kind == "SCHEMA":
            scoped = base.update_query_dict({"options": f"-csearch_path={name}"})
        else:
            scoped = base.set(database=name)
        engine = create_engine(scoped)
    try:
        inbox_metadata.create_all(engine)
        business.create_all(engine)
        with engine.begin() as connection:
            connection.execute(insert(accounts), [{"id": i, "balance": 0} for i in range(ACCOUNTS)])
        yield engine
    finally:
        engine.dispose()
        if drop is not None:
            with admin.connect() as connection:
                connection.execute(text(drop))
            admin.dispose()


def timed(calls: Callable[[], None], count: int) -> float:
    """Microseconds per message for one pass."""
    started = time.perf_counter()
    calls()
    return (time.perf_counter() - started) / count * 1e6


def run(url: str, messages: int, rounds: int) -> dict[str, Any]:
    with fresh_schema(url) as engine:
        sessions = sessionmaker(engine)
        inbox1 = Inbox(sessions)
        inbox1.handler("bench", name="bench.one_statement")(one_statement)
        inbox3 = Inbox(sessions)
        inbox3.handler("bench", name="bench.three_statements")(three_statements)
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
        through(inbox1, warm, Outcome.PROCESSED)
        through(inbox3, batch()[:500], Outcome.PROCESSED)

        samples: dict[str, list[float]] = {
            k: [] for k in ("plain-1", "inbox-1", "replay-1", "plain-3", "inbox-3", "select-1")
        }
        for round_number in range(rounds):
            first = batch()
            plain1, plain3, inbox3_batch = batch(), batch(), batch()
            steps: list[tuple[str, Callable[[], None]]] = [
                ("plain-1", functools.partial(plain, one_statement, plain1)),
                ("inbox-1", functools.partial(through, inbox1, first, Outcome.PROCESSED)),
                ("replay-1", functools.partial(through, inbox1, first, Outcome.DUPLICATE)),
                ("plain-3", functools.partial(plain, three_statements, plain3)),
                ("inbox-3", functools.partial(through, inbox3, inbox3_batch, Outcome.PROCESSED)),
                ("select-1", select_one),
            ]
            if round_number % 2:  # alternate which variant goes first
                steps = [steps[3], steps[4], steps[0], steps[1], steps[2], steps[5]]
            for name, step in steps:
                samples[name].append(timed(step, messages))
        server_version = ".".join(map(str, engine.dialect.server_version_info or ()))
    return {"samples": samples, "dialect": engine.dialect.name, "server_version": server_version}


def summarise(samples: dict[str, list[float]]) -> dict[str, Any]:
    median = {k: statistics.median(v) for k, v in samples.items()}
    spread = {k: (min(v), max(v)) for k, v in samples.items()}
    overhead = median["inbox-1"] - median["plain-1"]
    return {
        "median_us_per_message": median,
        "min_max_us_per_message": spread,
        "rate_msg_per_s": {k: 1e6 / v for k, v in median.items() if k != "select-1"},
        "inbox_minus_plain_us": overhead,
        "select_one_us": median["select-1"],
        "overhead_in_round_trips": overhead / median["select-1"],
        "inbox_over_plain_rate_1_statement": median["plain-1"] / median["inbox-1"],
        "inbox_over_plain_rate_3_statements": median["plain-3"] / median["inbox-3"],
        "replay_over_first_delivery_rate": median["inbox-1"] / median["replay-1"],
    }


def print_table(summary: dict[str, Any], args: argparse.Namespace, dialect: str) -> None:
    median = summary["median_us_per_message"]
    spread = summary["min_max_us_per_message"]
    print(f"\ninbox overhead on {dialect}: {args.messages} messages x {args.rounds} rounds")
    print(f"{'variant':<10} {'us/msg (median)':>16} {'min..max':>18} {'msg/s':>9}")
    for name, value in median.items():
        low, high = spread[name]
        rate = f"{1e6 / value:9.0f}" if name != "select-1" else f"{'':>9}"
        print(f"{name:<10} {value:16.1f} {low:8.1f}..{high:<8.1f} {rate}")
    print()
    print(
        f"inbox - plain, 1 statement:   {summary['inbox_minus_plain_us']:7.1f} us/msg = "
        f"{summary['overhead_in_round_trips']:.2f} x one SELECT 1 "
        f"({summary['select_one_us']:.1f} us)"
        "   target <= 1.5"
    )
    print(f"inbox / plain rate, 1 stmt:   {summary['inbox_over_plain_rate_1_statement']:7.3f}")
    print(
        f"inbox / plain rate, 3 stmts:  {summary['inbox_over_plain_rate_3_statements']:7.3f}"
        "   target >= 0.85"
    )
    print(
        f"replay / first delivery rate: {summary['replay_over_first_delivery_rate']:7.3f}"
        "   target >= 1.0"
    )


def installed(package: str) -> str | None:
    try:
        return version(package)
    except PackageNotFoundError:
        return None


def write_report(
    benchmark: str, path: Path | None, packages: tuple[str, ...], body: dict[str, Any]
) -> Path:
    """Write ``body`` with the machine, the package versions and the command as JSON to
    ``path`` (default: ``benchmarks/results/<benchmark>-<UTC time>.json``) and say where."""
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    path = path or Path(__file__).parent / "results" / f"{benchmark.replace('_', '-')}-{stamp}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    report = {
        "benchmark": benchmark,
        "when": stamp,
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "machine": {
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
        },
        "versions": {p: installed(p) for p in packages},
        **body,
    }
    path.write_text(json.dumps(report, indent=2))
    print(f"\nJSON: {path}")
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database-url", default=os.environ.get("INBOX_BENCH_URL", DEFAULT_URL))
    parser.add_argument("--messages", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    measured = run(args.database_url, args.messages, args.rounds)
    summary = summarise(measured["samples"])
    print_table(summary, args, f"{measured['dialect']} {measured['server_version']}")
    write_report(
        "overhead",
        args.json,
        ("inbox", "SQLAlchemy", "psycopg", "PyMySQL"),
        {
            "database": {
                "dialect": measured["dialect"],
                "server_version": measured["server_version"],
                "url": make_url(args.database_url).render_as_string(hide_password=True),
            },
            "parameters": {"messages": args.messages, "rounds": args.rounds},
            "samples_us_per_message": measured["samples"],
            "summary": summary,
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
