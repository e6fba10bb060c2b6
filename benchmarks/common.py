"""What every benchmark scenario shares: fresh schemas, repeated A/B sampling, the figure
record that the suite prints as one table, JSON reports and plots.

A scenario module (``s1_overhead.py`` ... ``s6_memory.py``) exposes

* ``SCENARIO``: its id ("S1") and ``TITLE``;
* ``add_arguments(parser)``: its own options (with defaults good for the full run);
* ``QUICK``: option overrides for a smoke run (``suite.py --quick``);
* ``run(options, out_dir) -> ScenarioReport``: measure, save plots into ``out_dir``.

and a ``main()`` that runs it alone through :func:`scenario_main`.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any, Protocol

from sqlalchemy import Engine, MetaData, create_engine, text
from sqlalchemy.engine import make_url

from inbox.schema import metadata as inbox_metadata

DEFAULT_DATABASE = os.environ.get(
    "INBOX_BENCH_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)
DEFAULT_MARIADB = os.environ.get(
    "INBOX_BENCH_MARIADB_URL", "mysql+pymysql://root@127.0.0.1:3306/test"
)
DEFAULT_BROKER = os.environ.get("INBOX_BENCH_BROKER", "amqp://guest:guest@127.0.0.1:5672//")
RESULTS = Path(__file__).resolve().parent / "results"
PACKAGES = ("inbox", "SQLAlchemy", "psycopg", "PyMySQL", "kombu", "amqp", "uuid6")


@dataclass
class Figure:
    """One headline number of a scenario, as the suite's table shows it."""

    name: str
    value: float
    unit: str = ""
    target: str = ""
    """Human-readable target, e.g. ">= 0.85"; empty when the figure is only reported."""
    met: bool | None = None
    """Whether the target was met; None when there is no target."""
    spread: tuple[float, float] | None = None
    """(min, max) over the repeats, when the figure is a median."""


@dataclass
class ScenarioReport:
    """What a scenario measured: headline figures, every raw sample, plots it saved."""

    scenario: str
    title: str
    parameters: dict[str, Any]
    figures: list[Figure]
    data: dict[str, Any] = field(default_factory=dict)
    plots: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """A plain dict for the JSON report."""
        return asdict(self)


class Scenario(Protocol):
    """The module interface of one scenario."""

    SCENARIO: str
    TITLE: str
    QUICK: dict[str, Any]

    def add_arguments(self, parser: argparse.ArgumentParser) -> None: ...

    def run(self, options: argparse.Namespace, out_dir: Path) -> ScenarioReport: ...


def at_least(value: float, target: float) -> tuple[str, bool]:
    """Target text and verdict for "value must be >= target"."""
    return f">= {target:g}", value >= target


def at_most(value: float, target: float) -> tuple[str, bool]:
    """Target text and verdict for "value must be <= target"."""
    return f"<= {target:g}", value <= target


def median_spread(samples: Sequence[float]) -> tuple[float, tuple[float, float]]:
    """The median and (min, max) of repeated samples."""
    return statistics.median(samples), (min(samples), max(samples))


def percentile(samples: Sequence[float], fraction: float) -> float:
    """The ``fraction`` quantile (0..1) by nearest rank; 0.0 for no samples."""
    if not samples:
        return 0.0
    ordered = sorted(samples)
    index = min(len(ordered) - 1, max(0, round(fraction * len(ordered)) - 1))
    return ordered[index]


def alternate(round_number: int, steps: Sequence[Any]) -> list[Any]:
    """A/B alternation: odd rounds run the variants in reverse order."""
    return list(reversed(steps)) if round_number % 2 else list(steps)


def timed(call: Callable[[], object]) -> float:
    """Seconds one call took."""
    started = time.perf_counter()
    call()
    return time.perf_counter() - started


@contextmanager
def fresh_schema(url: str, *tables: MetaData, inbox: bool = True) -> Iterator[Engine]:
    """A new PostgreSQL schema or MariaDB database (SQLite: the URL as given) holding the
    inbox table (unless ``inbox=False``) and ``tables``; dropped afterwards."""
    base = make_url(url)
    name = f"bench_{uuid.uuid4().hex[:12]}"
    backend = base.get_backend_name()
    admin: Engine | None = None
    drop = None
    if backend == "sqlite":
        engine = create_engine(url)
    else:
        admin = create_engine(url, isolation_level="AUTOCOMMIT")
        kind = "SCHEMA" if backend == "postgresql" else "DATABASE"
        with admin.connect() as connection:
            connection.execute(text(f"CREATE {kind} {name}"))
        drop = f"DROP {kind} {name}" + (" CASCADE" if kind == "SCHEMA" else "")
        if kind == "SCHEMA":
            scoped = base.update_query_dict({"options": f"-csearch_path={name}"})
        else:
            scoped = base.set(database=name)
        engine = create_engine(scoped)
    try:
        if inbox:
            inbox_metadata.create_all(engine)
        for metadata in tables:
            metadata.create_all(engine)
        yield engine
    finally:
        engine.dispose()
        if admin is not None and drop is not None:
            with admin.connect() as connection:
                connection.execute(text(drop))
            admin.dispose()


def installed(package: str) -> str | None:
    """The installed version of ``package``, or None."""
    try:
        return version(package)
    except PackageNotFoundError:
        return None


def server_version(engine: Engine) -> str:
    """The database server's version, e.g. "15.20"."""
    with engine.connect():
        pass
    return ".".join(map(str, engine.dialect.server_version_info or ()))


def stamp() -> str:
    """A UTC timestamp for file names."""
    return dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")


def write_report(name: str, path: Path | None, body: dict[str, Any]) -> Path:
    """Write ``body`` with the machine, the package versions and the command as JSON to
    ``path`` (default: ``benchmarks/results/<name>-<UTC time>.json``) and say where."""
    when = stamp()
    path = path or RESULTS / f"{name}-{when}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    report = {
        "benchmark": name,
        "when": when,
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "machine": {
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
        },
        "versions": {p: installed(p) for p in PACKAGES},
        **body,
    }
    path.write_text(json.dumps(report, indent=2, default=str))
    print(f"\nJSON: {path}")
    return path


def plot_lines(
    path: Path,
    title: str,
    xlabel: str,
    ylabel: str,
    series: dict[str, tuple[Sequence[float], Sequence[float]]],
) -> str | None:
    """Save a line plot (one line per series: (xs, ys)) as PNG; None when matplotlib is not
    installed (``pip install -e '.[bench]'``)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"  (matplotlib not installed: no plot {path.name})")
        return None
    figure, axes = plt.subplots(figsize=(8, 4.5))
    for label, (xs, ys) in series.items():
        axes.plot(xs, ys, marker="o", markersize=3, label=label)
    axes.set_title(title)
    axes.set_xlabel(xlabel)
    axes.set_ylabel(ylabel)
    axes.grid(True, alpha=0.3)
    axes.legend()
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return str(path)


def format_value(value: float, unit: str) -> str:
    """A figure's value for the table."""
    if unit in ("x", "ratio") or (unit == "" and abs(value) < 100):
        return f"{value:.3f}"
    if abs(value) >= 1000:
        return f"{value:,.0f} {unit}".rstrip()
    return f"{value:.1f} {unit}".rstrip()


def print_figures(reports: Sequence[ScenarioReport]) -> None:
    """One table: every scenario's figures, measured value, spread, target, verdict."""
    rows = [("scenario", "figure", "measured", "min..max", "target", "met")]
    for report in reports:
        for figure in report.figures:
            spread = (
                f"{format_value(figure.spread[0], '')}..{format_value(figure.spread[1], '')}"
                if figure.spread is not None
                else ""
            )
            met = "" if figure.met is None else ("yes" if figure.met else "NO")
            rows.append(
                (
                    report.scenario,
                    figure.name,
                    format_value(figure.value, figure.unit),
                    spread,
                    figure.target,
                    met,
                )
            )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for index, row in enumerate(rows):
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)))
        if index == 0:
            print("  ".join("-" * width for width in widths))


def scenario_main(module: Scenario, argv: list[str] | None = None) -> int:
    """Run one scenario alone: parse its options, run it, print its table, write JSON."""
    parser = argparse.ArgumentParser(
        allow_abbrev=False, description=f"{module.SCENARIO}: {module.TITLE}"
    )
    module.add_arguments(parser)
    parser.add_argument("--quick", action="store_true", help="a small smoke run")
    parser.add_argument("--json", type=Path, default=None, help="where to write the JSON")
    options = parser.parse_args(argv)
    if options.quick:
        for key, value in module.QUICK.items():
            setattr(options, key, value)
    out_dir = RESULTS / f"{module.SCENARIO.lower()}-{stamp()}"
    report = module.run(options, out_dir)
    print()
    print_figures([report])
    write_report(
        module.SCENARIO.lower(),
        options.json or out_dir / "report.json",
        {"scenarios": [report.to_json()]},
    )
    return 0


def start_celery_worker(
    module: str, queue: str, env: dict[str, str], *, log_level: str
) -> subprocess.Popen[bytes]:
    """``celery -A module worker`` (prefork, two children) consuming ``queue``, started from
    benchmarks/ with ``env`` added to this environment, in a process group of its own."""
    command = [sys.executable, "-m", "celery", "-A", module, "worker", "--pool=prefork"]
    command += ["-c", "2", "-Q", queue, "-l", log_level]
    command += ["--without-mingle", "--without-gossip", "--without-heartbeat"]
    command += ["-n", f"{module}{uuid.uuid4().hex[:6]}@%h"]
    here = Path(__file__).resolve().parent
    return subprocess.Popen(command, cwd=here, env={**os.environ, **env}, start_new_session=True)


def stop_worker(worker: subprocess.Popen[bytes]) -> None:
    """SIGTERM (a warm shutdown), then its whole group killed after 30 s."""
    worker.send_signal(signal.SIGTERM)
    try:
        worker.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(worker.pid, signal.SIGKILL)
        worker.wait()
