"""The outbox table as the ORM sees it, so that a publish joins the session's unit of work.

Each outbox table gets one class, mapped imperatively on a private registry (never the
application's): adding an instance to a session makes its INSERT part of the session's
next flush, on the session's connection, in the session's transaction. Publishing itself
does no I/O, which is also what lets an ``AsyncSession`` publish without an ``await``.
"""

from __future__ import annotations

import threading
from typing import Any, Final

from sqlalchemy import Table
from sqlalchemy.orm import Mapper, registry

from inbox.schema import resolve_outbox_table

__all__ = ["OutboxRecord", "record_class", "resolve_outbox_table"]

_registry: Final = registry()
_classes: dict[Table, type[OutboxRecord]] = {}
_lock: Final = threading.Lock()


class OutboxRecord:
    """A row of an outbox table as the unit of work writes it (one subclass per table)."""

    __mapper__: Mapper[Any]

    def __init__(self, **columns: Any) -> None:
        # Straight into the instance's dict, skipping twelve attribute events: a new
        # object's INSERT reads its values from there, and nothing else reads this object.
        self.__dict__.update(columns)

    def __repr__(self) -> str:
        return f"<outbox row {self.__dict__.get('id')} type={self.__dict__.get('type')!r}>"


def record_class(table: Table) -> type[OutboxRecord]:
    """The mapped class of ``table``, made on first use and shared afterwards."""
    with _lock:
        cls = _classes.get(table)
        if cls is None:
            # A name unique on the registry: tables of one name may live in several MetaData.
            cls = type(f"OutboxRecord{len(_classes)}_{table.name}", (OutboxRecord,), {})
            _registry.map_imperatively(cls, table)
            _classes[table] = cls
        return cls
