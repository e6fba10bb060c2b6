"""Workers claiming the same keys through different Galera nodes, under node kills and a node
leaving and rejoining, and a network split: every operation committed once, none dead-lettered.

    python tools/cluster/galera_conflicts.py --ops 1000 --fault-interval 6 [--sync-wait 0]

Three workers, each with its own ``Inbox`` on its own node (and the other two as fallbacks
when its node is down or not ready), are handed every operation at the same instant: the
three claims of one message race on three nodes. Galera does not take row locks across nodes,
so two of them do not wait on the unique index as on one server: each inserts its claim
locally and the one certified second fails at COMMIT with error 1213 (a certification
conflict, reported as a deadlock). The inbox must treat that as transient (re-run the
transaction), and the re-run must find the winner's claim (a duplicate): never a second
commit. What a worker does after ``process`` raised is decided by the shared delivery policy
(:func:`inbox.delivery._policy.decide`, as the kombu and FastStream edges do): a retry after
its delay, or a dead letter, which must never happen here.

Faults take turns, one at a time, every ``--fault-interval`` seconds (±50 %): a node
SIGKILLed, a node shut down cleanly (it leaves the cluster), each started again
``--downtime`` seconds later (it rejoins by IST), and a node cut off from its peers
(``gmcast.isolate``: a network split leaving it a non-primary component of one) for
``--downtime`` seconds, then healed. Exit 0 only when nothing is doubled, lost or dead-lettered.
"""

from __future__ import annotations

import argparse
import logging
import queue
import random
import sys
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import pymysql
from sqlalchemy import (
    BigInteger,
    Column,
    Engine,
    MetaData,
    String,
    Table,
    create_engine,
    event,
    func,
    select,
)
from sqlalchemy.engine import ExceptionContext
from sqlalchemy.orm import Session, sessionmaker

from inbox import Inbox, Message, Outcome, ProcessResult
from inbox.broker import RetryPolicy
from inbox.delivery._policy import DeadLetter, Retry, decide
from inbox.schema import metadata as inbox_metadata
from tools.cluster.galera import DATABASE, GaleraCluster, GaleraNode

__all__ = ["Figures", "main", "run"]

HANDLER = "galera.apply"
# A broker retry after the inbox's own re-runs gave up: long enough to outlast a node loss
# (a killed node is declared dead after evs.inactive_timeout, 6 s here).
POLICY = RetryPolicy(delays=(0.1, 0.2, 0.5, 1.0, 2.0, 4.0), max_tries=10)

metadata = MetaData()
effects = Table(
    "galera_effect",
    metadata,
    Column("id", BigInteger, primary_key=True, autoincrement=True),  # Galera: a PK everywhere
    Column("ref", String(64), nullable=False),
)


@dataclass
class Figures:
    """What one run measured."""

    operations: int = 0
    claims: int = 0
    processed: int = 0
    duplicates: int = 0
    conflicts_at_commit: int = 0
    conflicts_in_statement: int = 0
    transient_reruns: int = 0
    redeliveries: int = 0
    dead_letters: int = 0
    faults: Counter[str] = field(default_factory=Counter)
    doubled: int = 0
    lost: int = 0
    wall: float = 0.0
    errors: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def ok(self) -> bool:
        """Nothing doubled, lost or dead-lettered, and no other error."""
        return not (self.doubled or self.lost or self.dead_letters or self.errors)

    def add(self, name: str, n: int = 1) -> None:
        """Count ``n`` more of ``name`` (thread-safe)."""
        with self.lock:
            setattr(self, name, getattr(self, name) + n)

    def line(self, sync_wait: int) -> str:
        """The figures on one line."""
        faults = ", ".join(f"{k} {v}" for k, v in sorted(self.faults.items())) or "none"
        return (
            f"galera (wsrep_sync_wait={sync_wait}): operations {self.operations} "
            f"({self.claims} claims through 3 nodes), faults: {faults}; "
            f"1213 at COMMIT {self.conflicts_at_commit}, 1213 in a statement "
            f"{self.conflicts_in_statement}, transaction re-runs {self.transient_reruns}, "
            f"redeliveries {self.redeliveries}; processed {self.processed}, duplicates "
            f"{self.duplicates}; doubled {self.doubled}, lost {self.lost}, dead letters "
            f"{self.dead_letters}; {self.wall:.0f} s"
            + (f"; errors: {'; '.join(self.errors[:5])}" if self.errors else "")
        )


class _CountReruns(logging.Handler):
    def __init__(self, figures: Figures) -> None:
        super().__init__(logging.INFO)
        self.figures = figures

    def emit(self, record: logging.LogRecord) -> None:
        if "transient database error" in record.getMessage():
            self.figures.add("transient_reruns")


def _connector(preferred: GaleraNode, others: list[GaleraNode]) -> Any:
    """Connect to ``preferred``, or the first of ``others`` that is in the primary component
    and ready (a joining or partitioned node answers every query with error 1047)."""

    def connect() -> pymysql.Connection[Any]:
        last: Exception | None = None
        for node in [preferred, *others]:
            try:
                connection = node.connect(DATABASE)
                connection.autocommit(False)
                with connection.cursor() as cursor:
                    cursor.execute("SHOW STATUS LIKE 'wsrep_ready'")
                    row = cursor.fetchone()
                if row is not None and row[1] == "ON":
                    return connection
                connection.close()
            except pymysql.MySQLError as exc:
                last = exc
        raise last or pymysql.err.OperationalError(2003, "no Galera node is ready")

    return connect


def _engine(node: GaleraNode, others: list[GaleraNode], figures: Figures) -> Engine:
    engine = create_engine(
        "mysql+pymysql://",
        creator=_connector(node, others),
        pool_pre_ping=True,
        pool_size=2,
    )

    @event.listens_for(engine, "handle_error")
    def count_conflicts(context: ExceptionContext) -> None:
        args = getattr(context.original_exception, "args", ())
        if args and args[0] == 1213:
            # SQLAlchemy reports a failed COMMIT without a statement.
            at_commit = context.statement is None
            figures.add("conflicts_at_commit" if at_commit else "conflicts_in_statement")

    return engine


def _worker(
    inbox: Inbox, inbound: queue.Queue[Message | None], done: queue.Queue[str], figures: Figures
) -> None:
    while (message := inbound.get()) is not None:
        tries = 0
        while True:
            try:
                outcome: ProcessResult | BaseException = inbox.process(message)
            except Exception as exc:
                outcome = exc
            decision = decide(outcome, tries, POLICY)
            if isinstance(outcome, ProcessResult):
                figures.add("claims")
                for o in outcome.outcomes.values():
                    figures.add("processed" if o is Outcome.PROCESSED else "duplicates")
                break
            if isinstance(decision, Retry):
                figures.add("redeliveries")
                tries = decision.tries
                time.sleep(decision.delay_ms / 1000)
                continue
            if isinstance(decision, DeadLetter):
                figures.add("dead_letters")
                with figures.lock:
                    figures.errors.append(f"dead letter {message.body['ref']}: {decision.detail}")
            else:
                with figures.lock:
                    figures.errors.append(f"{message.body['ref']}: {decision}")
            break
        done.put(str(message.body["ref"]))


def _faults(
    cluster: GaleraCluster,
    interval: float,
    downtime: float,
    stop: threading.Event,
    figures: Figures,
) -> None:
    rng = random.Random()
    turn = 0
    while not stop.wait(interval * rng.uniform(0.5, 1.5)):
        node = cluster.nodes[turn % len(cluster.nodes)]
        kind = ("kill", "leave", "split")[turn % 3]
        turn += 1
        try:
            if kind == "split":
                cluster.isolate_node(node.name)
                time.sleep(downtime)
                cluster.heal_node(node.name)
                figures.faults["cut off+healed"] += 1
                continue
            if kind == "kill":
                cluster.kill_node(node.name)
            else:
                cluster.stop_node(node.name)
            time.sleep(downtime)
            how = cluster.start_node(node.name)
            figures.faults[f"{'killed' if kind == 'kill' else 'left'}+rejoined ({how})"] += 1
        except Exception as exc:
            with figures.lock:
                figures.errors.append(f"fault on {node.name}: {type(exc).__name__}: {exc}")
            return


def _count_effects(engine: Engine, refs: list[str], figures: Figures) -> None:
    with engine.connect() as connection:
        rows = connection.execute(select(effects.c.ref, func.count()).group_by(effects.c.ref))
        counts = {str(ref): int(count) for ref, count in rows}
    figures.doubled = sum(1 for count in counts.values() if count > 1)
    figures.lost = sum(1 for ref in refs if ref not in counts)


def run(
    ops: int, *, fault_interval: float, downtime: float, sync_wait: int, min_faults: int = 0
) -> Figures:
    """One run (see the module doc)."""
    figures = Figures()
    started = time.monotonic()
    counter = _CountReruns(figures)
    logging.getLogger("inbox.core").addHandler(counter)
    logging.getLogger("inbox.core").setLevel(logging.INFO)
    logging.getLogger("inbox.core").propagate = False
    with GaleraCluster(sync_wait=sync_wait) as cluster:
        setup = create_engine(cluster.url(cluster.nodes[0]), pool_pre_ping=True)
        inbox_metadata.create_all(setup)
        metadata.create_all(setup)
        engines = [
            _engine(node, [n for n in cluster.nodes if n is not node], figures)
            for node in cluster.nodes
        ]
        inboxes = []
        for engine in engines:
            inbox = Inbox(sessionmaker(engine))

            @inbox.handler("op", name=HANDLER)
            def apply(message: Message, session: Session) -> None:
                session.execute(effects.insert().values(ref=message.body["ref"]))

            inboxes.append(inbox)
        queues: list[queue.Queue[Message | None]] = [queue.Queue() for _ in inboxes]
        done: queue.Queue[str] = queue.Queue()
        threads = [
            threading.Thread(target=_worker, args=(inbox, q, done, figures), daemon=True)
            for inbox, q in zip(inboxes, queues, strict=True)
        ]
        for thread in threads:
            thread.start()
        stop = threading.Event()
        faulter = threading.Thread(
            target=_faults, args=(cluster, fault_interval, downtime, stop, figures), daemon=True
        )
        faulter.start()
        refs: list[str] = []
        n = -1
        while (n := n + 1) < ops or sum(figures.faults.values()) < min_faults:
            ref = f"op-{n}"
            refs.append(ref)
            message = Message(uuid.uuid4(), "op", {"ref": ref})
            for q in queues:
                q.put(message)  # three claims of one message, on three nodes at once
            # The next one once a worker has settled this one (the others race it).
            while done.get(timeout=300) != ref:
                pass
            if figures.errors:
                break
        figures.operations = len(refs)
        stop.set()
        faulter.join(300)
        for q in queues:
            q.put(None)
        for thread in threads:
            thread.join(600)
            if thread.is_alive():
                figures.errors.append("a worker did not finish its backlog")
        for node in cluster.nodes:
            if not node.running:
                cluster.start_node(node.name)
        _count_effects(setup, refs, figures)
        for engine in [*engines, setup]:
            engine.dispose()
    logging.getLogger("inbox.core").removeHandler(counter)
    figures.wall = time.monotonic() - started
    return figures


def main(argv: list[str] | None = None) -> int:
    """Run once, print the figures; 0 when nothing was doubled, lost or dead-lettered."""
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=1000)
    parser.add_argument("--fault-interval", type=float, default=6.0)
    parser.add_argument("--downtime", type=float, default=2.0)
    parser.add_argument("--sync-wait", type=int, default=7, help="wsrep_sync_wait (default 7)")
    parser.add_argument(
        "--min-faults", type=int, default=2, help="run on until this many faults (default 2)"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.CRITICAL)
    # A pooled connection whose node left the primary component fails its reset (1047) and
    # is discarded: SQLAlchemy logs that at ERROR, expectedly here.
    logging.getLogger("sqlalchemy.pool").setLevel(logging.CRITICAL)
    figures = run(
        args.ops,
        fault_interval=args.fault_interval,
        downtime=args.downtime,
        sync_wait=args.sync_wait,
        min_faults=args.min_faults,
    )
    print(figures.line(args.sync_wait), flush=True)
    return 0 if figures.ok else 1


if __name__ == "__main__":
    sys.exit(main())
