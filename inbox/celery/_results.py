"""Task return values, stored beside the claim in the task's own transaction.

A redelivered inbox task whose claim is already taken does not run again; it returns what
its first run returned, read from here, so a chain's next step or a chord's header gets the
right value. Values are JSON (kombu's, which also round-trips datetimes, UUIDs and
decimals); ``None`` is stored too (as ``null``), so a claim without its row is a value
lost - a redelivery that finds none says so in a warning rather than pass ``None`` on
silently.
"""

from __future__ import annotations

import datetime as dt
import logging
import uuid
from typing import Any, Final

from kombu.utils.json import dumps, loads
from sqlalchemy import MetaData, select
from sqlalchemy.orm import Session

from inbox.errors import InboxError
from inbox.schema import DEFAULT_RESULT_TABLE_NAME, inbox_task_result

__all__ = [
    "DEFAULT_MAX_RESULT_BYTES",
    "DEFAULT_RESULT_TABLE_NAME",
    "ResultTooLarge",
    "load_result",
    "result_metadata",
    "store_result",
    "task_result_table",
]

DEFAULT_MAX_RESULT_BYTES: Final = 64 * 1024

logger = logging.getLogger("inbox.celery")

result_metadata: Final = MetaData()
"""A metadata holding :data:`task_result_table` and nothing else (``create_all`` on it
creates that one table). The shipped alembic revisions (``inbox migrate``) create the
table as part of :data:`inbox.schema.metadata`: an autogenerate target that includes that
metadata must not list this one too (alembic refuses a table named in both)."""

task_result_table: Final = inbox_task_result.to_metadata(result_metadata)
"""``inbox_task_result``: an inbox task's return value per (claim key, task name); the
same table as :data:`inbox.schema.inbox_task_result`, on :data:`result_metadata`."""


class ResultTooLarge(InboxError, ValueError):
    """An inbox task returned a value whose JSON is longer than the task's
    ``max_result_bytes``: the task's transaction is rolled back (its claim with it)."""

    def __init__(self, task: str, size: int, limit: int) -> None:
        # The fields are the args, so Celery rebuilds it from a result backend as itself.
        super().__init__(task, size, limit)
        self.task = task
        self.size = size
        self.limit = limit

    def __str__(self) -> str:
        return (
            f"inbox task {self.task!r} returned {self.size} bytes of JSON, over "
            f"max_result_bytes={self.limit}: return a smaller value (an id to look the rest "
            "up), or raise the limit"
        )


def store_result(
    session: Session, claim_key: bytes, task: str, value: object, max_bytes: int
) -> None:
    """Write ``value`` for the claim ``(claim_key, task)`` in ``session``'s transaction
    (``None`` as ``null``). Raises :class:`ResultTooLarge` past ``max_bytes`` and
    ``TypeError`` for a value JSON cannot carry, both before anything is written."""
    text = dumps(value)
    size = len(text.encode("utf-8"))
    if size > max_bytes:
        raise ResultTooLarge(task, size, max_bytes)
    session.execute(
        task_result_table.insert().values(
            claim_key=claim_key, task=task, result=text, stored_at=dt.datetime.now(dt.UTC)
        )
    )


def load_result(session: Session, claim_key: bytes, task: str) -> Any:
    """The value stored for the claim ``(claim_key, task)``. With no row (deleted by hand,
    or the table emptied while the claims stayed) the value is lost: logs a warning on
    ``inbox.celery`` naming the claim and returns ``None``."""
    text = session.execute(
        select(task_result_table.c.result).where(
            task_result_table.c.claim_key == claim_key, task_result_table.c.task == task
        )
    ).scalar_one_or_none()
    if text is None:
        logger.warning(
            "inbox task %r: claim %s is taken but its stored return value is gone (the row of "
            "%s was deleted while the claim stayed); this redelivery returns None in its place",
            task,
            uuid.UUID(bytes=claim_key),
            task_result_table.name,
        )
        return None
    return loads(text)
