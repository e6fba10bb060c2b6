"""Inbox task against plain Celery task: the same one-row transaction, the same worker
settings, alternated in one run, on RabbitMQ and on Redis, against PostgreSQL.

One real ``celery worker`` (prefork, ``-c 2``, prefetch multiplier 1, ``acks_late``, no
result backend) per transport consumes one queue; each round sends ``--tasks`` tasks of
one kind (the two kinds alternated, the order swapped every round) and waits for their
rows. Each task writes one row stamped with the time it committed; a round's throughput is
(rows - 1) / (last stamp - first stamp), so the client's sending is not timed (it is
faster than the worker). The figure is the median over the rounds of inbox / plain. On a
shared machine wall time is noisy, so each round also reads the CPU time the worker (main
process and pool children, from /proc) spent per task: plain / inbox of that is the
throughput ratio a worker bound by its own CPU would see (the database server's CPU is
not in it).

    .venv/bin/python benchmarks/celery_throughput.py [--tasks 1500] [--rounds 5]
        [--transports rabbitmq,redis]

The worker imports this file as ``celery_throughput`` (the environment says where).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from celery import Celery
from common import (
    DEFAULT_BROKER,
    DEFAULT_DATABASE,
    alternate,
    fresh_schema,
    start_celery_worker,
    stop_worker,
    write_report,
)
from sqlalchemy import Column, Float, Integer, MetaData, String, Table, create_engine, func, select
from sqlalchemy.orm import Session, sessionmaker

from inbox import Inbox
from inbox.celery import InboxTasks

DEFAULT_REDIS = os.environ.get("INBOX_BENCH_REDIS", "redis://127.0.0.1:6379/7")
HERE = Path(__file__).resolve().parent

bench = MetaData()
rows = Table(
    "bench_celery_row",
    bench,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("ref", String(64), nullable=False),
    Column("at", Float, nullable=False),
)

app = Celery("celery_throughput", broker=os.environ.get("BENCH_CELERY_BROKER", "memory://"))
app.conf.update(
    task_default_queue=os.environ.get("BENCH_CELERY_QUEUE", "celery"),
    worker_prefetch_multiplier=1,
    task_acks_late=True,
    task_reject_on_worker_lost=True,
    task_ignore_result=True,
    task_time_limit=60,
    broker_transport_options={"visibility_timeout": 300},
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
)
engine = create_engine(os.environ.get("BENCH_CELERY_DATABASE", "sqlite://"))
sessions = sessionmaker(engine)
tasks = InboxTasks(app, Inbox(sessions), sessions)


def _write(session: Session, ref: str) -> None:
    session.execute(rows.insert().values(ref=ref, at=time.time()))


@tasks.task(name="bench.inbox_write")
def inbox_write(session: Session, ref: str) -> None:
    """The inbox task: one row in the inbox's handler transaction (with the claim)."""
    _write(session, ref)


@app.task(name="bench.plain_write", acks_late=True, reject_on_worker_lost=True)
def plain_write(ref: str) -> None:
    """The plain Celery task: the same row in a transaction of its own."""
    with sessions.begin() as session:
        _write(session, ref)


KINDS: dict[str, Any] = {"inbox": inbox_write, "plain": plain_write}


def _round(database: Any, broker: str, queue: str, kind: str, *, count: int, tag: str) -> float:
    """Send ``count`` tasks of ``kind``, wait for their rows; tasks per second."""
    task = KINDS[kind]
    with app.connection_for_write(broker) as connection:
        producer = connection.Producer()
        for _ in range(count):
            task.apply_async((tag,), producer=producer, queue=queue)
    query = select(func.count(), func.min(rows.c.at), func.max(rows.c.at)).where(rows.c.ref == tag)
    deadline = time.monotonic() + 600
    while True:
        with database.connect() as connection:
            done, first, last = connection.execute(query).one()
        if done >= count:
            return (done - 1) / (last - first)
        if time.monotonic() > deadline:
            raise SystemExit(f"{kind}: {done} of {count} rows after 600 s")
        time.sleep(0.2)


def _cpu_seconds(pid: int) -> float:
    """CPU seconds (user + system) of the worker ``pid`` and its pool children so far."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0.0
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    for process in (pid, *map(int, children)):
        fields = Path(f"/proc/{process}/stat").read_text().rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / ticks  # utime, stime
    return total


def _worker(broker: str, queue: str, database_url: str) -> subprocess.Popen[bytes]:
    env = {
        "BENCH_CELERY_BROKER": broker,
        "BENCH_CELERY_QUEUE": queue,
        "BENCH_CELERY_DATABASE": database_url,
    }
    return start_celery_worker("celery_throughput", queue, env, log_level="warning")


def run_transport(transport: str, broker: str, options: argparse.Namespace) -> dict[str, Any]:
    """Every round on one transport: the rates per kind and the inbox / plain ratios."""
    queue = f"bench-celery-{uuid.uuid4().hex[:8]}"
    with fresh_schema(options.database, bench) as database:
        worker = _worker(broker, queue, database.url.render_as_string(hide_password=False))
        try:
            for kind in KINDS:  # warm up: the worker started, pools and caches filled
                _round(database, broker, queue, kind, count=options.warmup, tag=f"warm-{kind}")
            rates: dict[str, list[float]] = {kind: [] for kind in KINDS}
            cpu: dict[str, list[float]] = {kind: [] for kind in KINDS}
            for number in range(options.rounds):
                for kind in alternate(number, list(KINDS)):
                    before = _cpu_seconds(worker.pid)
                    rate = _round(
                        database, broker, queue, kind, count=options.tasks, tag=f"{kind}-{number}"
                    )
                    used = (_cpu_seconds(worker.pid) - before) / options.tasks * 1000
                    rates[kind].append(rate)
                    cpu[kind].append(used)
                    print(
                        f"  {transport} round {number + 1} {kind:5}: {rate:7.0f} tasks/s, "
                        f"worker CPU {used:.2f} ms/task"
                    )
        finally:
            stop_worker(worker)
            with app.connection_for_write(broker) as connection:
                connection.default_channel.queue_delete(queue)
    ratios = [i / p for i, p in zip(rates["inbox"], rates["plain"], strict=True)]
    cpu_ratios = [p / i for i, p in zip(cpu["inbox"], cpu["plain"], strict=True)]
    return {
        "rates": rates,
        "ratios": ratios,
        "cpu_ms_per_task": cpu,
        "cpu_ratios": cpu_ratios,
        "cpu_inbox": statistics.median(cpu["inbox"]),
        "cpu_plain": statistics.median(cpu["plain"]),
        "cpu_ratio": statistics.median(cpu_ratios),
        "inbox": statistics.median(rates["inbox"]),
        "plain": statistics.median(rates["plain"]),
        "ratio": statistics.median(ratios),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--tasks", type=int, default=1500, help="tasks per round and kind")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--transports", default="rabbitmq,redis")
    parser.add_argument("--database", default=DEFAULT_DATABASE)
    parser.add_argument("--rabbitmq", default=DEFAULT_BROKER)
    parser.add_argument("--redis", default=DEFAULT_REDIS)
    parser.add_argument("--json", type=Path, default=None, help="report path")
    options = parser.parse_args(argv)
    urls = {"rabbitmq": options.rabbitmq, "redis": options.redis}
    results = {}
    for transport in options.transports.split(","):
        print(f"{transport}: {options.rounds} rounds of {options.tasks} tasks per kind")
        results[transport] = run_transport(transport, urls[transport], options)
    print(
        "\n| transport | plain (tasks/s) | inbox (tasks/s) | inbox / plain (min-max) | "
        "worker CPU plain / inbox (ms per task) | CPU-bound inbox / plain |"
    )
    print("|---|---:|---:|---:|---:|---:|")
    for transport, result in results.items():
        low, high = min(result["ratios"]), max(result["ratios"])
        print(
            f"| {transport} | {result['plain']:.0f} | {result['inbox']:.0f} | "
            f"{result['ratio']:.2f} ({low:.2f}-{high:.2f}) | {result['cpu_plain']:.2f} / "
            f"{result['cpu_inbox']:.2f} | {result['cpu_ratio']:.2f} |"
        )
    write_report(
        "celery_throughput",
        options.json,
        {"parameters": vars(options) | {"json": str(options.json)}, "results": results},
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
