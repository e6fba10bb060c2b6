"""``inbox-cleanup --archive-days N``: the dead letters archived more than N days ago
(:func:`inbox.schema.archive_table`) are deleted, in batches of at most
:data:`ARCHIVE_BATCH` rows; a database without the archive table is left alone."""

from __future__ import annotations

import datetime as dt
from typing import Final

from sqlalchemy import Engine, Table, delete, func, inspect, select

__all__ = ["ARCHIVE_BATCH", "expire_archive"]

ARCHIVE_BATCH: Final = 1000


def expire_archive(engine: Engine, archive: Table, days: int, *, dry_run: bool) -> int | None:
    """Delete (or with ``dry_run`` count) the rows of ``archive`` archived more than
    ``days`` days ago; None when the database has no such table."""
    with engine.connect() as connection:
        if not inspect(connection).has_table(archive.name, schema=archive.schema):
            return None
    cutoff = dt.datetime.now(dt.UTC) - dt.timedelta(days=days)
    old = archive.c.archived_at < cutoff
    if dry_run:
        with engine.connect() as connection:
            count = select(func.count()).select_from(archive).where(old)
            return int(connection.execute(count).scalar_one())
    deleted = 0
    while True:
        with engine.begin() as connection:
            ids = connection.execute(select(archive.c.id).where(old).limit(ARCHIVE_BATCH))
            batch = [row.id for row in ids]
            if batch:
                connection.execute(delete(archive).where(archive.c.id.in_(batch)))
        deleted += len(batch)
        if len(batch) < ARCHIVE_BATCH:
            return deleted
