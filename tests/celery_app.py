"""The Celery app the Celery worker tests run in real worker subprocesses
(``celery -A celery_app worker`` from tests/), configured by the environment:

INBOX_CELERY_BROKER  the broker URL        INBOX_CELERY_DATABASE  the database URL
INBOX_CELERY_QUEUE   the queue consumed    INBOX_CELERY_MARKERS   a directory of kill markers
INBOX_CELERY_BACKEND the result backend (default: none)

A marker file ``<markers>/kill-<ref>`` makes the pool child that just committed the task
for ``ref`` kill itself with SIGKILL (once: the file is removed first), after the commit and
before Celery acks the message or sends a chain's next step.
"""

from __future__ import annotations

import os
import signal
import uuid
from pathlib import Path
from typing import Any

from celery import Celery
from sqlalchemy import create_engine
from sqlalchemy.orm import Session, sessionmaker
from support.databases import effects

from inbox import Inbox
from inbox.celery import InboxTask, InboxTasks

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
        marker = MARKERS / f"kill-{args[0]}"
        try:
            marker.unlink()
        except FileNotFoundError:
            return value
        os.kill(os.getpid(), signal.SIGKILL)
        return value  # not reached


def write(session: Session, ref: str, handler: str) -> None:
    session.execute(effects.insert().values(ref=ref, handler=handler))


@tasks.task(name="ct.record", base=KilledAfterCommit)
def record(session: Session, ref: str) -> str:
    """One row per run; returns a value that differs on every run of the body."""
    write(session, ref, "ct.record")
    return f"{ref}:{uuid.uuid4().hex}"


@tasks.task(name="ct.after")
def after(session: Session, previous: str) -> None:
    """A chain's next step: records the value it was given."""
    write(session, previous, "ct.after")


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
