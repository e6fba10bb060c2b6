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
from collections.abc import Sequence
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Connection,
    Engine,
    Row,
    Select,
    Table,
    and_,
    delete,
    exists,
    func,
    inspect,
    select,
)

from inbox.retention._key_batches import delete_by_keys
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
    slowest batch's seconds). Each batch selects the oldest keys, then deletes by key, one
    statement per task (:func:`~inbox.retention._key_batches.delete_by_keys`)."""
    claimed = exists().where(_claim_of(results, claims))
    key = (results.c.claim_key, results.c.task)

    def batch(limit: int) -> Select[Any]:
        stale = results.c.stored_at < cutoff
        return select(*key).where(stale, ~claimed).order_by(results.c.stored_at).limit(limit)

    def delete_keys(connection: Connection, rows: Sequence[Row[Any]]) -> None:
        for task in {row.task for row in rows}:
            gone = [row.claim_key for row in rows if row.task == task]
            connection.execute(
                delete(results).where(results.c.task == task, results.c.claim_key.in_(gone))
            )

    deleted, batches, longest = delete_by_keys(engine, batch, delete_keys, sizing)
    logger.debug("cleanup: deleted %d task results from %s", deleted, results.fullname)
    return deleted, batches, longest
