"""The alembic autogenerate hook of a partitioned inbox table."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping

from sqlalchemy import Table

from inbox.schema import DEFAULT_TABLE_NAME, resolve_table

__all__ = ["skip_partitions"]


def skip_partitions(
    table: str | Table = DEFAULT_TABLE_NAME,
) -> Callable[[str | None, str, Mapping[str, str | None]], bool]:
    """An alembic ``include_name`` hook that hides the partitions of ``table`` from
    autogenerate, which would otherwise propose to drop them (they are tables PostgreSQL
    reports but no metadata defines). Everything else is included."""
    name = resolve_table(table).name
    partition_name = re.compile(rf"{re.escape(name)}_(?:before|future|keys|p[0-9]{{8}})")

    def include_name(name: str | None, type_: str, parent_names: Mapping[str, str | None]) -> bool:
        return not (type_ == "table" and name is not None and partition_name.fullmatch(name))

    return include_name
