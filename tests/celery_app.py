"""The Celery app the Celery worker tests run in real worker subprocesses
(``celery -A celery_app worker`` from tests/), configured by the environment:

INBOX_CELERY_BROKER  the broker URL        INBOX_CELERY_DATABASE  the database URL
INBOX_CELERY_QUEUE   the queue consumed    INBOX_CELERY_MARKERS   a directory of kill markers
INBOX_CELERY_BACKEND the result backend (none by default; a chord needs one)

A marker file ``<markers>/kill-<ref>`` makes the pool child that just committed the task
for ``ref`` kill itself with SIGKILL (once: the file is removed first), after the commit and
before Celery acks the message, stores its result or sends a chain's next step;
``<markers>/killmain-<ref>`` makes it kill the worker's main process instead.
``<markers>/diepublish-collect`` makes the process about to publish the chord body
``ct.collect`` kill itself first (once), as a host crash would, holding the chord's dispatch
claim; each publish of it that goes ahead adds a line to ``<markers>/published-collect``.
"""

from __future__ import annotations

import os
import signal
import uuid
from pathlib import Path
from typing import Any

from celery import Celery, signals
from sqlalchemy import create_engine
from sqlalchemy.orm import Session, sessionmaker
from support.databases import effects

from inbox import Inbox
from inbox.celery import InboxTask, InboxTasks, beat_slot

QUEUE = os.environ.get("INBOX_CELERY_QUEUE", "celery")
MARKERS = Path(os.environ.get("INBOX_CELERY_MARKERS", "."))

app = Celery(
    "celery_app",
    broker=os.environ.get("INBOX_CELERY_BROKER", "memory://"),
    backend=os.environ.get("INBOX_CELERY_BACKEND"),
)
app.conf.update(
    task_default_queue=QUEUE,
    worker_prefetch_multiplier=1,
    task_time_limit=60,
    broker_transport_options={"visibility_timeout": 300},
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
)
engine = create_engine(os.environ.get("INBOX_CELERY_DATABASE", "sqlite://"))
sessions = sessionmaker(engine)
tasks = InboxTasks(app, Inbox(sessions), sessions)


class KilledAfterCommit(InboxTask):
    """Kills its pool child after the commit when the task's marker file exists."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        value = super().__call__(*args, **kwargs)
        for marker, victim in (("kill", os.getpid()), ("killmain", os.getppid())):
            try:
                (MARKERS / f"{marker}-{args[0]}").unlink()
            except FileNotFoundError:
                continue
            os.kill(victim, signal.SIGKILL)
        return value


def die_in_publish(sender: str | None = None, **_: Any) -> None:
    """See the module's docstring: ``diepublish-collect`` and ``published-collect``."""
    if sender != "ct.collect":
        return
    try:
        (MARKERS / "diepublish-collect").unlink()
    except FileNotFoundError:
        with (MARKERS / "published-collect").open("a") as published:
            published.write(f"{os.getpid()}\n")
        return
    os.kill(os.getpid(), signal.SIGKILL)


signals.before_task_publish.connect(die_in_publish, weak=False)


def write(session: Session, ref: str, handler: str) -> None:
    session.execute(effects.insert().values(ref=ref, handler=handler))


@tasks.task(name="ct.record", base=KilledAfterCommit)
def record(session: Session, ref: str) -> str:
    """One row per run; returns a value that differs on every run of the body."""
    write(session, ref, "ct.record")
    return f"{ref}:{uuid.uuid4().hex}"


@tasks.task(name="ct.step", base=KilledAfterCommit)
def step(session: Session, ref: str) -> str:
    """A canvas step: one row per run, and one row of the value it returns (which differs
    on every run)."""
    write(session, ref, "ct.step")
    value = f"{ref}:{uuid.uuid4().hex}"
    write(session, value, "ct.step:value")
    return value


@tasks.task(name="ct.after")
def after(session: Session, previous: str) -> None:
    """A chain's next step: records the value it was given."""
    write(session, previous, "ct.after")


@tasks.task(name="ct.collect")
def collect(session: Session, values: list[str]) -> None:
    """A chord's body: one row per value of its header it was given."""
    for value in values:
        write(session, value, "ct.collect")


@tasks.task(name="ct.charge", key=lambda order: f"charge-{order}")
def charge(session: Session, order: str) -> None:
    write(session, order, "ct.charge")


@tasks.task(name="ct.flaky", bind=True, max_retries=3, default_retry_delay=0)
def flaky(self: Any, session: Session, ref: str) -> None:
    """Fails (and retries) until its third attempt, writing each time before failing."""
    write(session, ref, "ct.flaky")
    if self.request.retries < 2:
        raise self.retry(countdown=0)


@tasks.task(name="ct.fragile", autoretry_for=(RuntimeError,), max_retries=1, default_retry_delay=0)
def fragile(session: Session, ref: str) -> None:
    """Fails while its marker ``<markers>/fail-<ref>`` exists (retried once, then for good)."""
    write(session, ref, "ct.fragile")
    if (MARKERS / f"fail-{ref}").exists():
        raise RuntimeError(f"{ref} fails on purpose")


@tasks.task(name="ct.strict", key=lambda order: f"order-{order['id']}")
def strict(session: Session, order: dict[str, str]) -> None:
    """Its key needs a mapping with an id: anything else is a poison message."""
    write(session, order["id"], "ct.strict")


@tasks.task(name="ct.tick", key=beat_slot)
def tick(session: Session, slot: str) -> None:
    """A periodic task: one row per run, naming the slot beat sent it for."""
    write(session, slot, "ct.tick")


@tasks.task(name="ct.pay")
def pay(session: Session, ref: str) -> None:
    """Calls the provider once (at-most-once): its pool child dies inside the call while
    ``<markers>/callkill-<ref>`` exists (once: removed first), then writes its row."""

    def call(key: uuid.UUID) -> str:
        with (MARKERS / f"paid-{ref}").open("a") as provider:
            provider.write(f"{key}\n")
        try:
            (MARKERS / f"callkill-{ref}").unlink()
        except FileNotFoundError:
            return str(key)
        os.kill(os.getpid(), signal.SIGKILL)
        return str(key)  # not reached

    tasks.inbox.effect("provider.pay", call, mode="at-most-once")
    write(session, ref, "ct.pay")
