"""The benchmark results page (``benchmarks/results_page.py``): a run directory rendered into
the README between its markers (appended the first time, then replaced in place), with the
round-trip expectations taken from the reports, a failed benchmark's output, and the scripts
``run_all.py`` does not know."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import results_page  # noqa: E402
import run_all  # noqa: E402


def figure(name: str, value: float, unit: str = "", **extra: Any) -> dict[str, Any]:
    return {"name": name, "value": value, "unit": unit, "target": "", "met": None} | extra


def write_run(run_dir: Path) -> None:
    s7 = {
        "scenarios": [
            {
                "scenario": "S7",
                "plots": [],
                "figures": [
                    figure("batch, batch handler msg/s", 9000.0, "msg/s", spread=[8000, 9500]),
                    figure("batch, batch handler: per message, in SELECT 1 round trips", 0.42, "x"),
                    figure(
                        "batch, batch handler / per-message worker",
                        12.5,
                        "x",
                        target=">= 10",
                        met=True,
                    ),
                ],
            }
        ]
    }
    s1 = {
        "scenarios": [
            {
                "scenario": "S1",
                "plots": [],
                "figures": [
                    figure("postgresql: inbox-1 per message", 900.0, "us"),
                    figure("postgresql: select-1 per message", 150.0, "us"),
                    figure("sqlite: inbox-1 per message", 900.0, "us"),
                    figure("sqlite: select-1 per message", 30.0, "us"),
                ],
            }
        ]
    }
    effect = {"figures": {"postgresql": {"effect_per_message": {"round trips": 2.0}}}}
    (run_dir / "S7.json").write_text(json.dumps(s7))
    (run_dir / "S1.json").write_text(json.dumps(s1))
    (run_dir / "effect_cost.json").write_text(json.dumps(effect))
    (run_dir / "S2.log").write_text("connecting\nTraceback: broker unreachable\n")
    for name in ("S7", "S1", "effect_cost"):
        (run_dir / f"{name}.log").write_text("ok\n")
    entries = [
        {"name": n, "script": f"{n}.py", "command": f"python {n}.py", "status": "ok",
         "seconds": 3.0, "report": f"{n}.json", "log": f"{n}.log"}
        for n in ("S7", "S1", "effect_cost")
    ]  # fmt: skip
    entries.append(
        {"name": "S2", "script": "s2.py", "command": "python s2.py", "status": "exit 1",
         "seconds": 1.0, "report": None, "log": "S2.log"}
    )  # fmt: skip
    index = {
        "command": "run_all.py --quick",
        "quick": True,
        "started": "2026-11-26 13:10 UTC",
        "minutes": 1.0,
        "benchmarks": entries,
        "not_run": ["new_benchmark.py"],
    }
    machine = {"cpu": "a CPU", "cores": 2, "packages": {"SQLAlchemy": "2.1"}}
    (run_dir / "index.json").write_text(json.dumps(index))
    (run_dir / "machine.json").write_text(json.dumps(machine))


def test_the_section_is_appended_once_then_replaced(tmp_path: Path) -> None:
    run_dir = tmp_path / "all-x"
    run_dir.mkdir()
    write_run(run_dir)
    readme = tmp_path / "README.md"
    readme.write_text("# Benchmarks\n\nintro\n\n## Summary\n\nhand-written\n")
    results_page.publish(run_dir, readme)
    results_page.publish(run_dir, readme)
    text = readme.read_text()
    assert text.count(results_page.BEGIN) == 1
    assert text.count(results_page.END) == 1
    assert text.index("hand-written") < text.index(results_page.BEGIN)
    assert text.endswith(results_page.END + "\n")
    section = text[text.index(results_page.BEGIN) : text.index(results_page.END)]
    # Round trips: S7's own, S1's medians (900 / 150), the effect counted on the wire.
    assert "| S7 | batch, batch handler | 0.42 | same rounds |" in section
    assert "| S1 | postgresql inbox-1 | 6.00 | medians |" in section
    assert "| S1 | sqlite" not in section  # SQLite's SELECT 1 is no round trip
    assert "| effect_cost | postgresql: one inbox.effect | 2.00 | counted on the wire |" in section
    assert "| batch, batch handler / per-message worker | 12.500 |  | >= 10 | yes |" in section
    assert "Traceback: broker unreachable" in section  # the failed one's output
    assert "#### S2 (`s2.py`): exit 1" in section
    assert "Not run (not listed in `run_all.py`): new_benchmark.py." in section
    assert "| CPU | a CPU, 2 cores |" in section


def test_the_counted_round_trips_lead_what_to_expect(tmp_path: Path) -> None:
    run_dir = tmp_path / "all-x"
    run_dir.mkdir()
    write_run(run_dir)
    comparison = {"path": "MariaDB PyMySQL", "what": "1-statement handler", "plain": 3.0}
    counted = {
        "scenarios": [
            {
                "scenario": "ROUND_TRIPS",
                "plots": [],
                "figures": [figure("MariaDB PyMySQL / inbox-1", 5.0)],
                "data": {
                    "round_trips": {"MariaDB PyMySQL": {"inbox-1": 5.0, "duplicate": 3.0}},
                    "comparisons": [comparison | {"inbox": 5.0}],
                },
            }
        ]
    }
    (run_dir / "ROUND_TRIPS.json").write_text(json.dumps(counted))
    (run_dir / "ROUND_TRIPS.log").write_text("ok\n")
    index = json.loads((run_dir / "index.json").read_text())
    index["benchmarks"].append(
        {"name": "ROUND_TRIPS", "script": "round_trips.py", "command": "python round_trips.py",
         "status": "ok", "seconds": 9.0, "report": "ROUND_TRIPS.json", "log": "ROUND_TRIPS.log"}
    )  # fmt: skip
    (run_dir / "index.json").write_text(json.dumps(index))
    section = results_page.render(run_dir)
    expect = section[section.index("### What to expect") : section.index("### Every benchmark")]
    assert "| MariaDB PyMySQL | 1-statement handler | 3.00 | 5.00 | +2.00 |" in expect
    assert "| MariaDB PyMySQL | a duplicate delivery (handler skipped) | | 3.00 | |" in expect
    assert "round trips x your network round trip" in expect
    assert expect.index("counted on the wire") < expect.index("Timed, in `SELECT 1`")
    assert "| S1 | postgresql inbox-1 | 6.00 | medians |" in expect  # the timed table stays


def test_every_script_in_benchmarks_is_run_or_a_known_helper() -> None:
    assert run_all.unlisted() == []
    for benchmark in run_all.BENCHMARKS:
        assert (BENCHMARKS / benchmark.script).exists(), benchmark.script


def test_a_directory_without_a_run_is_refused(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        results_page.publish(tmp_path, tmp_path / "README.md")
