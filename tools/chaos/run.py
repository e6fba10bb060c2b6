"""Chaos harness: many things go wrong at once, and every operation still commits exactly once.

    .venv/bin/python tools/chaos/run.py                       # short mode (CI): 5,000 ops
    .venv/bin/python tools/chaos/run.py --database mariadb    # the same on MariaDB
    .venv/bin/python tools/chaos/run.py --soak                # 200,000 ops + a DB restart
    .venv/bin/python tools/chaos/run.py --cluster both        # clusters: see cluster_mode.py
    .venv/bin/python tools/chaos/run.py --outbox              # follow-ups: see outbox_stage.py

Publishes N business operations through RabbitMQ (a vhost of its own) with duplicates:
copies under the same message id (producer retries, redeliveries) and copies under a fresh id
with the same ``idempotency-key``. K ``inbox-worker`` processes (``app.py``) consume them into
a fresh PostgreSQL schema or MariaDB database while the harness injects faults at random:
SIGKILL of a worker from outside, SIGKILL from inside a handler and between commit and ack,
server-side closes of every AMQP connection, terminations of the workers' database
sessions, handlers that raise, poison operations that always raise, and (soak) a database
restart. Killed workers are respawned. At the end the ledger must show every operation
committed exactly once, or dead-lettered with its reason: zero missing, zero doubled.

Prints a one-screen report and writes JSON to tools/chaos/results/; exits 1 if the ledger
is not exact.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import random
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chaos_tables import effects, metadata
from cluster_mode import CLUSTERS, ClusterMode
from effect_stage import MODES, PROVIDER_FILE, effect_report, provider_calls, report_lines
from kombu import Connection
from outbox_stage import (
    FOLLOWUP_QUEUE,
    FOLLOWUP_TARGET,
    Relays,
    followup_ledger,
    outbox_pending,
    outbox_report,
)
from outbox_stage import report_lines as outbox_lines
from sqlalchemy import Engine, create_engine, func, select, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import OperationalError

from inbox.broker import Publisher
from inbox.errors import PublishError
from inbox.schema import metadata as inbox_metadata

HERE = Path(__file__).resolve().parent
QUEUE = "ops"
URLS = {
    "postgresql": "postgresql+psycopg://postgres@127.0.0.1:5432/test",
    "mariadb": "mysql+pymysql://root@127.0.0.1:3306/test",
}
AMQP = "amqp://guest:guest@127.0.0.1:5672"


@dataclass
class Settings:
    """Everything a run is configured with (recorded in the JSON)."""

    database: str
    ops: int
    workers: int
    same_id_rate: float
    fresh_id_rate: float
    fail_rate: float
    poison_every: int
    kill_in_handler: float
    kill_after_commit: float
    fault_interval: float
    restart_database: bool
    seed: int
    timeout: float
    cluster: str | None = None
    replication: str = "sync"
    cluster_fault_interval: float = 8.0
    effects: str | None = None
    kill_in_call: float = 0.0
    outbox: bool = False
    relays: int = 2


@dataclass
class Run:
    """What happened during a run."""

    published: int = 0
    same_id_copies: int = 0
    fresh_id_copies: int = 0
    publish_retries: int = 0
    faults: Counter[str] = field(default_factory=Counter)
    spawned: int = 0
    exits: Counter[str] = field(default_factory=Counter)


def rabbitmqctl(*args: str) -> str:
    done = subprocess.run(
        ["rabbitmqctl", "--quiet", *args], capture_output=True, text=True, timeout=120, check=True
    )
    return done.stdout


@contextmanager
def vhost(ctl: Callable[..., str] = rabbitmqctl) -> Iterator[str]:
    """A RabbitMQ vhost of its own: faults close only this run's connections."""
    name = f"chaos-{uuid.uuid4().hex[:8]}"
    ctl("add_vhost", name)
    ctl("set_permissions", "-p", name, "guest", ".*", ".*", ".*")
    try:
        yield name
    finally:
        ctl("delete_vhost", name)


@contextmanager
def database(
    kind: str, application_name: str, base_url: str | None = None
) -> Iterator[tuple[str, Engine]]:
    """A fresh schema (PostgreSQL) or database (MariaDB) with the inbox and effect tables."""
    base = make_url(base_url or URLS[kind])
    name = f"chaos_{uuid.uuid4().hex[:12]}"
    admin = create_engine(base, isolation_level="AUTOCOMMIT", pool_pre_ping=True)
    with admin.connect() as connection:
        connection.execute(
            text(f"CREATE {'SCHEMA' if kind == 'postgresql' else 'DATABASE'} {name}")
        )
    if kind == "postgresql":
        url = base.update_query_dict(
            {"options": f"-csearch_path={name}", "application_name": application_name}
        )
    else:
        url = base.set(database=name)
    engine = create_engine(url, pool_pre_ping=True)
    inbox_metadata.create_all(engine)
    metadata.create_all(engine)
    try:
        yield url.render_as_string(hide_password=False), engine
    finally:
        engine.dispose()
        with admin.connect() as connection:
            drop = (
                f"DROP SCHEMA {name} CASCADE" if kind == "postgresql" else f"DROP DATABASE {name}"
            )
            connection.execute(text(drop))
        admin.dispose()


class Workers:
    """K ``inbox-worker`` processes, respawned when they die."""

    def __init__(self, settings: Settings, broker: str, database_url: str, logs: Path) -> None:
        self.settings = settings
        self.broker = broker
        self.database_url = database_url
        self.logs = logs
        self.processes: list[subprocess.Popen[bytes]] = []
        self.log_files: list[Path] = []
        self.run = Run()
        self.lock = threading.Lock()
        self.extra_args: list[str] = []
        self.target, self.queue, self.count = "app:inbox", QUEUE, settings.workers
        self.logs_of: list[Path] = []  # the log of each process in self.processes

    def start(self) -> subprocess.Popen[bytes]:
        script = Path(sys.executable).with_name("inbox-worker")
        command = [str(script)] if script.exists() else [sys.executable, "-m", "inbox.broker.cli"]
        log = self.logs / f"worker-{len(self.log_files):03d}.log"
        env = {
            **os.environ,
            "CHAOS_DATABASE_URL": self.database_url,
            "CHAOS_FAIL_RATE": str(self.settings.fail_rate),
            "CHAOS_POISON_EVERY": str(self.settings.poison_every),
            "CHAOS_KILL_IN_HANDLER": str(self.settings.kill_in_handler),
            "CHAOS_KILL_AFTER_COMMIT": str(self.settings.kill_after_commit),
            "CHAOS_EFFECT_MODE": self.settings.effects or "",
            "CHAOS_PROVIDER_FILE": str(self.logs / PROVIDER_FILE),
            "CHAOS_KILL_IN_CALL": str(self.settings.kill_in_call),
            "CHAOS_OUTBOX": "1" if self.settings.outbox else "",
        }
        with log.open("wb") as stderr:
            process = subprocess.Popen(
                [
                    *command, self.target, "--broker", self.broker, "--queue", self.queue,
                    "--prefetch", "20", "--max-tries", "8", "--retry-delays", "0.1,0.3,1",
                    "--log-level", "DEBUG", "--stats-interval", "3600",
                    "--connect-retries", "30", *self.extra_args,
                ],
                cwd=HERE,
                env=env,
                stderr=stderr,
                stdout=subprocess.DEVNULL,
            )  # fmt: skip
        self.log_files.append(log)
        self.run.spawned += 1
        return process

    def start_all(self) -> None:
        with self.lock:
            self.processes = [self.start() for _ in range(self.count)]
            self.logs_of = self.log_files[-self.count :]

    def respawn_dead(self) -> None:
        with self.lock:
            for i, process in enumerate(self.processes):
                code = process.poll()
                if code is not None:
                    self.run.exits["SIGKILL" if code == -signal.SIGKILL else f"exit {code}"] += 1
                    self.processes[i] = self.start()
                    self.logs_of[i] = self.log_files[-1]

    def kill_one(self, rng: random.Random) -> None:
        with self.lock:
            rng.choice(self.processes).send_signal(signal.SIGKILL)

    def stop_all(self) -> list[int]:
        with self.lock:
            # A worker respawned just now may not have installed its signal handlers yet
            # (a SIGTERM would end it with -15): wait until it consumes.
            deadline = time.monotonic() + 60
            for process, log in zip(self.processes, self.logs_of, strict=True):
                while process.poll() is None and time.monotonic() < deadline:
                    if "consuming " in log.read_text(errors="replace"):
                        break
                    time.sleep(0.2)
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
            return codes


def terminate_sessions(
    kind: str, engine: Engine, application_name: str, admin_url: str | None = None
) -> int:
    """End every database session of the workers, from the server side."""
    admin = create_engine(admin_url or URLS[kind], isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as connection:
            if kind == "postgresql":
                return len(
                    connection.execute(
                        text(
                            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                            "WHERE application_name = :name"
                        ),
                        {"name": application_name},
                    ).all()
                )
            schema = engine.url.database
            ids = connection.execute(
                text("SELECT id FROM information_schema.processlist WHERE db = :db"), {"db": schema}
            ).scalars()
            killed = 0
            for session_id in ids:
                try:
                    connection.execute(text(f"KILL {int(session_id)}"))
                    killed += 1
                except Exception:
                    pass  # the session ended meanwhile
            return killed
    finally:
        admin.dispose()


def publish_all(settings: Settings, broker: str, run: Run, done: threading.Event) -> None:
    """Publish every operation once, plus duplicate copies, in a shuffled order."""
    rng = random.Random(settings.seed)
    order = list(range(settings.ops))
    rng.shuffle(order)
    with Publisher(broker, routing_key=QUEUE) as publisher:

        def send(op: int, message_id: uuid.UUID | None) -> uuid.UUID:
            while True:
                try:
                    sent = publisher.publish(
                        "op", {"op": op}, idempotency_key=f"op-{op}", message_id=message_id
                    )
                except PublishError:
                    run.publish_retries += 1  # a fault closed the connection: send again
                    time.sleep(0.2)
                    continue
                run.published += 1
                return sent

        for op in order:
            first = send(op, None)
            if rng.random() < settings.same_id_rate:
                send(op, first)
                run.same_id_copies += 1
            if rng.random() < settings.fresh_id_rate:
                send(op, None)
                run.fresh_id_copies += 1
    done.set()


def queue_depths(vhost_name: str, ctl: Callable[..., str] = rabbitmqctl) -> dict[str, int]:
    """Messages (ready + unacked) per queue of the run's vhost."""
    out = ctl("list_queues", "-p", vhost_name, "--no-table-headers", "name", "messages")
    depths: dict[str, int] = {}
    for line in out.splitlines():
        # Only "<queue> <count>" rows: a node under stress may add a notice line.
        fields = line.split()
        if len(fields) == 2 and fields[1].isdigit():
            depths[fields[0]] = int(fields[1])
    return depths


def ledger(engine: Engine) -> Counter[int]:
    for attempt in range(30):  # a failover (--cluster postgres) may end the read: read again
        try:
            with engine.connect() as connection:
                rows = connection.execute(select(effects.c.op, func.count()).group_by(effects.c.op))
                return Counter({int(op): int(n) for op, n in rows})
        except OperationalError:
            if attempt == 29:
                raise
            time.sleep(1.0)
    raise AssertionError("unreachable")


def drain_dead_letters(broker: str) -> list[tuple[int, str]]:
    """(operation, reason) of every dead letter."""
    found: list[tuple[int, str]] = []
    with Connection(broker) as connection, connection.channel() as channel:
        while (raw := channel.basic_get(f"{QUEUE}.dlq", no_ack=False)) is not None:
            message = channel.message_to_python(raw)
            body = message.body
            op = json.loads(body if isinstance(body, str | bytes) else bytes(body))["op"]
            found.append((int(op), str(message.headers.get("x-inbox-reason"))))
            channel.basic_ack(raw.delivery_tag)
    return found


LOG_PATTERNS = {
    "processed": re.compile(r"\) processed by ledger\.apply"),
    "duplicates_skipped": re.compile(r"duplicate skipped"),
    "failed_tries": re.compile(r"try \d+/\d+ failed"),
    "dead_lettered": re.compile(r"dead-lettered to"),
    "self_kill_in_handler": re.compile(r"chaos: SIGKILL in-handler"),
    "self_kill_after_commit": re.compile(r"chaos: SIGKILL after-commit"),
    "self_kill_in_call": re.compile(r"chaos: SIGKILL in-call"),
    "transient_db_retries": re.compile(r"transient database error"),
    "broker_reconnects": re.compile(r"Connection to broker lost|broker connection failed"),
}


def count_logs(paths: list[Path]) -> dict[str, int]:
    counts: Counter[str] = Counter()
    for path in paths:
        text_ = path.read_text(errors="replace")
        for name, pattern in LOG_PATTERNS.items():
            counts[name] += len(pattern.findall(text_))
    return dict(counts)


def chaos(settings: Settings) -> dict[str, Any]:  # noqa: PLR0912, PLR0915 (one run, top to bottom)
    rng = random.Random(settings.seed + 1)
    application_name = f"chaos-{uuid.uuid4().hex[:8]}"
    logs = HERE / "results" / f"chaos-logs-{application_name}"
    logs.mkdir(parents=True, exist_ok=True)
    with ExitStack() as stack:
        mode = None
        if settings.cluster:
            synchronous = settings.replication == "sync"
            mode = stack.enter_context(ClusterMode(settings.cluster, synchronous=synchronous))
        ctl = mode.rabbitmqctl if mode and mode.rabbit else rabbitmqctl
        vhost_name = stack.enter_context(vhost(ctl))
        pg_url = mode.database_url() if mode and mode.postgres else None
        url, engine = stack.enter_context(database(settings.database, application_name, pg_url))
        broker = mode.broker_url(vhost_name) if mode and mode.rabbit else f"{AMQP}/{vhost_name}"
        workers = Workers(settings, broker, url, logs)
        workers.extra_args = mode.worker_args if mode else []
        stack.callback(workers.stop_all)  # however the run ends, no worker outlives it
        run = workers.run
        started = time.monotonic()
        stage = _outbox_stage(settings, broker, url, logs, stack)
        workers.start_all()
        published = threading.Event()
        publisher = threading.Thread(
            target=publish_all, args=(settings, broker, run, published), daemon=True
        )
        time.sleep(2.0)  # let the workers declare the topology before the first publish
        publisher.start()
        if mode:
            faults_rng = random.Random(settings.seed + 2)
            mode.start_faults(faults_rng, settings.cluster_fault_interval, vhost_name, QUEUE)
        # Asynchronous replication may lose acked commits: the run ends when the queues do.
        may_lose = bool(mode and mode.postgres and not mode.synchronous)
        # Quorum queues report their depth a few seconds late: trust "empty" only after a while.
        quiet_needed = 6.0 if mode and mode.rabbit else 3.0 if may_lose else 0.0
        # An at-most-once effect left uncertain is dead-lettered, never committed.
        uncertain = settings.effects == "at-most-once"
        quiet_needed = max(quiet_needed, 2.0 if uncertain else 0.0)
        quiet_since: float | None = None
        poison = {
            op
            for op in range(settings.ops)
            if settings.poison_every and op % settings.poison_every == 0
        }
        restarted = False
        next_fault = time.monotonic() + settings.fault_interval
        kinds = ["kill_worker", "close_amqp_connections", "terminate_db_sessions"]
        if settings.outbox:
            kinds.append("kill_relay")
        # Besides the clock, a fault fires at fixed shares of the committed operations, one
        # per kind: a run that a fast path finishes in a few seconds still meets every kind
        # while operations are in flight (the clock alone once gave a short run two faults).
        milestones = [settings.ops * (n + 1) // (len(kinds) + 2) for n in range(len(kinds))]
        while True:
            workers.respawn_dead()
            for pool in stage:
                pool.respawn_dead()
            now = time.monotonic()
            if now - started > settings.timeout:
                raise SystemExit(f"chaos: not settled after {settings.timeout} s")
            if mode:
                mode.track_workers({p.pid for p in workers.processes}, application_name)
            if mode and mode.errors:
                mode.abort()
                raise SystemExit(f"chaos: a cluster fault failed: {mode.errors[0]}")
            counts = ledger(engine)
            settled = published.is_set() and (
                may_lose or uncertain or len(counts) >= settings.ops - len(poison)
            )
            if settled and settings.outbox:  # every committed operation's follow-up is in
                settled = outbox_pending(engine) == 0 and len(followup_ledger(engine)) >= len(
                    counts
                )
            if settled:
                depths = queue_depths(vhost_name, ctl)
                busy = {q: n for q, n in depths.items() if q != f"{QUEUE}.dlq" and n}
                quiet_since = None if busy else quiet_since or now
                quiet = quiet_since is not None and now - quiet_since >= quiet_needed
                dead_letters = depths.get(f"{QUEUE}.dlq", 0)
                accounted = not uncertain or len(counts) + dead_letters >= settings.ops
                if quiet and dead_letters >= len(poison) and accounted:
                    break
            reached = bool(milestones) and len(counts) >= milestones[0]
            if (now >= next_fault or reached) and not settled:
                if reached:
                    milestones.pop(0)
                kind = kinds[sum(run.faults[k] for k in kinds) % len(kinds)]  # in turn
                if kind == "kill_worker":
                    workers.kill_one(rng)
                elif kind == "kill_relay":
                    stage[0].kill_one(rng.choice)
                elif kind == "close_amqp_connections":
                    ctl("close_all_connections", "--vhost", vhost_name, "chaos")
                else:
                    try:
                        terminate_sessions(settings.database, engine, application_name, pg_url)
                    except OperationalError:
                        if not pg_url:
                            raise
                        kind = "terminate_db_sessions_skipped_in_failover"
                run.faults[kind] += 1
                if settings.restart_database and not restarted and len(counts) > settings.ops // 2:
                    restart_database(settings.database)
                    run.faults["database_restart"] += 1
                    restarted = True
                next_fault = now + rng.uniform(0.5, 1.5) * settings.fault_interval
            time.sleep(0.25)
        if mode:
            mode.stop_faults()
        wall = time.monotonic() - started
        exit_codes = workers.stop_all()
        relay_codes = stage[0].stop_all() if stage else []
        followup_codes = stage[1].stop_all() if stage else []
        counts = ledger(engine)
        follow = followup_ledger(engine) if stage else Counter()
        pending = outbox_pending(engine) if stage else 0
        dead = drain_dead_letters(broker)
        final_depths = queue_depths(vhost_name, ctl)
        for _ in range(int(quiet_needed * 3)):  # the late depths of quorum queues catch up
            if not any(final_depths.values()):
                break
            time.sleep(1.0)
            final_depths = queue_depths(vhost_name, ctl)
        cluster_report = mode.report() if mode else None
    from_logs = count_logs(workers.log_files)
    dead_ops = {op for op, _ in dead}
    doubled = sorted(op for op, n in counts.items() if n > 1)
    missing = sorted(
        op for op in range(settings.ops) if counts.get(op, 0) == 0 and op not in dead_ops
    )
    poison_not_dead = sorted(poison - dead_ops)
    dead_not_poison = sorted(dead_ops - poison)
    report = {
        "operations": settings.ops,
        "messages_published": run.published,
        "same_id_copies": run.same_id_copies,
        "fresh_id_copies": run.fresh_id_copies,
        "publish_retries": run.publish_retries,
        "workers": settings.workers,
        "workers_spawned": run.spawned,
        "worker_exits_during_run": dict(run.exits),
        "final_exit_codes": exit_codes,
        "faults_injected": {
            **dict(run.faults),
            "self_kill_in_handler": from_logs.get("self_kill_in_handler", 0),
            "self_kill_after_commit": from_logs.get("self_kill_after_commit", 0),
            "self_kill_in_call": from_logs.get("self_kill_in_call", 0),
            "handler_failures_injected": from_logs.get("failed_tries", 0),
        },
        "from_worker_logs": from_logs,
        "effects_committed": sum(counts.values()),
        "operations_committed_once": sum(1 for n in counts.values() if n == 1),
        "doubled": doubled,
        "missing": missing,
        "dead_letters": dict(Counter(reason for _, reason in dead)),
        "dead_letter_operations": len(dead_ops),
        "poison_operations": len(poison),
        "poison_not_dead_lettered": poison_not_dead,
        "dead_lettered_not_poison": dead_not_poison,
        "queues_at_end": final_depths,
        "wall_seconds": round(wall, 1),
        "operations_per_second": round(settings.ops / wall, 1),
        "logs": str(logs),
    }
    if settings.effects:
        calls = provider_calls(logs / PROVIDER_FILE)
        report["effects"] = effect_report(settings.effects, calls, counts, dead)
    if stage:
        report["outbox"] = outbox_report(
            counts,
            follow,
            pending=pending,
            relay_logs=stage[0].log_files,
            relay_exits=stage[0].exits,
            final_codes=relay_codes,
        )
        report["outbox"]["followup_worker_exit_codes"] = followup_codes
        report["outbox"]["sound"] &= all(code == 0 for code in followup_codes)
    if cluster_report is not None:
        report["cluster"] = cluster_report
        faults = report["faults_injected"]
        assert isinstance(faults, dict)
        faults.update(mode.faults if mode else {})
    sound = (
        not doubled
        and not poison_not_dead
        and not (cluster_report and cluster_report["errors"])
        and all(n == 0 for n in final_depths.values())
        and all(code == 0 for code in exit_codes)
        and set(run.exits) <= {"SIGKILL"}  # a worker died only when the harness killed it
        and report.get("effects", {}).get("sound", True)
        and report.get("outbox", {}).get("sound", True)
    )
    report["exact"] = sound and not missing
    # With asynchronous replication a lost operation is the measured cost, not a bug.
    report["loss_expected"] = may_lose
    report["sound"] = sound and (may_lose or not missing)
    return report


def _outbox_stage(
    settings: Settings, broker: str, url: str, logs: Path, stack: ExitStack
) -> tuple[Relays, Workers] | tuple[()]:
    """With ``--outbox``: the follow-up workers (started first: they declare the queue the
    relays send to) and the relays, stopped however the run ends."""
    if not settings.outbox:
        return ()
    followers = Workers(settings, broker, url, logs)
    followers.target, followers.queue, followers.count = FOLLOWUP_TARGET, FOLLOWUP_QUEUE, 2
    stack.callback(followers.stop_all)
    followers.start_all()
    relays = Relays(settings.relays, broker, url, logs)
    stack.callback(relays.stop_all)
    time.sleep(2.0)  # the follow-up queue exists before the first row is relayed
    relays.start_all()
    return relays, followers


def restart_database(kind: str) -> None:
    if kind == "postgresql":
        version = sorted(os.listdir("/etc/postgresql"))[0]
        subprocess.run(
            ["pg_ctlcluster", "--skip-systemctl-redirect", version, "main", "restart"],
            check=True,
            timeout=120,
        )
    else:
        raise SystemExit("--restart-database is implemented for PostgreSQL only")


def print_report(report: dict[str, Any], settings: Settings) -> None:
    faults = report["faults_injected"]
    logged = report["from_worker_logs"]
    lines = [
        f"chaos on {settings.database}: {settings.ops} operations, {settings.workers} workers",
        f"  messages published            {report['messages_published']:>8} "
        f"(same-id copies {report['same_id_copies']}, fresh-id copies "
        f"{report['fresh_id_copies']}, publish retries {report['publish_retries']})",
        *(
            f"  {label:<30}{logged.get(key, 0):>8}"
            for label, key in (
                ("handler runs committed", "processed"),
                ("duplicates skipped", "duplicates_skipped"),
                ("failed tries (retried)", "failed_tries"),
                ("transient DB retries in place", "transient_db_retries"),
                ("broker reconnects", "broker_reconnects"),
            )
        ),
        "  faults injected               "
        + ", ".join(f"{k}={v}" for k, v in sorted(faults.items())),
        f"  workers spawned               {report['workers_spawned']:>8} "
        f"(exits during run: {report['worker_exits_during_run']})",
        f"  dead letters                  {report['dead_letter_operations']:>8} "
        f"{report['dead_letters']} (poison ops: {report['poison_operations']}, others: "
        f"{len(report['dead_lettered_not_poison'])})",
        f"  operations committed once     {report['operations_committed_once']:>8}",
        f"  doubled effects               {len(report['doubled']):>8}",
        f"  lost operations               {len(report['missing']):>8}",
        f"  queues at end                 {report['queues_at_end']}",
        f"  wall time                     {report['wall_seconds']:>8} s "
        f"({report['operations_per_second']} ops/s)",
        "EXACT: every operation committed once or dead-lettered with its reason"
        if report["exact"]
        else (
            f"NOT EXACT, as measured: {len(report['missing'])} acked operations lost with "
            "asynchronous replication, nothing doubled"
            if report["sound"]
            else "NOT EXACT"
        ),
    ]
    if "cluster" in report:
        lines.insert(-1, f"  cluster                       {report['cluster']}")
    if "effects" in report:
        lines[-1:-1] = report_lines(report["effects"])
    if "outbox" in report:
        lines[-1:-1] = outbox_lines(report["outbox"])
    print("\n".join(lines))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    parser.add_argument("--database", choices=sorted(URLS), default="postgresql")
    parser.add_argument("--soak", action="store_true", help="200,000 ops and a database restart")
    parser.add_argument("--ops", type=int, default=None)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--same-id-rate", type=float, default=0.2)
    parser.add_argument("--fresh-id-rate", type=float, default=0.1)
    parser.add_argument("--fail-rate", type=float, default=0.02)
    parser.add_argument("--poison-every", type=int, default=997)
    parser.add_argument("--kill-in-handler", type=float, default=0.001)
    parser.add_argument("--kill-after-commit", type=float, default=0.001)
    parser.add_argument("--fault-interval", type=float, default=1.5)
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--timeout", type=float, default=None)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument(
        "--cluster", choices=CLUSTERS, default=None, help="run on clusters it starts and breaks"
    )
    parser.add_argument("--replication", choices=["sync", "async"], default="sync")
    parser.add_argument("--cluster-fault-interval", type=float, default=8.0)
    parser.add_argument(
        "--effects", choices=MODES, default=None, help="the effect stage (effect_stage.py)"
    )
    parser.add_argument("--kill-in-call", type=float, default=0.002)
    parser.add_argument(
        "--outbox", action="store_true", help="the outbox stage (outbox_stage.py): follow-ups"
    )
    parser.add_argument("--relays", type=int, default=2, help="inbox-relay processes (--outbox)")
    args = parser.parse_args(argv)
    pg_cluster = args.cluster in ("postgres", "both", "patroni")
    if pg_cluster and args.database != "postgresql":
        parser.error(f"--cluster {args.cluster} runs on PostgreSQL: drop --database")
    ops = args.ops or (200_000 if args.soak else 5_000)
    settings = Settings(
        database=args.database,
        ops=ops,
        workers=args.workers,
        same_id_rate=args.same_id_rate,
        fresh_id_rate=args.fresh_id_rate,
        fail_rate=args.fail_rate,
        poison_every=args.poison_every,
        kill_in_handler=args.kill_in_handler,
        kill_after_commit=args.kill_after_commit,
        fault_interval=args.fault_interval,
        restart_database=args.soak and args.database == "postgresql" and not pg_cluster,
        seed=args.seed,
        timeout=args.timeout or max(300.0, ops / 20),
        cluster=args.cluster,
        replication=args.replication,
        cluster_fault_interval=args.cluster_fault_interval,
        effects=args.effects,
        kill_in_call=args.kill_in_call if args.effects else 0.0,
        outbox=args.outbox,
        relays=args.relays,
    )
    report = chaos(settings)
    print_report(report, settings)
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    path = args.json or HERE / "results" / f"chaos-{settings.database}-{stamp}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        json.dumps(
            {
                "benchmark": "chaos",
                "when": stamp,
                "command": " ".join([Path(sys.executable).name, *sys.argv]),
                "machine": {"platform": platform.platform(), "cpus": os.cpu_count()},
                "settings": settings.__dict__,
                "report": report,
            },
            indent=2,
        )
    )
    print(f"JSON: {path}")
    return 0 if report["sound"] else 1


if __name__ == "__main__":
    sys.exit(main())
