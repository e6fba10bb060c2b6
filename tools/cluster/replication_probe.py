"""How many acknowledged commits does a crash of the primary take with it?

    python tools/cluster/replication_probe.py --trials 20              # synchronous
    python tools/cluster/replication_probe.py --trials 20 --async      # asynchronous

Each trial: ``--writers`` connections commit one-row transactions to the primary as fast as
they can (the shape of an inbox claim: one INSERT, one COMMIT) and record every id whose
COMMIT returned — the moment a worker would ack the delivery. After a random 0.3 to 1.5 s the
primary is SIGKILLed (every process at once), the standby promoted, and the new primary
asked for the recorded ids. An id whose COMMIT had returned but that the new primary lacks
is a lost acknowledged commit: with the inbox, a message acked to the broker whose claim and
effects are gone. The old primary is then rebuilt as the standby for the next trial.

Prints one line per trial and a summary, and writes JSON with ``--json``.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tools.cluster.postgres import USER, PgNode, PostgresPair

__all__ = ["Trial", "main", "probe"]


@dataclass
class Trial:
    """One crash: how many commits returned before it, and how many of those were lost."""

    acknowledged: int = 0
    lost: int = 0
    seconds: float = 0.0
    unwritable_seconds: float = 0.0
    ids: list[int] = field(default_factory=list, repr=False)


def _connect(node: PgNode) -> psycopg.Connection[Any]:
    return psycopg.connect(
        host="127.0.0.1", port=node.port, user=USER, dbname="postgres", connect_timeout=5
    )


def _writer(node: PgNode, start: int, step: int, trial: Trial, lock: threading.Lock) -> None:
    try:
        with _connect(node) as connection:
            next_id = start
            while True:
                connection.execute("INSERT INTO probe (id) VALUES (%s)", (next_id,))
                connection.commit()  # returned: from here on the caller would ack
                with lock:
                    trial.ids.append(next_id)
                next_id += step
    except psycopg.Error:
        return  # the primary is gone: this writer's trial is over


def probe(pair: PostgresPair, writers: int, rng: random.Random, offset: int) -> Trial:
    """Run one trial on ``pair`` (see the module doc); ids start at ``offset``."""
    trial = Trial()
    lock = threading.Lock()
    threads = [
        threading.Thread(target=_writer, args=(pair.primary, offset + i, writers, trial, lock))
        for i in range(writers)
    ]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    time.sleep(rng.uniform(0.3, 1.5))
    crash = time.monotonic()
    pair.kill_primary()
    pair.promote()
    trial.unwritable_seconds = time.monotonic() - crash
    for thread in threads:
        thread.join(30)
    trial.seconds = crash - started
    with lock:
        acknowledged = set(trial.ids)
    with _connect(pair.primary) as connection:
        present = {
            row[0]
            for row in connection.execute(
                "SELECT id FROM probe WHERE id = ANY(%s)", (sorted(acknowledged),)
            )
        }
    trial.acknowledged = len(acknowledged)
    trial.lost = len(acknowledged - present)
    pair.rebuild_standby()
    return trial


def main(argv: list[str] | None = None) -> int:
    """Run the trials and print the figures."""
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    parser.add_argument("--async", dest="synchronous", action="store_false")
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--writers", type=int, default=4)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.trials < 1 or args.writers < 1:
        parser.error("--trials and --writers must be at least 1")
    rng = random.Random(args.seed)
    mode = "sync (remote_apply)" if args.synchronous else "async"
    trials: list[Trial] = []
    with PostgresPair(synchronous=args.synchronous) as pair:
        with _connect(pair.primary) as connection:
            connection.execute("CREATE TABLE probe (id bigint PRIMARY KEY)")
            connection.commit()
        for n in range(args.trials):
            trial = probe(pair, args.writers, rng, offset=n * 10_000_000)
            trials.append(trial)
            rate = trial.acknowledged / trial.seconds if trial.seconds else 0.0
            print(
                f"trial {n + 1:>3} ({mode}): {trial.acknowledged:>6} commits acknowledged "
                f"({rate:,.0f}/s), lost {trial.lost}, no writable primary for "
                f"{trial.unwritable_seconds:.2f} s",
                flush=True,
            )
    acknowledged = sum(t.acknowledged for t in trials)
    lost = sum(t.lost for t in trials)
    crashes_with_loss = sum(1 for t in trials if t.lost)
    summary = {
        "replication": "sync" if args.synchronous else "async",
        "trials": args.trials,
        "writers": args.writers,
        "commits_acknowledged": acknowledged,
        "commits_per_second": round(acknowledged / sum(t.seconds for t in trials), 1),
        "lost": lost,
        "crashes_with_loss": crashes_with_loss,
        "max_lost_in_one_crash": max(t.lost for t in trials),
        "per_trial_lost": [t.lost for t in trials],
    }
    print(
        f"{mode}: {args.trials} crashes of the primary, {acknowledged} acknowledged commits, "
        f"{lost} lost ({crashes_with_loss} crashes lost something, at most "
        f"{summary['max_lost_in_one_crash']} in one)"
    )
    if args.json:
        args.json.write_text(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
