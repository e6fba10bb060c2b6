"""The chaos harness's ``--cluster`` mode: the run's broker and database are clusters that
the harness starts on this machine and breaks while the workers run.

* ``rabbit``: a three-node RabbitMQ cluster (:mod:`tools.cluster.rabbit`), quorum queues; the
  workers and the publisher get every node's URL (kombu fails over to the next one). Faults:
  a node stopped cleanly or SIGKILLed, the queue's leader or a follower, down for a few
  seconds and started again. One node at a time: a quorum of two always remains.
* ``postgres``: a primary and a streaming standby (:mod:`tools.cluster.postgres`), reached
  through a multi-host URL with ``target_session_attrs=read-write``. Fault: the primary is
  SIGKILLed, the standby promoted, the old primary rebuilt as the new standby.
  ``--replication sync`` (``remote_apply``) must lose nothing; ``async`` may lose commits
  that were acknowledged (and their deliveries acked) but had not reached the standby: the
  run reports them as lost operations instead of failing on them.
* ``both``: both at once.
* ``patroni``: three PostgreSQL members under Patroni and one etcd
  (:mod:`tools.cluster.patroni`), reached through the multi-host URL. Faults take turns: a
  failover (the leader's Patroni and PostgreSQL SIGKILLed; a replica takes over once the
  leader key expires; the old leader rejoins) and a switchover (Patroni's REST API).
  ``--replication sync`` is Patroni's ``synchronous_mode: true`` with ``remote_apply``.
"""

from __future__ import annotations

import itertools
import random
import shutil
import sys
import tempfile
import threading
import time
from collections import Counter
from contextlib import ExitStack
from pathlib import Path
from types import TracebackType
from typing import Self

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tools.cluster._process import ClusterError, Watchdog
from tools.cluster.patroni import PatroniCluster
from tools.cluster.postgres import PostgresPair
from tools.cluster.rabbit import RabbitCluster

__all__ = ["CLUSTERS", "ClusterMode"]

CLUSTERS = ("rabbit", "postgres", "both", "patroni")
RABBIT_FAULTS = ("rabbit_kill_leader", "rabbit_stop_leader", "rabbit_kill_node", "rabbit_stop_node")


class ClusterMode:
    """The clusters of one run, their URLs, and a thread that injects their faults."""

    def __init__(self, kind: str, *, synchronous: bool, node_downtime: float = 3.0) -> None:
        if kind not in CLUSTERS:
            raise ValueError(f"--cluster must be one of {', '.join(CLUSTERS)}, got {kind!r}")
        self.kind = kind
        self.synchronous = synchronous
        self.node_downtime = node_downtime
        self.rabbit: RabbitCluster | None = None
        self.postgres: PostgresPair | PatroniCluster | None = None
        self.faults: Counter[str] = Counter()
        self.errors: list[str] = []
        self.pg_unavailable: list[float] = []
        self.pg_switchover_stalls: list[float] = []
        self._stack = ExitStack()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._workers_watchdog: Watchdog | None = None

    def __enter__(self) -> Self:
        with ExitStack() as stack:
            if self.kind in ("rabbit", "both"):
                self.rabbit = stack.enter_context(RabbitCluster())
            if self.kind in ("postgres", "both"):
                self.postgres = stack.enter_context(PostgresPair(synchronous=self.synchronous))
            if self.kind == "patroni":
                self.postgres = stack.enter_context(PatroniCluster(synchronous=self.synchronous))
            self._stack = stack.pop_all()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop_faults()
        self._stack.close()

    # -- what the harness connects to --------------------------------------------------

    def rabbitmqctl(self, *args: str) -> str:
        """``rabbitmqctl`` on a running node; retried on another while a fault is under way."""
        assert self.rabbit is not None
        for attempt in range(20):
            try:
                return self.rabbit.ctl("--quiet", *args)
            except ClusterError:
                if attempt == 19:
                    raise
                time.sleep(0.5)
        raise AssertionError("unreachable")

    def broker_url(self, vhost: str) -> str:
        """Every node's URL for ``vhost``, ``;``-separated (kombu's failover list)."""
        assert self.rabbit is not None
        return self.rabbit.url(vhost)

    def database_url(self) -> str:
        """The pair's multi-host URL."""
        assert self.postgres is not None
        return self.postgres.url()

    @property
    def worker_args(self) -> list[str]:
        """Extra ``inbox-worker`` arguments: quorum queues on a RabbitMQ cluster."""
        return ["--queue-type", "quorum"] if self.rabbit is not None else []

    # -- faults ------------------------------------------------------------------------

    def start_faults(self, rng: random.Random, interval: float, vhost: str, queue: str) -> None:
        """Inject one cluster fault every ``interval`` seconds (±50 %) until :meth:`stop_faults`.

        The kinds take turns in a fixed order (with ``both``: a failover, the RabbitMQ queue
        leader's crash, a failover, the leader stopped, ...), so a short run sees the first
        kinds of each."""
        rabbit = list(RABBIT_FAULTS) if self.rabbit else []
        postgres = ["pg_failover"] * (len(rabbit) or 1) if self.postgres else []
        if self.kind == "patroni":
            postgres = ["pg_failover", "pg_switchover"]
        order = [k for pair in itertools.zip_longest(postgres, rabbit) for k in pair if k]
        kinds = itertools.cycle(order)

        def loop() -> None:
            while not self._stop.wait(rng.uniform(0.5, 1.5) * interval):
                kind = next(kinds)
                try:
                    self._inject(kind, rng, vhost, queue)
                except Exception as exc:  # reported: the run is then not exact
                    self.errors.append(f"{kind}: {type(exc).__name__}: {exc}")
                    return

        self._thread = threading.Thread(target=loop, name="cluster-faults", daemon=True)
        self._thread.start()

    def stop_faults(self) -> None:
        """Stop injecting; return once the fault under way is over and every node runs."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(300)
            if self._thread.is_alive():
                self.errors.append("the fault thread did not finish within 300 s")
            self._thread = None

    def track_workers(self, pids: set[int], marker: str) -> None:
        """Have the workers SIGKILLed too if the harness dies without its teardown (their
        cluster would be gone, and a worker retries a lost broker for ever)."""
        if self._workers_watchdog is None:
            root = Path(tempfile.mkdtemp(prefix="chaos-workers-"))
            self._workers_watchdog = Watchdog(root, marker)
            self._stack.callback(shutil.rmtree, root, ignore_errors=True)
            self._stack.callback(self._workers_watchdog.close)  # runs first
        self._workers_watchdog.watch_pids(pids)

    def abort(self) -> None:
        """Kill the clusters now: a fault failed and a sync primary without its standby
        would hold every commit (the teardown's too) for ever."""
        self._stop.set()
        self._stack.close()

    def _inject(self, kind: str, rng: random.Random, vhost: str, queue: str) -> None:
        if kind == "pg_failover":
            assert self.postgres is not None
            self.pg_unavailable.append(self.postgres.failover())
            self.faults[kind] += 1
            return
        if kind == "pg_switchover":
            assert isinstance(self.postgres, PatroniCluster)
            self.pg_switchover_stalls.append(self.postgres.switchover())
            self.faults[kind] += 1
            return
        assert self.rabbit is not None
        leader = self.rabbit.leader(queue, vhost)
        if kind.endswith("_leader"):
            name = leader
        else:
            name = rng.choice([n.name for n in self.rabbit.nodes if n.name != leader])
        if kind.startswith("rabbit_kill"):
            self.rabbit.kill_node(name)
        else:
            self.rabbit.stop_node(name)
        self.faults[kind] += 1
        time.sleep(self.node_downtime)
        self.rabbit.start_node(name)

    def report(self) -> dict[str, object]:
        """What the cluster mode did, for the run's JSON."""
        report: dict[str, object] = {"cluster": self.kind, "errors": self.errors}
        if self.postgres is not None:
            report["replication"] = "sync" if self.synchronous else "async"
            report["pg_promotions"] = self.postgres.promotions
            if self.pg_unavailable:
                report["pg_unwritable_seconds_max"] = round(max(self.pg_unavailable), 2)
            if self.pg_switchover_stalls:
                report["pg_switchover_unwritable_seconds"] = [
                    round(s, 2) for s in self.pg_switchover_stalls
                ]
        if self.rabbit is not None:
            report["rabbit_nodes"] = [n.name for n in self.rabbit.nodes]
        return report
