"""The inbox tables one ``inbox-cleanup`` run works on: per database, the table as named, or
one per tenant schema given (``--schema``) or found (``--all-schemas``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import Engine, Table

from inbox._backends import family_of
from inbox.errors import ConfigurationError
from inbox.schema import DEFAULT_EFFECT_TABLE_NAME, DEFAULT_RESULT_TABLE_NAME, resolve_table

__all__ = ["Target", "schemas_holding", "targets_for"]


@dataclass(frozen=True, slots=True)
class Target:
    """One inbox table to clean, with the effect and task result tables beside it."""

    table: Table
    effect_table: str
    result_table: str = DEFAULT_RESULT_TABLE_NAME


def targets_for(
    engine: Engine, table: str, schemas: Sequence[str], all_schemas: bool
) -> list[Target]:
    """The tables of one database: ``table`` itself (with the default effect table), or
    ``table``'s name in each schema (with the effect and result tables of that schema)."""
    if all_schemas:
        schemas = schemas_holding(engine, table)
    if not schemas:
        return [Target(resolve_table(table), DEFAULT_EFFECT_TABLE_NAME)]
    return [
        Target(
            resolve_table(f"{schema}.{table}"),
            f"{schema}.{DEFAULT_EFFECT_TABLE_NAME}",
            f"{schema}.{DEFAULT_RESULT_TABLE_NAME}",
        )
        for schema in schemas
    ]


def schemas_holding(engine: Engine, table: str) -> list[str]:
    """Every schema (a database, on MariaDB/MySQL) of ``engine``'s server holding a table
    named ``table``; ValueError on SQLite, which has none."""
    query = family_of(engine).schemas_query
    if query is None:
        raise ConfigurationError(
            "--all-schemas needs PostgreSQL or MariaDB/MySQL (SQLite has no schemas)"
        )
    with engine.connect() as connection:
        return [str(schema) for schema in connection.execute(query, {"name": table}).scalars()]
