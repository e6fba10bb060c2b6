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

from sqlalchemy import ColumnElement, Engine, Table, and_, delete, func, inspect, select

__all__ = ["count_expired_effects", "delete_expired_effects", "has_effect_table"]

logger = logging.getLogger("inbox.retention")


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
    engine: Engine, effects: Table, claims: Table, cutoff: dt.datetime, batch_size: int
) -> tuple[int, int, float]:
    """Delete the effect records of claims processed strictly before ``cutoff``, at most
    ``batch_size`` per transaction; return (records deleted, batches, slowest batch's
    seconds). Each batch selects the keys through the claims, then deletes by key (MySQL
    and MariaDB take no LIMIT in a subquery of the table being deleted from)."""
    batch = (
        select(effects.c.effect_key)
        .select_from(claims.join(effects, _expired(effects, claims, cutoff)))
        .limit(batch_size)
    )
    deleted = batches = 0
    longest = 0.0
    while True:
        began = time.perf_counter()
        with engine.begin() as connection:
            keys = list(connection.execute(batch).scalars())
            if keys:
                connection.execute(delete(effects).where(effects.c.effect_key.in_(keys)))
        longest = max(longest, time.perf_counter() - began)
        batches += 1
        deleted += len(keys)
        if len(keys) < batch_size:
            break
    logger.debug("cleanup: deleted %d effect records from %s", deleted, effects.fullname)
    return deleted, batches, longest
