"""Which tenant a handler run belongs to, for its effect keys (docs/effects.md, "Tenants").

With ``sessions_for=`` the same message is a claim in each tenant that receives it, and so
must be an effect of each: the tenant is part of the effect's identity. It is named by the
``inbox_tenant`` execution option of the claim's connection (set on the tenant's engine or
``sessionmaker`` bind), which is stable by construction; without it, by where the claim
lives: the database name of the engine's URL, its ``schema_translate_map``, and, where the
claim table's name is unqualified, the schema the connection's search path found it in
(tenants with an engine each and a ``search_path`` in its connect options, its pool's
``connect`` event, or its role). That schema is read from the server once per pooled
connection and kept in the connection's ``info``: no round trip per message, and so a
``search_path`` changed later on that connection (per checkout, inside a transaction) is
not seen: such tenants must be named with ``inbox_tenant``. Host, port, user and password
are left out on purpose: a failover or a new password must not change which effect a
message is.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from sqlalchemy import Connection, Table

from inbox._backends import family_of
from inbox.errors import EffectError

__all__ = ["TENANT_OPTION", "read_searched_schema", "schema_to_read", "tenant_of"]

TENANT_OPTION: Final = "inbox_tenant"
"""The execution option that names a tenant, e.g.
``engine.execution_options(inbox_tenant="acme")``."""

_SEARCHED: Final = "inbox_searched_schema"  # connection.info: {table name: schema}


def tenant_of(
    connection: Connection, *, claims: Table | None, effects: Table | None = None
) -> tuple[str | None, str | None]:
    """The tenant of the handler run holding its claim on ``connection``: the
    ``inbox_tenant`` option if set, else (an inbox with ``sessions_for``, whose claim table
    is ``claims``) the database, schema map and searched schema the claim is made in, else
    None (one tenant: effect keys without one).

    Second, the identity earlier versions gave an unnamed tenant whose claim table the
    search path finds outside the default schema (the same without ``@schema``), when the
    records kept under it are this tenant's own: ``effects``, the effect table beside the
    claims, is found by the search path in that same schema. Else None."""
    options = connection.get_execution_options()
    named = options.get(TENANT_OPTION)
    if named is not None:
        if not isinstance(named, str) or not named.strip():
            raise EffectError(
                f"the {TENANT_OPTION} execution option must name the tenant with a non-empty "
                f"str, got {named!r}"
            )
        return named, None
    if claims is None:
        return None, None
    database = connection.engine.url.database or ""
    schemas = options.get("schema_translate_map") or {}
    mapped = ",".join(
        sorted(f"{source or ''}={target or ''}" for source, target in schemas.items())
    )
    where = f"{database}/{mapped}" if mapped else database
    if _searched(claims, schemas) and family_of(connection).has_search_path:
        schema = read_searched_schema(connection, claims)
        if schema is not None:
            own = (
                effects is not None
                and _searched(effects, schemas)
                and read_searched_schema(connection, effects) == schema
            )
            return f"{where}@{schema}", where if own else None
    return where, None


def schema_to_read(connection: Connection, *tables: Table | None) -> bool:
    """Whether :func:`tenant_of` would ask the server now for the searched schema of one of
    ``tables``, its claim table first, then its effect table (an awaiting caller reads them
    first, with :func:`read_searched_schema` run in the driver's greenlet)."""
    options = connection.get_execution_options()
    if options.get(TENANT_OPTION) is not None or not family_of(connection).has_search_path:
        return False
    known = connection.info.get(_SEARCHED, {})
    schemas = options.get("schema_translate_map") or {}
    claims = tables[0]
    return (
        claims is not None
        and _searched(claims, schemas)
        and any(
            table is not None and _searched(table, schemas) and table.name not in known
            for table in tables
        )
    )


def read_searched_schema(connection: Connection, *tables: Table | None) -> str | None:
    """The schema the search path of ``connection`` finds the first of ``tables`` in (None:
    the default one, or a qualified name), each unqualified one read once per pooled
    connection."""
    known: dict[str, str | None] = connection.info.setdefault(_SEARCHED, {})
    schemas = connection.get_execution_options().get("schema_translate_map") or {}
    for table in tables:
        if table is not None and table.name not in known and _searched(table, schemas):
            known[table.name] = family_of(connection).searched_schema(connection, table)
    first = tables[0]
    return None if first is None else known.get(first.name)


def _searched(claims: Table, schemas: Mapping[Any, Any]) -> bool:
    """Whether the claim table's name goes to the server unqualified (the search path
    decides which table it is)."""
    schema = schemas.get(claims.schema, claims.schema)
    return schema is None
