"""S1 across versions of the inbox, alternated in one run: what the core costs today beside
what it cost at earlier commits, on the same machine at the same time (issue 22).

    .venv/bin/python benchmarks/s1_versions.py --checkout 208fc7a=/path/to/worktree \\
        --checkout 269bef0=/path/to/other --checkout today=. [--messages 3000] [--rounds 5]

Each ``--checkout NAME=PATH`` is a checkout of this repository (``git worktree add PATH REV``).
Round by round, in a rotating order, each runs one S1 round (``s1_overhead.measure`` with
that checkout's ``inbox`` first on ``sys.path``) in a process of its own, on a fresh schema:
its plain session transactions, ``Inbox.process`` with a 1- and a 3-statement handler, the
replay of the 1-statement messages and ``SELECT 1`` through a session. Every figure is taken
within one process (inbox against its own plain and ``SELECT 1``), then compared across the
checkouts by median over the rounds. Python calls per message are counted once per checkout
(cProfile, 1-statement handler). Prints a table and writes JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
FIGURES = (
    ("added us/msg, 1 statement", "added_us", "{:+.0f}"),
    ("inbox - plain, SELECT 1 units", "added_units", "{:.2f}"),
    ("inbox/plain rate, 3 statements", "ratio3", "{:.2f}"),
    ("replay/first rate", "replay", "{:.2f}"),
    ("calls/msg (plain)", "calls", "{}"),
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkout", action="append", required=True, metavar="NAME=PATH")
    parser.add_argument("--messages", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--synchronous-commit", choices=["on", "off"], default="off")
    parser.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--count-calls", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--json", type=Path, default=None)
    options = parser.parse_args(argv)
    if options.worker is not None:
        return _worker(options)
    checkouts = dict(item.split("=", 1) for item in options.checkout)
    rounds: dict[str, list[dict[str, Any]]] = {name: [] for name in checkouts}
    names = list(checkouts)
    for number in range(options.rounds):
        order = names[number % len(names) :] + names[: number % len(names)]
        for name in order:
            rounds[name].append(_run(checkouts[name], options, profile=number == 0))
            print(f"round {number + 1}/{options.rounds} {name}: {_figures(rounds[name][-1])}")
    table = {name: _summary(samples) for name, samples in rounds.items()}
    width = max(len(label) for label, _, _ in FIGURES)
    print(f"\nS1 by version, {options.messages} messages x {options.rounds} rounds, medians")
    print(f"{'':{width}}  " + "  ".join(f"{n:>16}" for n in names))
    for label, key, form in FIGURES:
        cells = [form.format(table[n][key]) for n in names]
        print(f"{label:{width}}  " + "  ".join(f"{c:>16}" for c in cells))
    path = options.json or HERE / "results" / "s1-versions.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    report = {"options": {k: str(v) for k, v in vars(options).items()}, "rounds": rounds}
    path.write_text(json.dumps(report | {"medians": table}, indent=2))
    print(f"JSON: {path}")
    return 0


def _run(checkout: str, options: argparse.Namespace, *, profile: bool) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(checkout).resolve()), str(HERE)])}
    argv = [sys.executable, str(Path(__file__).resolve()), "--checkout", "x=.", "--worker"]
    argv += [str(Path(checkout).resolve()), "--messages", str(options.messages)]
    argv += ["--synchronous-commit", options.synchronous_commit]
    if profile:
        argv.append("--count-calls")
    done = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{checkout}: {done.stderr}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def _worker(options: argparse.Namespace) -> int:
    from s1_overhead import DEFAULT_DATABASE, measure

    import inbox  # the checkout's, first on sys.path

    assert Path(inbox.__file__).resolve().is_relative_to(options.worker.resolve()), inbox.__file__
    _, samples = measure(DEFAULT_DATABASE, options.messages, 1, options.synchronous_commit)
    result: dict[str, Any] = {k: v[0] for k, v in samples.items()}
    if options.count_calls:
        result["calls"] = _calls()
    print(json.dumps(result))
    return 0


def _calls() -> dict[str, int]:
    """cProfile's calls per message, plain and inbox, 1-statement handler."""
    import cProfile
    import pstats

    from common import fresh_schema
    from s1_overhead import DEFAULT_DATABASE, business, one_statement
    from sqlalchemy.orm import sessionmaker

    from inbox import Inbox, Message

    counts = {}
    with fresh_schema(DEFAULT_DATABASE, business) as engine:
        sessions = sessionmaker(engine)
        box = Inbox(sessions)
        box.handler("bench", name="bench.one_statement")(one_statement)

        def plain(message: Message) -> None:
            with sessions() as session, session.begin():
                one_statement(message, session)

        for name, step in (("plain", plain), ("inbox", box.process)):
            batch = [Message.new("bench", {"ref": i, "amount": 7}) for i in range(300)]
            for message in batch[:100]:
                step(message)
            profile = cProfile.Profile()
            profile.enable()
            for message in batch[100:]:
                step(message)
            profile.disable()
            counts[name] = round(pstats.Stats(profile).total_calls / 200)  # type: ignore[attr-defined]
    return counts


def _figures(sample: dict[str, Any]) -> dict[str, float]:
    added = sample["inbox-1"] - sample["plain-1"]
    return {
        "added_us": added,
        "added_units": added / sample["select-1"],
        "ratio3": sample["plain-3"] / sample["inbox-3"],
        "replay": sample["inbox-1"] / sample["replay-1"],
    }


def _summary(samples: list[dict[str, Any]]) -> dict[str, Any]:
    figures = [_figures(sample) for sample in samples]
    summary: dict[str, Any] = {
        key: statistics.median(f[key] for f in figures) for key in figures[0]
    }
    calls = next((s["calls"] for s in samples if "calls" in s), None)
    summary["calls"] = f"{calls['inbox']} ({calls['plain']})" if calls else "-"
    return summary


if __name__ == "__main__":
    sys.exit(main())
