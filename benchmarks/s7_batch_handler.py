"""S7: a batch handler (one executemany per batch) vs the per-message worker and pgbench.

    .venv/bin/python benchmarks/s7_batch_handler.py [--messages 3000] [--batch-messages 20000]
        [--rounds 3] [--batch-size 100] [--seconds 5] [--profile] [--database-only]

In a fresh PostgreSQL schema, RabbitMQ → ``inbox.broker.Worker`` → PostgreSQL, every
variant writing the same one-row ``INSERT INTO bench_order`` per message, alternating which
goes first round by round:

* per-message worker: ``batch_size=1``, prefetch ``--prefetch`` (300 for every consumer), a
  per-message handler (claim, insert, commit per message; one ack each), over
  ``--messages`` messages;
* batch, per-message handler: ``batch_size=--batch-size``, the same handler (the worker's
  batch mode before batch handlers: one transaction and one claim statement per batch, one
  insert per message), over ``--batch-messages``;
* batch, batch handler: the same batch mode with ``@inbox.batch_handler``: the batch's rows
  in ONE executemany (psycopg: one multi-row ``INSERT``), one ack frame per batch;
* pgbench, 1 client, prepared, ``-T --seconds``: ``BEGIN; INSERT; COMMIT`` (one transaction
  per message: what one connection allows a design that commits every message) and the
  same with the inbox's claim (S3's two scripts);
* ``process_batch``, no broker (``s7_database.py``): the same batch handler called through
  ``inbox.process_batch`` on ``--batch-messages`` messages built in memory, in batches of
  ``--batch-size``: the batch path at the database, the figure to set beside pgbench's
  ``BEGIN; INSERT; COMMIT``; and the same with a handler that sends its rows as arrays
  (``INSERT … SELECT unnest(:refs), unnest(:amounts)``). What one batch sends to the driver
  is printed first (one line per cursor call); ``--profile`` adds a cProfile of one run;
  ``--database-only`` runs these, pgbench and ``SELECT 1`` alone (no broker variants);
* kombu consumer, no database: a plain kombu ``Consumer`` at the same prefetch that acks
  every ``--batch-size`` deliveries with one ``multiple=True`` ack and does nothing else,
  over ``--batch-messages``: what the broker and kombu deliver to one Python consumer, the
  ceiling of any worker on this machine;
* ``SELECT 1``: 2,000 through a session, as S1 measures it: the round trip every other
  figure is also given in (per message, in the same rounds), the unit that carries over to
  other hardware better than microseconds.

A worker's rate is messages / (end of the last ``process``/``process_batch`` call - start of
the first): the broker's delivery, the claims, the handler and the commits, without the
connection set-up or the idle wait at the end. Messages are published before each run (not
timed). Ratios are taken round by round, then the median.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from common import (
    DEFAULT_BROKER,
    DEFAULT_DATABASE,
    Figure,
    ScenarioReport,
    alternate,
    at_least,
    fresh_schema,
    median_spread,
    plot_lines,
    scenario_main,
    server_version,
)
from s1_overhead import INSERT_ORDER, SELECT_ONE, business, orders
from s3_ceiling import PgBench
from s7_database import (
    PB_EXECUTEMANY,
    PB_UNNEST,
    Span,
    all_rows,
    fill,
    profile,
    run_broker_only,
    run_process_batch,
    statements_per_batch,
    wire_round_trips,
)
from sqlalchemy import Engine, func, select
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker

from inbox import Inbox, Message
from inbox.broker import Worker
from inbox.broker._idle import delete_queues, run_until_idle

SCENARIO = "S7"
TITLE = "batch handler: worker batch + one executemany vs per-message worker and pgbench"
QUICK: dict[str, Any] = {"messages": 800, "batch_messages": 4000, "rounds": 2, "seconds": 2.0}

PER_MESSAGE = "per-message worker"
BATCH_SINGLE = "batch, per-message handler"
BATCH_HANDLER = "batch, batch handler"
PG_INSERT = "pgbench insert only"
PG_CLAIM = "pgbench claim + insert"
BROKER_ONLY = "kombu consumer, no database"
SELECT_1 = "SELECT 1"
VARIANTS = (
    PER_MESSAGE,
    BATCH_SINGLE,
    BATCH_HANDLER,
    BROKER_ONLY,
    PB_EXECUTEMANY,
    PB_UNNEST,
    PG_INSERT,
    PG_CLAIM,
    SELECT_1,
)
DATABASE_VARIANTS = (PB_EXECUTEMANY, PB_UNNEST, PG_INSERT, PG_CLAIM, SELECT_1)
MESSAGE_RATES = (PER_MESSAGE, BATCH_SINGLE, BATCH_HANDLER, BROKER_ONLY, PB_EXECUTEMANY, PB_UNNEST)
SELECTS = 2000  # SELECT 1 round trips per round
HANDLER = "bench.orders"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """S7's options."""
    parser.add_argument("--database-url", default=DEFAULT_DATABASE)
    parser.add_argument("--broker", default=DEFAULT_BROKER)
    parser.add_argument("--messages", type=int, default=3000, help="per-message worker run")
    parser.add_argument("--batch-messages", type=int, default=20_000, help="batch mode runs")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=100)
    parser.add_argument(
        "--prefetch",
        type=int,
        default=300,
        help="every consumer's prefetch: 3 batches, so the next one is at hand (at 100 the "
        "worker waits for the broker after each batch's ack and makes partial batches)",
    )
    parser.add_argument("--seconds", type=float, default=5.0, help="pgbench -T per run")
    parser.add_argument("--pgbench", default="pgbench", help="the pgbench binary")
    parser.add_argument(
        "--profile",
        action="store_true",
        help="after the rounds, cProfile one process_batch run (no broker) and print it",
    )
    parser.add_argument(
        "--database-only",
        action="store_true",
        help="only the variants without a broker: process_batch, pgbench, SELECT 1",
    )


def one_row(message: Message, session: Session) -> None:
    """The per-message handler: one INSERT."""
    session.execute(INSERT_ORDER, {"ref": message.body["ref"], "amount": 7})


def round_trips(engine: Engine) -> dict[str, Any]:
    """``SELECTS`` ``SELECT 1`` through one session: the rate of one round trip."""
    with sessionmaker(engine)() as session, session.begin():
        started = time.perf_counter()
        for _ in range(SELECTS):
            session.execute(SELECT_ONE).scalar_one()
        elapsed = time.perf_counter() - started
    return {"rate": SELECTS / elapsed}


def run_worker(
    engine: Engine,
    options: argparse.Namespace,
    variant: str,
    messages: int,
    first_ref: int,
) -> dict[str, Any]:
    """One worker run of ``variant`` over ``messages`` fresh messages: its rate and how many
    ``multiple=True`` acks it sent."""
    inbox = Inbox(sessionmaker(engine))
    if variant == BATCH_HANDLER:
        inbox.batch_handler("order.created", name=HANDLER)(all_rows)
    else:
        inbox.handler("order.created", name=HANDLER)(one_row)
    batch_size = 1 if variant == PER_MESSAGE else options.batch_size
    span = Span(inbox)
    queue = f"bench-s7-{uuid.uuid4().hex[:8]}"
    worker = Worker(
        inbox,
        options.broker,
        [queue],
        prefetch=max(options.prefetch, batch_size),
        batch_size=batch_size,
        stats_interval=None,
    )
    worker.prepare()
    try:
        fill(options.broker, queue, messages, first_ref)
        run_until_idle(worker, 1.0)
    finally:
        delete_queues(worker)
    if worker.stats.processed != messages or worker.stats.acked != messages:
        raise SystemExit(
            f"{variant}: processed {worker.stats.processed}, acked "
            f"{worker.stats.acked} of {messages}"
        )
    return {
        "rate": span.rate(messages),
        "messages": messages,
        "batches": span.calls,
        "multiple_acks": worker._dispatch.acks.multiple_acks,
    }


def run(options: argparse.Namespace, out_dir: Path) -> ScenarioReport:
    """Every variant, alternated, ``--rounds`` times."""
    if shutil.which(options.pgbench) is None:
        raise SystemExit(f"S7 needs pgbench ({options.pgbench!r} is not on PATH)")
    samples: dict[str, list[dict[str, Any]]] = {name: [] for name in VARIANTS}
    length = ["-T", str(max(1, round(options.seconds)))]
    refs = iter(range(0, 10**15, 10**7))
    with (
        fresh_schema(options.database_url, business) as engine,
        tempfile.TemporaryDirectory(prefix="s7-pgbench-") as work,
    ):
        version = server_version(engine)
        bench = PgBench(options, engine, Path(work))

        def worker(variant: str, messages: int) -> Callable[[], dict[str, Any]]:
            return lambda: run_worker(engine, options, variant, messages, next(refs))

        def batch_path(variant: str) -> Callable[[], dict[str, Any]]:
            size, messages = options.batch_size, options.batch_messages
            return lambda: run_process_batch(engine, variant, messages, size, next(refs))

        steps: dict[str, Callable[[], dict[str, Any]]] = {
            PER_MESSAGE: worker(PER_MESSAGE, options.messages),
            BATCH_SINGLE: worker(BATCH_SINGLE, options.batch_messages),
            BATCH_HANDLER: worker(BATCH_HANDLER, options.batch_messages),
            BROKER_ONLY: lambda: run_broker_only(options, options.batch_messages, next(refs)),
            PB_EXECUTEMANY: batch_path(PB_EXECUTEMANY),
            PB_UNNEST: batch_path(PB_UNNEST),
            PG_INSERT: lambda: bench.run(PG_INSERT, length),
            PG_CLAIM: lambda: bench.run(PG_CLAIM, length),
            SELECT_1: lambda: round_trips(engine),
        }
        variants = DATABASE_VARIANTS if options.database_only else VARIANTS
        # Warm up: the pool, the statement caches, the server's plans and buffers.
        if not options.database_only:
            worker(BATCH_HANDLER, min(1000, options.batch_messages))()
        bench.run(PG_INSERT, ["-T", "1"])
        sent: dict[str, list[str]] = {}
        wire: dict[str, dict[int, int]] = {}
        for variant in (PB_EXECUTEMANY, PB_UNNEST):
            run_process_batch(engine, variant, 1000, options.batch_size, next(refs))
            sent[variant] = statements_per_batch(engine, variant, options.batch_size, next(refs))
            print(f"  one batch of {options.batch_size}, {variant}:")
            for line in sent[variant]:
                print(f"    {line}")
            wire[variant] = wire_round_trips(engine, variant, (2, options.batch_size))
            print(f"    round trips on the wire per batch, by batch size: {wire[variant]}")
        for round_number in range(options.rounds):
            for name in alternate(round_number, variants):
                sample = steps[name]()
                samples[name].append({k: v for k, v in sample.items() if k != "output"})
                print(f"  round {round_number + 1}: {name:<42} {sample['rate']:9.0f} /s")
        if options.profile:
            run_once = batch_path(PB_EXECUTEMANY)
            profiled = profile(run_once)
            out_dir.mkdir(parents=True, exist_ok=True)
            (out_dir / "s7_profile.txt").write_text(profiled)
            print(profiled)
        with engine.connect() as connection:
            written = connection.execute(select(func.count()).select_from(orders)).scalar_one()
    return report(options, samples, version, written, out_dir, sent=sent, wire=wire)


def report(
    options: argparse.Namespace,
    samples: dict[str, list[dict[str, Any]]],
    version: str,
    written: int,
    out_dir: Path,
    *,
    sent: dict[str, list[str]],
    wire: dict[str, dict[int, int]],
) -> ScenarioReport:
    """Figures and the plot."""
    ran = [name for name in VARIANTS if samples[name]]
    rates = {name: [s["rate"] for s in samples[name]] for name in VARIANTS}
    figures = []
    for name in ran:
        value, spread = median_spread(rates[name])
        unit = "msg/s" if name in MESSAGE_RATES else "tx/s"
        unit = "round trips/s" if name == SELECT_1 else unit
        figures.append(Figure(f"{name} {unit}", value, unit, spread=spread))
    for name in ran[:-1]:  # per message, in SELECT 1 round trips of the same round
        per_round = [rtt / rate for rate, rtt in zip(rates[name], rates[SELECT_1], strict=True)]
        value, spread = median_spread(per_round)
        figures.append(
            Figure(f"{name}: per message, in SELECT 1 round trips", value, "x", spread=spread)
        )

    def ratio(top: str, bottom: str, target: float | None) -> None:
        if not (rates[top] and rates[bottom]):
            return  # not run (--database-only)
        per_round = [a / b for a, b in zip(rates[top], rates[bottom], strict=True)]
        value, spread = median_spread(per_round)
        verdict = at_least(value, target) if target is not None else ("", None)
        figures.append(Figure(f"{top} / {bottom}", value, "x", verdict[0], verdict[1], spread))

    ratio(BATCH_HANDLER, PER_MESSAGE, 10.0)
    ratio(PB_EXECUTEMANY, PG_INSERT, 3.0)  # the batch path at the database
    ratio(PB_UNNEST, PG_INSERT, None)
    ratio(BATCH_HANDLER, PG_INSERT, 3.0)  # through RabbitMQ: bounded by the next line
    ratio(BROKER_ONLY, PG_INSERT, None)
    ratio(BATCH_HANDLER, PB_EXECUTEMANY, None)
    ratio(BATCH_HANDLER, PG_CLAIM, None)
    ratio(BATCH_HANDLER, BATCH_SINGLE, None)
    ratio(BATCH_SINGLE, PER_MESSAGE, None)
    ratio(BATCH_HANDLER, BROKER_ONLY, None)
    if samples[BATCH_HANDLER]:
        figures += batch_figures(samples[BATCH_HANDLER])
    rounds = list(range(1, options.rounds + 1))
    plots = []
    plot = plot_lines(
        out_dir / "s7_rates_by_round.png",
        "S7: one-row handler, messages (transactions) per second",
        "round",
        "per second",
        {name: (rounds, rates[name]) for name in ran},
    )
    if plot:
        plots.append(plot)
    return ScenarioReport(
        SCENARIO,
        TITLE,
        {
            "database": make_url(options.database_url).render_as_string(hide_password=True),
            "server_version": version,
            "messages": options.messages,
            "batch_messages": options.batch_messages,
            "rounds": options.rounds,
            "batch_size": options.batch_size,
            "prefetch": options.prefetch,
            "seconds": options.seconds,
            "handler": "one INSERT INTO bench_order per message",
            "rows_written": written,
            "one_batch_sends": sent,
            "round_trips_on_the_wire_per_batch": wire,
            "variants": ran,
        },
        figures,
        {"samples": samples, "rates": rates},
        plots,
    )


def batch_figures(samples: list[dict[str, Any]]) -> list[Figure]:
    """The worker's batch handler runs: acks per batch, messages per batch."""
    figures = []
    per_batch = [s["multiple_acks"] / s["batches"] for s in samples]
    figures.append(
        Figure(
            "batch handler: multiple acks / batches (1.0: every batch acked with one frame)",
            median_spread(per_batch)[0],
            "ratio",
            spread=median_spread(per_batch)[1],
        )
    )
    size = [s["messages"] / s["batches"] for s in samples]
    value, spread = median_spread(size)
    figures.append(Figure("batch handler: messages per batch", value, "", spread=spread))
    return figures


if __name__ == "__main__":
    sys.exit(scenario_main(sys.modules[__name__]))
