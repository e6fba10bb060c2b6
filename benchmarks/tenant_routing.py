"""TENANTS: what per-tenant routing costs per message — ``Inbox(sessions_for=...)`` over N
schemas vs ``Inbox(session_factory)`` on one schema, on PostgreSQL.

    .venv/bin/python benchmarks/tenant_routing.py [--messages N] [--rounds R] [--quick]

The handler is S1's three-statement one (read a balance, insert an order, update the
balance; ``s1_overhead.three_statements``). One engine, one pool; the tenants are N
PostgreSQL schemas ``<run>_t0`` ... holding the inbox tables and S1's business tables,
created through ``schema_translate_map`` as docs/tenants.md shows. Alternating the variants
round by round (odd rounds in reverse order), the median and (min..max) over the rounds:

* plain-3: the handler in a plain session transaction, no inbox (for scale);
* inbox-3: ``Inbox(sessionmaker(engine))`` on one schema reached through the connection's
  ``search_path``: the shipped single-tenant path (BEGIN and the prepared claim in one
  round trip, inbox/_backends/postgresql/_psycopg.py);
* inbox-3-map: ``Inbox(sessionmaker(engine.execution_options(schema_translate_map={None:
  t0})))``: one tenant, no routing function, but every statement (the claim included) goes
  through the schema translation;
* tenants-N (N = 1, 3, 10; ``--tenants 1 3 10 30`` for others):
  ``Inbox(sessions_for=sessions_for)`` where ``sessions_for`` is
  ``tenants[message.headers["tenant"]]()``: a dict lookup of a per-tenant ``sessionmaker``
  bound to ``engine.execution_options(schema_translate_map={None: "<run>_tK"})``, then the
  session; the messages go to the N tenants in turn;
* select-1: one ``SELECT 1`` through a session, the price of one round trip in the same
  round, which every per-message figure is also given in.

Then, outside the timed rounds: the statements each variant sends per message and its
SQLAlchemy compiled-cache misses (an ``after_cursor_execute`` listener on 60 messages), the
compiled-cache entries and the server-side prepared statements (psycopg prepares a
statement text after 5 executions; each tenant's text differs) after the largest N; the
claim alone on one connection through SQLAlchemy (what every claim after a transaction's
first and every other driver takes), without and under a ``schema_translate_map``,
alternated; and the routing function alone against a plain ``sessionmaker()`` call (ns per
call, no database).
"""

from __future__ import annotations

import argparse
import datetime as dt
import functools
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from common import (
    DEFAULT_DATABASE,
    Figure,
    ScenarioReport,
    alternate,
    median_spread,
    plot_lines,
    scenario_main,
    server_version,
    timed,
)
from s1_overhead import (
    ACCOUNTS,
    accounts,
    business,
    plain,
    select_ones,
    three_statements,
    through,
)
from sqlalchemy import Connection, Engine, create_engine, event, insert, text
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker

from inbox import Inbox, Message
from inbox._backends import Claims
from inbox.schema import inbox_message
from inbox.schema import metadata as inbox_metadata

SCENARIO = "TENANTS"
TITLE = "per-tenant routing: Inbox(sessions_for=...) over N schemas vs one session_factory"
QUICK: dict[str, Any] = {"messages": 300, "rounds": 3, "claims": 300, "calls": 20_000}
TENANT_COUNTS = (1, 3, 10)


def variants(counts: Sequence[int]) -> tuple[str, ...]:
    """The variants' names, for tenant counts ``counts``; select-1 last."""
    return ("plain-3", "inbox-3", "inbox-3-map", *(f"tenants-{n}" for n in counts), "select-1")


CLAIM_PATHS = ("no map", "under schema_translate_map")
HANDLER = "bench.three_statements"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The scenario's options."""
    parser.add_argument("--database-url", default=DEFAULT_DATABASE, help="a PostgreSQL URL")
    parser.add_argument("--messages", type=int, default=3000, help="messages per variant")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--claims", type=int, default=2000, help="claims per path, claim alone")
    parser.add_argument("--calls", type=int, default=200_000, help="routing calls, no database")
    parser.add_argument(
        "--synchronous-commit",
        choices=["on", "off"],
        default="on",
        help="off: commits do not wait for the WAL flush (the sessions' setting), so a busy "
        "disk's noise leaves the figures; round trips and Python stay",
    )
    parser.add_argument(
        "--tenants",
        type=int,
        nargs="+",
        default=list(TENANT_COUNTS),
        help="tenant counts N to route over (1 must be among them)",
    )


class Schemas:
    """The run's schemas (a base one on the search path and N tenant ones) on one engine."""

    def __init__(self, url: str, tenants: int, synchronous_commit: str = "on") -> None:
        base = make_url(url)
        if base.get_backend_name() != "postgresql":
            raise SystemExit("tenant_routing.py measures schema_translate_map on PostgreSQL")
        prefix = f"bench_{uuid.uuid4().hex[:10]}"
        self.base = f"{prefix}_base"
        self.tenants = [f"{prefix}_t{k}" for k in range(tenants)]
        self._admin = create_engine(url, isolation_level="AUTOCOMMIT")
        with self._admin.connect() as connection:
            for schema in (self.base, *self.tenants):
                connection.execute(text(f"CREATE SCHEMA {schema}"))
        options = f"-csearch_path={self.base} -csynchronous_commit={synchronous_commit}"
        self.engine = create_engine(base.update_query_dict({"options": options}))
        for schema in (None, *self.tenants):
            target = (
                self.engine
                if schema is None
                else self.engine.execution_options(schema_translate_map={None: schema})
            )
            inbox_metadata.create_all(target)
            business.create_all(target)
            with target.begin() as connection:
                connection.execute(
                    insert(accounts), [{"id": i, "balance": 0} for i in range(ACCOUNTS)]
                )

    def tenant_engine(self, schema: str) -> Engine:
        """The shared engine, translating unqualified tables to ``schema``."""
        return self.engine.execution_options(schema_translate_map={None: schema})

    def drop(self) -> None:
        """Drop every schema of the run."""
        self.engine.dispose()
        with self._admin.connect() as connection:
            for schema in (self.base, *self.tenants):
                connection.execute(text(f"DROP SCHEMA {schema} CASCADE"))
        self._admin.dispose()


def routed(schemas: Schemas, count: int) -> tuple[Callable[[Message], Session], list[str]]:
    """``sessions_for`` over the first ``count`` tenants, and their names."""
    names = schemas.tenants[:count]
    tenants = {name: sessionmaker(schemas.tenant_engine(name)) for name in names}

    def sessions_for(message: Message) -> Session:
        return tenants[message.headers["tenant"]]()

    return sessions_for, names


def build_inboxes(
    schemas: Schemas, counts: Sequence[int]
) -> tuple[dict[str, Inbox], dict[str, list[str]]]:
    """Every inbox variant, and the tenants each one's messages name (none: no header)."""
    inboxes = {
        "inbox-3": Inbox(sessionmaker(schemas.engine)),
        "inbox-3-map": Inbox(sessionmaker(schemas.tenant_engine(schemas.tenants[0]))),
    }
    names: dict[str, list[str]] = {"inbox-3": [], "inbox-3-map": []}
    for count in counts:
        sessions_for, tenants = routed(schemas, count)
        inboxes[f"tenants-{count}"] = Inbox(sessions_for=sessions_for)
        names[f"tenants-{count}"] = tenants
    for inbox in inboxes.values():
        inbox.handler("bench", name=HANDLER)(three_statements)
    return inboxes, names


class Batches:
    """Fresh messages, each variant's spread over its tenants in turn."""

    def __init__(self) -> None:
        self._refs = iter(range(10**12))

    def make(self, count: int, tenants: list[str]) -> list[Message]:
        """``count`` new messages; with ``tenants``, message i names tenant i mod N."""
        return [
            Message.new(
                "bench",
                {"ref": next(self._refs), "amount": 7},
                {"tenant": tenants[i % len(tenants)]} if tenants else None,
            )
            for i in range(count)
        ]


def measure_rounds(
    schemas: Schemas, inboxes: dict[str, Inbox], tenants: dict[str, list[str]], options: Any
) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """µs per message of every variant, one sample per round: wall time, and this process's
    CPU time (Python, SQLAlchemy, psycopg and libpq; not the server's, not the waiting),
    which other jobs on the machine disturb much less."""
    sessions = sessionmaker(schemas.engine)
    batches = Batches()
    messages: int = options.messages
    # Warm up the pool, the compiled cache, psycopg's prepared statements in every schema.
    plain(sessions, batches.make(200, []))
    for name, inbox in inboxes.items():
        through(inbox, batches.make(200, tenants[name]))
    select_ones(sessions, 200)
    names = variants(options.tenants)
    samples: dict[str, list[float]] = {name: [] for name in names}
    cpu: dict[str, list[float]] = {name: [] for name in names}
    for round_number in range(options.rounds):
        steps: list[tuple[str, Callable[[], None]]] = [
            ("plain-3", functools.partial(plain, sessions, batches.make(messages, []))),
            *(
                (name, functools.partial(through, inbox, batches.make(messages, tenants[name])))
                for name, inbox in inboxes.items()
            ),
            ("select-1", functools.partial(select_ones, sessions, messages)),
        ]
        for name, step in alternate(round_number, steps):
            started = time.process_time()
            samples[name].append(timed(step) / messages * 1e6)
            cpu[name].append((time.process_time() - started) / messages * 1e6)
        print(
            f"  round {round_number + 1}: "
            + ", ".join(f"{name} {samples[name][-1]:.0f}" for name in names)
            + " us/msg; client CPU "
            + ", ".join(f"{cpu[name][-1]:.0f}" for name in names),
            flush=True,
        )
    return samples, cpu


def count_statements(
    schemas: Schemas, inboxes: dict[str, Inbox], tenants: dict[str, list[str]], count: int = 60
) -> dict[str, dict[str, float]]:
    """Per message, for each variant: statements sent, compiled-cache misses, and the
    compiled-cache entries added (a listener on the engine; not timed)."""
    seen = {"statements": 0, "misses": 0}

    def after(*arguments: Any) -> None:  # (conn, cursor, statement, params, context, many)
        context = arguments[4]
        seen["statements"] += 1
        if context is not None and context.cache_hit is context.dialect.CACHE_MISS:
            seen["misses"] += 1

    event.listen(schemas.engine, "after_cursor_execute", after)
    batches = Batches()
    sessions = sessionmaker(schemas.engine)
    counted: dict[str, dict[str, float]] = {}
    cache = schemas.engine._compiled_cache
    try:
        runs: list[tuple[str, Callable[[], None]]] = [
            ("plain-3", functools.partial(plain, sessions, batches.make(count, []))),
            *(
                (name, functools.partial(through, inbox, batches.make(count, tenants[name])))
                for name, inbox in inboxes.items()
            ),
        ]
        for name, run in runs:
            seen.update(statements=0, misses=0)
            entries = len(cache) if cache is not None else 0
            run()
            counted[name] = {
                "statements": seen["statements"] / count,
                "compiled_cache_misses": seen["misses"] / count,
                "compiled_cache_entries_added": (len(cache) if cache is not None else 0) - entries,
            }
    finally:
        event.remove(schemas.engine, "after_cursor_execute", after)
    return counted


def prepared_statements(schemas: Schemas) -> dict[str, Any]:
    """The compiled cache's size and the statements PostgreSQL holds prepared on the pool's
    connection (psycopg prepares a text after 5 executions), by schema named in them."""
    with schemas.engine.connect() as connection:
        rows = connection.exec_driver_sql("SELECT statement FROM pg_prepared_statements").all()
    by_schema: dict[str, int] = {}
    for (statement,) in rows:
        # Longest name first: "..._t1" is a prefix of "..._t10".
        tenant = next(
            (t for t in sorted(schemas.tenants, key=len, reverse=True) if t in statement), None
        )
        where = "search_path" if tenant is None else tenant.rsplit("_", 1)[-1]
        by_schema[where] = by_schema.get(where, 0) + 1
    cache = schemas.engine._compiled_cache
    return {
        "compiled_cache_entries": len(cache) if cache is not None else None,
        "prepared_statements_on_one_connection": len(rows),
        "prepared_by_schema": by_schema,
        "pool_connections": schemas.engine.pool.checkedin(),
    }


def claim_paths(schemas: Schemas, claims: int, rounds: int) -> dict[str, list[float]]:
    """µs per claim on one connection in one transaction (rolled back), through SQLAlchemy
    (the claim after the first of a transaction, and every driver's), with and without a
    schema_translate_map: wall time ("<path>") and this process's CPU ("<path>, client CPU")."""
    table_claims = Claims(inbox_message)
    at = dt.datetime.now(dt.UTC)
    tenant = schemas.tenant_engine(schemas.tenants[0])

    def run(engine: Engine, claim: Callable[[Connection, bytes, str, dt.datetime], bool]) -> None:
        keys = [uuid.uuid4().bytes for _ in range(claims)]
        with engine.connect() as connection, connection.begin() as transaction:
            started, cpu_started = time.perf_counter(), time.process_time()
            for key in keys:
                if not claim(connection, key, HANDLER, at):
                    raise AssertionError("a fresh key was not claimed")
            elapsed.append(time.perf_counter() - started)
            cpu_elapsed.append(time.process_time() - cpu_started)
            transaction.rollback()

    elapsed: list[float] = []
    cpu_elapsed: list[float] = []
    steps = {
        "no map": functools.partial(run, schemas.engine, table_claims.claim),
        "under schema_translate_map": functools.partial(run, tenant, table_claims.claim),
    }
    for step in steps.values():  # warm: caches, prepared statements
        step()
    samples: dict[str, list[float]] = {
        label: [] for name in CLAIM_PATHS for label in (name, f"{name}, client CPU")
    }
    for round_number in range(rounds):
        for name in alternate(round_number, CLAIM_PATHS):
            steps[name]()
            samples[name].append(elapsed[-1] / claims * 1e6)
            samples[f"{name}, client CPU"].append(cpu_elapsed[-1] / claims * 1e6)
    return samples


def wire_round_trips(schemas: Schemas, counts: Sequence[int], count: int = 50) -> dict[str, float]:
    """Round trips per message on the wire, per variant: each variant rebuilt on an engine
    that goes through ``inbox.testing.round_trips.RoundTripCounter`` (a counting TCP proxy);
    empty when this inbox has no counter."""
    try:
        from inbox.testing.round_trips import RoundTripCounter
    except ImportError:
        print("  (inbox.testing.round_trips not available: no round trips counted)")
        return {}
    url = schemas.engine.url
    counted: dict[str, float] = {}
    with RoundTripCounter(url.host or "127.0.0.1", url.port or 5432) as counter:
        proxied = Schemas.__new__(Schemas)
        proxied.base, proxied.tenants = schemas.base, schemas.tenants
        proxied.engine = create_engine(counter.url(url.render_as_string(hide_password=False)))
        try:
            inboxes, tenants = build_inboxes(proxied, counts)
            sessions = sessionmaker(proxied.engine)
            batches = Batches()
            runs: list[tuple[str, Callable[[list[Message]], None]]] = [
                ("plain-3", functools.partial(plain, sessions)),
                *((name, functools.partial(through, inbox)) for name, inbox in inboxes.items()),
            ]
            for name, run in runs:
                # Warm: 10 messages per tenant, past psycopg's prepare threshold (5).
                run(batches.make(10 * max(1, len(tenants.get(name, []))), tenants.get(name, [])))
                batch = batches.make(count, tenants.get(name, []))
                counter.reset()
                run(batch)
                counted[name] = counter.count / count
        finally:
            proxied.engine.dispose()
    return counted


def routing_calls(schemas: Schemas, calls: int, rounds: int) -> dict[str, list[float]]:
    """ns per call: ``sessionmaker()`` vs ``sessions_for(message)`` over up to 10 tenants (each
    session closed; nothing connects)."""
    factory = sessionmaker(schemas.engine)
    sessions_for, names = routed(schemas, 10)
    messages = [Message.new("bench", {}, {"tenant": names[i % len(names)]}) for i in range(1000)]

    def direct() -> None:
        for _ in range(calls):
            factory().close()

    def route() -> None:
        for i in range(calls):
            sessions_for(messages[i % 1000]).close()

    steps = {"sessionmaker()": direct, "sessions_for(message)": route}
    samples: dict[str, list[float]] = {name: [] for name in steps}
    for round_number in range(rounds):
        for name in alternate(round_number, list(steps)):
            samples[name].append(timed(steps[name]) / calls * 1e9)
    return samples


def ratio_figures(samples: dict[str, list[float]], counts: Sequence[int]) -> list[Figure]:
    """Per-round differences and round-trip equivalents, then the medians."""
    select = samples["select-1"]

    def per_round(name: str, minus: str | None = None) -> list[float]:
        values = samples[name]
        base = samples[minus] if minus else [0.0] * len(values)
        return [(v - b) / s for v, b, s in zip(values, base, select, strict=True)]

    figures: list[Figure] = []
    for label, values in (
        *(
            (
                f"tenants-{n} - inbox-3, in SELECT 1 round trips",
                per_round(f"tenants-{n}", "inbox-3"),
            )
            for n in counts
        ),
        ("inbox-3-map - inbox-3 (schema_translate_map alone)", per_round("inbox-3-map", "inbox-3")),
        ("tenants-1 - inbox-3-map (routing function alone)", per_round("tenants-1", "inbox-3-map")),
        *(
            (f"tenants-{n} - tenants-1 ({n} schemas vs 1)", per_round(f"tenants-{n}", "tenants-1"))
            for n in counts
            if n != 1
        ),
        ("inbox-3 - plain-3 (the inbox itself)", per_round("inbox-3", "plain-3")),
    ):
        value, spread = median_spread(values)
        figures.append(Figure(label, value, "x", spread=spread))
    for name in variants(counts)[:-1]:
        value, spread = median_spread(per_round(name))
        figures.append(
            Figure(f"{name}: per message, in SELECT 1 round trips", value, "x", spread=spread)
        )
    for name in variants(counts):
        value, spread = median_spread(samples[name])
        figures.append(Figure(f"{name}: us per message", value, "us", spread=spread))
    return figures


def run(options: argparse.Namespace, out_dir: Path) -> ScenarioReport:
    """Measure every variant; figures, raw samples and a plot."""
    counts = sorted(set(options.tenants))
    if 1 not in counts:
        raise SystemExit("--tenants must include 1 (the routing function's own cost)")
    options.tenants = counts
    largest = max(counts)
    schemas = Schemas(options.database_url, largest, options.synchronous_commit)
    try:
        inboxes, tenants = build_inboxes(schemas, counts)
        version = f"postgresql {server_version(schemas.engine)}"
        print(
            f"TENANTS on {version}: {options.messages} messages x {options.rounds} rounds, "
            f"tenants {', '.join(map(str, counts))}, synchronous_commit "
            f"{options.synchronous_commit}",
            flush=True,
        )
        samples, cpu = measure_rounds(schemas, inboxes, tenants, options)
        counted = count_statements(schemas, inboxes, tenants)
        caches = prepared_statements(schemas)
        claims = claim_paths(schemas, options.claims, options.rounds)
        calls = routing_calls(schemas, options.calls, options.rounds)
        wire = wire_round_trips(schemas, counts)
    finally:
        schemas.drop()
    for name in variants(counts):
        value, (low, high) = median_spread(samples[name])
        cpu_value, (cpu_low, cpu_high) = median_spread(cpu[name])
        print(
            f"  {name:<12} {value:9.1f} us/msg  ({low:.1f}..{high:.1f}); client CPU "
            f"{cpu_value:.1f} ({cpu_low:.1f}..{cpu_high:.1f})"
        )
    print("  statements / compiled-cache misses per message (60 messages, after the rounds):")
    for name, values in counted.items():
        print(
            f"    {name:<12} {values['statements']:.2f} / {values['compiled_cache_misses']:.2f}"
            f" (cache entries added {values['compiled_cache_entries_added']})"
        )
    print(f"  caches after the run: {caches}")
    print(f"  round trips per message on the wire: {wire}")
    for name in claims:
        value, (low, high) = median_spread(claims[name])
        print(f"  claim alone, {name:<42} {value:7.1f} us  ({low:.1f}..{high:.1f})")
    for name, values in calls.items():
        value, (low, high) = median_spread(values)
        print(f"  {name:<22} {value:7.0f} ns/call  ({low:.0f}..{high:.0f})")

    figures = ratio_figures(samples, counts)
    names = variants(counts)[:-1]
    for label, minus in (
        *((f"tenants-{n} - inbox-3", f"tenants-{n}") for n in counts),
        ("inbox-3-map - inbox-3", "inbox-3-map"),
        ("tenants-1 - inbox-3-map", "tenants-1"),
        ("inbox-3 - plain-3", "inbox-3"),
    ):
        base = label.split(" - ")[1]
        values = [v - b for v, b in zip(cpu[minus], cpu[base], strict=True)]
        value, spread = median_spread(values)
        figures.append(Figure(f"{label}, client CPU per message", value, "us", spread=spread))
    for name in names:
        value, spread = median_spread(cpu[name])
        figures.append(Figure(f"{name}: client CPU us per message", value, "us", spread=spread))

    def delta(suffix: str = "") -> list[float]:
        return [
            m - d
            for m, d in zip(
                claims[f"under schema_translate_map{suffix}"],
                claims[f"no map{suffix}"],
                strict=True,
            )
        ]

    for label, values in (
        ("claim alone: under schema_translate_map - no map", delta()),
        ("claim alone, client CPU: under schema_translate_map - no map", delta(", client CPU")),
        *((f"claim alone: {name}", claims[name]) for name in claims),
    ):
        value, spread = median_spread(values)
        figures.append(Figure(label, value, "us", spread=spread))
    route = [
        r - d for r, d in zip(calls["sessions_for(message)"], calls["sessionmaker()"], strict=True)
    ]
    value, spread = median_spread(route)
    figures.append(
        Figure("routing function - sessionmaker(), per call", value, "ns", spread=spread)
    )
    for name, trips in wire.items():
        figures.append(Figure(f"{name}: round trips counted per message", trips))
    for name in ("inbox-3", "inbox-3-map", f"tenants-{largest}"):
        figures.append(Figure(f"{name}: statements per message", counted[name]["statements"]))
    figures.append(
        Figure(
            f"tenants-{largest}: compiled-cache misses per message after warm-up",
            counted[f"tenants-{largest}"]["compiled_cache_misses"],
        )
    )

    rounds = list(range(1, options.rounds + 1))
    plots: list[str] = []
    plot = plot_lines(
        out_dir / "tenants_per_message.png",
        "TENANTS: 3-statement handler, per message, in SELECT 1 round trips (same round)",
        "round",
        "SELECT 1 round trips",
        {
            name: (rounds, [v / s for v, s in zip(samples[name], samples["select-1"], strict=True)])
            for name in variants(counts)[:-1]
        },
    )
    if plot:
        plots.append(plot)
    return ScenarioReport(
        SCENARIO,
        TITLE,
        {
            "messages": options.messages,
            "rounds": options.rounds,
            "tenants": counts,
            "claims": options.claims,
            "calls": options.calls,
            "server": version,
            "synchronous_commit": options.synchronous_commit,
        },
        figures,
        {
            "samples_us_per_message": samples,
            "client_cpu_us_per_message": cpu,
            "counted_per_message": counted,
            "caches": caches,
            "claim_alone_us": claims,
            "routing_ns_per_call": calls,
            "round_trips_on_the_wire_per_message": wire,
        },
        plots,
    )


if __name__ == "__main__":
    sys.exit(scenario_main(sys.modules[__name__]))
