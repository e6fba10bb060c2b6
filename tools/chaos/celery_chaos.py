"""Celery chaos run: inbox tasks under real prefork ``celery worker`` processes on RabbitMQ and
on Redis while everything the issue lists goes wrong at once; then every task must have
written its row exactly once, none lost, its effect called once or recorded uncertain.

    .venv/bin/python tools/chaos/celery_chaos.py [--tasks 2000] [--transports rabbitmq,redis]

Per transport: two workers (``celery_chaos_app``, ``-c 2``) reach the broker through a TCP
proxy of the run's own (``tcp_proxy.py``); two ``celery beat`` processes send the same
interval entry. Faults, in one run:

* ``kill -9`` from outside, in turn: of a random pool child, of a worker's main process
  (restarted at once), and a cut of every worker broker connection at the proxy;
* from inside (marker files, see the app): a pool child killed after its commit before its
  ack, a main process killed there, a pool child killed inside its effect's provider call;
* one task in ``--duplicate-one-in`` sent twice under one task id and again under a new one
  (a client retrying ``.delay()``); two beats sending every slot;
* Redis: slow tasks (sent with a per-message time limit above ``visibility_timeout``) that
  sleep past it, so kombu redelivers them while they run (counted from the deliveries log);
* RabbitMQ: tasks sent with ``Outbox.send_task``, relayed by a relay that SIGKILLs itself
  after the broker confirmed a batch and before deleting it (``tests/outbox_relay_crash.py``),
  twice, then drained by a sound relay.

Then the ledger (``celery_chaos_ledger.py``). Prints a table row per transport and writes a
JSON report; exits 1 when anything is doubled, lost, called twice, or a fault did not fire.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path[:0] = [str(HERE), str(ROOT / "benchmarks")]

from celery_chaos_app import tables, write  # noqa: E402
from celery_chaos_fleet import Chaos, Fleet, pending  # noqa: E402
from celery_chaos_ledger import dead_letters, ledger, problems, slow_redeliveries  # noqa: E402
from common import fresh_schema, write_report  # noqa: E402
from kombu import Connection  # noqa: E402
from sqlalchemy import Engine  # noqa: E402
from sqlalchemy.orm import Session  # noqa: E402
from tcp_proxy import TcpProxy  # noqa: E402

from inbox import Outbox  # noqa: E402
from inbox.broker import Relay  # noqa: E402

RELAY_CRASH = ROOT / "tests" / "outbox_relay_crash.py"
OUTBOX_BASE, SLOW_BASE = 1_000_000, 2_000_000
MARKS = {  # the in-task kills: marker prefix -> the report's count of those that happened
    "kill": "children_killed_after_commit",
    "killmain": "mains_killed_after_commit",
    "callkill": "killed_in_call",
}
DEFAULT_PORTS = {"amqp": 5672, "pyamqp": 5672, "redis": 6379}


def _through(proxy: TcpProxy, broker: str) -> str:
    parts = urlsplit(broker)
    userinfo = parts.netloc.rpartition("@")[0]
    netloc = f"{userinfo}@127.0.0.1:{proxy.port}" if userinfo else f"127.0.0.1:{proxy.port}"
    return urlunsplit(parts._replace(netloc=netloc))


def _relay_stage(url: str, broker: str, options: argparse.Namespace, out: dict[str, Any]) -> None:
    crash = [sys.executable, str(RELAY_CRASH), url, broker, str(options.relay_batch)]
    for _ in range(options.relay_crashes):
        done = subprocess.run(crash, capture_output=True, timeout=120, check=False)
        out["relay_crashes"] += done.returncode == -signal.SIGKILL
    out["relay_published_after_crashes"] = Relay(
        url, broker, batch_size=options.relay_batch, listen=False, stats_interval=None
    ).drain()


def _environment(
    broker: str, queue: str, url: str, markers: Path, options: argparse.Namespace
) -> dict[str, str]:
    return {
        "CHAOS_BROKER": broker,
        "CHAOS_QUEUE": queue,
        "CHAOS_DATABASE": url,
        "CHAOS_MARKERS": str(markers),
        "CHAOS_VISIBILITY": str(options.visibility),
        "CHAOS_BEAT_EVERY": str(options.beat_every),
        "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
    }


def run_transport(transport: str, broker: str, options: argparse.Namespace) -> dict[str, Any]:
    """One chaos run on one transport; returns its figures and its ledger."""
    queue = f"chaos-celery-{uuid.uuid4().hex[:8]}"
    chance = random.Random(options.seed)
    refs = list(range(options.tasks))
    duplicated = [ref for ref in refs if chance.randrange(options.duplicate_one_in) == 0]
    marked = chance.sample(refs, 3 * options.marked)
    outbox_refs = [OUTBOX_BASE + n for n in range(options.outbox_tasks)]
    slow_refs = [SLOW_BASE + n for n in range(options.slow_tasks)]
    if transport != "rabbitmq":
        outbox_refs = []  # the relay speaks AMQP
    if transport != "redis":
        slow_refs = []  # visibility_timeout is Redis's
    everything = refs + outbox_refs + slow_refs
    sleep = options.visibility + 6
    out: dict[str, Any] = {"transport": transport, "relay_crashes": 0, "messages_sent": 0}
    port = urlsplit(broker).port or DEFAULT_PORTS[urlsplit(broker).scheme]
    proxy = TcpProxy(urlsplit(broker).hostname or "127.0.0.1", port)
    with tempfile.TemporaryDirectory() as directory, fresh_schema(options.database, tables) as db:
        markers = Path(directory)
        for n, kind in enumerate(MARKS):
            for ref in marked[n * options.marked : (n + 1) * options.marked]:
                (markers / f"{kind}-{ref}").touch()
        url = db.url.render_as_string(hide_password=False)
        env = _environment(_through(proxy, broker), queue, url, markers, options)
        started = time.monotonic()
        fleet = Fleet(queue, env, broker)
        relay: threading.Thread | None = None
        try:
            out["messages_sent"] = _send(broker, queue, refs, duplicated, (slow_refs, sleep))
            if outbox_refs:
                with Session(db) as session, session.begin():
                    for ref in outbox_refs:
                        Outbox().send_task(session, "chaos.write", args=(ref,), queue=queue)
                relay = threading.Thread(target=_relay_stage, args=(url, broker, options, out))
                relay.start()
            chaos = Chaos(fleet, proxy, db, broker, queue, everything, slow_refs, sleep,
                          markers, options)  # fmt: skip
            chaos.run()
            out["children_killed"] = chaos.counts["children"]
            out["mains_killed"] = chaos.counts["mains"]
            out["connections_cut"], out["connection_cuts"] = proxy.connections_cut, proxy.cuts
            out["wall_seconds"] = round(time.monotonic() - started, 1)
            if relay is not None:
                relay.join()
            time.sleep(options.linger)  # late redeliveries have time to land
        finally:
            fleet.stop()
            proxy.close()
            if relay is not None:
                relay.join()
        out |= _account(db, markers, (broker, queue), everything, options.marked)
        out |= slow_redeliveries(markers, slow_refs, sleep)
    out |= {
        "tasks": len(everything),
        "duplicated_tasks": len(duplicated),
        "outbox_tasks": len(outbox_refs),
        "slow_tasks": len(slow_refs),
    }
    return out


def _send(
    broker: str, queue: str, refs: list[int], duplicated: list[int], slow: tuple[list[int], float]
) -> int:
    sent = 0
    twice = set(duplicated)
    slow_refs, sleep = slow
    with Connection(broker) as connection:
        producer = connection.Producer()
        for ref in slow_refs:  # first, so their redelivery overlaps the rest of the run
            limit = sleep * 3  # per message: above visibility_timeout, unseen by the check
            write.apply_async((ref,), {"sleep": sleep}, producer=producer, queue=queue,
                              time_limit=limit)  # fmt: skip
            sent += 1
        for ref in refs:
            task_id = str(uuid.uuid4())
            write.apply_async((ref,), task_id=task_id, producer=producer, queue=queue)
            sent += 1
            if ref in twice:
                for again in (task_id, str(uuid.uuid4())):
                    write.apply_async((ref,), task_id=again, producer=producer, queue=queue)
                    sent += 1
    return sent


def _account(
    db: Engine, markers: Path, where: tuple[str, str], everything: list[int], marked: int
) -> dict[str, Any]:
    """The ledger, the dead letters taken, the in-task kills that happened; then the run's
    queues and keys are deleted."""
    broker, queue = where
    unfinished = pending(broker, queue)  # before the dead letters are taken
    dead = dead_letters(broker, queue)
    out = ledger(db, markers, everything, dead)
    out["unfinished_at_end"] = unfinished
    out["dead_letters_not_uncertain"] = sorted(w for w, r in dead if r != "uncertain-effect")
    for kind, name in MARKS.items():  # removed by the process that kills itself on it
        out[name] = marked - len(list(markers.glob(f"{kind}-*")))
    _cleanup(broker, queue)
    return out


def _cleanup(broker: str, queue: str) -> None:
    with Connection(broker) as connection:
        channel = connection.default_channel
        for name in (queue, f"{queue}.dlq"):
            with contextlib.suppress(Exception):  # never declared
                channel.queue_delete(name)
        if broker.startswith("redis"):
            channel.client.delete(*(f"{queue}.{key}" for key in ("unacked", "unacked_index")))


def main(argv: list[str] | None = None) -> int:
    """Run each transport, print the table, write the report; 1 when the run failed."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--tasks", type=int, default=2000, help=".delay() tasks per transport")
    parser.add_argument("--transports", default="rabbitmq,redis")
    parser.add_argument("--duplicate-one-in", type=int, default=10)
    parser.add_argument("--marked", type=int, default=3, help="tasks per in-task kill kind")
    parser.add_argument("--outbox-tasks", type=int, default=200, help="RabbitMQ")
    parser.add_argument("--relay-batch", type=int, default=20)
    parser.add_argument("--relay-crashes", type=int, default=2)
    parser.add_argument("--slow-tasks", type=int, default=2, help="Redis")
    parser.add_argument("--visibility", type=float, default=8.0, help="Redis, seconds")
    parser.add_argument("--beat-every", type=float, default=1.0, help="seconds")
    parser.add_argument("--beat-seconds", type=float, default=30.0, help="how long beats run")
    parser.add_argument("--fault-every", type=float, default=1.5, help="seconds")
    parser.add_argument("--settle", type=float, default=60.0, help="seconds without progress")
    parser.add_argument("--quiet", type=float, default=3.0, help="seconds all done, to end")
    parser.add_argument("--linger", type=float, default=3.0)
    parser.add_argument("--seed", type=int, default=37)
    parser.add_argument("--database", default="postgresql+psycopg://postgres@127.0.0.1:5432/test")
    parser.add_argument("--rabbitmq", default="amqp://guest:guest@127.0.0.1:5672//")
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/5")
    parser.add_argument("--json", type=Path, default=None, help="report path")
    options = parser.parse_args(argv)
    urls = {"rabbitmq": options.rabbitmq, "redis": options.redis}
    results = [run_transport(t, urls[t], options) for t in options.transports.split(",")]
    print("\n| transport | tasks (sent) | wall | children killed (+ after commit) | mains killed"
          " (+ after commit) | connections cut | killed in a call | duplicated | beat slots"
          " (sends) | slow redelivered | relay crashes | doubled | lost | uncertain |")  # fmt: skip
    print("|---" * 14 + "|")
    for r in results:
        print(
            f"| {r['transport']} | {r['tasks']:,} ({r['messages_sent']:,}) | "
            f"{r['wall_seconds']:.0f} s | {r['children_killed']} "
            f"(+{r['children_killed_after_commit']}) | {r['mains_killed']} "
            f"(+{r['mains_killed_after_commit']}) | {r['connections_cut']} | "
            f"{r['killed_in_call']} | {r['duplicated_tasks']} | {r['beat_slots_sent']} "
            f"({r['beat_sends']}) | {r.get('slow_redelivered_while_running', '-')} | "
            f"{r['relay_crashes']} | **{len(r['doubled'])}** | **{len(r['lost'])}** | "
            f"{r['dead_letters'].get('uncertain-effect', 0)} |"
        )
        for problem in problems(r):
            print(f"  {r['transport']}: {problem}")
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    path = options.json or HERE / "results" / f"celery-chaos-{stamp}.json"
    write_report("celery_chaos", path, {"parameters": vars(options), "results": results})
    return 1 if any(problems(r) for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
