"""The benchmark suite: every scenario (or some), one table, one JSON, plots beside it.

    .venv/bin/python benchmarks/suite.py                      # S1..S7, full size (long)
    .venv/bin/python benchmarks/suite.py --only S1 S2         # some scenarios
    .venv/bin/python benchmarks/suite.py --quick              # a small smoke run of all
    .venv/bin/python benchmarks/suite.py --only S4 --set S4.rows=2000000

Each scenario runs its comparisons side by side, A/B alternated, repeated, and reports the
median and the (min, max) spread; ``--set SCENARIO.option=value`` overrides one of a
scenario's options (see ``benchmarks/sN_*.py --help``). Results go to
``benchmarks/results/suite-<time>/``: ``report.json`` and the PNG plots.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from types import ModuleType
from typing import Any

from common import (
    RESULTS,
    Figure,
    ScenarioReport,
    at_least,
    print_figures,
    stamp,
    write_report,
)

MODULES = {
    "S1": "s1_overhead",
    "S2": "s2_end_to_end",
    "S3": "s3_ceiling",
    "S4": "s4_growth",
    "S5": "s5_cleanup",
    "S6": "s6_memory",
    "S7": "s7_batch_handler",
}


def scenario_options(module: ModuleType, quick: bool, overrides: list[str]) -> argparse.Namespace:
    """The scenario's defaults, its QUICK values under --quick, then the --set overrides."""
    parser = argparse.ArgumentParser(allow_abbrev=False, prog=module.__name__)
    module.add_arguments(parser)
    options = parser.parse_args([])
    if quick:
        for key, value in module.QUICK.items():
            setattr(options, key, value)
    for override in overrides:
        key, _, text = override.partition("=")
        if not hasattr(options, key):
            raise SystemExit(f"{module.SCENARIO} has no option {key!r}")
        current = getattr(options, key)
        if isinstance(current, list):
            element = type(current[0]) if current else str
            value: Any = [element(part) for part in text.split(",")]
        elif isinstance(current, bool):
            value = text.lower() in ("1", "true", "yes")
        elif current is None:
            value = text
        else:
            value = type(current)(text)
        setattr(options, key, value)
    return options


def cross_figures(reports: dict[str, ScenarioReport]) -> list[Figure]:
    """Figures that compare two scenarios run in the same suite run."""
    figures: list[Figure] = []
    if "S2" in reports and "S3" in reports:
        batch = _find(reports["S2"], "batch ", "1-statement handler")
        ceiling = _find(reports["S3"], "pgbench claim + insert", "")
        if batch is not None and ceiling is not None:
            ratio = batch.value / ceiling.value
            target, met = at_least(ratio, 1.5)
            figures.append(
                Figure("S2 batch msg/s / S3 pgbench per-message ceiling", ratio, "x", target, met)
            )
    return figures


def _find(report: ScenarioReport, prefix: str, part: str) -> Figure | None:
    return next((f for f in report.figures if f.name.startswith(prefix) and part in f.name), None)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", choices=list(MODULES), default=list(MODULES))
    parser.add_argument("--quick", action="store_true", help="small sizes: a smoke run")
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="SCENARIO.OPTION=VALUE",
        help="override a scenario option, e.g. S1.messages=5000 (repeatable)",
    )
    args = parser.parse_args(argv)
    out_dir = RESULTS / f"suite-{stamp()}"
    reports: dict[str, ScenarioReport] = {}
    for scenario in args.only:
        module = importlib.import_module(MODULES[scenario])
        prefix = f"{scenario}."
        mine = [o[len(prefix) :] for o in args.overrides if o.startswith(prefix)]
        options = scenario_options(module, args.quick, mine)
        print(f"\n=== {scenario}: {module.TITLE} ===")
        reports[scenario] = module.run(options, out_dir)
        reports[scenario].parameters.setdefault("options", vars(options))
    cross = cross_figures(reports)
    shown = list(reports.values())
    if cross:
        shown.append(ScenarioReport("S2/S3", "cross-scenario", {}, cross))
    print("\n=== summary ===")
    print_figures(shown)
    write_report(
        "suite",
        out_dir / "report.json",
        {
            "quick": args.quick,
            "overrides": args.overrides,
            "scenarios": [r.to_json() for r in shown],
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
