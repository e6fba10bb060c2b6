"""One message's claims and effect records: find them by message id or business key, and
release them so that the next delivery runs the handler again.

The keys are computed as the core computes them (:meth:`inbox.core._handlers.RegisteredHandler
.claim_key`): a handler without ``key=`` claims under the producer's ``idempotency-key``
(``uuid5(KEY_NAMESPACE, key)``) or else the message id; a handler with ``key=`` under what
its function returned (a string through the same ``uuid5``, a UUID or 16 bytes as they are).
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import Connection, Engine, Table, delete, inspect, select

from inbox.errors import ConfigurationError, InvalidMessage
from inbox.message import key_bytes, parse_message_id

__all__ = [
    "Claim",
    "Effect",
    "Found",
    "LookupKey",
    "find",
    "handlers_holding",
    "lookup_keys",
    "release",
]


@dataclass(frozen=True, slots=True)
class LookupKey:
    """A 16-byte claim key and how it was derived from what the operator typed."""

    key: uuid.UUID
    how: str


@dataclass(frozen=True, slots=True)
class Claim:
    """One claim row: this handler committed for this key at ``processed_at``."""

    key: LookupKey
    handler: str
    processed_at: dt.datetime


@dataclass(frozen=True, slots=True)
class Effect:
    """One effect record of a (claim key, handler); ``status`` as ``inbox`` shows it
    (``done without result`` included)."""

    key: LookupKey
    handler: str
    step: str
    status: str
    attempts: int
    error: str | None
    started_at: dt.datetime
    updated_at: dt.datetime


@dataclass(frozen=True, slots=True)
class Found:
    """The claims and effect records under the looked-up keys (effects may exist without a
    claim: a run that failed or crashed after an effect started)."""

    claims: tuple[Claim, ...]
    effects: tuple[Effect, ...]

    def __bool__(self) -> bool:
        return bool(self.claims or self.effects)


def lookup_keys(text: str, *, business_key: bool = False) -> tuple[LookupKey, ...]:
    """The claim keys ``text`` can stand for. A UUID (canonical or 32 hex digits) is a
    message id (or a ``key=`` UUID) and, as a string, possibly a business key too; anything
    else is a business key. ``business_key=True``: only the business key. Raises
    ``ValueError`` for an empty text or one that cannot be a key."""
    if not text:
        raise ConfigurationError("the message id or key is empty")
    as_key = LookupKey(uuid.UUID(bytes=key_bytes(text)), f"business key {text!r}")
    if business_key:
        return (as_key,)
    try:
        message_id = parse_message_id(text)
    except InvalidMessage:
        return (as_key,)
    return (LookupKey(message_id, "message id"), as_key)


def find(
    engine: Engine,
    claims: Table,
    effects: Table | None,
    keys: Sequence[LookupKey],
    handler: str | None = None,
) -> Found:
    """Every claim under ``keys`` (of ``handler`` only, when given), oldest first, and the
    effect records of the same keys; ``effects`` None, or not in the database: none."""
    with engine.connect() as connection:
        return _find(connection, claims, effects, keys, handler)


def handlers_holding(
    engine: Engine, claims: Table, effects: Table | None, keys: Sequence[LookupKey]
) -> tuple[str, ...]:
    """The handlers with a claim or an effect record under ``keys``, sorted: the names a
    release of these keys can be for."""
    found = find(engine, claims, effects, keys)
    return tuple(sorted({c.handler for c in found.claims} | {e.handler for e in found.effects}))


def release(
    engine: Engine, claims: Table, effects: Table | None, keys: Sequence[LookupKey], handler: str
) -> tuple[int, int]:
    """Delete the claims of ``handler`` under ``keys`` and their effect records, in one
    transaction; return how many of each were deleted. The next delivery of the message runs
    the handler again, and each of its effect steps calls again. A claim whose handler is
    still running is not there yet and is not deleted."""
    values = [k.key for k in keys]
    with engine.begin() as connection:
        deleted = connection.execute(
            delete(claims).where(claims.c.message_id.in_(values), claims.c.handler == handler)
        ).rowcount
        deleted_effects = 0
        if effects is not None and inspect(connection).has_table(effects.name, effects.schema):
            deleted_effects = connection.execute(
                delete(effects).where(effects.c.claim_key.in_(values), effects.c.handler == handler)
            ).rowcount
    return deleted, deleted_effects


def _find(
    connection: Connection,
    claims: Table,
    effects: Table | None,
    keys: Sequence[LookupKey],
    handler: str | None,
) -> Found:
    by_key = {k.key: k for k in keys}
    query = select(claims.c.message_id, claims.c.handler, claims.c.processed_at).where(
        claims.c.message_id.in_(list(by_key))
    )
    if handler is not None:
        query = query.where(claims.c.handler == handler)
    found_claims = tuple(
        Claim(by_key[key], name, at)
        for key, name, at in connection.execute(query.order_by(claims.c.processed_at))
    )
    if effects is None or not inspect(connection).has_table(effects.name, effects.schema):
        return Found(found_claims, ())
    c = effects.c
    from inbox.operations._status import effect_status

    status = effect_status(c.status, c.result)
    effect_query = select(
        c.claim_key, c.handler, c.step, status, c.attempts, c.error, c.started_at, c.updated_at
    ).where(c.claim_key.in_(list(by_key)))
    if handler is not None:
        effect_query = effect_query.where(c.handler == handler)
    rows = connection.execute(effect_query.order_by(c.handler, c.started_at))
    found_effects = tuple(
        Effect(by_key[key], name, step, status, attempts, error, started, updated)
        for key, name, step, status, attempts, error, started, updated in rows
    )
    return Found(found_claims, found_effects)
