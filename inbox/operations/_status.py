"""What ``inbox status`` reads from the database: claims per handler, the table's size and
partitions, the outbox backlog and its refused rows, and the effects not done."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Final

from sqlalchemy import (
    ColumnElement,
    Connection,
    Engine,
    Table,
    and_,
    case,
    func,
    inspect,
    literal,
    select,
)

from inbox._backends import family_of
from inbox.partitioning._catalog import is_partitioned, list_partitions

__all__ = [
    "DONE_WITHOUT_RESULT",
    "ClaimsByHandler",
    "EffectsReport",
    "OutboxReport",
    "StatusReport",
    "UnfinishedEffect",
    "effect_status",
    "read_status",
    "recent_claims",
]

_TOP_ERRORS = 5
_UNFINISHED_SHOWN = 10


@dataclass(frozen=True, slots=True)
class ClaimsByHandler:
    """The claims of one handler."""

    handler: str
    count: int
    oldest: dt.datetime | None
    newest: dt.datetime | None


@dataclass(frozen=True, slots=True)
class OutboxReport:
    """Rows waiting in the outbox; ``refused``: rows the relay tried and could not send."""

    pending: int
    oldest: dt.datetime | None
    refused: int
    oldest_refused: dt.datetime | None
    errors: tuple[tuple[str, int], ...]
    """The most frequent last errors of refused rows, with their counts."""


@dataclass(frozen=True, slots=True)
class UnfinishedEffect:
    """An effect started or failed and not done: its outcome outside the database is
    uncertain until a later attempt finishes it (or a person releases it). Also one done
    without its result (:data:`DONE_WITHOUT_RESULT`), which waits for a person."""

    handler: str
    step: str
    status: str
    attempts: int
    updated_at: dt.datetime
    error: str | None


@dataclass(frozen=True, slots=True)
class EffectsReport:
    """Effect records by status, and the oldest of those not done."""

    by_status: dict[str, int]
    unfinished: tuple[UnfinishedEffect, ...]


@dataclass(frozen=True, slots=True)
class StatusReport:
    """Everything ``inbox status`` prints; None for a table the database does not have."""

    table: str
    claims: tuple[ClaimsByHandler, ...]
    size_bytes: int | None
    partitions: int | None
    outbox: OutboxReport | None
    effects: EffectsReport | None
    dead_letters: dict[str, int | None] = field(default_factory=dict)
    """Dead letters per dead-letter queue (``inbox status --queue``); None: no such queue."""


def read_status(engine: Engine, claims: Table, outbox: Table, effects: Table) -> StatusReport:
    """Read the report from the database (each count is one scan of its table)."""
    with engine.connect() as connection:
        present = inspect(connection)
        by_handler = tuple(
            ClaimsByHandler(handler, count, oldest, newest)
            for handler, count, oldest, newest in connection.execute(
                select(
                    claims.c.handler,
                    func.count(),
                    func.min(claims.c.processed_at),
                    func.max(claims.c.processed_at),
                )
                .group_by(claims.c.handler)
                .order_by(claims.c.handler)
            )
        )
        size = _size(connection, claims)
        outbox_report = (
            _outbox(connection, outbox) if present.has_table(outbox.name, outbox.schema) else None
        )
        effects_report = (
            _effects(connection, effects)
            if present.has_table(effects.name, effects.schema)
            else None
        )
    partitions = len(list_partitions(engine, claims)) if is_partitioned(engine, claims) else None
    return StatusReport(
        claims.fullname, by_handler, size, partitions, outbox_report, effects_report
    )


def _size(connection: Connection, table: Table) -> int | None:
    """Table and index bytes (partitions included) where the family can tell (PostgreSQL,
    MySQL/MariaDB)."""
    return family_of(connection).table_bytes(connection, table)


def _outbox(connection: Connection, outbox: Table) -> OutboxReport:
    c = outbox.c
    pending, oldest = connection.execute(select(func.count(), func.min(c.created_at))).one()
    refused_rows = select(func.count(), func.min(c.created_at)).where(c.attempts > 0)
    refused, oldest_refused = connection.execute(refused_rows).one()
    errors = tuple(
        (str(error), int(count))
        for error, count in connection.execute(
            select(c.last_error, func.count().label("n"))
            .where(c.attempts > 0, c.last_error.is_not(None))
            .group_by(c.last_error)
            .order_by(func.count().desc())
            .limit(_TOP_ERRORS)
        )
    )
    return OutboxReport(int(pending), oldest, int(refused), oldest_refused, errors)


def _effects(connection: Connection, effects: Table) -> EffectsReport:
    c = effects.c
    status = effect_status(c.status, c.result)
    by_status = {
        str(name): int(count)
        for name, count in connection.execute(
            select(status, func.count()).group_by(status).order_by(status)
        )
    }
    unfinished = tuple(
        UnfinishedEffect(handler, step, shown, attempts, updated_at, error)
        for handler, step, shown, attempts, updated_at, error in connection.execute(
            select(c.handler, c.step, status, c.attempts, c.updated_at, c.error)
            .where(status != DONE)
            .order_by(c.updated_at)
            .limit(_UNFINISHED_SHOWN)
        )
    )
    return EffectsReport(by_status, unfinished)


def recent_claims(engine: Engine, claims: Table, since: dt.timedelta) -> dict[str, int]:
    """Claims committed in the last ``since``, per handler (the handlers with none left
    out): what the console shows as recent work."""
    cutoff = dt.datetime.now(dt.UTC) - since
    with engine.connect() as connection:
        return {
            str(handler): int(count)
            for handler, count in connection.execute(
                select(claims.c.handler, func.count())
                .where(claims.c.processed_at >= cutoff)
                .group_by(claims.c.handler)
                .order_by(claims.c.handler)
            )
        }


DONE: Final = "done"
DONE_WITHOUT_RESULT: Final = "done without result"
"""How ``inbox`` shows an effect the ledger recorded done with no result (the call was
made, its result could not be stored): every later attempt raises ``UncertainEffect`` until
a person releases the record."""


def effect_status(status: ColumnElement[str], result: ColumnElement[str]) -> ColumnElement[str]:
    """An effect record's status as ``inbox`` shows it: ``done`` without a stored result is
    :data:`DONE_WITHOUT_RESULT` (a result of ``None`` is stored as the JSON ``null``)."""
    return case(
        (and_(status == DONE, result.is_(None)), literal(DONE_WITHOUT_RESULT)), else_=status
    )
