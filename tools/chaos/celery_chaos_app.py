"""The Celery app of the Celery chaos run (``celery_chaos.py``): ``celery -A celery_chaos_app
worker`` and ``celery -A celery_chaos_app beat`` import it, configured by the environment
(``CHAOS_BROKER``, ``CHAOS_QUEUE``, ``CHAOS_DATABASE``, ``CHAOS_MARKERS``, a directory the
processes write their logs to and read kill markers from, ``CHAOS_VISIBILITY`` the Redis
``visibility_timeout`` in seconds, ``CHAOS_BEAT_EVERY`` the beat interval in seconds).

Tasks:

* ``chaos.write(ref, sleep=0)``: an inbox task keyed by ``ref``; calls the fake provider
  through ``inbox.effect`` (at-most-once), sleeps ``sleep`` seconds (the slow task), writes one
  ``chaos_celery_row`` row (no unique constraint: a second run is a second row). Markers:
  ``kill-<ref>`` kills the pool child after the commit, before the ack; ``killmain-<ref>`` the
  worker's main process there; ``callkill-<ref>`` the pool child inside the provider's call.
* ``chaos.tick(slot)``: a beat entry's inbox task keyed by its slot, one ``chaos_celery_tick``
  row per run.

Logs (one line each, appended with ``O_APPEND``, so a killed process's lines stay):
``provider-calls`` (``<ref> <effect key>``), ``deliveries`` (``<task> <ref or slot> <time>
<hostname> <pid>``, at ``task_prerun``) and, in a beat process, ``beat-sends`` (``<slot>``).
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from pathlib import Path
from typing import Any

from celery import Celery, signals
from sqlalchemy import Column, Integer, MetaData, String, Table, create_engine
from sqlalchemy.orm import Session, sessionmaker

from inbox import Inbox
from inbox.celery import InboxTask, InboxTasks, beat_slot

BROKER = os.environ.get("CHAOS_BROKER", "memory://")
QUEUE = os.environ.get("CHAOS_QUEUE", "celery")
MARKERS = Path(os.environ.get("CHAOS_MARKERS", "."))
VISIBILITY = float(os.environ.get("CHAOS_VISIBILITY", "8"))
BEAT_EVERY = float(os.environ.get("CHAOS_BEAT_EVERY", "1"))

tables = MetaData()
rows = Table(
    "chaos_celery_row",
    tables,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("ref", Integer, nullable=False, index=True),  # not unique: a double is counted
    Column("pid", Integer, nullable=False),
)
ticks = Table(
    "chaos_celery_tick",
    tables,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("slot", String(64), nullable=False, index=True),  # not unique either
)

transport_options: dict[str, Any] = {}
if BROKER.startswith("redis"):
    # A short visibility_timeout, swept every second, on unacked keys of this run's own:
    # kombu's default keys are shared by every client of the Redis database, and a sweep
    # with this timeout would redeliver other users' messages.
    transport_options = {
        "visibility_timeout": VISIBILITY,
        "unacked_restore_interval": 1,
        "unacked_restore_throttle": 1,
        "unacked_key": f"{QUEUE}.unacked",
        "unacked_index_key": f"{QUEUE}.unacked_index",
        "unacked_mutex_key": f"{QUEUE}.unacked_mutex",
        # A sweep cut off by a connection drop leaves the mutex held until it expires.
        "unacked_mutex_expire": 5,
    }

app = Celery("celery_chaos_app", broker=BROKER)
app.conf.update(
    task_default_queue=QUEUE,
    worker_prefetch_multiplier=1,
    task_ignore_result=True,
    # Below visibility_timeout, as the worker's settings check demands; the slow task is
    # sent with a per-message time limit above it (which no worker-start check can see).
    task_time_limit=VISIBILITY * 0.75,
    broker_transport_options=transport_options,
    broker_connection_retry_on_startup=True,
    broker_connection_max_retries=None,
    worker_hijack_root_logger=False,
)
engine = create_engine(os.environ.get("CHAOS_DATABASE", "sqlite://"), pool_pre_ping=True)
sessions = sessionmaker(engine)
tasks = InboxTasks(app, Inbox(sessions), sessions)


def _log(name: str, line: str) -> None:
    descriptor = os.open(MARKERS / name, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(descriptor, f"{line}\n".encode())
    finally:
        os.close(descriptor)


def _take(marker: str) -> bool:
    try:
        (MARKERS / marker).unlink()
    except FileNotFoundError:
        return False
    return True


class KilledAfterCommit(InboxTask):
    """Kills its pool child, or the worker's main process, after the commit and before the
    ack, when the ref's marker exists (once: the marker is removed first)."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        value = super().__call__(*args, **kwargs)
        if _take(f"kill-{args[0]}"):
            os.kill(os.getpid(), signal.SIGKILL)
        if _take(f"killmain-{args[0]}"):
            os.kill(os.getppid(), signal.SIGKILL)
        return value


def _provider(ref: int, key: uuid.UUID) -> dict[str, str]:
    _log("provider-calls", f"{ref} {key}")
    if _take(f"callkill-{ref}"):
        os.kill(os.getpid(), signal.SIGKILL)
    return {"receipt": str(key)}


@tasks.task(name="chaos.write", key=lambda ref, sleep=0.0: str(ref), base=KilledAfterCommit)
def write(session: Session, ref: int, sleep: float = 0.0) -> None:
    """The provider called once, then one row for ``ref``, exactly once."""
    tasks.inbox.effect("provider.call", lambda key: _provider(ref, key), mode="at-most-once")
    if sleep:
        time.sleep(sleep)
    session.execute(rows.insert().values(ref=ref, pid=os.getpid()))


@tasks.task(name="chaos.tick", key=beat_slot)
def tick(session: Session, slot: str) -> None:
    """One row per beat slot, exactly once."""
    session.execute(ticks.insert().values(slot=slot))


app.conf.beat_schedule = {"chaos-tick": tasks.beat_entry(tick, BEAT_EVERY)}


@signals.task_prerun.connect
def _delivered(task: Any = None, args: Any = None, kwargs: Any = None, **_: Any) -> None:
    what = (kwargs or {}).get("slot") if task.name == "chaos.tick" else (args or ["?"])[0]
    when, host = f"{time.time():.3f}", task.request.hostname
    _log("deliveries", f"{task.name} {what} {when} {host} {os.getpid()}")


@signals.before_task_publish.connect
def _sent(sender: Any = None, body: Any = None, **_: Any) -> None:
    if sender == "chaos.tick" and os.environ.get("CHAOS_ROLE") == "beat":
        _log("beat-sends", str(body[1]["slot"]))
