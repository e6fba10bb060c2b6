"""PostgreSQL's batched delete of expired claims: one walker per table deleting key ranges
of ``processed_at`` from a keyset cursor (no row locks to wait on) under an advisory lock, and
helpers deleting ``SKIP LOCKED`` beside it (docs/operations.md). The statements, built once
per table; :mod:`inbox.retention._batches` runs the loop."""

from __future__ import annotations

import datetime as dt
import zlib
from collections.abc import Callable
from typing import Any, Final

from sqlalchemy import (
    Connection,
    Executable,
    Table,
    and_,
    any_,
    bindparam,
    cast,
    delete,
    false,
    func,
    literal_column,
    select,
)
from sqlalchemy.dialects.postgresql import OID
from sqlalchemy.sql import ColumnElement
from sqlalchemy.types import Integer

from inbox._column_types import UTCDateTime

__all__ = ["Step", "pg_step"]

Step = Callable[
    [Connection, dict[bool, "dt.datetime | None"], int],
    tuple[bool, int, int, "dt.datetime | None"],
]
"""One batch in the caller's transaction, about ``limit`` rows, from the cursor of its kind
in ``cursors``: (the walker's kind?, a full batch: more may follow from the next cursor?,
rows deleted, the next cursor)."""


def pg_step(table: Table, cutoff: dt.datetime) -> Step:
    """One PostgreSQL batch in the caller's transaction: the walker's if its advisory lock
    is free for this transaction, else a helper's; from that kind's cursor in ``cursors``
    (True: the walker's). Returns (walker?, full?, rows deleted, the next cursor)."""
    opening = {bounded: _pg_opening(table, cutoff, bounded=bounded) for bounded in (True, False)}
    ranges = {bounded: _pg_range(table, cutoff, bounded=bounded) for bounded in (True, False)}
    ties = _pg_ties(table, cutoff)
    helpers = {bounded: _pg_helper(table, cutoff, bounded=bounded) for bounded in (True, False)}
    keys: list[int | None] = []

    def step(
        connection: Connection, cursors: dict[bool, dt.datetime | None], limit: int
    ) -> tuple[bool, bool, int, dt.datetime | None]:
        if not keys:
            keys.append(_oid_key(connection, table))
        key = keys[0]
        edge = cursors.get(True)
        params: dict[str, Any] = {"key": key, "limit": limit, "edge": edge}
        walker, _, to = connection.execute(opening[edge is not None], params).one()
        if walker:
            if edge is not None and to == edge:
                # More than a batch of claims share one processed_at (one transaction's
                # claims, a bulk import): a batch of them by ctid, the cursor stays.
                count = connection.execute(ties, {"edge": edge, "limit": limit}).rowcount
                return True, True, int(count), edge
            bounds = {"edge": edge, "to": cutoff if to is None else to}
            count = int(connection.execute(ranges[edge is not None], bounds).rowcount)
            if to is None:
                # The rest, up to the cutoff. A full batch is followed by one more, as on
                # the other dialects; from the cutoff on it finds nothing.
                return True, count >= limit, count, cutoff
            return True, True, count, to
        edge = cursors.get(False)
        params = {"limit": limit, "edge": edge}
        count, next_edge = connection.execute(helpers[edge is not None], params).one()
        return False, count >= limit, int(count), next_edge

    return step


def _pg_opening(table: Table, cutoff: dt.datetime, *, bounded: bool) -> Executable:
    """A batch's first statement: take the walker's lock for this transaction if it is
    free (NULL ``:key``: the table is gone, the batch will say so), turn
    ``synchronous_commit`` off for it, and read where the walker's batch ends: the
    ``processed_at`` of the first expired claim past ``:limit`` of them from the cursor
    ``:edge`` on (when ``bounded``), or NULL when no more than ``:limit`` are left. An
    index-only scan of the ``processed_at`` index, reading no table rows."""
    at = table.c.processed_at
    expired = at < cutoff
    if bounded:
        expired = and_(at >= bindparam("edge", type_=UTCDateTime()), expired)
    to = select(at).where(expired).order_by(at).offset(bindparam("limit", type_=Integer()))
    key = bindparam("key", type_=Integer())
    return select(
        func.coalesce(func.pg_try_advisory_xact_lock(_LOCK_SPACE, key), false()),
        func.set_config("synchronous_commit", "off", True),
        to.limit(1).scalar_subquery(),
    )


def _pg_range(table: Table, cutoff: dt.datetime, *, bounded: bool) -> Executable:
    """The walker's batch: every claim in ``[:edge, :to)`` (from the start when not
    ``bounded``), and never one at or after the cutoff whatever ``:to`` says."""
    at = table.c.processed_at
    expired = and_(at < bindparam("to", type_=UTCDateTime()), at < cutoff)
    if bounded:
        expired = and_(at >= bindparam("edge", type_=UTCDateTime()), expired)
    return delete(table).where(expired)


_CTID: Final[ColumnElement[Any]] = literal_column("ctid")
"""A row's physical address, unique within one table (one partition)."""


def _pg_ties(table: Table, cutoff: dt.datetime) -> Executable:
    """A batch of ``:limit`` claims whose ``processed_at`` is ``:edge``, by ``ctid``."""
    at = table.c.processed_at
    ctid = _CTID
    tied = at == bindparam("edge", type_=UTCDateTime())
    batch = select(ctid).select_from(table).where(tied, at < cutoff)
    batch = batch.limit(bindparam("limit", type_=Integer()))
    return delete(table).where(ctid == any_(func.array(batch.scalar_subquery())))


def _pg_helper(table: Table, cutoff: dt.datetime, *, bounded: bool) -> Executable:
    """A helper's batch: at most ``:limit`` expired claims, newest first (at or before the
    cursor ``:edge`` when ``bounded``), picked ``FOR UPDATE SKIP LOCKED`` and deleted by
    ``ctid``; returns how many went and the oldest ``processed_at`` among them.

    ``table`` must be a plain table or a single partition: a ``ctid`` is unique within one
    relation only, so on a partitioned parent the addresses of one partition's expired rows
    would also match other partitions' rows.
    """
    at = table.c.processed_at
    expired = at < cutoff
    if bounded:
        expired = and_(at <= bindparam("edge", type_=UTCDateTime()), expired)
    ctid = _CTID
    batch = select(ctid).select_from(table).where(expired).order_by(at.desc())
    batch = batch.limit(bindparam("limit", type_=Integer())).with_for_update(skip_locked=True)
    gone = (
        delete(table)
        .where(ctid == any_(func.array(batch.scalar_subquery())))
        .returning(at)
        .cte("gone")
    )
    return select(func.count(), func.min(gone.c.processed_at)).select_from(gone)


# The walker's advisory lock on one table: (a constant naming inbox cleanup, the table's
# oid), taken by each walker batch for its transaction. The cleanup whose batch finds it
# taken runs a helper batch instead, and again for its next batch until the lock is free.
_LOCK_SPACE: Final = zlib.crc32(b"inbox.retention.walker") - 2**31


def _oid_key(connection: Connection, table: Table) -> int | None:
    """The oid of ``table`` as the server resolves its name (``schema_translate_map``
    applied, then the search path), as an int4 lock key; None when there is no such table.
    """
    schema = table.schema
    translate = connection.get_execution_options().get("schema_translate_map") or {}
    schema = translate.get(schema, schema)
    name = func.quote_ident(table.name)
    if schema:
        name = func.concat(func.quote_ident(schema), ".", name)
    # oid to int4 is a binary cast: oids above 2**31 become negative keys, still distinct.
    value = connection.execute(select(cast(cast(func.to_regclass(name), OID), Integer))).scalar()
    return None if value is None else int(value)
