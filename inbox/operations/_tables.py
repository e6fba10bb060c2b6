"""The tables an operation works on: the claims, effect and outbox tables (and the dead-letter
archive) as a person names
them (``[SCHEMA.]NAME``), the same tables in a tenant's schema, and the schemas holding them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy import Engine, MetaData, Table

from inbox.retention._targets import schemas_holding
from inbox.schema import effect_table, inbox_dead_letter_archive, outbox_table, resolve_table

__all__ = ["Tables", "tenant_schemas"]


@dataclass(frozen=True, slots=True)
class Tables:
    """The tables the operations read and change, as named on the command line or given to
    the console."""

    claims: Table
    effects: Table
    outbox: Table
    archive: Table = inbox_dead_letter_archive
    """The dead-letter archive (:mod:`inbox.operations._archive`)."""

    @classmethod
    def named(cls, claims: str, effects: str, outbox: str) -> Tables:
        """The tables named ``[SCHEMA.]NAME``; ``ValueError`` for a name that is not a plain
        identifier."""
        return cls(
            resolve_table(claims), _named(effects, effect_table), _named(outbox, outbox_table)
        )

    def in_schema(self, schema: str) -> Tables:
        """The same tables in ``schema`` (a tenant's), on metadata of their own."""
        return Tables(
            *(_in_schema(t, schema) for t in (self.claims, self.effects, self.outbox, self.archive))
        )


def tenant_schemas(engine: Engine, tables: Tables) -> list[str]:
    """Every schema holding the claims table (``--all-schemas``); ``ValueError`` on SQLite,
    which has none."""
    return schemas_holding(engine, tables.claims.name)


def _named(name: str, build: Callable[..., Table]) -> Table:
    schema, _, bare = name.rpartition(".")
    return build(MetaData(), bare, schema=schema or None)


def _in_schema(table: Table, schema: str) -> Table:
    """A copy of ``table`` in ``schema``, on metadata of its own."""
    return table.to_metadata(MetaData(), schema=schema)
