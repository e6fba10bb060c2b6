"""The chaos harness's outbox stage (``--outbox``): every operation's handler also publishes a
``followup`` message through the outbox in its own transaction; ``inbox-relay`` processes
send the rows to the ``followups`` queue, and ``inbox-worker app:followup_inbox`` processes (a
second inbox, with its own claim table) commit one ``chaos_followup`` row per follow-up.

Relays are SIGKILLed at random (and respawned), and meet the harness's other faults: their
AMQP connections are closed with everyone's, their database sessions terminated with the
workers'. At the end every committed operation must have exactly one committed follow-up,
no follow-up may exist for an operation that did not commit, and the outbox must be empty.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from chaos_tables import followups
from sqlalchemy import Engine, func, select
from sqlalchemy.exc import OperationalError

from inbox.schema import outbox_message

FOLLOWUP_QUEUE = "followups"
FOLLOWUP_TARGET = "app:followup_inbox"
_STATS = re.compile(
    r"relay (?:stats|stopped): batches=(\d+) published=(\d+) refused=(\d+) resent=(\d+) "
    r"unconfirmed=(\d+) broker_reconnects=(\d+) database_errors=(\d+)"
)
_FIELDS = (
    "batches",
    "published",
    "refused",
    "resent",
    "unconfirmed",
    "broker_reconnects",
    "database_errors",
)


class Relays:
    """N ``inbox-relay`` processes on the run's database and vhost, respawned when they die."""

    def __init__(self, count: int, broker: str, database_url: str, logs: Path) -> None:
        self.count = count
        self.broker = broker
        self.database_url = database_url
        self.logs = logs
        self.processes: list[subprocess.Popen[bytes]] = []
        self.log_files: list[Path] = []
        self.logs_of: list[Path] = []  # the log of each process in self.processes
        self.exits: Counter[str] = Counter()
        self.lock = threading.Lock()

    def start(self) -> subprocess.Popen[bytes]:
        script = Path(sys.executable).with_name("inbox-relay")
        command = (
            [str(script)] if script.exists() else [sys.executable, "-m", "inbox.outbox.relay.cli"]
        )
        log = self.logs / f"relay-{len(self.log_files):03d}.log"
        with log.open("wb") as stderr:
            process = subprocess.Popen(
                [
                    *command, "--database-url", self.database_url, "--broker", self.broker,
                    "--batch-size", "50", "--poll-interval", "0.2", "--max-retry-delay", "2",
                    "--connect-retries", "30", "--stats-interval", "1",
                ],
                stderr=stderr,
                stdout=subprocess.DEVNULL,
            )  # fmt: skip
        self.log_files.append(log)
        return process

    def _wait_started(self) -> None:
        """Until every live relay has installed its signal handlers (it logs ``relaying``
        after): a SIGTERM before that ends it with -15 instead of a clean stop."""
        deadline = time.monotonic() + 60
        for process, log in zip(self.processes, self.logs_of, strict=True):
            while process.poll() is None and time.monotonic() < deadline:
                if "relaying " in log.read_text(errors="replace"):
                    break
                time.sleep(0.2)

    def start_all(self) -> None:
        with self.lock:
            self.processes = [self.start() for _ in range(self.count)]
            self.logs_of = self.log_files[-self.count :]

    def respawn_dead(self) -> None:
        with self.lock:
            for i, process in enumerate(self.processes):
                code = process.poll()
                if code is not None:
                    self.exits["SIGKILL" if code == -signal.SIGKILL else f"exit {code}"] += 1
                    self.processes[i] = self.start()
                    self.logs_of[i] = self.log_files[-1]

    def kill_one(self, pick: Any) -> None:
        with self.lock:
            pick(self.processes).send_signal(signal.SIGKILL)

    def stop_all(self) -> list[int]:
        with self.lock:
            self._wait_started()
            for process in self.processes:
                if process.poll() is None:
                    process.send_signal(signal.SIGTERM)
            codes = []
            for process in self.processes:
                try:
                    codes.append(process.wait(60))
                except subprocess.TimeoutExpired:
                    process.kill()
                    codes.append(process.wait())
            self.processes, self.logs_of = [], []
            return codes


def outbox_pending(engine: Engine) -> int:
    """Rows still in the outbox (None-safe across a failover: -1 when it cannot be read)."""
    try:
        with engine.connect() as connection:
            count = connection.execute(select(func.count()).select_from(outbox_message))
            return int(count.scalar_one())
    except OperationalError:
        return -1


def followup_ledger(engine: Engine) -> Counter[int]:
    """op -> committed follow-up rows."""
    with engine.connect() as connection:
        rows = connection.execute(select(followups.c.op, func.count()).group_by(followups.c.op))
        return Counter({int(op): int(n) for op, n in rows})


def outbox_report(
    committed: Iterable[int],
    follow: Counter[int],
    *,
    pending: int,
    relay_logs: list[Path],
    relay_exits: Counter[str],
    final_codes: list[int],
) -> dict[str, Any]:
    """The stage's figures and violations (lists of operations; empty when sound)."""
    committed_ops = set(committed)
    stats: Counter[str] = Counter()
    for path in relay_logs:  # each relay's last stats line (a killed one: up to 1 s old)
        lines = _STATS.findall(path.read_text(errors="replace"))
        if lines:
            stats.update(dict(zip(_FIELDS, map(int, lines[-1]), strict=True)))
    report: dict[str, Any] = {
        "followups_committed": sum(follow.values()),
        "operations_with_followup": len(follow),
        "relays_spawned": len(relay_logs),
        "relay_exits_during_run": dict(relay_exits),
        "relay_final_exit_codes": final_codes,
        "relay_stats": dict(stats),
        "outbox_rows_at_end": pending,
        "violations": {
            "followup_missing": sorted(committed_ops - set(follow)),
            "followup_doubled": sorted(op for op, n in follow.items() if n > 1),
            "followup_without_commit": sorted(set(follow) - committed_ops),
        },
    }
    report["sound"] = (
        not any(report["violations"].values())
        and pending == 0
        and all(code == 0 for code in final_codes)
        and set(relay_exits) <= {"SIGKILL"}
    )
    return report


def report_lines(report: dict[str, Any]) -> list[str]:
    """The stage's lines in the harness's one-screen report."""
    violations = {k: len(v) for k, v in report["violations"].items() if v}
    return [
        f"  outbox follow-ups             {report['followups_committed']:>8} committed for "
        f"{report['operations_with_followup']} ops; relays spawned "
        f"{report['relays_spawned']} (exits {report['relay_exits_during_run']}), rows left "
        f"{report['outbox_rows_at_end']}",
        f"  relay stats (summed)          {report['relay_stats']}",
        f"  follow-up violations          {violations or 'none'}",
    ]
