"""S5: retention beside live workers on PostgreSQL — the batched delete against dropping
whole partitions.

    .venv/bin/python benchmarks/s5_cleanup.py [--rows 10000000] [--days 30]
        [--batch-size N | --batch-ms 25] [--pause-ms 0] [--pause-percent 0]
        [--layouts batched,partitioned,bare]

For each layout, in a fresh schema:

* **batched**: the plain inbox table (``inbox.schema``);
* **partitioned**: the same table partitioned by message id (``inbox.partitioning``: one
  partition per day of UUIDv7 ids, ``_before``, ``_future``, ``_keys``),

and, with ``--layouts ...,bare``,

* **bare**: the plain table again, purged by the database's own ``DELETE ... WHERE
  processed_at < cutoff`` in one statement and one transaction — what the server does
  without any batching: the ceiling for the batched delete, not a way to run beside workers,

the table is filled on the server with ``--rows`` claims (``INSERT ... SELECT
generate_series`` in chunks) whose ``processed_at`` is spread evenly over twice the retention
window, so half of them are expired. Each id is UUIDv7-shaped: the 6-byte big-endian
millisecond of the row's time, then random bytes with the version (7) and variant bits. Rows
go in in time order, as live traffic writes them. The ``processed_at`` index is built after
the fill (the primary key is kept throughout: time-ordered keys append at its right edge),
then ``VACUUM ANALYZE`` and a ``CHECKPOINT``.

Then two worker threads call ``Inbox.process`` on new messages (``Message.new``: fresh
UUIDv7 ids) with a handler that inserts one row into a business table, and each call's
latency is recorded: first for ``--latency-seconds`` without any purge, then while
``inbox.cleanup(engine, days=--days, batch_size=--batch-size, batch_seconds=--batch-ms,
pause_seconds=--pause-ms, pause_ratio=--pause-percent / 100)`` runs (by default each
batch sized to take ``--batch-ms``;
``--batch-size`` fixes the rows per batch) — the batched delete on the plain table;
partition drops plus batched deletes of the rest on the partitioned one.
The purge runs in a process of its own (as ``inbox-cleanup`` does from cron), so it does not
compete with the workers for the GIL; it reports its progress through the
``inbox.retention`` log records.

Figures per layout: the purge's rate (expired rows removed / purge seconds), its longest
single transaction (``CleanupReport.longest_batch_seconds``: a delete batch, or a partition
drop with its lock wait), the median and p99 batch, and the workers' p99 latency during the
purge over p99 without it.
Plots: rows removed over time for both layouts, and the latency percentiles.
"""

from __future__ import annotations

import argparse
import datetime as dt
import logging
import multiprocessing
import os
import sys
import threading
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from common import (
    DEFAULT_DATABASE,
    Figure,
    ScenarioReport,
    at_least,
    at_most,
    fresh_schema,
    percentile,
    plot_lines,
    scenario_main,
    server_version,
)
from sqlalchemy import (
    BigInteger,
    Column,
    Engine,
    MetaData,
    String,
    Table,
    create_engine,
    insert,
    text,
)
from sqlalchemy.orm import Session, sessionmaker

from inbox import CleanupReport, Inbox, Message, cleanup
from inbox.partitioning import create_partitioned_table, list_partitions
from inbox.retention._purge import cutoff_for
from inbox.schema import inbox_message

SCENARIO = "S5"
TITLE = "cleanup: batched delete vs partition drop, claim latency during the purge"
QUICK: dict[str, Any] = {"rows": 200_000, "latency_seconds": 3.0}

HANDLER = "bench.apply"
FILLER = "bench.filled"
CHUNK = 1_000_000
WORKERS = 2
WARMUP_SECONDS = 1.0
PERCENTILES = (0.5, 0.9, 0.95, 0.99, 0.999)
TARGET_RATE = 300_000
TARGET_LONGEST_MS = 100
TARGET_P99_RATIO = 1.5
LAYOUTS = ("batched", "partitioned", "bare")

business = MetaData()
bench_effects = Table(
    "bench_effects",
    business,
    Column("id", BigInteger, primary_key=True, autoincrement=True),
    Column("ref", String(64), nullable=False),
)

FILL = text(
    """
    INSERT INTO inbox_message (message_id, handler, processed_at)
    SELECT set_byte(set_byte(raw, 6, (get_byte(raw, 6) & 15) | 112),
                    8, (get_byte(raw, 8) & 63) | 128),
           :handler, t
    FROM (
        SELECT t,
               substring(int8send(floor(extract(epoch FROM t) * 1000)::int8) FROM 3)
               || substring(uuid_send(gen_random_uuid()) FROM 7) AS raw
        FROM (
            SELECT CAST(:now AS timestamptz)
                   - make_interval(secs => :span * (1 - (g - 0.5) / :rows)) AS t
            FROM generate_series(CAST(:first AS int8), CAST(:last AS int8)) AS g
        ) AS times
    ) AS ids
    """
)


@dataclass
class Latencies:
    """Per-call latencies of the worker threads, with when each call started."""

    samples: list[tuple[float, float]] = field(default_factory=list)
    errors: list[BaseException] = field(default_factory=list)

    def between(self, start: float, end: float) -> list[float]:
        return [seconds for began, seconds in self.samples if start <= began <= end]


class Progress(logging.Handler):
    """Rows removed over time, from the purge's log records (``inbox.retention`` logs each
    batch, ``inbox.partitioning`` each dropped partition, with its rows as ``inbox_deleted``)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.removed = 0
        self.points: list[tuple[float, int]] = []
        self.batches: list[tuple[int, float]] = []  # (rows, seconds) of each delete batch

    def emit(self, record: logging.LogRecord) -> None:
        deleted = getattr(record, "inbox_deleted", None)
        if isinstance(deleted, int):
            self.removed += deleted
            self.points.append((time.monotonic(), self.removed))
            if record.name == "inbox.retention" and isinstance(record.args, tuple):
                self.batches.append((deleted, float(record.args[-1]) / 1000))


def purge_process(
    url: str,
    days: int,
    pipe: Connection,
    *,
    batch_size: int | None,
    batch_ms: float,
    pause_ms: float,
    pause_percent: int = 0,
    bare: bool,
) -> None:
    """The purge, in a process of its own as ``inbox-cleanup`` runs from cron: connect, say
    ready, wait for the go, run ``cleanup`` (or the bare ``DELETE``) and send back its
    report and progress."""
    engine = create_engine(url, pool_size=1, max_overflow=0)
    with engine.connect():
        pass
    progress = Progress()
    logger = logging.getLogger("inbox")  # inbox.retention's batches, inbox.partitioning's drops
    logger.addHandler(progress)
    logger.setLevel(logging.DEBUG)
    pipe.send("ready")
    pipe.recv()
    started = time.monotonic()
    if bare:
        report = bare_delete(engine, days)
    else:
        report = cleanup(
            engine,
            days=days,
            batch_size=batch_size,
            batch_seconds=batch_ms / 1000,
            pause_seconds=pause_ms / 1000,
            pause_ratio=pause_percent / 100,
        )
    ended = time.monotonic()
    engine.dispose()
    pipe.send((report, started, ended, progress.points, progress.batches))


def bare_delete(engine: Engine, days: int) -> CleanupReport:
    """The database's own delete of every expired claim: one statement, one transaction."""
    cutoff = cutoff_for(days)
    began = time.perf_counter()
    with engine.begin() as connection:
        deleted = connection.execute(
            text("DELETE FROM inbox_message WHERE processed_at < :cutoff"), {"cutoff": cutoff}
        ).rowcount
    seconds = time.perf_counter() - began
    return CleanupReport(deleted, 1, seconds, cutoff, False, seconds)


@dataclass
class Layout:
    """What one layout measured."""

    name: str
    fill_seconds: float
    index_seconds: float
    vacuum_seconds: float
    expired: int
    partitions: int
    report: CleanupReport
    timeline: list[tuple[float, int]]
    batch_times: list[tuple[int, float]]
    without: list[float]
    during: list[float]
    worker_errors: int
    load_average: dict[str, tuple[float, float, float]]

    def percentiles(self, samples: list[float]) -> dict[str, float]:
        return {f"p{q * 100:g}": percentile(samples, q) * 1000 for q in PERCENTILES}

    def batch_percentiles(self) -> dict[str, float]:
        seconds = [s for _, s in self.batch_times]
        return {f"p{q * 100:g}": percentile(seconds, q) * 1000 for q in (0.5, 0.99, 1.0)}

    def to_json(self) -> dict[str, Any]:
        return {
            "fill_seconds": self.fill_seconds,
            "index_seconds": self.index_seconds,
            "vacuum_seconds": self.vacuum_seconds,
            "expired_rows": self.expired,
            "partitions": self.partitions,
            "purge": {
                "deleted": self.report.deleted,
                "batches": self.report.batches,
                "seconds": self.report.seconds,
                "rows_per_second": self.rate,
                "longest_batch_ms": self.report.longest_batch_seconds * 1000,
                "batch_ms": self.batch_percentiles(),
                "batch_rows": {
                    "median": percentile([n for n, _ in self.batch_times], 0.5),
                    "max": max((n for n, _ in self.batch_times), default=0),
                },
                "partitions_dropped": list(self.report.partitions_dropped),
            },
            "latency_ms": {
                "without": self.percentiles(self.without),
                "during": self.percentiles(self.during),
                "samples_without": len(self.without),
                "samples_during": len(self.during),
            },
            "p99_ratio": self.p99_ratio,
            "timeline": self.timeline,
            "batches": [(rows, round(seconds * 1000, 2)) for rows, seconds in self.batch_times],
            "worker_errors": self.worker_errors,
            "load_average": self.load_average,
        }

    @property
    def rate(self) -> float:
        return self.report.deleted / self.report.seconds if self.report.seconds else 0.0

    @property
    def p99_ratio(self) -> float:
        without = percentile(self.without, 0.99)
        return percentile(self.during, 0.99) / without if without else 0.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """S5's options."""
    parser.add_argument("--database-url", default=DEFAULT_DATABASE, help="PostgreSQL URL")
    parser.add_argument("--rows", type=int, default=10_000_000, help="claims in the table")
    parser.add_argument("--days", type=int, default=30, help="retention window in days")
    parser.add_argument(
        "--batch-size",
        type=int,
        default=None,
        help="rows per delete batch (default: sized by --batch-ms)",
    )
    parser.add_argument(
        "--batch-ms",
        type=float,
        default=25.0,
        help="without --batch-size: the time budget of each delete batch (default: 25)",
    )
    parser.add_argument(
        "--pause-ms",
        type=float,
        default=0.0,
        help="sleep between two delete batches (inbox-cleanup --pause-ms; default: 0)",
    )
    parser.add_argument(
        "--pause-percent",
        type=int,
        default=0,
        help="after each delete batch, sleep this share of its time (inbox-cleanup "
        "--pause-percent; default: 0)",
    )
    parser.add_argument(
        "--layouts",
        default="batched,partitioned",
        help=f"which layouts to measure, comma-separated, of {','.join(LAYOUTS)}",
    )
    parser.add_argument(
        "--latency-seconds",
        type=float,
        default=10.0,
        help="how long the claim latency is measured without a purge",
    )


def fill(engine: Engine, rows: int, days: int, now: dt.datetime) -> tuple[float, float, float]:
    """Fill the inbox table as the module docstring says; return (fill, index, vacuum) s."""
    index = f"ix_{inbox_message.name}_processed_at"
    with engine.begin() as connection:
        connection.execute(text(f"DROP INDEX {index}"))
    began = time.perf_counter()
    span = 2 * days * 86_400
    for first in range(1, rows + 1, CHUNK):
        last = min(rows, first + CHUNK - 1)
        with engine.begin() as connection:
            connection.execute(
                FILL,
                {
                    "handler": FILLER,
                    "now": now,
                    "span": span,
                    "rows": rows,
                    "first": first,
                    "last": last,
                },
            )
        print(f"    filled {last:,} / {rows:,} ({time.perf_counter() - began:.0f} s)", flush=True)
    filled = time.perf_counter() - began
    began = time.perf_counter()
    with engine.begin() as connection:
        connection.execute(text(f"CREATE INDEX {index} ON inbox_message (processed_at)"))
    indexed = time.perf_counter() - began
    began = time.perf_counter()
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
        connection.execute(text("VACUUM ANALYZE inbox_message"))  # and its partitions
        connection.execute(text("CHECKPOINT"))
    return filled, indexed, time.perf_counter() - began


def run_workers(
    engine: Engine, stop: threading.Event, latencies: Latencies
) -> list[threading.Thread]:
    """Start the worker threads: each processes new messages until ``stop`` is set."""
    inbox = Inbox(sessionmaker(engine))

    @inbox.handler("bench", name=HANDLER)
    def apply(message: Message, session: Session) -> None:
        session.execute(insert(bench_effects).values(ref=message.body["ref"]))

    def work(number: int) -> None:
        sequence = 0
        try:
            while not stop.is_set():
                sequence += 1
                message = Message.new("bench", {"ref": f"{number}-{sequence}"})
                began = time.monotonic()
                inbox.process(message)
                latencies.samples.append((began, time.monotonic() - began))
        except BaseException as exc:
            latencies.errors.append(exc)

    threads = [threading.Thread(target=work, args=(n,), daemon=True) for n in range(WORKERS)]
    for thread in threads:
        thread.start()
    return threads


def measure(name: str, engine: Engine, options: argparse.Namespace, now: dt.datetime) -> Layout:
    """Fill, then measure the claim latency without and during the purge."""
    print(f"  {name}: filling {options.rows:,} rows", flush=True)
    filled, indexed, vacuumed = fill(engine, options.rows, options.days, now)
    cutoff = dt.datetime.now(dt.UTC) - dt.timedelta(days=options.days)
    with engine.connect() as connection:
        expired = connection.execute(
            text("SELECT count(*) FROM inbox_message WHERE processed_at < :cutoff"),
            {"cutoff": cutoff},
        ).scalar_one()
    print(
        f"  {name}: filled in {filled:.0f} s, index {indexed:.0f} s, vacuum {vacuumed:.0f} s; "
        f"{expired:,} expired",
        flush=True,
    )

    workers_engine = create_engine(engine.url, pool_size=WORKERS, max_overflow=0)
    url = engine.url.render_as_string(hide_password=False)
    context = multiprocessing.get_context("spawn")
    pipe, child_pipe = context.Pipe()
    purger = context.Process(
        target=purge_process,
        args=(url, options.days, child_pipe),
        kwargs={
            "batch_size": options.batch_size,
            "batch_ms": options.batch_ms,
            "pause_ms": options.pause_ms,
            "pause_percent": options.pause_percent,
            "bare": name == "bare",
        },
    )
    purger.start()
    latencies = Latencies()
    stop = threading.Event()
    try:
        if pipe.recv() != "ready":
            raise RuntimeError("the purge process did not start")
        threads = run_workers(workers_engine, stop, latencies)
        time.sleep(WARMUP_SECONDS)
        load = {"before_baseline": os.getloadavg()}
        baseline_start = time.monotonic()
        time.sleep(options.latency_seconds)
        baseline_end = time.monotonic()
        load["before_purge"] = os.getloadavg()
        print(f"  {name}: purging", flush=True)
        pipe.send("go")
        report, purge_started, purge_ended, points, batch_times = pipe.recv()
        load["after_purge"] = os.getloadavg()
        stop.set()
        for thread in threads:
            thread.join(60)
    finally:
        stop.set()
        purger.join(60)
        workers_engine.dispose()
    layout = Layout(
        name=name,
        fill_seconds=filled,
        index_seconds=indexed,
        vacuum_seconds=vacuumed,
        expired=expired,
        partitions=len(list_partitions(engine)),
        report=report,
        timeline=[(0.0, 0)] + [(t - purge_started, n) for t, n in points],
        batch_times=batch_times,
        without=latencies.between(baseline_start, baseline_end),
        during=latencies.between(purge_started, purge_ended),
        worker_errors=len(latencies.errors),
        load_average=load,
    )
    if latencies.errors:
        print(f"  {name}: {len(latencies.errors)} worker errors, first: {latencies.errors[0]!r}")
    print(
        f"  {name}: removed {report.deleted:,} rows in {report.seconds:.2f} s "
        f"({layout.rate:,.0f} rows/s), {report.batches} batches, "
        f"{len(report.partitions_dropped)} partitions dropped, "
        f"longest {report.longest_batch_seconds * 1000:.1f} ms "
        f"(batches: median {layout.batch_percentiles()['p50']:.1f} ms, "
        f"p99 {layout.batch_percentiles()['p99']:.1f} ms, median "
        f"{percentile([n for n, _ in batch_times], 0.5):,.0f} rows); p99 "
        f"{percentile(layout.without, 0.99) * 1000:.1f} ms without, "
        f"{percentile(layout.during, 0.99) * 1000:.1f} ms during "
        f"({len(layout.during)} calls)",
        flush=True,
    )
    return layout


def run(options: argparse.Namespace, out_dir: Path) -> ScenarioReport:
    """Measure the layouts asked for; save the plots into ``out_dir``."""
    print(f"{SCENARIO}: {TITLE}")
    wanted = [name.strip() for name in options.layouts.split(",") if name.strip()]
    unknown = set(wanted) - set(LAYOUTS)
    if unknown or not wanted:
        raise SystemExit(f"--layouts takes some of {', '.join(LAYOUTS)}, got {options.layouts!r}")
    now = dt.datetime.now(dt.UTC)
    layouts: list[Layout] = []
    version = ""
    for name in wanted:
        if name == "partitioned":
            with fresh_schema(options.database_url, business, inbox=False) as engine:
                version = server_version(engine)
                with engine.begin() as connection:
                    create_partitioned_table(
                        connection,
                        start=(now - dt.timedelta(days=2 * options.days + 1)).date(),
                        days_ahead=7,
                    )
                print(f"  partitioned: {len(list_partitions(engine))} partitions", flush=True)
                layouts.append(measure(name, engine, options, now))
        else:
            with fresh_schema(options.database_url, business) as engine:
                version = server_version(engine)
                layouts.append(measure(name, engine, options, now))

    figures: list[Figure] = []
    for layout in layouts:
        if layout.name == "bare":
            figures.append(Figure("bare DELETE (one statement): rate", layout.rate, "rows/s"))
            seconds = layout.report.longest_batch_seconds * 1000
            figures.append(Figure("bare DELETE: its one transaction", seconds, "ms"))
            figures.append(Figure("bare DELETE: p99 during / without", layout.p99_ratio, "x"))
            continue
        label = "purge rate" if layout.name == "batched" else "purge rate (rows gone / s)"
        figures.append(
            Figure(
                f"{layout.name}: {label}",
                layout.rate,
                "rows/s",
                *at_least(layout.rate, TARGET_RATE),
            )
        )
        longest = layout.report.longest_batch_seconds * 1000
        step = "longest batch" if layout.name == "batched" else "longest step (drop or batch)"
        figures.append(
            Figure(f"{layout.name}: {step}", longest, "ms", *at_most(longest, TARGET_LONGEST_MS))
        )
        batch_ms = layout.batch_percentiles()
        figures.append(Figure(f"{layout.name}: delete batch median", batch_ms["p50"], "ms"))
        figures.append(Figure(f"{layout.name}: delete batch p99", batch_ms["p99"], "ms"))
        figures.append(
            Figure(
                f"{layout.name}: p99 during / without purge",
                layout.p99_ratio,
                "x",
                *at_most(layout.p99_ratio, TARGET_P99_RATIO),
            )
        )
        figures.append(
            Figure(
                f"{layout.name}: claim p99 without purge",
                percentile(layout.without, 0.99) * 1000,
                "ms",
            )
        )
        figures.append(
            Figure(
                f"{layout.name}: claim p99 during purge",
                percentile(layout.during, 0.99) * 1000,
                "ms",
            )
        )

    plots = []
    removed = plot_lines(
        out_dir / "s5_rows_removed.png",
        f"S5: rows removed during the purge ({options.rows:,} rows, half expired)",
        "seconds since the purge started",
        "rows removed",
        {
            f"{layout.name} ({layout.rate:,.0f} rows/s)": (
                [t for t, _ in layout.timeline],
                [n for _, n in layout.timeline],
            )
            for layout in layouts
        },
    )
    latency = plot_lines(
        out_dir / "s5_latency.png",
        f"S5: claim latency of {WORKERS} workers without and during the purge",
        "percentile",
        "ms",
        {
            f"{layout.name}, {phase}": (
                [q * 100 for q in PERCENTILES],
                [percentile(samples, q) * 1000 for q in PERCENTILES],
            )
            for layout in layouts
            for phase, samples in (("without", layout.without), ("during", layout.during))
        },
    )
    plots += [p for p in (removed, latency) if p is not None]
    return ScenarioReport(
        scenario=SCENARIO,
        title=TITLE,
        parameters={
            "rows": options.rows,
            "days": options.days,
            "batch_size": options.batch_size,
            "batch_ms": options.batch_ms,
            "pause_ms": options.pause_ms,
            "pause_percent": options.pause_percent,
            "layouts": wanted,
            "latency_seconds": options.latency_seconds,
            "workers": WORKERS,
            "postgresql": version,
        },
        figures=figures,
        data={layout.name: layout.to_json() for layout in layouts},
        plots=plots,
    )


if __name__ == "__main__":
    sys.exit(scenario_main(sys.modules[__name__]))
