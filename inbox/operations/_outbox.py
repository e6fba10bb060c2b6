"""Outbox rows for a person: list the pending and refused ones, send refused rows again now
(once their cause is fixed: the queue declared, the exchange bound), or drop rows that can
never go out. The relay (docs/outbox.md) keeps a refused row for ever, its ``available_at``
pushed back by up to ``--max-retry-delay``; :func:`retry_now` moves it to now, so the
relay's next look (within its poll interval) sends it."""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Collection
from dataclasses import dataclass
from typing import Final

from sqlalchemy import Engine, Table, delete, func, select, update

from inbox.errors import ConfigurationError

__all__ = ["OutboxRow", "drop_rows", "list_rows", "parse_row_id", "retry_now"]

_MAX_IDS: Final = 1000


@dataclass(frozen=True, slots=True)
class OutboxRow:
    """One outbox row as an operator sees it (the body is left out: see ``body_bytes``)."""

    id: uuid.UUID
    type: str
    exchange: str
    routing_key: str
    created_at: dt.datetime
    attempts: int
    available_at: dt.datetime
    last_error: str | None
    body_bytes: int

    @property
    def refused(self) -> bool:
        """Whether the broker refused it at least once."""
        return self.attempts > 0


def parse_row_id(text: str) -> uuid.UUID:
    """An outbox row id (a UUID); ``ValueError`` for anything else."""
    try:
        return uuid.UUID(text.strip())
    except ValueError:
        raise ConfigurationError(f"not an outbox row id (a UUID): {text[:60]!r}") from None


def list_rows(
    engine: Engine, outbox: Table, *, refused_only: bool = False, limit: int = 100
) -> list[OutboxRow]:
    """The oldest ``limit`` rows (by id: creation order), only refused ones if asked."""
    c = outbox.c
    query = select(
        c.id,
        c.type,
        c.exchange,
        c.routing_key,
        c.created_at,
        c.attempts,
        c.available_at,
        c.last_error,
        func.length(c.body),
    )
    if refused_only:
        query = query.where(c.attempts > 0)
    with engine.connect() as connection:
        rows = connection.execute(query.order_by(c.id).limit(limit))
        return [OutboxRow(*row) for row in rows]


def _checked(ids: Collection[uuid.UUID]) -> list[uuid.UUID]:
    if not ids:
        raise ConfigurationError("no outbox row chosen")
    if len(ids) > _MAX_IDS:
        raise ConfigurationError(f"at most {_MAX_IDS} rows at a time, got {len(ids)}")
    return list(ids)


def retry_now(engine: Engine, outbox: Table, ids: Collection[uuid.UUID]) -> int:
    """Make the refused rows among ``ids`` due now; return how many. Rows not refused are
    due already and are left alone (also a row a relay is sending this moment: the
    UPDATE waits for its batch, then finds it gone or refused again)."""
    c = outbox.c
    with engine.begin() as connection:
        return int(
            connection.execute(
                update(outbox)
                .where(c.id.in_(_checked(ids)), c.attempts > 0)
                .values(available_at=dt.datetime.now(dt.UTC))
            ).rowcount
        )


def drop_rows(engine: Engine, outbox: Table, ids: Collection[uuid.UUID]) -> int:
    """Delete the refused rows among ``ids`` for good (they will never be sent); return how
    many. A row never refused is the relay's to send, and is left alone."""
    c = outbox.c
    with engine.begin() as connection:
        return int(
            connection.execute(
                delete(outbox).where(c.id.in_(_checked(ids)), c.attempts > 0)
            ).rowcount
        )
