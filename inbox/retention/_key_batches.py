"""The batch loop the tables beside the claims share (effect records, Celery task results):
select the keys of a batch, delete by those keys, size the next batch, pause, again.

Each batch is one transaction that selects at most ``sizing.size`` keys and deletes the rows
they name (MySQL and MariaDB take no LIMIT in a subquery of the table being deleted from, so
the keys travel through Python). A look that finds no key is no batch: it ends the loop and
is neither counted nor timed. A batch that found fewer keys than it asked for was the last.
Between two batches the loop sleeps ``sizing.next_pause`` seconds, as the claims' loop does.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from sqlalchemy import Connection, Engine, Row, Select

from inbox.retention._sizing import BatchSizing

__all__ = ["delete_by_keys"]


def delete_by_keys(
    engine: Engine,
    select_keys: Callable[[int], Select[Any]],
    delete_keys: Callable[[Connection, Sequence[Row[Any]]], None],
    sizing: BatchSizing,
) -> tuple[int, int, float]:
    """Delete in batches: ``select_keys(limit)`` is the statement that picks a batch's keys,
    ``delete_keys(connection, rows)`` deletes the rows those keys name, in the same
    transaction. Return (rows deleted, batches, seconds of the slowest batch)."""
    deleted = batches = 0
    longest = 0.0
    while True:
        limit = sizing.size
        began = time.perf_counter()
        with engine.begin() as connection:
            rows = connection.execute(select_keys(limit)).all()
            if rows:
                delete_keys(connection, rows)
        if not rows:
            break  # nothing (left) to delete: a look, not a batch
        seconds = time.perf_counter() - began
        sizing.record(len(rows), seconds)
        longest = max(longest, seconds)
        batches += 1
        deleted += len(rows)
        if len(rows) < limit:
            break
        if pause := sizing.next_pause:
            time.sleep(pause)
    return deleted, batches, longest
