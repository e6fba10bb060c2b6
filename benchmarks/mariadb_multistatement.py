"""MARIADB_MULTI: can the claim share a round trip on MariaDB? A measurement, not a feature.

    .venv/bin/python benchmarks/mariadb_multistatement.py [--messages N] [--rounds R] [--quick]

On MariaDB through PyMySQL (the supported driver), S1's three-statement handler (read a
balance, insert an order, update the balance), per message, in a fresh database,
alternating the variants round by round (odd rounds in reverse order):

through SQLAlchemy (a ``sessionmaker`` on the engine, one message at a time):

* sa-plain: the handler in a plain session transaction, no inbox;
* sa-inbox: ``Inbox.process`` as shipped;
* sa-inbox-noreset: the same, on an engine whose pool skips its reset ``ROLLBACK`` when
  PyMySQL's last server status says no transaction is open (``pool_reset_on_return=None``
  and a ``reset`` event that rolls back only then): not a change to the inbox, an engine
  option an application can set;
* sa-select-1: one ``SELECT 1`` through a session;

raw PyMySQL, one connection, no SQLAlchemy (the statements ``Inbox.process`` sends, by hand):

* raw-plain: ``SELECT balance; INSERT order; UPDATE balance; COMMIT``;
* raw-inbox: the claim ``INSERT INTO inbox_message``, the three statements, the claim-held
  ``SELECT count(*)``, ``COMMIT``: what the inbox sends, less SQLAlchemy and the pool;
* raw-multi: the same, the claim and the handler's first statement sent as ONE
  multi-statement packet (a second connection with ``CLIENT.MULTI_STATEMENTS``): the upper
  bound of what sending the claim "for free" could save;
* raw-select-1: one ``SELECT 1`` on the raw connection.

Round trips are counted, not timed: every command PyMySQL writes
(``Connection._execute_command``) per message, over a counting pass after the rounds. The
time is µs per message and, per round, in ``SELECT 1`` round trips of the same round (the
SQLAlchemy variants against sa-select-1, the raw ones against raw-select-1). Before it
measures, it checks how MariaDB and PyMySQL treat a multi-statement packet (a duplicate
claim's error 1062, whether the statement after an error runs, where a later statement's
error surfaces) and MariaDB's ``Questions`` counter for one raw-multi message.
"""

from __future__ import annotations

import argparse
import datetime as dt
import functools
import sys
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pymysql  # type: ignore[import-untyped]
from common import (
    DEFAULT_MARIADB,
    Figure,
    ScenarioReport,
    alternate,
    fresh_schema,
    median_spread,
    plot_lines,
    scenario_main,
    server_version,
    timed,
)
from pymysql.constants import CLIENT, SERVER_STATUS  # type: ignore[import-untyped]
from s1_overhead import (
    ACCOUNTS,
    accounts,
    business,
    plain,
    select_ones,
    three_statements,
    through,
)
from sqlalchemy import Engine, create_engine, event, insert
from sqlalchemy.engine import URL
from sqlalchemy.orm import sessionmaker

from inbox import Inbox, Message

SCENARIO = "MARIADB_MULTI"
TITLE = "MariaDB: the claim in the handler's first packet (multi-statement), measured"
QUICK: dict[str, Any] = {"messages": 300, "rounds": 3}
SA_VARIANTS = ("sa-plain", "sa-inbox", "sa-inbox-noreset", "sa-select-1")
RAW_VARIANTS = ("raw-plain", "raw-inbox", "raw-multi", "raw-select-1")
VARIANTS = SA_VARIANTS + RAW_VARIANTS
HANDLER = "bench.three_statements"
DUPLICATE_ENTRY = 1062

CLAIM = "INSERT INTO inbox_message (message_id, handler, processed_at) VALUES (%s, %s, %s)"
READ = "SELECT balance FROM bench_account WHERE id = %s"
ORDER = "INSERT INTO bench_order (ref, amount) VALUES (%s, %s)"
ADD = "UPDATE bench_account SET balance = balance + %s WHERE id = %s"
HELD = "SELECT count(*) FROM inbox_message WHERE message_id = %s AND handler = %s"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The experiment's options."""
    parser.add_argument("--mariadb-url", default=DEFAULT_MARIADB)
    parser.add_argument("--messages", type=int, default=3000, help="messages per variant")
    parser.add_argument("--rounds", type=int, default=5)


class Commands:
    """Every command PyMySQL sends (a query, COMMIT, ROLLBACK...), from now on: one request
    and its response each, i.e. one round trip."""

    def __init__(self) -> None:
        self.count = 0
        self._original = pymysql.connections.Connection._execute_command

    @contextmanager
    def counting(self) -> Iterator[Commands]:
        """Count while inside; PyMySQL is restored on leaving."""
        original = self._original
        counts = self

        def counted(connection: Any, command: int, sql: Any) -> Any:
            counts.count += 1
            return original(connection, command, sql)

        self.count = 0
        pymysql.connections.Connection._execute_command = counted
        try:
            yield self
        finally:
            pymysql.connections.Connection._execute_command = original


def reset_only_in_transaction(engine: Engine) -> None:
    """With ``pool_reset_on_return=None``: roll back a returned connection only when PyMySQL's
    last server status says a transaction is open (after COMMIT it is not)."""

    @event.listens_for(engine, "reset")
    def reset(dbapi_connection: Any, record: Any, state: Any) -> None:
        if dbapi_connection.server_status & SERVER_STATUS.SERVER_STATUS_IN_TRANS:
            dbapi_connection.rollback()


def raw_connection(url: URL, multi: bool) -> Any:
    """A PyMySQL connection to ``url``'s database, autocommit off (PyMySQL's default)."""
    return pymysql.connect(
        host=url.host or "127.0.0.1",
        port=url.port or 3306,
        user=url.username or "root",
        password=url.password or "",
        database=url.database,
        client_flag=CLIENT.MULTI_STATEMENTS if multi else 0,
    )


class Raw:
    """The handler and the inbox's statements by hand on raw PyMySQL connections."""

    def __init__(self, url: URL) -> None:
        self.single = raw_connection(url, multi=False)
        self.multi = raw_connection(url, multi=True)
        self.at = dt.datetime.now(dt.UTC).replace(tzinfo=None)

    def close(self) -> None:
        """Close both connections."""
        self.single.close()
        self.multi.close()

    @staticmethod
    def _rest(cursor: Any, message: Message) -> None:
        ref, amount = message.body["ref"], message.body["amount"]
        cursor.execute(ORDER, (ref, amount))
        cursor.execute(ADD, (amount, ref % ACCOUNTS))

    def plain(self, batch: list[Message]) -> None:
        """raw-plain."""
        with self.single.cursor() as cursor:
            for message in batch:
                cursor.execute(READ, (message.body["ref"] % ACCOUNTS,))
                cursor.fetchone()
                self._rest(cursor, message)
                self.single.commit()

    def inbox(self, batch: list[Message]) -> None:
        """raw-inbox: claim, handler, claim-held check, commit; a duplicate rolls back."""
        with self.single.cursor() as cursor:
            for message in batch:
                key = message.id.bytes
                try:
                    cursor.execute(CLAIM, (key, HANDLER, self.at))
                except pymysql.IntegrityError as exc:
                    if exc.args[0] != DUPLICATE_ENTRY:
                        raise
                    self.single.rollback()
                    continue
                cursor.execute(READ, (message.body["ref"] % ACCOUNTS,))
                cursor.fetchone()
                self._rest(cursor, message)
                cursor.execute(HELD, (key, HANDLER))
                if cursor.fetchone()[0] != 1:
                    raise AssertionError("claim gone")
                self.single.commit()

    def multi_statement(self, batch: list[Message]) -> None:
        """raw-multi: ``claim; first statement`` in one packet, then as raw-inbox."""
        packet = f"{CLAIM}; {READ}"
        with self.multi.cursor() as cursor:
            for message in batch:
                key = message.id.bytes
                try:
                    cursor.execute(packet, (key, HANDLER, self.at, message.body["ref"] % ACCOUNTS))
                except pymysql.IntegrityError as exc:  # the claim's 1062: the read never ran
                    if exc.args[0] != DUPLICATE_ENTRY:
                        raise
                    self.multi.rollback()
                    continue
                if cursor.rowcount != 1 or not cursor.nextset():
                    raise AssertionError("the claim's result, then the read's, expected")
                cursor.fetchone()
                self._rest(cursor, message)
                cursor.execute(HELD, (key, HANDLER))
                if cursor.fetchone()[0] != 1:
                    raise AssertionError("claim gone")
                self.multi.commit()

    def select_ones(self, count: int) -> None:
        """raw-select-1: ``count`` ``SELECT 1``."""
        with self.single.cursor() as cursor:
            for _ in range(count):
                cursor.execute("SELECT 1")
                cursor.fetchone()
            self.single.commit()


def behaviour(raw: Raw) -> dict[str, Any]:
    """How a multi-statement packet behaves on this server and PyMySQL (the answers the
    design would rest on), each checked on the server."""
    found: dict[str, Any] = {}
    connection, cursor = raw.multi, raw.multi.cursor()
    key = uuid.uuid4().bytes
    cursor.execute(CLAIM, (key, "check", raw.at))
    connection.commit()
    # 1. A duplicate claim first: error 1062 raised by execute(); the next statement?
    marker = -(uuid.uuid4().int % 10**9)
    try:
        cursor.execute(f"{CLAIM}; {ORDER}", (key, "check", raw.at, marker, 1))
        found["duplicate claim first: raised"] = None
    except pymysql.IntegrityError as exc:
        found["duplicate claim first: raised"] = f"IntegrityError {exc.args[0]} from execute()"
    connection.rollback()
    cursor.execute("SELECT count(*) FROM bench_order WHERE ref = %s", (marker,))
    found["duplicate claim first: the statement after it ran"] = cursor.fetchone()[0] == 1
    # 2. The claim wins, the second statement fails: where does its error surface?
    other = uuid.uuid4().bytes
    cursor.execute(f"{CLAIM}; {CLAIM}", (other, "check", raw.at, key, "check", raw.at))
    found["error in the 2nd statement: execute() returned, first rowcount"] = cursor.rowcount
    try:
        cursor.nextset()
        found["error in the 2nd statement: raised by nextset()"] = False
    except pymysql.IntegrityError:
        found["error in the 2nd statement: raised by nextset()"] = True
    connection.rollback()
    # 3. Left unread, that error surfaces on the NEXT statement, from another cursor.
    cursor.execute(f"{CLAIM}; {CLAIM}", (other, "check", raw.at, key, "check", raw.at))
    try:
        with connection.cursor() as unrelated:
            unrelated.execute("SELECT 1")
        found["unread error: raised by the next, unrelated statement"] = False
    except pymysql.IntegrityError:
        found["unread error: raised by the next, unrelated statement"] = True
    connection.rollback()
    # 4. Without the flag, a packet of two statements is a syntax error.
    try:
        with raw.single.cursor() as single:
            single.execute("SELECT 1; SELECT 2")
        found["without CLIENT.MULTI_STATEMENTS: two statements"] = "accepted"
    except pymysql.err.ProgrammingError as exc:
        found["without CLIENT.MULTI_STATEMENTS: two statements"] = f"error {exc.args[0]}"
    raw.single.rollback()
    # 5. MariaDB's Questions counts statements, not packets: one raw-multi message.
    before = questions(connection)
    raw.multi_statement([Message.new("bench", {"ref": 1, "amount": 1})])
    found["Questions for one raw-multi message (5 packets)"] = questions(connection) - before - 1
    cursor.close()
    return found


def questions(connection: Any) -> int:
    """The session's ``Questions`` (this SHOW included)."""
    with connection.cursor() as cursor:
        cursor.execute("SHOW SESSION STATUS LIKE 'Questions'")
        return int(cursor.fetchone()[1])


class Batches:
    """Fresh messages with refs never used before."""

    def __init__(self) -> None:
        self._refs = iter(range(10**12))

    def make(self, count: int) -> list[Message]:
        """``count`` new messages."""
        return [Message.new("bench", {"ref": next(self._refs), "amount": 7}) for _ in range(count)]


def steps_for(
    engine: Engine, noreset: Engine, raw: Raw, batches: Batches, messages: int
) -> dict[str, Callable[[], None]]:
    """One round's work per variant (fresh messages each)."""
    sessions = sessionmaker(engine)
    inbox = Inbox(sessions)
    inbox.handler("bench", name=HANDLER)(three_statements)
    quiet = Inbox(sessionmaker(noreset))
    quiet.handler("bench", name=HANDLER)(three_statements)
    return {
        "sa-plain": functools.partial(plain, sessions, batches.make(messages)),
        "sa-inbox": functools.partial(through, inbox, batches.make(messages)),
        "sa-inbox-noreset": functools.partial(through, quiet, batches.make(messages)),
        "sa-select-1": functools.partial(select_ones, sessions, messages),
        "raw-plain": functools.partial(raw.plain, batches.make(messages)),
        "raw-inbox": functools.partial(raw.inbox, batches.make(messages)),
        "raw-multi": functools.partial(raw.multi_statement, batches.make(messages)),
        "raw-select-1": functools.partial(raw.select_ones, messages),
    }


def run(options: argparse.Namespace, out_dir: Path) -> ScenarioReport:
    """Check the behaviour, measure every variant, count the round trips."""
    messages: int = options.messages
    with fresh_schema(options.mariadb_url, business) as engine:
        with engine.begin() as connection:
            connection.execute(insert(accounts), [{"id": i, "balance": 0} for i in range(ACCOUNTS)])
        noreset = create_engine(engine.url, pool_reset_on_return=None)
        reset_only_in_transaction(noreset)
        raw = Raw(engine.url)
        try:
            version = f"mariadb {server_version(engine)}"
            print(f"{SCENARIO} on {version}, PyMySQL {pymysql.__version__}", flush=True)
            checks = behaviour(raw)
            for what, answer in checks.items():
                print(f"  {what}: {answer}")
            batches = Batches()
            for step in steps_for(engine, noreset, raw, batches, 200).values():
                step()  # warm the pool, caches, the server
            samples: dict[str, list[float]] = {name: [] for name in VARIANTS}
            for round_number in range(options.rounds):
                steps = steps_for(engine, noreset, raw, batches, messages)
                for name in alternate(round_number, list(VARIANTS)):
                    samples[name].append(timed(steps[name]) / messages * 1e6)
                print(
                    f"  round {round_number + 1}: "
                    + ", ".join(f"{n} {samples[n][-1]:.0f}" for n in VARIANTS)
                    + " us/msg",
                    flush=True,
                )
            counted: dict[str, float] = {}
            commands = Commands()
            for name, step in steps_for(engine, noreset, raw, batches, 50).items():
                with commands.counting():
                    step()
                counted[name] = commands.count / 50
        finally:
            raw.close()
            noreset.dispose()
    return report(
        options, version=version, checks=checks, samples=samples, counted=counted, out_dir=out_dir
    )


def report(
    options: argparse.Namespace,
    *,
    version: str,
    checks: dict[str, Any],
    samples: dict[str, list[float]],
    counted: dict[str, float],
    out_dir: Path,
) -> ScenarioReport:
    """Print the table's lines and build the figures."""
    print("  variant            us/msg (min..max)        round trips counted / message")
    for name in VARIANTS:
        value, (low, high) = median_spread(samples[name])
        print(f"  {name:<18} {value:8.1f} ({low:.1f}..{high:.1f})   {counted[name]:.2f}")

    def in_trips(name: str, minus: str | None = None) -> list[float]:
        select = samples["sa-select-1" if name.startswith("sa-") else "raw-select-1"]
        base = samples[minus] if minus else [0.0] * len(select)
        return [(v - b) / s for v, b, s in zip(samples[name], base, select, strict=True)]

    figures: list[Figure] = []
    for name in VARIANTS:
        if not name.endswith("select-1"):
            value, spread = median_spread(in_trips(name))
            figures.append(
                Figure(f"{name}: per message, in SELECT 1 round trips", value, "x", spread=spread)
            )
    for label, values, unit in (
        (
            "raw-inbox - raw-multi (what the shared packet saves)",
            in_trips("raw-inbox", "raw-multi"),
            "x",
        ),
        (
            "raw-inbox - raw-plain (the inbox's two statements)",
            in_trips("raw-inbox", "raw-plain"),
            "x",
        ),
        ("sa-inbox - sa-plain", in_trips("sa-inbox", "sa-plain"), "x"),
        (
            "sa-inbox - sa-inbox-noreset (the pool's idle ROLLBACK)",
            in_trips("sa-inbox", "sa-inbox-noreset"),
            "x",
        ),
        (
            "raw-inbox - raw-multi, share of sa-inbox's time",
            [
                (i - m) / s
                for i, m, s in zip(
                    samples["raw-inbox"], samples["raw-multi"], samples["sa-inbox"], strict=True
                )
            ],
            "ratio",
        ),
    ):
        value, spread = median_spread(values)
        figures.append(Figure(label, value, unit, spread=spread))
    for name in VARIANTS:
        value, spread = median_spread(samples[name])
        figures.append(Figure(f"{name}: us per message", value, "us", spread=spread))
    for name in VARIANTS:
        if not name.endswith("select-1"):
            figures.append(Figure(f"{name}: round trips counted per message", counted[name]))
    rounds = list(range(1, options.rounds + 1))
    plots: list[str] = []
    plot = plot_lines(
        out_dir / "mariadb_multistatement.png",
        "MariaDB, 3-statement handler: per message, in SELECT 1 round trips (same round)",
        "round",
        "SELECT 1 round trips",
        {name: (rounds, in_trips(name)) for name in VARIANTS if not name.endswith("select-1")},
    )
    if plot:
        plots.append(plot)
    return ScenarioReport(
        SCENARIO,
        TITLE,
        {"messages": options.messages, "rounds": options.rounds, "server": version},
        figures,
        {
            "behaviour": checks,
            "samples_us_per_message": samples,
            "round_trips_counted_per_message": counted,
            "pymysql": pymysql.__version__,
        },
        plots,
    )


if __name__ == "__main__":
    sys.exit(scenario_main(sys.modules[__name__]))
