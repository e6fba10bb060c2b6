"""S3: the database's own ceiling: pgbench running the inbox's statements, beside the library.

    .venv/bin/python benchmarks/s3_ceiling.py [--seconds 10 | --transactions N]
        [--messages 10000] [--rounds 5]

In a fresh PostgreSQL schema (the inbox table and a ``bench_order`` table), alternating round
by round which goes first:

* pgbench claim + insert: one client, ``-M prepared``, the transaction ``inbox.process`` sends
  for a one-row handler: BEGIN; the claim ``INSERT INTO inbox_message ... ON CONFLICT
  (message_id, handler) DO NOTHING`` with a fresh UUIDv7-like key built in SQL (6 bytes of
  ``clock_timestamp()`` in ms, then ``gen_random_uuid()``'s random bytes with version 7);
  the business ``INSERT INTO bench_order``; COMMIT;
* pgbench insert only: BEGIN; the business insert; COMMIT;
* inbox: ``inbox.process`` of ``--messages`` messages whose handler does the same insert,
  one message at a time, from Python (psycopg 3 through SQLAlchemy).

pgbench is what the server and the network allow one connection; inbox / pgbench is how much
of that the library keeps. pgbench's output and the latency percentiles of every run (from
its per-transaction log) are kept in the JSON.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from common import (
    DEFAULT_DATABASE,
    Figure,
    ScenarioReport,
    alternate,
    at_least,
    fresh_schema,
    median_spread,
    percentile,
    plot_lines,
    scenario_main,
    server_version,
)
from s1_overhead import INSERT_ORDER, business
from sqlalchemy import Engine
from sqlalchemy.engine import URL, make_url
from sqlalchemy.orm import Session, sessionmaker

from inbox import Inbox, Message, Outcome

SCENARIO = "S3"
TITLE = "the database's ceiling: pgbench claim + insert vs inbox.process"
QUICK: dict[str, Any] = {"seconds": 2, "messages": 1000, "rounds": 2}

HANDLER = "bench.one_statement"
VARIANTS = ("pgbench claim + insert", "pgbench insert only", "inbox")

# A UUIDv7-like key per transaction: bytes 0-5 the Unix time in ms (big-endian), byte 6
# version 7 in its high nibble, the rest from gen_random_uuid() (variant bits in byte 8).
_KEY = (
    "set_byte(overlay(k.r PLACING substring(int8send("
    "(extract(epoch FROM clock_timestamp()) * 1000)::int8) FROM 3 FOR 6) FROM 1 FOR 6), "
    "6, (get_byte(k.r, 6) & 15) | 112)"
)
SCRIPTS = {
    "pgbench claim + insert": (
        "\\set ref random(1, 1000000000)\n"
        "BEGIN;\n"
        "INSERT INTO inbox_message (message_id, handler, processed_at) "
        f"SELECT {_KEY}, '{HANDLER}', now() "
        "FROM (SELECT uuid_send(gen_random_uuid()) AS r OFFSET 0) AS k "
        "ON CONFLICT (message_id, handler) DO NOTHING;\n"
        "INSERT INTO bench_order (ref, amount) VALUES (:ref, 7);\n"
        "COMMIT;\n"
    ),
    "pgbench insert only": (
        "\\set ref random(1, 1000000000)\n"
        "BEGIN;\n"
        "INSERT INTO bench_order (ref, amount) VALUES (:ref, 7);\n"
        "COMMIT;\n"
    ),
}
_TPS = re.compile(r"^tps = ([0-9.]+)", re.MULTILINE)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """S3's options."""
    parser.add_argument("--database-url", default=DEFAULT_DATABASE)
    parser.add_argument("--seconds", type=float, default=10.0, help="pgbench -T per run")
    parser.add_argument(
        "--transactions", type=int, default=None, help="pgbench -t per run (instead of -T)"
    )
    parser.add_argument("--messages", type=int, default=10_000, help="inbox messages per round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--pgbench", default="pgbench", help="the pgbench binary")


def one_statement(message: Message, session: Session) -> None:
    """Insert one row: the same business insert as the pgbench scripts."""
    session.execute(INSERT_ORDER, {"ref": message.body["ref"], "amount": 7})


def latency_summary(seconds: list[float]) -> dict[str, float]:
    """Percentiles of per-transaction latencies, in microseconds."""
    return {
        "count": len(seconds),
        "mean_us": sum(seconds) / len(seconds) * 1e6 if seconds else 0.0,
        "p50_us": percentile(seconds, 0.50) * 1e6,
        "p90_us": percentile(seconds, 0.90) * 1e6,
        "p99_us": percentile(seconds, 0.99) * 1e6,
        "max_us": max(seconds, default=0.0) * 1e6,
    }


class PgBench:
    """Runs pgbench scripts against one schema of the benchmark database."""

    def __init__(self, options: argparse.Namespace, engine: Engine, work: Path) -> None:
        url: URL = engine.url
        self.binary = options.pgbench
        self.work = work
        self.base = [
            "-h",
            url.host or "127.0.0.1",
            "-p",
            str(url.port or 5432),
            "-U",
            url.username or "postgres",
            "-n",  # no vacuum of pgbench's own tables: there are none
            "-c",
            "1",
            "-j",
            "1",
            "-M",
            "prepared",
            "-r",  # per-statement latencies
        ]
        self.database = url.database or "postgres"
        self.env = dict(os.environ)
        # The schema of fresh_schema(), e.g. "-csearch_path=bench_0123abcd".
        self.env["PGOPTIONS"] = str(url.query["options"])
        if url.password:
            self.env["PGPASSWORD"] = str(url.password)
        self.runs = 0
        for name, script in SCRIPTS.items():
            (work / _file_name(name)).write_text(script)

    def run(self, name: str, length: list[str]) -> dict[str, Any]:
        """Run the script of ``name`` once; its tps, latencies and output."""
        self.runs += 1
        prefix = f"run{self.runs}"
        command = [
            self.binary,
            *self.base,
            *length,
            "-f",
            str(self.work / _file_name(name)),
            "-l",
            f"--log-prefix={prefix}",
            self.database,
        ]
        done = subprocess.run(
            command, cwd=self.work, env=self.env, capture_output=True, text=True, check=False
        )
        if done.returncode != 0:
            raise RuntimeError(f"pgbench failed ({done.returncode}): {done.stderr.strip()}")
        match = _TPS.search(done.stdout)
        if match is None:
            raise RuntimeError(f"no tps in pgbench's output:\n{done.stdout}")
        latencies: list[float] = []
        for log in sorted(self.work.glob(f"{prefix}.*")):
            for line in log.read_text().splitlines():
                latencies.append(int(line.split()[2]) / 1e6)  # column 3: latency in us
            log.unlink()
        return {
            "rate": float(match.group(1)),
            "latency": latency_summary(latencies),
            "output": done.stdout,
        }


def _file_name(name: str) -> str:
    return re.sub(r"\W+", "_", name) + ".sql"


def through_inbox(box: Inbox, messages: int, first_ref: int) -> dict[str, Any]:
    """``inbox.process`` of ``messages`` new messages; the rate and latencies."""
    batch = [Message.new("bench", {"ref": first_ref + i}) for i in range(messages)]
    latencies = []
    clock = time.perf_counter
    started = clock()
    for message in batch:
        before = clock()
        if box.process(message).outcome is not Outcome.PROCESSED:
            raise AssertionError(f"{message.id}: not processed")
        latencies.append(clock() - before)
    elapsed = clock() - started
    return {"rate": messages / elapsed, "latency": latency_summary(latencies)}


def run(options: argparse.Namespace, out_dir: Path) -> ScenarioReport:
    """pgbench's two scripts and the inbox, alternated, ``--rounds`` times."""
    if options.transactions is not None:
        length = ["-t", str(options.transactions)]
    else:
        length = ["-T", str(max(1, round(options.seconds)))]
    samples: dict[str, list[dict[str, Any]]] = {name: [] for name in VARIANTS}
    with (
        fresh_schema(options.database_url, business) as engine,
        tempfile.TemporaryDirectory(prefix="s3-pgbench-") as work,
    ):
        version = server_version(engine)
        box = Inbox(sessionmaker(engine))
        box.handler("bench", name=HANDLER)(one_statement)
        bench = PgBench(options, engine, Path(work))
        refs = iter(range(0, 10**15, 10**7))
        steps: dict[str, Callable[[], dict[str, Any]]] = {
            "pgbench claim + insert": lambda: bench.run("pgbench claim + insert", length),
            "pgbench insert only": lambda: bench.run("pgbench insert only", length),
            "inbox": lambda: through_inbox(box, options.messages, next(refs)),
        }
        # Warm up: the pool, the statement caches, the server's plans and buffers.
        bench.run("pgbench claim + insert", ["-T", "2"])
        bench.run("pgbench insert only", ["-T", "2"])
        through_inbox(box, min(1000, options.messages), next(refs))
        for round_number in range(options.rounds):
            for name in alternate(round_number, VARIANTS):
                sample = steps[name]()
                samples[name].append(sample)
                latency = sample["latency"]
                print(
                    f"  round {round_number + 1}: {name:<21} {sample['rate']:8.0f} /s  "
                    f"p50 {latency['p50_us']:6.0f} us  p99 {latency['p99_us']:7.0f} us"
                )
    return report(options, samples, version, out_dir)


def report(
    options: argparse.Namespace,
    samples: dict[str, list[dict[str, Any]]],
    version: str,
    out_dir: Path,
) -> ScenarioReport:
    """Figures, the table printed to stdout, the plot."""
    rates = {name: [s["rate"] for s in samples[name]] for name in VARIANTS}
    medians = {name: median_spread(rates[name]) for name in VARIANTS}
    claim = "pgbench claim + insert"
    per_round = [i / p for i, p in zip(rates["inbox"], rates[claim], strict=True)]
    ratio = medians["inbox"][0] / medians[claim][0]
    claim_cost = [
        1e6 / c - 1e6 / o for c, o in zip(rates[claim], rates["pgbench insert only"], strict=True)
    ]
    print(f"\nS3 the database's ceiling, 1 connection, median of {options.rounds} rounds")
    print(f"{'variant':<22} {'per s':>8} {'min..max':>15} {'p50 us':>8} {'p99 us':>8}")
    for name in VARIANTS:
        median, (low, high) = medians[name]
        p50 = median_spread([s["latency"]["p50_us"] for s in samples[name]])[0]
        p99 = median_spread([s["latency"]["p99_us"] for s in samples[name]])[0]
        print(f"{name:<22} {median:8.0f} {low:7.0f}..{high:<6.0f} {p50:8.0f} {p99:8.0f}")
    print(f"inbox / pgbench claim + insert: {ratio:.3f} (per round {min(per_round):.3f}..", end="")
    print(f"{max(per_round):.3f})   aim >= 0.5")
    print(f"the claim statement in pgbench: {median_spread(claim_cost)[0]:.0f} us per transaction")
    target, met = at_least(ratio, 0.5)
    figures = [
        Figure("pgbench claim + insert tx/s", medians[claim][0], "tx/s", spread=medians[claim][1]),
        Figure(
            "pgbench insert only tx/s",
            medians["pgbench insert only"][0],
            "tx/s",
            spread=medians["pgbench insert only"][1],
        ),
        Figure("inbox.process msg/s", medians["inbox"][0], "msg/s", spread=medians["inbox"][1]),
        Figure(
            "inbox / pgbench claim + insert",
            ratio,
            "ratio",
            target,
            met,
            (min(per_round), max(per_round)),
        ),
        Figure(
            "claim's cost in pgbench",
            median_spread(claim_cost)[0],
            "us/tx",
            spread=median_spread(claim_cost)[1],
        ),
    ]
    rounds = list(range(1, options.rounds + 1))
    plots = []
    plot = plot_lines(
        out_dir / "s3_rates_by_round.png",
        "S3: one connection, pgbench vs inbox.process",
        "round",
        "transactions (messages) per second",
        {name: (rounds, rates[name]) for name in VARIANTS},
    )
    if plot:
        plots.append(plot)
    return ScenarioReport(
        SCENARIO,
        TITLE,
        {
            "database": make_url(options.database_url).render_as_string(hide_password=True),
            "server_version": version,
            "seconds": options.seconds if options.transactions is None else None,
            "transactions": options.transactions,
            "messages": options.messages,
            "rounds": options.rounds,
            "scripts": SCRIPTS,
        },
        figures,
        {
            "samples": samples,
            "rates": rates,
            "inbox_over_pgbench_per_round": per_round,
            "claim_cost_us_per_round": claim_cost,
        },
        plots,
    )


if __name__ == "__main__":
    sys.exit(scenario_main(sys.modules[__name__]))
