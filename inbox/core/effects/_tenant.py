"""Which tenant a handler run belongs to, for its effect keys (docs/effects.md, "Tenants").

With ``sessions_for=`` the same message is a claim in each tenant that receives it, and so
must be an effect of each: the tenant is part of the effect's identity. It is named by the
``inbox_tenant`` execution option of the claim's connection (set on the tenant's engine or
``sessionmaker`` bind), which is stable by construction; without it, by where the claim
lives: the database name of the engine's URL and its ``schema_translate_map``. Host, port,
user and password are left out on purpose: a failover or a new password must not change
which effect a message is.
"""

from __future__ import annotations

from typing import Final

from sqlalchemy import Connection

from inbox.errors import EffectError

__all__ = ["TENANT_OPTION", "tenant_of"]

TENANT_OPTION: Final = "inbox_tenant"
"""The execution option that names a tenant, e.g.
``engine.execution_options(inbox_tenant="acme")``."""


def tenant_of(connection: Connection, *, per_message_sessions: bool) -> str | None:
    """The tenant of the handler run holding its claim on ``connection``: the
    ``inbox_tenant`` option if set, else (an inbox with ``sessions_for``) the database and
    schema map the claim is made in, else None (one tenant: effect keys without one)."""
    options = connection.get_execution_options()
    named = options.get(TENANT_OPTION)
    if named is not None:
        if not isinstance(named, str) or not named.strip():
            raise EffectError(
                f"the {TENANT_OPTION} execution option must name the tenant with a non-empty "
                f"str, got {named!r}"
            )
        return named
    if not per_message_sessions:
        return None
    database = connection.engine.url.database or ""
    schemas = options.get("schema_translate_map") or {}
    mapped = ",".join(
        sorted(f"{source or ''}={target or ''}" for source, target in schemas.items())
    )
    return f"{database}/{mapped}" if mapped else database
