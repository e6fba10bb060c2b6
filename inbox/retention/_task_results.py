"""Celery inbox tasks' stored return values go with their claims: a result row is deleted
once it is older than the window and its claim is gone, after the claims of the same run.

Why: a redelivered inbox task whose claim is still there returns its stored value
(docs/celery.md), so a result must not go while its claim stays - and a claim can outlive
its result's ``stored_at`` (a claim stamped by a server clock behind the workers', a
partition kept because its lock was busy); once the claim is gone a redelivery runs the
task again anyway, as for any claim past retention.
"""

from __future__ import annotations

import datetime as dt
import logging
import time

from sqlalchemy import ColumnElement, Engine, Table, and_, delete, exists, func, inspect, select

from inbox.retention._sizing import BatchSizing

__all__ = ["count_expired_results", "delete_expired_results", "has_result_table"]

logger = logging.getLogger("inbox.retention")


def has_result_table(engine: Engine, results: Table) -> bool:
    """Whether ``results`` exists (a database migrated before Celery tasks has none)."""
    with engine.connect() as connection:
        return inspect(connection).has_table(results.name, schema=results.schema)


def _claim_of(results: Table, claims: Table) -> ColumnElement[bool]:
    return and_(claims.c.message_id == results.c.claim_key, claims.c.handler == results.c.task)


def count_expired_results(
    engine: Engine, results: Table, claims: Table, cutoff: dt.datetime
) -> int:
    """How many results stored strictly before ``cutoff`` a cleanup would delete: those
    whose claim is gone or goes in the same run (processed before ``cutoff``)."""
    young_claim = exists().where(_claim_of(results, claims), claims.c.processed_at >= cutoff)
    query = (
        select(func.count()).select_from(results).where(results.c.stored_at < cutoff, ~young_claim)
    )
    with engine.connect() as connection:
        return int(connection.execute(query).scalar_one())


def delete_expired_results(
    engine: Engine, results: Table, claims: Table, cutoff: dt.datetime, sizing: BatchSizing
) -> tuple[int, int, float]:
    """Delete the results stored strictly before ``cutoff`` whose claim in ``claims`` is
    gone, as many per transaction as ``sizing`` says; return (rows deleted, batches,
    slowest batch's seconds); a look that finds none is no batch. Each batch selects the
    oldest keys, then deletes by key (MySQL and MariaDB take no LIMIT in a subquery of the
    table being deleted from)."""
    claimed = exists().where(_claim_of(results, claims))
    deleted = batches = 0
    longest = 0.0
    key = (results.c.claim_key, results.c.task)
    while True:
        limit = sizing.size
        batch = (
            select(*key).where(results.c.stored_at < cutoff, ~claimed).order_by(results.c.stored_at)
        ).limit(limit)
        began = time.perf_counter()
        with engine.begin() as connection:
            rows = connection.execute(batch).all()
            for task in {row.task for row in rows}:
                gone = [row.claim_key for row in rows if row.task == task]
                connection.execute(
                    delete(results).where(results.c.task == task, results.c.claim_key.in_(gone))
                )
        if not rows:
            break  # nothing (left) to delete: a look, not a batch
        seconds = time.perf_counter() - began
        sizing.record(len(rows), seconds)
        longest = max(longest, seconds)
        batches += 1
        deleted += len(rows)
        if len(rows) < limit:
            break
    logger.debug("cleanup: deleted %d task results from %s", deleted, results.fullname)
    return deleted, batches, longest
