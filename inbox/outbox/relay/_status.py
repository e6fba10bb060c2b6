"""What an operator asks of an outbox table: how many rows wait, since when, and which the
broker refused (how many, the oldest, its last error)."""

from __future__ import annotations

import datetime as dt
import uuid
from dataclasses import dataclass

from sqlalchemy import Engine, Table, func, select

from inbox.errors import ConfigurationError

__all__ = ["OutboxStatus", "outbox_status"]


@dataclass(frozen=True)
class OutboxStatus:
    """The state of one outbox table at one moment.

    ``pending``: rows not sent yet (refused ones included), the oldest created at
    ``oldest_created_at``; ``refused``: rows the broker refused at least once. The oldest
    refused row (by id) is ``oldest_refused_id``, with its ``attempts``, ``last_error`` and
    ``next_attempt_at``.
    """

    table: str
    pending: int
    oldest_created_at: dt.datetime | None
    refused: int
    oldest_refused_id: uuid.UUID | None = None
    attempts: int = 0
    last_error: str | None = None
    next_attempt_at: dt.datetime | None = None

    def line(self) -> str:
        """The status on one line, for a terminal or a log."""
        text = f"{self.table}: pending={self.pending}"
        if self.oldest_created_at is not None:
            text += f" oldest={self.oldest_created_at.isoformat(timespec='seconds')}"
        text += f" refused={self.refused}"
        if self.oldest_refused_id is not None:
            due = self.next_attempt_at
            when = due.isoformat(timespec="seconds") if due is not None else "?"
            text += (
                f" oldest_refused={self.oldest_refused_id} attempts={self.attempts} "
                f"next_attempt={when} last_error={self.last_error!r}"
            )
        return text


def outbox_status(engine: Engine, table: Table) -> OutboxStatus:
    """Read the status of the outbox ``table`` (three short queries, no locks)."""
    c = table.c
    name = f"{table.schema}.{table.name}" if table.schema else table.name
    with engine.connect() as connection:
        pending, oldest = connection.execute(
            select(func.count(), func.min(c.created_at)).select_from(table)
        ).one()
        refused = connection.execute(
            select(func.count()).select_from(table).where(c.attempts > 0)
        ).scalar_one()
        worst = connection.execute(
            select(c.id, c.attempts, c.last_error, c.available_at)
            .where(c.attempts > 0)
            .order_by(c.id)
            .limit(1)
        ).first()
    status = OutboxStatus(name, int(pending), _aware(oldest), int(refused))
    if worst is None:
        return status
    return OutboxStatus(
        name,
        status.pending,
        status.oldest_created_at,
        status.refused,
        worst.id,
        int(worst.attempts),
        worst.last_error,
        worst.available_at,
    )


def _aware(value: object) -> dt.datetime | None:
    """``func.min`` loses the column type on some dialects: read the value as UTC."""
    if value is None:
        return None
    if isinstance(value, str):  # SQLite returns the stored text
        value = dt.datetime.fromisoformat(value)
    if not isinstance(value, dt.datetime):
        raise ConfigurationError(f"expected a timestamp, got {type(value).__name__}")
    return value.replace(tzinfo=dt.UTC) if value.tzinfo is None else value.astimezone(dt.UTC)
