"""The results page: a ``run_all.py`` directory rendered into ``benchmarks/README.md``.

    .venv/bin/python benchmarks/results_page.py benchmarks/results/all-<time>   # re-render

Replaces the part of the README between ``<!-- results:begin -->`` and
``<!-- results:end -->`` (appended at the end the first time) with: the run's
command, mode and duration; the machine and versions; "what to expect on your hardware" (the
round trips per message of every path counted on the wire by ``round_trips.py``, and the
rule to turn them into time; then per message costs timed in ``SELECT 1`` round trips, which
carry over between machines better than microseconds); every benchmark's figures, or the
tail of its output; where the raw JSON, logs and plots are. The plots (the round-trip chart,
the S7 rates, and every plot a benchmark saved, copied in) are written into the run's
directory, which git ignores.
"""

from __future__ import annotations

import json
import re
import shutil
import statistics
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from common import format_value

HERE = Path(__file__).resolve().parent
README = HERE / "README.md"
BEGIN, END = "<!-- results:begin -->", "<!-- results:end -->"
Row = tuple[str, str, float, str]
"""A "what to expect" row: (benchmark, what, round trips per message, how it was measured)."""


def load(run_dir: Path) -> tuple[dict[str, Any], dict[str, Any], dict[str, dict[str, Any]]]:
    """The run's index, machine, and every report that was written, by benchmark name."""
    index = json.loads((run_dir / "index.json").read_text())
    machine = json.loads((run_dir / "machine.json").read_text())
    reports = {}
    for entry in index["benchmarks"]:
        if entry["report"]:
            reports[entry["name"]] = json.loads((run_dir / entry["report"]).read_text())
    return index, machine, reports


def figures_of(report: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The figures of a scenario report (``common.Figure`` as dicts)."""
    for scenario in report.get("scenarios", []):
        yield from scenario.get("figures", [])


def flatten(value: Any, prefix: str = "") -> Iterator[tuple[str, float, str]]:
    """Every number in a nested dict with its path ("postgresql / effect_us"); a list of
    numbers (one sample per round) as its median, with its min..max."""
    if isinstance(value, bool):
        return
    if isinstance(value, int | float):
        yield prefix, float(value), ""
    elif isinstance(value, list) and value and all(isinstance(v, int | float) for v in value):
        yield prefix, statistics.median(value), f"{_number(min(value))}..{_number(max(value))}"
    elif isinstance(value, dict):
        for key, inner in value.items():
            yield from flatten(inner, f"{prefix} / {key}" if prefix else str(key))


def expectations(reports: dict[str, dict[str, Any]]) -> list[Row]:
    """Per-message costs in SELECT 1 round trips, from every report that measured them."""
    rows: list[Row] = []
    for name, report in reports.items():
        figures = list(figures_of(report))
        # S7, TENANTS, MARIADB_MULTI: computed round by round against a SELECT 1 measured in
        # the same rounds; MARIADB_MULTI also counts its round trips (PyMySQL's commands).
        for figure in figures:
            if figure["name"].endswith(": per message, in SELECT 1 round trips"):
                what = figure["name"].split(":")[0]
                rows.append((name, what, figure["value"], "same rounds"))
            elif figure["name"].endswith(": round trips counted per message"):
                what = figure["name"].split(":")[0]
                rows.append((name, what, figure["value"], "counted on the wire"))
        # S1, A1: "<group>: <variant> per message" in µs beside "<group>: select-1 per message"
        # (not SQLite's: there a SELECT 1 is a call inside the process, not a round trip).
        selects = {
            f["name"].split(": ")[0]: f["value"]
            for f in figures
            if f["name"].endswith(": select-1 per message")
            and f["value"] > 0
            and "sqlite" not in f["name"].split(": ")[0]
        }
        for figure in figures:
            group, _, rest = figure["name"].partition(": ")
            if group in selects and rest.endswith(" per message") and "select-1" not in rest:
                variant = rest.removesuffix(" per message")
                rows.append(
                    (name, f"{group} {variant}", figure["value"] / selects[group], "medians")
                )
    effect = reports.get("effect_cost", {}).get("figures", {})
    for backend, values in effect.items():
        trips = values.get("effect_per_message", {}).get("round trips")
        if trips is not None:
            rows.append(
                ("effect_cost", f"{backend}: one inbox.effect", trips, "counted on the wire")
            )
    publish = reports.get("outbox_publish", {}).get("figures", {})
    for backend, values in publish.items():
        for what, measured in values.items():
            trips = measured.get("select_1_round_trips") if isinstance(measured, dict) else None
            if trips is not None:
                rows.append(("outbox_publish", f"{backend}: {what}", trips, "same rounds"))
    return rows


def counted_round_trips(reports: dict[str, dict[str, Any]]) -> list[str]:
    """``round_trips.py``'s counts (its ``ROUND_TRIPS`` report) as the "what to expect"
    table: per path, the plain transaction, the inbox, and the difference; then each path's
    duplicate delivery. Empty without that report."""
    report = reports.get("ROUND_TRIPS")
    scenario = next(iter(report.get("scenarios", [])), None) if report else None
    if scenario is None:
        return []
    data = scenario.get("data", {})
    lines = [
        "Round trips per message, counted on the wire (`round_trips.py`: a counting TCP proxy, "
        "`inbox.testing.round_trips.RoundTripCounter`, in front of the real servers, after a "
        "warm-up). These are exact counts: they do not depend on this machine or its load.",
        "",
        "| path | handler | plain transaction | inbox | inbox - plain |",
        "|---|---|---:|---:|---:|",
    ]
    for row in data.get("comparisons", []):
        difference = row["inbox"] - row["plain"]
        lines.append(
            f"| {row['path']} | {row['what']} | {row['plain']:.2f} | {row['inbox']:.2f} "
            f"| {difference:+.2f} |"
        )
    for path, measured in data.get("round_trips", {}).items():
        if "duplicate" in measured:
            lines.append(
                f"| {path} | a duplicate delivery (handler skipped) | | "
                f"{measured['duplicate']:.2f} | |"
            )
    lines += [
        "",
        "**The rule: per-message time ~ round trips x your network round trip + the "
        "server's work** (above all a COMMIT's WAL flush: `synchronous_commit on` waits for "
        "the disk). Measure your round trip (a `SELECT 1` from the consumer's host) and your "
        "disk's fsync, and multiply. SQLite is not counted: it has no network, each "
        "statement is a call inside the process.",
        "",
    ]
    return lines


def machine_lines(machine: dict[str, Any]) -> list[str]:
    """The machine and versions as a two-column table."""
    load = machine.get("load_average") or []
    after = machine.get("load_average_after") or []
    pg = machine.get("postgresql", {})
    pg_text = pg.get("error") or (
        f"{pg.get('version')} (synchronous_commit {pg.get('synchronous_commit')}, fsync "
        f"{pg.get('fsync')}, shared_buffers {pg.get('shared_buffers')})"
    )
    rabbit = machine.get("rabbitmq", {})
    packages = ", ".join(f"{k} {v}" for k, v in machine.get("packages", {}).items() if v)
    rows = [
        ("CPU", f"{machine.get('cpu')}, {machine.get('cores')} cores"),
        ("RAM", f"{machine.get('memory_gib')} GiB"),
        ("load average (1, 5, 15 min) before / after", f"{_load(load)} / {_load(after)}"),
        ("OS", str(machine.get("platform"))),
        ("Python", str(machine.get("python"))),
        ("PostgreSQL", pg_text),
        ("MariaDB", str(machine.get("mariadb", {}).get("version") or machine.get("mariadb"))),
        ("RabbitMQ", str(rabbit.get("version") or rabbit.get("error"))),
        ("pgbench", str(machine.get("pgbench"))),
        ("packages", packages),
    ]
    return ["| | |", "|---|---|", *[f"| {k} | {v} |" for k, v in rows]]


def _load(values: list[float]) -> str:
    return ", ".join(f"{v:.1f}" for v in values) or "?"


def figure_table(report: dict[str, Any]) -> list[str]:
    """A scenario report's figures; a plain report's numbers (its ``figures`` or, without
    one, everything but its parameters and raw data)."""
    figures = list(figures_of(report))
    if figures:
        lines = ["| figure | measured | min..max | target | met |", "|---|---:|---:|---:|---|"]
        for f in figures:
            spread = f.get("spread")
            text = "" if not spread else f"{_number(spread[0])}..{_number(spread[1])}"
            met = "" if f.get("met") is None else ("yes" if f["met"] else "**no**")
            value = format_value(f["value"], f.get("unit", ""))
            lines.append(f"| {f['name']} | {value} | {text} | {f.get('target', '')} | {met} |")
        return lines
    skip = {"benchmark", "when", "command", "machine", "versions", "parameters", "data"}
    body = report.get("figures") or {k: v for k, v in report.items() if k not in skip}
    numbers = list(flatten(body))
    if not numbers:
        return ["(no figures in the report)"]
    lines = ["| figure | measured | min..max |", "|---|---:|---:|"]
    lines += [f"| {path} | {value:,.3f} | {spread} |" for path, value, spread in numbers]
    return lines


def _number(value: float) -> str:
    return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.3g}"


def log_tail(path: Path, lines: int = 25) -> list[str]:
    """The last ``lines`` lines a benchmark printed, as a code block."""
    text = path.read_text(errors="replace").rstrip().splitlines()[-lines:] if path.exists() else []
    return ["```", *text, "```"]


def plots(run_dir: Path, rows: list[Row], reports: dict[str, dict[str, Any]]) -> list[Path]:
    """The page's own charts, and every plot a benchmark saved, copied into ``run_dir``."""
    made: list[Path] = []
    for report in reports.values():
        for scenario in report.get("scenarios", []):
            for plot in scenario.get("plots", []):
                source = Path(plot)
                if source.suffix == ".png" and source.exists():
                    target = run_dir / source.name
                    shutil.copyfile(source, target)
                    made.append(target)
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("  (matplotlib not installed: no charts; pip install -e '.[bench]')")
        return made
    if rows:
        figure, axes = plt.subplots(figsize=(9, 0.32 * len(rows) + 1.2))
        labels = [f"{bench}: {what}" for bench, what, _, _ in rows]
        axes.barh(labels, [value for _, _, value, _ in rows])
        axes.invert_yaxis()
        axes.set_xlabel("per message, in SELECT 1 round trips")
        axes.set_title("What a message costs, in round trips")
        axes.grid(True, axis="x", alpha=0.3)
        figure.tight_layout()
        path = run_dir / "round_trips_per_message.png"
        figure.savefig(path, dpi=110)
        plt.close(figure)
        made.insert(0, path)
    return made


def render(run_dir: Path) -> str:
    """The results section's markdown."""
    index, machine, reports = load(run_dir)
    rows = expectations(reports)
    charts = plots(run_dir, rows, reports)
    where = run_dir.relative_to(HERE.parent) if run_dir.is_relative_to(HERE.parent) else run_dir
    mode = (
        "quick (small sizes: a smoke run; judge targets on full runs)" if index["quick"] else "full"
    )
    out = [
        BEGIN,
        "## Results page (generated)",
        "",
        "Regenerated by `.venv/bin/python benchmarks/run_all.py --quick` (every benchmark, one "
        "process each, then this section); do not edit by hand between the markers.",
        "",
        f"`{index['command']}` — started {index['started']}, {index['minutes']} min, mode: "
        f"{mode}. Raw JSON, logs and plots: `{where}/` (git-ignored; the command recreates "
        "them). Ratios are side by side within one benchmark's run; figures of different "
        "benchmarks were measured minutes apart and the machine is shared, so compare "
        "across benchmarks only in round trips, and loosely.",
        "",
        "### Machine and versions",
        "",
        *machine_lines(machine),
        "",
        "### What to expect on your hardware",
        "",
        *counted_round_trips(reports),
        "Timed, in `SELECT 1` round trips: a message's cost in round trips of one `SELECT 1` "
        "through a SQLAlchemy session on the same connection carries over between machines "
        "better than microseconds: the inbox's work is mostly round trips and commits. "
        "Measure one `SELECT 1` on yours (loopback is ~0.1 to 0.3 ms, a network hop ~0.5 to "
        "1 ms) and multiply. Commit cost (the WAL flush, here `synchronous_commit on` on a "
        "shared disk) is inside these figures and varies more between machines than round "
        "trips do.",
        "",
        "| benchmark | per message | SELECT 1 round trips | how |",
        "|---|---|---:|---|",
        *[f"| {b} | {what} | {value:.2f} | {how} |" for b, what, value, how in rows],
        "",
        "Reading it: a per-message path costs a fixed number of round trips per message "
        "(BEGIN, the claim, the handler's statements, the claim check, COMMIT; psycopg 3 "
        "sends the claim in BEGIN's round trip and the check in COMMIT's); a batch of N "
        "pays them once per batch, so its figure falls towards the handler's share as N "
        "grows; a batch handler sends the batch's rows in one statement, which leaves well "
        "under one round trip per message.",
        "",
        "### Every benchmark",
        "",
    ]
    for entry in index["benchmarks"]:
        heading = f"#### {entry['name']} (`{entry['script']}`)"
        out += [f"{heading}: {entry['status']}, {entry['seconds']:.0f} s", ""]
        out += [f"`{entry['command']}`", ""]
        report = reports.get(entry["name"])
        if entry["status"] == "ok" and report is not None:
            out += figure_table(report)
        else:
            out += log_tail(run_dir / entry["log"])
        out.append("")
    if index.get("not_run"):
        out += [f"Not run (not listed in `run_all.py`): {', '.join(index['not_run'])}.", ""]
    if charts:
        out += [
            "### Plots",
            "",
            f"In `{where}/`: " + ", ".join(f"`{p.name}`" for p in charts) + ".",
            "",
        ]
    out.append(END)
    return "\n".join(out)


def publish(run_dir: Path, readme: Path = README) -> None:
    """Write the section into the README (at its end the first time)."""
    section = render(run_dir)
    text = readme.read_text()
    if BEGIN in text and END in text:
        pattern = re.compile(re.escape(BEGIN) + ".*?" + re.escape(END), re.DOTALL)
        text = pattern.sub(lambda _: section, text, count=1)
    else:
        text = text.rstrip() + "\n\n" + section + "\n"
    readme.write_text(text)
    print(f"page: {readme} (results section regenerated from {run_dir})")


if __name__ == "__main__":
    if len(sys.argv) != 2 or not (Path(sys.argv[1]) / "index.json").exists():
        sys.exit("usage: results_page.py benchmarks/results/all-<time>  (a run_all.py directory)")
    publish(Path(sys.argv[1]).resolve())
