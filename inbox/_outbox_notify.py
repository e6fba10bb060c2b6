"""The outbox table's NOTIFY trigger on PostgreSQL: the DDL :func:`inbox.schema.outbox_table`
runs after creating the table, in the table's schema when it has one, else on the search
path."""

from __future__ import annotations

from typing import Any, Final

from sqlalchemy import DDL, Connection, Dialect, Table
from sqlalchemy.schema import SchemaItem
from sqlalchemy.sql.ddl import BaseDDLElement

from inbox._backends import family_of

__all__ = ["NOTIFY_DDL"]


# Constant statements: the table's quoted name and schema (schema_translate_map applied) are
# filled in by SQLAlchemy. Trigger names are per table in PostgreSQL, so one name serves every
# outbox. The function lives in the table's schema when it has one (a tenant's schema under a
# schema_translate_map included): created in whatever schema comes first on the search path,
# it would tie every tenant's trigger to that schema, and dropping it would drop them all.
def _in_named_schema(
    ddl: BaseDDLElement,
    target: SchemaItem | str,
    bind: Connection | None,
    tables: list[Table] | None = None,
    state: Any | None = None,
    *,
    dialect: Dialect,
    **kw: Any,
) -> bool:
    if not family_of(dialect).notifies or not isinstance(target, Table):
        return False
    translate = (bind.get_execution_options() if bind is not None else {}).get(
        "schema_translate_map"
    ) or {}
    return translate.get(target.schema, target.schema) is not None


def _on_search_path(
    ddl: BaseDDLElement,
    target: SchemaItem | str,
    bind: Connection | None,
    tables: list[Table] | None = None,
    state: Any | None = None,
    *,
    dialect: Dialect,
    **kw: Any,
) -> bool:
    named = _in_named_schema(ddl, target, bind, tables, state, dialect=dialect)
    return family_of(dialect).notifies and not named


# Two pairs that differ only in the schema prefix, written out: tests/test_hostile_sql.py
# holds every DDL() to a literal string, so no prefix is formatted in.
NOTIFY_DDL: Final = (
    DDL(  # type: ignore[no-untyped-call]
        "CREATE OR REPLACE FUNCTION %(schema)s.inbox_outbox_notify() "
        "RETURNS trigger LANGUAGE plpgsql AS "
        "$$ BEGIN PERFORM pg_notify('inbox_outbox', TG_TABLE_SCHEMA || '.' || TG_TABLE_NAME); "
        "RETURN NULL; END $$"
    ).execute_if(callable_=_in_named_schema),
    DDL(  # type: ignore[no-untyped-call]
        "CREATE TRIGGER inbox_outbox_notify AFTER INSERT ON %(fullname)s "
        "FOR EACH STATEMENT EXECUTE FUNCTION %(schema)s.inbox_outbox_notify()"
    ).execute_if(callable_=_in_named_schema),
    DDL(  # type: ignore[no-untyped-call]
        "CREATE OR REPLACE FUNCTION inbox_outbox_notify() "
        "RETURNS trigger LANGUAGE plpgsql AS "
        "$$ BEGIN PERFORM pg_notify('inbox_outbox', TG_TABLE_SCHEMA || '.' || TG_TABLE_NAME); "
        "RETURN NULL; END $$"
    ).execute_if(callable_=_on_search_path),
    DDL(  # type: ignore[no-untyped-call]
        "CREATE TRIGGER inbox_outbox_notify AFTER INSERT ON %(fullname)s "
        "FOR EACH STATEMENT EXECUTE FUNCTION inbox_outbox_notify()"
    ).execute_if(callable_=_on_search_path),
)
