"""What one ``inbox.effect`` costs: a handler with one effect around a no-op call vs the same
handler without it, per message, on PostgreSQL and MariaDB.

Round trips are counted on the wire, not timed: on PostgreSQL every ``ReadyForQuery`` the
server sends (libpq's trace of each connection: one per request/response exchange, BEGIN
and COMMIT included); on MariaDB every command PyMySQL sends (a query, COMMIT, ROLLBACK,
``SET AUTOCOMMIT``...). The engine's statements (``before_cursor_execute``) are shown
beside them. Time is the median over A/B-alternated rounds of the per-message wall time
(µs). Prints one table and writes a JSON report.

    .venv/bin/python benchmarks/effect_cost.py [--messages 300] [--rounds 7]
"""

from __future__ import annotations

import argparse
import functools
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pymysql  # type: ignore[import-untyped]
from common import (
    DEFAULT_DATABASE,
    DEFAULT_MARIADB,
    alternate,
    fresh_schema,
    median_spread,
    server_version,
    write_report,
)
from sqlalchemy import Engine, create_engine, event
from sqlalchemy.orm import Session, sessionmaker

from inbox import Inbox, Message


class Counts:
    """Round trips on the wire and statements on one engine, from :meth:`start` on."""

    def __init__(self, engine: Engine, trace_dir: Path) -> None:
        self.engine = engine
        self.statements = 0
        self._traces: list[Path] = []
        self._commands = 0
        self._trace_dir = trace_dir
        event.listen(engine, "before_cursor_execute", self._statement)
        if engine.dialect.name == "postgresql":
            event.listen(engine.pool, "connect", self._trace)
        else:
            self._count_pymysql_commands()

    def _statement(self, *_: Any) -> None:
        self.statements += 1

    def _trace(self, dbapi_connection: Any, _record: Any) -> None:
        path = self._trace_dir / f"pq-{len(self._traces)}.trace"
        self._traces.append(path)
        handle = path.open("w")
        dbapi_connection.pgconn.trace(handle.fileno())
        self._keep_open = [*getattr(self, "_keep_open", []), handle]

    def _count_pymysql_commands(self) -> None:
        original = pymysql.connections.Connection._execute_command
        counts = self

        def counted(connection: Any, command: int, sql: Any) -> Any:
            counts._commands += 1
            return original(connection, command, sql)

        pymysql.connections.Connection._execute_command = counted

    def round_trips(self) -> int:
        if self.engine.dialect.name != "postgresql":
            return self._commands
        for handle in getattr(self, "_keep_open", []):
            handle.flush()
        return sum(p.read_text().count("\tReadyForQuery") for p in self._traces)


def make_inbox(engine: Engine, with_effect: bool) -> Inbox:
    inbox = Inbox(sessionmaker(engine))

    def noop(key: uuid.UUID) -> None:
        return None

    @inbox.handler("bench", name="bench.handler")
    def handler(message: Message, session: Session) -> None:
        if with_effect:
            inbox.effect("noop", noop)

    return inbox


def run_variant(inbox: Inbox, messages: int) -> float:
    """Seconds per message over ``messages`` fresh messages."""
    batch: list[Message] = [Message.new("bench", {}) for _ in range(messages)]
    started = time.perf_counter()
    for message in batch:
        inbox.process(message)
    return (time.perf_counter() - started) / messages


def measure(url: str, messages: int, rounds: int) -> dict[str, Any]:
    with fresh_schema(url) as engine:
        variants: dict[str, Callable[[], float]] = {}
        for name, with_effect in (("without", False), ("with effect", True)):
            inbox = make_inbox(engine, with_effect)
            run_variant(inbox, 50)  # warm the pool, caches, prepared statements
            variants[name] = functools.partial(run_variant, inbox, messages)
        seconds: dict[str, list[float]] = {name: [] for name in variants}
        for round_number in range(rounds):
            for name in alternate(round_number, list(variants)):
                seconds[name].append(variants[name]())
        trips: dict[str, dict[str, float]] = {}
        scoped = engine.url.render_as_string(hide_password=False)
        for name, with_effect in (("without", False), ("with effect", True)):
            with tempfile.TemporaryDirectory() as trace_dir:
                counted = create_engine(scoped)
                counts = Counts(counted, Path(trace_dir))
                inbox = make_inbox(counted, with_effect)
                run_variant(inbox, 20)  # connect the pool first
                before = (counts.round_trips(), counts.statements)
                run_variant(inbox, messages)
                after = (counts.round_trips(), counts.statements)
                counted.dispose()
            trips[name] = {
                "round trips": (after[0] - before[0]) / messages,
                "statements": (after[1] - before[1]) / messages,
            }
        return {
            "server": f"{engine.dialect.name} {server_version(engine)}",
            "seconds_per_message": seconds,
            "per_message": trips,
        }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--postgres", default=DEFAULT_DATABASE)
    parser.add_argument("--mariadb", default=DEFAULT_MARIADB)
    parser.add_argument("--json", type=Path, default=None, help="report path")
    options = parser.parse_args(argv)
    results = {
        backend: measure(url, options.messages, options.rounds)
        for backend, url in (("postgresql", options.postgres), ("mariadb", options.mariadb))
    }
    header = (
        f"{'backend':<11} {'variant':<12} {'µs/msg median (min..max)':>26} "
        f"{'round trips':>11} {'statements':>10}"
    )
    print(header)
    print("-" * len(header))
    figures: dict[str, Any] = {}
    for backend, result in results.items():
        medians = {}
        per = result["per_message"]
        for name, samples in result["seconds_per_message"].items():
            median, (low, high) = median_spread(samples)
            medians[name] = median
            spread = f"{median * 1e6:.0f} ({low * 1e6:.0f}..{high * 1e6:.0f})"
            print(
                f"{backend:<11} {name:<12} {spread:>26} "
                f"{per[name]['round trips']:>11.2f} {per[name]['statements']:>10.2f}"
            )
        extra = {k: per["with effect"][k] - per["without"][k] for k in per["without"]}
        cost_us = (medians["with effect"] - medians["without"]) * 1e6
        figures[backend] = {"effect_us": cost_us, "effect_per_message": extra}
        print(
            f"{backend:<11} {'one effect':<12} {cost_us:>26.0f} "
            f"{extra['round trips']:>11.2f} {extra['statements']:>10.2f}"
        )
    write_report(
        "effect_cost",
        options.json,
        {"parameters": vars(options) | {"json": None}, "figures": figures, "data": results},
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
