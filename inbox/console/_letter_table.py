"""The dead-letters table of the console: its columns, the order of its rows (by the time
they were dead-lettered unless a column is chosen; ties keep the queue's order), and the
error of a row cut to one line (the whole text is on the letter's page)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final
from urllib.parse import urlencode

from inbox.operations._dead_letters import DeadLetterRecord

__all__ = ["COLUMNS", "ERROR_SHOWN", "Column", "Order", "error_line", "order_of", "sorted_letters"]

ERROR_SHOWN: Final = 120
"""The characters of an error's first line a row shows."""
_NEVER: Final = dt.datetime.max.replace(tzinfo=dt.UTC)


@dataclass(frozen=True, slots=True)
class Column:
    """A sortable column: its name in the URL, its heading, and what its rows sort by."""

    name: str
    heading: str
    key: Callable[[DeadLetterRecord], str | int | dt.datetime]


COLUMNS: Final = (
    Column("id", "message id", lambda x: x.ref),
    Column("type", "type", lambda x: x.type or ""),
    Column("reason", "reason", lambda x: x.reason or ""),
    Column("tries", "tries", lambda x: x.tries),
    Column("replays", "replays", lambda x: x.replays),
    Column("at", "dead-lettered", lambda x: x.dead_lettered() or _NEVER),
    Column("handlers", "failed handlers", lambda x: ",".join(x.failed_handlers)),
    Column("error", "error", lambda x: x.error or ""),
)
_BY_NAME: Final = {c.name: c for c in COLUMNS}


@dataclass(frozen=True, slots=True)
class Order:
    """The column the rows are sorted by, and whether descending."""

    column: str = "at"
    descending: bool = False

    def link(self, queue: str, column: str) -> str:
        """The query string that sorts by ``column``: ascending, or the other way round when
        it is the column sorted by now."""
        descending = column == self.column and not self.descending
        query = {"queue": queue, "sort": column, "order": "desc" if descending else "asc"}
        return urlencode(query)

    def mark(self, column: str) -> str:
        """An arrow on the column sorted by, else nothing."""
        if column != self.column:
            return ""
        return " ▼" if self.descending else " ▲"


def order_of(sort: str | None, order: str | None) -> Order:
    """The order a page asks for (``?sort=COLUMN&order=asc|desc``); an unknown column or
    direction is the default (dead-lettered time, oldest first)."""
    if sort not in _BY_NAME:
        return Order()
    return Order(sort, order == "desc")


def sorted_letters(letters: Sequence[DeadLetterRecord], order: Order) -> list[DeadLetterRecord]:
    """``letters`` in ``order`` (a stable sort: equal ones keep the queue's order)."""
    key = _BY_NAME[order.column].key
    return sorted(letters, key=key, reverse=order.descending)


def error_line(error: str | None) -> str:
    """An error's first line, cut to :data:`ERROR_SHOWN` characters; ``…`` marks a cut or
    lines left out."""
    lines = (error or "").strip().splitlines()
    if not lines:
        return ""
    first = lines[0].strip()
    if len(first) > ERROR_SHOWN:
        return first[: ERROR_SHOWN - 1] + "…"
    return first + (" …" if len(lines) > 1 else "")
