"""The Celery chaos run's processes and outside faults: two prefork workers (a worker whose
main process dies is restarted), two beats, and the loop that kills pool children and main
processes and cuts the workers' broker connections until every task is accounted for."""

from __future__ import annotations

import argparse
import contextlib
import itertools
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from celery_chaos_app import rows
from celery_chaos_ledger import slow_redeliveries
from common import start_celery_worker, stop_worker
from kombu import Connection
from sqlalchemy import Engine, func, select
from tcp_proxy import TcpProxy

HERE = Path(__file__).resolve().parent


def children(pid: int) -> list[int]:
    """The child processes of ``pid`` (a worker's pool children)."""
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def pending(broker: str, queue: str) -> int:
    """Messages of ``queue`` not yet finished: ready ones, and on Redis the unacked ones of
    this run (kept under the run's own unacked key)."""
    with Connection(broker) as connection:
        channel = connection.default_channel
        try:
            ready = int(channel.queue_declare(queue, passive=True).message_count)
        except Exception:  # no such queue yet
            ready = 0
        if broker.startswith("redis"):
            ready += int(channel.client.hlen(f"{queue}.unacked"))
        return ready


class Fleet:
    """The run's processes: workers (restarted when their main process is killed) and beats."""

    def __init__(self, queue: str, env: dict[str, str], broker: str) -> None:
        self.queue, self.env = queue, env
        self.workers = [self._worker(), self._worker()]
        self.dead: list[subprocess.Popen[bytes]] = []
        beat = [sys.executable, "-m", "celery", "-A", "celery_chaos_app", "beat", "-l", "error"]
        markers = Path(env["CHAOS_MARKERS"])
        self.beats = [
            subprocess.Popen(
                [*beat, "-s", str(markers / f"beat{n}"), f"--pidfile={markers / f'beat{n}.pid'}"],
                cwd=HERE,
                # Straight to the broker: a beat's send lost in a cut would be no inbox fault.
                env={**os.environ, **env, "CHAOS_ROLE": "beat", "CHAOS_BROKER": broker},
                start_new_session=True,
            )
            for n in range(2)
        ]

    def _worker(self) -> subprocess.Popen[bytes]:
        return start_celery_worker("celery_chaos_app", self.queue, self.env, log_level="critical")

    def replace_dead(self) -> None:
        """A worker whose main process died (killed from outside or by its task) is restarted."""
        for n, worker in enumerate(self.workers):
            if worker.poll() is not None:
                self.dead.append(worker)
                self.workers[n] = self._worker()

    def stop_beats(self) -> None:
        """``kill -9`` of both beats."""
        for beat in self.beats:
            os.killpg(beat.pid, signal.SIGKILL)
            beat.wait()
        self.beats = []

    def stop(self) -> None:
        """Beats killed, workers stopped, orphaned pool children of killed workers killed."""
        if self.beats:
            self.stop_beats()
        for worker in self.workers:
            stop_worker(worker)
        for worker in self.dead:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(worker.pid, signal.SIGKILL)


@dataclass
class Chaos:
    """The outside faults of one run, and when it is over."""

    fleet: Fleet
    proxy: TcpProxy
    db: Engine
    broker: str
    queue: str
    everything: list[int]
    slow_refs: list[int]
    slow_sleep: float
    markers: Path
    options: argparse.Namespace
    counts: dict[str, int] = field(default_factory=lambda: {"children": 0, "mains": 0})

    def run(self) -> None:
        """Faults until every task is written or dead-lettered, nothing is pending and that
        held for ``--quiet`` seconds, or until nothing moved for ``--settle`` seconds (what is
        missing then is lost)."""
        options = self.options
        chance = random.Random(options.seed + 1)
        turns = itertools.cycle(["child", "cut", "child", "main"])
        beats_end = time.monotonic() + options.beat_seconds
        query = select(func.count(func.distinct(rows.c.ref)))
        seen, last_change, quiet_since = -1, time.monotonic(), None
        next_fault = time.monotonic() + options.fault_every
        while True:
            self.fleet.replace_dead()
            with self.db.connect() as connection:
                done = int(connection.execute(query).scalar_one())
            if done != seen:
                seen, last_change = done, time.monotonic()
            if self.fleet.beats and time.monotonic() >= beats_end:
                self.fleet.stop_beats()
            # The dead-letter queue may hold several copies of one task: this only says when
            # to stop injecting faults; the ledger counts exactly.
            accounted = done + _depth(self.broker, f"{self.queue}.dlq") >= len(self.everything)
            idle = accounted and not self.fleet.beats and pending(self.broker, self.queue) == 0
            quiet_since = (quiet_since or time.monotonic()) if idle else None
            if quiet_since is not None and time.monotonic() - quiet_since >= options.quiet:
                return
            if time.monotonic() - last_change > options.settle:
                return
            # Faults start once tasks run (a child killed while the pool starts stops the
            # worker), and stop once all is accounted for.
            if time.monotonic() >= next_fault and done > 0 and not accounted:
                self._fault(next(turns), chance)
                next_fault = time.monotonic() + options.fault_every
            time.sleep(0.2)

    def _fault(self, turn: str, chance: random.Random) -> None:
        # While a slow task runs, the children running it and their main processes are
        # spared (a slow task killed every few seconds would never end), and until its
        # redelivery is seen no connection is cut either: a cut in that window made kombu
        # redeliver it only after its first run ended (seen), which proves nothing.
        slow_pids = self._slow_pids() if self._slow_running() else set()
        may_cut = not slow_pids or self._slow_redelivered()
        if turn == "cut" and not may_cut:
            turn = "child"
        if may_cut and (turn == "cut" or not self.proxy.cuts):  # one cut in any short run
            turn = "cut"
        if turn == "cut":
            self.proxy.cut()
            return
        worker = chance.choice(self.fleet.workers)
        alive = children(worker.pid)
        if turn == "main" and not slow_pids.intersection(alive):
            os.kill(worker.pid, signal.SIGKILL)
            self.counts["mains"] += 1
            return
        victims = [pid for pid in alive if pid not in slow_pids]
        if victims:
            os.kill(chance.choice(victims), signal.SIGKILL)
            self.counts["children"] += 1

    def _slow_running(self) -> bool:
        """A slow task is not committed yet."""
        if not self.slow_refs:
            return False
        with self.db.connect() as connection:
            query = select(func.count(func.distinct(rows.c.ref)))
            written = connection.execute(query.where(rows.c.ref.in_(self.slow_refs)))
            return int(written.scalar_one()) < len(self.slow_refs)

    def _slow_redelivered(self) -> bool:
        found = slow_redeliveries(self.markers, self.slow_refs, self.slow_sleep)
        return bool(found["slow_redelivered_while_running"])

    def _slow_pids(self) -> set[int]:
        """Pool children that run a slow task: spared, so its run outlives the timeout."""
        path = self.markers / "deliveries"
        if not self.slow_refs or not path.exists():
            return set()
        slow = {str(ref) for ref in self.slow_refs}
        lines = [line.split() for line in path.read_text().splitlines()]
        return {int(words[4]) for words in lines if words[1] in slow}


def _depth(broker: str, queue: str) -> int:
    with Connection(broker) as connection:
        try:
            return int(connection.default_channel.queue_declare(queue, passive=True).message_count)
        except Exception:  # no such queue yet
            return 0
