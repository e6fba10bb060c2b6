"""The relay's database side: take a batch of due rows, delete the confirmed ones, record the
refused ones. Every statement is a SQLAlchemy construct; rows are decoded by
:mod:`inbox.outbox._row`, the one place that knows how the publishing side stores them.

Rows are taken ``FOR UPDATE SKIP LOCKED`` where the database family can (PostgreSQL,
MySQL/MariaDB), so relays running at once never take the same row while it is being sent; on
SQLite (one relay) the plain ``SELECT``. The family may set the transaction's isolation first
(MySQL/MariaDB: READ COMMITTED, so that InnoDB locks no gap after the last row) and may
delete sent rows one by one (``Family.relay_isolation``, ``deletes_rows_one_by_one``).
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from sqlalchemy import Connection, MetaData, Table, bindparam, delete, select, update

from inbox._backends import family_of
from inbox.errors import ConfigurationError
from inbox.outbox._amqp_limits import check_headers
from inbox.outbox._arguments import short_string
from inbox.outbox._row import OutboxRow, row_from_mapping
from inbox.outbox.relay._refusals import error_line, refusal_delay
from inbox.schema import DEFAULT_OUTBOX_TABLE_NAME, outbox_message, outbox_table

__all__ = ["OutboxRows", "Refusal", "Taken", "resolve_outbox_table"]


def resolve_outbox_table(table: str | Table) -> Table:
    """``table`` itself, or the outbox table named ``"name"`` or ``"schema.name"``."""
    if isinstance(table, Table):
        return table
    if not isinstance(table, str):
        raise ConfigurationError(
            f"table must be a str or a sqlalchemy Table, got {type(table).__name__}"
        )
    if table == DEFAULT_OUTBOX_TABLE_NAME:
        return outbox_message
    schema, dot, name = table.rpartition(".")
    if dot and not schema:
        raise ConfigurationError(
            f"outbox table must be NAME or SCHEMA.NAME, each a plain identifier, got {table!r}"
        )
    return outbox_table(MetaData(), name, schema=schema or None)


@dataclass
class Taken:
    """One batch: the rows to send in id order, their attempts so far, the rows that could
    not be read (id -> why), which are refused without being sent, and the length of each
    row's stored headers."""

    rows: list[OutboxRow] = field(default_factory=list)
    attempts: dict[uuid.UUID, int] = field(default_factory=dict)
    unreadable: dict[uuid.UUID, str] = field(default_factory=dict)
    header_sizes: dict[uuid.UUID, int] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.rows) + len(self.unreadable)

    def refusals(
        self, refused: Mapping[uuid.UUID, str], now: dt.datetime, cap: float
    ) -> list[Refusal]:
        """The refusals to record: the unreadable rows and ``refused`` (id -> why), each
        with its attempts counting this one and its next attempt after a backoff."""
        recorded = []
        for row_id, reason in {**self.unreadable, **refused}.items():
            attempts = self.attempts[row_id] + 1
            delay = dt.timedelta(seconds=refusal_delay(attempts, cap))
            recorded.append(Refusal(row_id, attempts, reason, now + delay))
        return recorded


@dataclass(frozen=True)
class Refusal:
    """A refused row: its id, its attempts counting this one, the error, its next attempt."""

    id: uuid.UUID
    attempts: int
    error: str
    next_attempt: dt.datetime


class OutboxRows:
    """The statements of the relay on one outbox ``table``."""

    def __init__(self, table: Table) -> None:
        self.table = table
        c = table.c
        self._delete_one = delete(table).where(c.id == bindparam("b_id"))
        self._refuse = (
            update(table)
            .where(c.id == bindparam("b_id"))
            .values(
                attempts=bindparam("b_attempts"),
                last_error=bindparam("b_error"),
                available_at=bindparam("b_next"),
            )
        )

    def take(self, connection: Connection, limit: int, now: dt.datetime) -> Taken:
        """Lock and read up to ``limit`` rows due at ``now``, in id order (the first
        statement of the relay's transaction)."""
        family = family_of(connection)
        if family.relay_isolation is not None:
            connection.execute(family.relay_isolation)
        c = self.table.c
        query = select(self.table).where(c.available_at <= now).order_by(c.id).limit(limit)
        if family.skips_locked_rows:
            query = query.with_for_update(skip_locked=True)
        taken = Taken()
        for stored in connection.execute(query):
            mapping = stored._asdict()
            row_id: uuid.UUID = mapping["id"]
            taken.attempts[row_id] = int(mapping["attempts"])
            headers = mapping["headers"]
            if isinstance(headers, str):
                taken.header_sizes[row_id] = len(headers)
            try:
                row = row_from_mapping(mapping)
            except Exception as exc:  # a row written by hand or by another version
                taken.unreadable[row_id] = f"the row cannot be read: {error_line(exc)}"
                continue
            unsendable = _unsendable(row)
            if unsendable is None:
                taken.rows.append(row)
            else:
                taken.unreadable[row_id] = f"AMQP cannot carry the row: {unsendable}"
        return taken

    def delete(self, connection: Connection, ids: Sequence[uuid.UUID]) -> int:
        """Delete the rows ``ids``; how many there were."""
        if not ids:
            return 0
        if family_of(connection).deletes_rows_one_by_one:
            result = connection.execute(self._delete_one, [{"b_id": i} for i in ids])
        else:
            result = connection.execute(delete(self.table).where(self.table.c.id.in_(ids)))
        return int(result.rowcount)

    def refuse(self, connection: Connection, refusals: Sequence[Refusal]) -> None:
        """Record each refusal on its row: attempts, last error, next attempt."""
        if not refusals:
            return
        connection.execute(
            self._refuse,
            [
                {
                    "b_id": r.id,
                    "b_attempts": r.attempts,
                    "b_error": r.error,
                    "b_next": r.next_attempt,
                }
                for r in refusals
            ],
        )


def _unsendable(row: OutboxRow) -> str | None:
    """Why AMQP cannot carry ``row`` as it is stored (the rules ``Outbox.publish`` checks,
    which a row written by hand may break), or None."""
    try:
        for name in ("type", "exchange", "routing_key", "content_type"):
            short_string(name, getattr(row, name))
        if row.content_encoding is not None:
            short_string("content_encoding", row.content_encoding)
        check_headers(row.headers, max_bytes=None)  # whether it fits a frame: checked later
    except ValueError as exc:  # InvalidMessage (a TypeError too for a wrong type)
        return error_line(exc)
    return None
