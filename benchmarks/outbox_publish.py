"""What ``outbox.publish`` costs inside a handler transaction: the same handler with and
without a publish, per message, on PostgreSQL (and MariaDB with ``--mariadb URL``).

Four handler pairs: one Core INSERT (sent at once), one ORM object (pending until the
commit's flush), each without and with one ``outbox.publish``; and the Core handler with ten
publishes (they share one INSERT statement). Round trips are counted, not timed: every
statement the engine sends (a ``before_cursor_execute`` event) and every COMMIT, per message;
the publish call itself is counted separately (statements sent during the call: 0 expected)
and timed alone. Time is the median over A/B-alternated rounds of the per-message wall time
(µs), and the cost of a publish is also given in ``SELECT 1`` round trips measured in the
same rounds (the figure that survives a noisy machine best). Prints one table and writes a
JSON report.

    .venv/bin/python benchmarks/outbox_publish.py [--messages 500] [--rounds 7]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from common import (
    DEFAULT_DATABASE,
    alternate,
    fresh_schema,
    median_spread,
    server_version,
    write_report,
)
from sqlalchemy import Column, Engine, Integer, String, event, insert, text
from sqlalchemy.orm import DeclarativeBase, Session, sessionmaker

from inbox import Inbox, Message, Outbox


class Base(DeclarativeBase):
    pass


class Effect(Base):
    __tablename__ = "bench_effect"
    id = Column(Integer, primary_key=True, autoincrement=True)
    ref = Column(String(64), nullable=False)


effects = Effect.__table__
outbox = Outbox()

SELECT_ONE = text("SELECT 1")
ROUND_TRIP = "SELECT 1"
# name: (how the handler writes its effect, how many messages it publishes)
VARIANTS: dict[str, tuple[str, int]] = {
    "core": ("core", 0),
    "core+publish": ("core", 1),
    "orm": ("orm", 0),
    "orm+publish": ("orm", 1),
    "core+10 publishes": ("core", 10),
}


class Counts:
    """Statements and commits on one engine while ``active``; statements sent while
    ``in_publish`` are counted apart."""

    def __init__(self, engine: Engine) -> None:
        self.seen: Counter[str] = Counter()
        self.active = False
        self.in_publish = False
        event.listen(engine, "before_cursor_execute", self._statement)
        event.listen(engine, "commit", self._commit)

    def _statement(self, *_: Any) -> None:
        if self.active:
            self.seen["statements"] += 1
            if self.in_publish:
                self.seen["statements during publish()"] += 1

    def _commit(self, *_: Any) -> None:
        if self.active:
            self.seen["commits"] += 1


def make_inbox(engine: Engine, write: str, publishes: int, counts: Counts | None) -> Inbox:
    inbox = Inbox(sessionmaker(engine))

    @inbox.handler("bench", name="bench.handler")
    def handler(message: Message, session: Session) -> None:
        if write == "core":
            session.execute(insert(effects).values(ref=str(message.id)))
        else:
            session.add(Effect(ref=str(message.id)))
        for n in range(publishes):
            if counts is not None:
                counts.in_publish = True
            outbox.publish(session, "bench.done", {"n": n}, routing_key="bench")
            if counts is not None:
                counts.in_publish = False

    return inbox


def run_variant(inbox: Inbox, messages: int) -> float:
    """Seconds per message over ``messages`` fresh messages."""
    batch = [Message.new("bench", {}) for _ in range(messages)]
    started = time.perf_counter()
    for message in batch:
        inbox.process(message)
    return (time.perf_counter() - started) / messages


def publish_call_seconds(engine: Engine, calls: int) -> float:
    """Seconds one ``outbox.publish`` call takes (no flush: the rows are rolled back)."""
    with Session(engine) as session:
        session.connection()  # the check at the call finds the connection taken
        started = time.perf_counter()
        for n in range(calls):
            outbox.publish(session, "bench.done", {"n": n}, routing_key="bench")
        elapsed = time.perf_counter() - started
        session.rollback()
    return elapsed / calls


def select_one_seconds(engine: Engine, statements: int) -> float:
    """Seconds one ``SELECT 1`` round trip takes, in one session: the unit of the table."""
    with Session(engine) as session, session.begin():
        started = time.perf_counter()
        for _ in range(statements):
            session.execute(SELECT_ONE).scalar_one()
        return (time.perf_counter() - started) / statements


def measure(url: str, messages: int, rounds: int) -> dict[str, Any]:
    with fresh_schema(url, Base.metadata) as engine:
        counts = Counts(engine)
        variants: dict[str, Callable[[], float]] = {}
        for name, (write, publishes) in VARIANTS.items():
            inbox = make_inbox(engine, write, publishes, None)
            run_variant(inbox, 50)  # warm the pool, caches, prepared statements
            variants[name] = lambda inbox=inbox: run_variant(inbox, messages)
        variants[ROUND_TRIP] = lambda: select_one_seconds(engine, messages)
        seconds: dict[str, list[float]] = {name: [] for name in variants}
        call_seconds: list[float] = []
        for round_number in range(rounds):
            for name in alternate(round_number, list(variants)):
                seconds[name].append(variants[name]())
            call_seconds.append(publish_call_seconds(engine, messages))
        trips: dict[str, dict[str, float]] = {ROUND_TRIP: {"statements": 1.0}}
        for name, (write, publishes) in VARIANTS.items():
            inbox = make_inbox(engine, write, publishes, counts)
            counts.seen.clear()
            counts.active = True
            run_variant(inbox, messages)
            counts.active = False
            trips[name] = {k: v / messages for k, v in counts.seen.items()}
        return {
            "server": f"{engine.dialect.name} {server_version(engine)}",
            "seconds_per_message": seconds,
            "seconds_per_publish_call": call_seconds,
            "round_trips_per_message": trips,
        }


def print_table(backend: str, result: dict[str, Any]) -> dict[str, Any]:
    """Print one backend's rows; return its headline figures."""
    medians = {}
    for name, samples in result["seconds_per_message"].items():
        median, (low, high) = median_spread(samples)
        medians[name] = median
        trips = result["round_trips_per_message"][name]
        print(
            f"{backend:<11} {name:<18} {median * 1e6:>8.0f} ({low * 1e6:.0f}..{high * 1e6:.0f})"
            f"{'':>4} {trips.get('statements', 0):>10.2f} {trips.get('commits', 0):>8.2f} "
            f"{trips.get('statements during publish()', 0):>12.2f}"
        )
    trips = result["round_trips_per_message"]
    figures: dict[str, Any] = {}
    for base, with_publish in (
        ("core", "core+publish"),
        ("orm", "orm+publish"),
        ("core", "core+10 publishes"),
    ):
        extra = trips[with_publish].get("statements", 0) - trips[base].get("statements", 0)
        cost = (medians[with_publish] - medians[base]) * 1e6
        in_trips = cost / (medians[ROUND_TRIP] * 1e6)
        figures[f"{with_publish} - {base}"] = {
            "us": cost,
            "statements": extra,
            "select_1_round_trips": in_trips,
        }
        label = f"  {with_publish} - {base}"
        print(
            f"{backend:<11} {label:<30} {cost:>6.0f} µs {extra:>10.2f}"
            f"   = {in_trips:.2f} SELECT 1 round trips"
        )
    call, (low, high) = median_spread(result["seconds_per_publish_call"])
    figures["publish() call"] = {"us": call * 1e6, "spread": (low * 1e6, high * 1e6)}
    spread = f"({low * 1e6:.1f}..{high * 1e6:.1f})"
    print(f"{backend:<11} {'  one publish() call':<30} {call * 1e6:>6.1f} µs {spread}")
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--postgres", default=DEFAULT_DATABASE)
    parser.add_argument("--mariadb", default=None, help="also measure this MariaDB URL")
    parser.add_argument("--json", type=Path, default=None, help="report path")
    options = parser.parse_args(argv)
    urls = {"postgresql": options.postgres}
    if options.mariadb:
        urls["mariadb"] = options.mariadb
    results = {
        backend: measure(url, options.messages, options.rounds) for backend, url in urls.items()
    }
    header = (
        f"{'backend':<11} {'handler':<18} {'µs/msg (median, min..max)':>26} "
        f"{'statements':>10} {'commits':>8} {'in publish()':>12}"
    )
    print(header)
    print("-" * len(header))
    figures = {backend: print_table(backend, result) for backend, result in results.items()}
    write_report(
        "outbox_publish",
        options.json,
        {"parameters": vars(options) | {"json": None}, "figures": figures, "data": results},
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
