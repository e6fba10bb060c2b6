"""Effect records go with their claims: an effect record is deleted only once the committed
claim it belongs to is past retention, and before that claim is deleted.

Why this order is safe: while the claim is there, a redelivery is a duplicate and its
handler never runs, so no effect record is read; once the claim is gone a redelivery runs
the handler again anyway, as for any claim past retention. An effect whose claim never
committed (the handler still failing, the delivery dead-lettered, an at-most-once effect
left uncertain) has no claim to expire with: it stays until a person releases it.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Sequence
from typing import Any, Final

from sqlalchemy import (
    ColumnElement,
    Connection,
    Engine,
    Row,
    Select,
    Table,
    and_,
    delete,
    func,
    inspect,
    select,
)

from inbox.retention._key_batches import delete_by_keys
from inbox.retention._sizing import BatchSizing

__all__ = [
    "count_expired_effects",
    "delete_expired_effects",
    "effect_sizing",
    "has_effect_table",
]

logger = logging.getLogger("inbox.retention")

MAX_EFFECT_BATCH: Final = 10_000
"""The most effect records per batch: each batch deletes by a list of keys, one bound
parameter each (PostgreSQL takes at most 65,535 in one statement)."""


def effect_sizing(
    batch_size: int | None,
    batch_seconds: float,
    pause_seconds: float = 0.0,
    pause_ratio: float = 0.0,
) -> BatchSizing:
    """The batches of effect records (and task results): as for claims, the same pause
    between two, at most :data:`MAX_EFFECT_BATCH` rows."""
    fixed = None if batch_size is None else min(batch_size, MAX_EFFECT_BATCH)
    return BatchSizing(
        fixed, batch_seconds, most=MAX_EFFECT_BATCH, pause=pause_seconds, pause_ratio=pause_ratio
    )


def has_effect_table(engine: Engine, effects: Table) -> bool:
    """Whether ``effects`` exists (a database migrated before effects has none)."""
    with engine.connect() as connection:
        return inspect(connection).has_table(effects.name, schema=effects.schema)


def _expired(effects: Table, claims: Table, cutoff: dt.datetime) -> ColumnElement[bool]:
    return and_(
        claims.c.message_id == effects.c.claim_key,
        claims.c.handler == effects.c.handler,
        claims.c.processed_at < cutoff,
    )


def count_expired_effects(
    engine: Engine, effects: Table, claims: Table, cutoff: dt.datetime
) -> int:
    """How many effect records belong to claims processed strictly before ``cutoff``."""
    query = select(func.count()).select_from(
        effects.join(claims, _expired(effects, claims, cutoff))
    )
    with engine.connect() as connection:
        return int(connection.execute(query).scalar_one())


def delete_expired_effects(
    engine: Engine, effects: Table, claims: Table, cutoff: dt.datetime, sizing: BatchSizing
) -> tuple[int, int, float]:
    """Delete the effect records of claims processed strictly before ``cutoff``, as many per
    transaction as ``sizing`` says; return (records deleted, batches, slowest batch's
    seconds). Each batch selects the keys through the claims, then deletes by key
    (:func:`~inbox.retention._key_batches.delete_by_keys`)."""
    expired = claims.join(effects, _expired(effects, claims, cutoff))

    def batch(limit: int) -> Select[Any]:
        return select(effects.c.effect_key).select_from(expired).limit(limit)

    def delete_keys(connection: Connection, rows: Sequence[Row[Any]]) -> None:
        keys = [row.effect_key for row in rows]
        connection.execute(delete(effects).where(effects.c.effect_key.in_(keys)))

    deleted, batches, longest = delete_by_keys(engine, batch, delete_keys, sizing)
    logger.debug("cleanup: deleted %d effect records from %s", deleted, effects.fullname)
    return deleted, batches, longest
