"""Every benchmark in one command, then the results page.

    .venv/bin/python benchmarks/run_all.py --quick           # every benchmark, small (~20 min)
    .venv/bin/python benchmarks/run_all.py                   # full sizes (hours: S4, S5, S6)
    .venv/bin/python benchmarks/run_all.py --quick --only S7 effect_cost
    .venv/bin/python benchmarks/run_all.py --no-page         # results only, README untouched

Each benchmark runs in a process of its own (a crash or a hang in one costs only its own
entry; OpenTelemetry's and asyncio's global state stay separate), one after another, into
``benchmarks/results/all-<UTC time>/``: ``<name>.json`` (its report), ``<name>.log`` (what it
printed), ``machine.json`` (CPU, cores, RAM, load before and after, Python, packages, server
versions and settings) and ``index.json`` (what ran, how long, exit codes). Then
:mod:`results_page` regenerates the results section of ``benchmarks/README.md`` and the
plots from that directory (``results_page.py DIR`` does it again without re-running).

A file in ``benchmarks/`` that is neither listed in :data:`BENCHMARKS` nor a known helper is
reported as not run, so a new benchmark cannot be left off the page silently.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common import RESULTS, stamp
from machine import machine_info
from results_page import publish

HERE = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Benchmark:
    """One benchmark script: its arguments in quick mode and in full mode (``{json}`` is
    replaced by the report's path; a script without ``--json`` gets ``json_option=False``
    and only its log is kept)."""

    name: str
    script: str
    quick: tuple[str, ...]
    full: tuple[str, ...] = ()
    json_option: bool = True


BENCHMARKS: tuple[Benchmark, ...] = (
    Benchmark("S1", "s1_overhead.py", ("--quick",)),
    Benchmark("S2", "s2_end_to_end.py", ("--quick",)),
    Benchmark("S3", "s3_ceiling.py", ("--quick",)),
    Benchmark("S4", "s4_growth.py", ("--quick",)),
    Benchmark("S5", "s5_cleanup.py", ("--quick",)),
    Benchmark("S6", "s6_memory.py", ("--quick",)),
    Benchmark("S7", "s7_batch_handler.py", ("--quick",)),
    Benchmark("A1", "aio_overhead.py", ("--quick",)),
    Benchmark("A2", "aio_throughput.py", ("--quick",)),
    Benchmark("TENANTS", "tenant_routing.py", ("--quick",)),
    Benchmark("MARIADB_MULTI", "mariadb_multistatement.py", ("--quick",)),
    Benchmark("ROUND_TRIPS", "round_trips.py", ("--quick",)),
    Benchmark("FLOOR", "floor.py", ("--messages", "300", "--rounds", "3")),
    Benchmark("RELAY", "outbox_relay.py", ("--quick",)),
    Benchmark("effect_cost", "effect_cost.py", ("--messages", "100", "--rounds", "3")),
    Benchmark("outbox_publish", "outbox_publish.py", ("--messages", "200", "--rounds", "3")),
    Benchmark(
        "telemetry_overhead", "telemetry_overhead.py", ("--messages", "300", "--rounds", "3")
    ),
    Benchmark(
        "middleware_overhead",
        "middleware_overhead.py",
        ("--messages", "500", "--rounds", "3"),
        json_option=False,
    ),
)
HELPERS = {
    "common.py",
    "suite.py",
    "run_all.py",
    "results_page.py",
    "machine.py",
    "aio_profile.py",  # sums a profile for A1/A2 --profile
    "s6_app.py",  # the application S6's worker process runs
    "s7_database.py",  # S7's database-side figures; s7_batch_handler.py runs them
    # S1 against other checkouts of the repository (git worktrees): run by hand with their
    # paths, as benchmarks/README.md shows; its table goes there.
    "s1_versions.py",
    # Celery: real `celery worker` processes on RabbitMQ and Redis, run by hand as
    # benchmarks/README.md and docs/celery.md show; their tables go there.
    "celery_throughput.py",
    "celery_soak.py",
}


def unlisted() -> list[str]:
    """Scripts in benchmarks/ that this runner does not know."""
    known = {b.script for b in BENCHMARKS} | HELPERS
    return sorted(p.name for p in HERE.glob("*.py") if p.name not in known)


def run_one(benchmark: Benchmark, quick: bool, out_dir: Path, timeout: float) -> dict[str, Any]:
    """Run ``benchmark`` in its own process; what happened."""
    report = out_dir / f"{benchmark.name}.json"
    log = out_dir / f"{benchmark.name}.log"
    arguments = list(benchmark.quick if quick else benchmark.full)
    if benchmark.json_option:
        arguments += ["--json", str(report)]
    command = [sys.executable, str(HERE / benchmark.script), *arguments]
    shown = [a.replace(f"{HERE.parent}/", "") for a in arguments]  # paths from the repository
    print(f"=== {benchmark.name}: {' '.join(command[1:])}", flush=True)
    started = time.monotonic()
    with log.open("w") as output:
        try:
            done = subprocess.run(
                command,
                cwd=HERE,
                stdout=output,
                stderr=subprocess.STDOUT,
                timeout=timeout,
                check=False,
            )
            code: int | None = done.returncode
        except subprocess.TimeoutExpired:
            code = None
    seconds = time.monotonic() - started
    status = "ok" if code == 0 else ("timed out" if code is None else f"exit {code}")
    print(f"    {status} in {seconds:.0f} s", flush=True)
    return {
        "name": benchmark.name,
        "script": benchmark.script,
        "command": " ".join([".venv/bin/python", f"benchmarks/{benchmark.script}", *shown]),
        "status": status,
        "seconds": round(seconds, 1),
        "report": report.name if report.exists() else None,
        "log": log.name,
    }


def main(argv: list[str] | None = None) -> int:
    """Run the benchmarks, write the index and the machine, regenerate the page."""
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes for every benchmark")
    parser.add_argument("--only", nargs="+", metavar="NAME", help="some benchmarks, by name")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds per benchmark")
    parser.add_argument("--no-page", action="store_true", help="do not touch the README")
    options = parser.parse_args(argv)
    names = {b.name for b in BENCHMARKS}
    if options.only and not set(options.only) <= names:
        parser.error(
            f"unknown benchmark(s) {sorted(set(options.only) - names)}; known: {sorted(names)}"
        )
    chosen = [b for b in BENCHMARKS if not options.only or b.name in options.only]
    out_dir = RESULTS / f"all-{stamp()}"
    out_dir.mkdir(parents=True)
    before = machine_info()
    started = time.time()
    ran = [run_one(b, options.quick, out_dir, options.timeout) for b in chosen]
    after = machine_info()
    index = {
        "command": " ".join([".venv/bin/python", "benchmarks/run_all.py", *(argv or sys.argv[1:])]),
        "quick": options.quick,
        "started": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(started)),
        "minutes": round((time.time() - started) / 60, 1),
        "benchmarks": ran,
        "not_run": unlisted(),
    }
    before["load_average_after"] = after["load_average"]
    (out_dir / "machine.json").write_text(json.dumps(before, indent=2))
    (out_dir / "index.json").write_text(json.dumps(index, indent=2))
    print(f"\nresults: {out_dir}")
    if not options.no_page:
        publish(out_dir)
    failed = [r["name"] for r in ran if r["status"] != "ok"]
    if failed:
        print(f"failed: {', '.join(failed)} (see their .log)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
