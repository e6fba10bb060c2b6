"""A soak of inbox tasks under a real prefork ``celery worker``: many tasks per transport
(RabbitMQ, Redis) while pool children are SIGKILLed and tasks are sent twice; then every
task must have written its row exactly once: 0 doubled, 0 lost, no dead letter.

Each task writes one row for its ``ref`` (no unique constraint: a second write would be a
second row). Its claim is its key, the ref. The faults:

* ``kill -9`` of a random pool child every ``--kill-every`` seconds (mid-task: the
  transaction rolls back and Celery requeues the task, ``reject_on_worker_lost``; between
  tasks: nothing lost);
* a pool child that kills itself right after its commit and before Celery's ack, for one
  task in ``--self-kill-one-in`` (the redelivery must be skipped as a duplicate);
* one task in ``--duplicate-one-in`` sent twice under the same task id (a broker or relay
  duplicate) and one more time under a new task id (a client retrying ``.delay()``).

    .venv/bin/python benchmarks/celery_soak.py [--tasks 20000] [--transports rabbitmq,redis]

Prints one table row per transport (the table of docs/celery.md) and writes a JSON report;
exits 1 when a row is doubled or lost. The worker imports this file as ``celery_soak``.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from celery import Celery
from common import (
    DEFAULT_BROKER,
    DEFAULT_DATABASE,
    fresh_schema,
    start_celery_worker,
    stop_worker,
    write_report,
)
from sqlalchemy import Column, Integer, MetaData, String, Table, create_engine, func, select
from sqlalchemy.orm import Session, sessionmaker

from inbox import Inbox
from inbox.celery import InboxTask, InboxTasks

DEFAULT_REDIS = os.environ.get("INBOX_BENCH_REDIS", "redis://127.0.0.1:6379/7")
HERE = Path(__file__).resolve().parent
MARKERS = Path(os.environ.get("SOAK_MARKERS", "."))

soak = MetaData()
rows = Table(
    "soak_celery_row",
    soak,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("ref", String(64), nullable=False, index=True),
)

app = Celery("celery_soak", broker=os.environ.get("SOAK_BROKER", "memory://"))
app.conf.update(
    task_default_queue=os.environ.get("SOAK_QUEUE", "celery"),
    worker_prefetch_multiplier=1,
    task_ignore_result=True,
    task_time_limit=60,
    broker_transport_options={"visibility_timeout": 300},
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
)
engine = create_engine(os.environ.get("SOAK_DATABASE", "sqlite://"))
sessions = sessionmaker(engine)
tasks = InboxTasks(app, Inbox(sessions), sessions)


class KilledAfterCommit(InboxTask):
    """Kills its pool child after the commit, before the ack, when its marker exists."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        value = super().__call__(*args, **kwargs)
        try:
            (MARKERS / f"kill-{args[0]}").unlink()
        except FileNotFoundError:
            return value
        os.kill(os.getpid(), signal.SIGKILL)
        return value  # not reached


@tasks.task(name="soak.write", key=lambda ref: ref, base=KilledAfterCommit)
def write(session: Session, ref: str) -> None:
    """One row for ``ref``, exactly once."""
    session.execute(rows.insert().values(ref=ref))


def _children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(child) for child in text.split()]


def _worker(broker: str, queue: str, database_url: str, markers: Path) -> subprocess.Popen[bytes]:
    env = {
        "SOAK_BROKER": broker,
        "SOAK_QUEUE": queue,
        "SOAK_DATABASE": database_url,
        "SOAK_MARKERS": str(markers),
    }
    return start_celery_worker("celery_soak", queue, env, log_level="error")


def _depth(broker: str, queue: str) -> int:
    with app.connection_for_write(broker) as connection:
        try:
            return int(connection.default_channel.queue_declare(queue, passive=True).message_count)
        except Exception:  # no such queue
            return 0


def run_transport(transport: str, broker: str, options: argparse.Namespace) -> dict[str, Any]:
    """One soak on one transport: send, kill, wait, count."""
    queue = f"soak-celery-{uuid.uuid4().hex[:8]}"
    chance = random.Random(options.seed)
    refs = [f"r{n}" for n in range(options.tasks)]
    self_kills = [ref for ref in refs if chance.randrange(options.self_kill_one_in) == 0]
    duplicated = [ref for ref in refs if chance.randrange(options.duplicate_one_in) == 0]
    killed = sent = 0
    with (
        tempfile.TemporaryDirectory() as markers,
        fresh_schema(options.database, soak) as database,
    ):
        for ref in self_kills:
            (Path(markers) / f"kill-{ref}").touch()
        url = database.url.render_as_string(hide_password=False)
        worker = _worker(broker, queue, url, Path(markers))
        started = time.monotonic()
        try:
            with app.connection_for_write(broker) as connection:
                producer = connection.Producer()
                for ref in refs:
                    task_id = str(uuid.uuid4())
                    write.apply_async((ref,), task_id=task_id, producer=producer, queue=queue)
                    sent += 1
                    if ref in duplicated:
                        for again in (task_id, str(uuid.uuid4())):
                            write.apply_async((ref,), task_id=again, producer=producer, queue=queue)
                            sent += 1
            query = select(func.count(func.distinct(rows.c.ref)), func.count())
            last_change, seen = time.monotonic(), (-1, -1)
            next_kill = time.monotonic() + options.kill_every
            while True:
                with database.connect() as connection:
                    done, written = connection.execute(query).one()
                if (done, written) != seen:
                    seen, last_change = (done, written), time.monotonic()
                if done >= options.tasks and _depth(broker, queue) == 0:
                    break
                if time.monotonic() - last_change > options.settle:
                    break  # nothing moves any more: what is missing is lost
                # Kills start once the worker runs tasks (a child killed while the pool starts
                # stops the worker: "Could not start worker processes").
                if time.monotonic() >= next_kill and 0 < done < options.tasks:
                    children = _children(worker.pid)
                    if children:
                        os.kill(chance.choice(children), signal.SIGKILL)
                        killed += 1
                    next_kill = time.monotonic() + options.kill_every
                time.sleep(0.1)
            wall = time.monotonic() - started
            time.sleep(options.linger)  # redeliveries of the last tasks have time to land
        finally:
            stop_worker(worker)
        with database.connect() as connection:
            counted = select(rows.c.ref, func.count()).group_by(rows.c.ref)
            per_ref = {str(ref): int(n) for ref, n in connection.execute(counted)}
        dead = _depth(broker, f"{queue}.dlq")
        with app.connection_for_write(broker) as connection:
            for name in (queue, f"{queue}.dlq"):
                connection.default_channel.queue_delete(name)
        left_markers = len(list(Path(markers).iterdir()))
    doubled = sum(1 for count in per_ref.values() if count > 1)
    lost = sum(1 for ref in refs if ref not in per_ref)
    return {
        "transport": transport,
        "tasks": options.tasks,
        "messages_sent": sent,
        "wall_seconds": round(wall, 1),
        "children_killed": killed,
        "self_kills_after_commit": len(self_kills) - left_markers,
        "duplicated_tasks": len(duplicated),
        "doubled": doubled,
        "lost": lost,
        "dead_letters": dead,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--tasks", type=int, default=20_000)
    parser.add_argument("--transports", default="rabbitmq,redis")
    parser.add_argument("--kill-every", type=float, default=2.0, help="seconds between kills")
    parser.add_argument("--self-kill-one-in", type=int, default=500)
    parser.add_argument("--duplicate-one-in", type=int, default=20)
    parser.add_argument("--settle", type=float, default=90.0, help="seconds without progress")
    parser.add_argument("--linger", type=float, default=3.0)
    parser.add_argument("--seed", type=int, default=31)
    parser.add_argument("--database", default=DEFAULT_DATABASE)
    parser.add_argument("--rabbitmq", default=DEFAULT_BROKER)
    parser.add_argument("--redis", default=DEFAULT_REDIS)
    parser.add_argument("--json", type=Path, default=None, help="report path")
    options = parser.parse_args(argv)
    urls = {"rabbitmq": options.rabbitmq, "redis": options.redis}
    results = [run_transport(t, urls[t], options) for t in options.transports.split(",")]
    print(
        "\n| transport | tasks (messages sent) | wall | pool children killed | killed after "
        "commit | sent twice + retried | doubled | lost | dead letters |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for r in results:
        print(
            f"| {r['transport']} | {r['tasks']:,} ({r['messages_sent']:,}) | "
            f"{r['wall_seconds']:.0f} s | {r['children_killed']} | "
            f"{r['self_kills_after_commit']} | {r['duplicated_tasks']} | **{r['doubled']}** | "
            f"**{r['lost']}** | {r['dead_letters']} |"
        )
    write_report("celery_soak", options.json, {"parameters": vars(options), "results": results})
    failed = any(r["doubled"] or r["lost"] or r["dead_letters"] for r in results)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
