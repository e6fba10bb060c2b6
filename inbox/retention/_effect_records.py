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
import time
from typing import Final

from sqlalchemy import ColumnElement, Engine, Table, and_, delete, func, inspect, select

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


def effect_sizing(batch_size: int | None, batch_seconds: float) -> BatchSizing:
    """The batches of effect records: as for claims, at most :data:`MAX_EFFECT_BATCH`."""
    fixed = None if batch_size is None else min(batch_size, MAX_EFFECT_BATCH)
    return BatchSizing(fixed, batch_seconds, most=MAX_EFFECT_BATCH)


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
    seconds). Each batch selects the keys through the claims, then deletes by key (MySQL
    and MariaDB take no LIMIT in a subquery of the table being deleted from)."""
    expired = claims.join(effects, _expired(effects, claims, cutoff))
    deleted = batches = 0
    longest = 0.0
    while True:
        limit = sizing.size
        batch = select(effects.c.effect_key).select_from(expired).limit(limit)
        began = time.perf_counter()
        with engine.begin() as connection:
            keys = list(connection.execute(batch).scalars())
            if keys:
                connection.execute(delete(effects).where(effects.c.effect_key.in_(keys)))
        seconds = time.perf_counter() - began
        sizing.record(len(keys), seconds)
        longest = max(longest, seconds)
        batches += 1
        deleted += len(keys)
        if len(keys) < limit:
            break
    logger.debug("cleanup: deleted %d effect records from %s", deleted, effects.fullname)
    return deleted, batches, longest
