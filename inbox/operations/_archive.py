"""The dead-letter archive: dead letters moved out of ``<queue>.dlq`` into a table of the
inbox's database (``inbox_dead_letter_archive``, :func:`inbox.schema.archive_table`)
instead of being deleted, with who archived them and when; restored (replayed to their
queue) or deleted from there, and deleted after a number of days by ``inbox-cleanup
--archive-days`` (:mod:`inbox.retention._archive_retention`).

An archive commits each dead letter's row before it takes the letter from the dead-letter
queue: a crash in between leaves it in both (archived twice at worst), never in neither. A
restore publishes the copy (confirmed on RabbitMQ) before it deletes the row: a crash in
between sends it again on the next restore, and the inbox skips it for every handler that
committed."""

from __future__ import annotations

import datetime as dt
import json
import uuid
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any, Final

from sqlalchemy import ColumnElement, Engine, Table, delete, func, select

from inbox.errors import ConfigurationError, InvalidMessage
from inbox.message import uuid7
from inbox.operations import _replay
from inbox.operations._dead_letter_sources import DeadLetters
from inbox.operations._dead_letters import DeadLetterRecord
from inbox.operations._filters import Filters
from inbox.outbox._row import encoded_headers, headers_from_json

__all__ = [
    "LISTED",
    "ArchivedLetter",
    "archive",
    "count_archived",
    "delete_archived",
    "keep_letter",
    "listed",
    "restore",
]

LISTED: Final = 200
"""The archived letters one listing shows, at most (newest first)."""


@dataclass(frozen=True, slots=True)
class ArchivedLetter:
    """One row of the archive, without its body."""

    id: uuid.UUID
    queue: str
    ref: str
    source: str
    reason: str | None
    error: str | None
    dead_lettered_at: dt.datetime | None
    archived_at: dt.datetime
    archived_by: str
    body_bytes: int


def archive(
    source: DeadLetters,
    engine: Engine,
    table: Table,
    queue: str,
    *,
    filters: Filters,
    who: str,
    limit: int | None = None,
    max_read: int | None = None,
    dry_run: bool = False,
    preview: _replay.PreviewBound | None = None,
) -> _replay.MoveReport:
    """Move at most ``limit`` dead letters of ``queue`` that pass ``filters`` into the
    archive ``table``, as ``who``: bounded and previewed as :func:`_replay.purge` (a dry run
    moves nothing); each row committed before its dead letter is taken."""

    def keep(held: _replay.HeldLetter) -> None:
        headers, properties, body = held.contents()
        keep_letter(
            engine,
            table,
            held.letter,
            queue=queue,
            kind=source.kind,
            headers=headers,
            properties=properties,
            body=body,
            who=who,
        )

    return _replay.purge(
        source,
        queue,
        filters,
        limit=limit,
        max_read=max_read,
        dry_run=dry_run,
        preview=preview,
        keep=keep,
    )


def keep_letter(
    engine: Engine,
    table: Table,
    letter: DeadLetterRecord,
    *,
    queue: str,
    kind: str,
    headers: Mapping[str, Any],
    properties: Mapping[str, Any],
    body: bytes,
    who: str,
) -> uuid.UUID:
    """Commit one dead letter of ``queue`` (on a ``kind`` broker) as a row of the archive
    ``table``, archived by ``who``; its id."""
    archived_id = uuid7()
    row = {
        "id": archived_id,
        "queue": queue,
        "ref": letter.ref[:255],
        "source": kind,
        "reason": (letter.reason or "")[:64] or None,
        "error": letter.error,
        "headers": _json(headers),
        "properties": _json(properties),
        "body": body,
        "dead_lettered_at": letter.dead_lettered(),
        "archived_at": dt.datetime.now(dt.UTC),
        "archived_by": who[:255],
    }
    with engine.begin() as connection:
        connection.execute(table.insert().values(row))
    return archived_id


def _json(value: Mapping[str, Any]) -> str:
    """Headers or properties as JSON, every value AMQP carries (bytes, a time, a decimal,
    a table) tagged as the outbox stores headers, so a restore sends them back as they were
    (a key a handler computes from a header must not change); a value of a type no AMQP
    table carries is stored as its text."""
    try:
        return encoded_headers(value)
    except InvalidMessage:
        return json.dumps(dict(value), default=str, sort_keys=True)


def listed(
    engine: Engine, table: Table, queue: str | None = None, limit: int = LISTED
) -> list[ArchivedLetter]:
    """The newest ``limit`` archived dead letters (of ``queue`` when given)."""
    query = select(*_shown_columns(table))
    if queue is not None:
        query = query.where(table.c.queue == queue)
    query = query.order_by(table.c.archived_at.desc(), table.c.id.desc()).limit(limit)
    with engine.connect() as connection:
        return [ArchivedLetter(**row._asdict()) for row in connection.execute(query)]


def _shown_columns(table: Table) -> list[ColumnElement[Any]]:
    c = table.c
    return [
        c.id,
        c.queue,
        c.ref,
        c.source,
        c.reason,
        c.error,
        c.dead_lettered_at,
        c.archived_at,
        c.archived_by,
        func.length(c.body).label("body_bytes"),
    ]


def count_archived(engine: Engine, table: Table) -> int:
    """The rows of the archive."""
    with engine.connect() as connection:
        return int(connection.execute(select(func.count()).select_from(table)).scalar_one())


def restore(
    source: DeadLetters, engine: Engine, table: Table, ids: Collection[uuid.UUID]
) -> list[ArchivedLetter]:
    """Put the archived dead letters ``ids`` back on their queues as a replay would (tries
    reset, ``x-inbox-replays`` counted), each row deleted once its copy is published; the
    letters restored (an id not in the archive is left out)."""
    c = table.c
    done = []
    for archived_id in ids:
        with engine.connect() as connection:
            row = connection.execute(select(table).where(c.id == archived_id)).one_or_none()
            found = connection.execute(
                select(*_shown_columns(table)).where(c.id == archived_id)
            ).one_or_none()
        if row is None or found is None:
            continue
        shown = ArchivedLetter(**found._asdict())
        if row.source != source.kind:
            raise ConfigurationError(
                f"archived letter {archived_id} came from {row.source}: restore it on that broker"
            )
        headers, properties = headers_from_json(row.headers), headers_from_json(row.properties)
        source.restore(row.queue, headers, properties, row.body)
        with engine.begin() as connection:
            connection.execute(delete(table).where(c.id == archived_id))
        done.append(shown)
    return done


def delete_archived(engine: Engine, table: Table, ids: Collection[uuid.UUID]) -> int:
    """Delete the archived dead letters ``ids`` for good; how many there were."""
    if not ids:
        return 0
    with engine.begin() as connection:
        return int(connection.execute(delete(table).where(table.c.id.in_(list(ids)))).rowcount)
