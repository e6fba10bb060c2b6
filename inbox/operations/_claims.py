"""One message's claims and effect records: find them by message id or business key, and
release them so that the next delivery runs the handler again.

The keys are computed as the core computes them (:meth:`inbox.core._handlers.RegisteredHandler
.claim_key`): a handler without ``key=`` claims under the producer's ``idempotency-key``
(``uuid5(KEY_NAMESPACE, key)``) or else the message id; a handler with ``key=`` under what
its function returned (a string through the same ``uuid5``, a UUID or 16 bytes as they are).

So a message id finds only the claims of handlers that claim under it. The claims table holds
no message id beside a key (a wider row on every claim, for the rare look-up), so from a
message id alone the others are found only where the key was written down: a worker's log
lines (``under claim key K``) and a dead letter's ``x-inbox-claim-keys`` header, which
:func:`look_up` reads when it is given the workers' queues.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from sqlalchemy import Connection, Engine, Table, delete, inspect, select

from inbox.delivery import headers as h
from inbox.errors import ConfigurationError, InvalidMessage
from inbox.message import IDEMPOTENCY_KEY_HEADER, key_bytes, parse_message_id
from inbox.operations import _dead_letters

__all__ = [
    "DEAD_LETTERS_READ",
    "Claim",
    "Effect",
    "Found",
    "Lookup",
    "LookupKey",
    "find",
    "handlers_holding",
    "keys_in_dead_letters",
    "look_up",
    "lookup_keys",
    "release",
]


DEAD_LETTERS_READ: Final = 1000
"""The dead letters :func:`look_up` reads of each dead-letter queue at most (each held
unacked while it reads): ``inbox dlq show`` reads them all."""


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
    effect_key: uuid.UUID | None = None
    """The record's own key (its page: the console's ``/effects/KEY``)."""


@dataclass(frozen=True, slots=True)
class Found:
    """The claims and effect records under the looked-up keys (effects may exist without a
    claim: a run that failed or crashed after an effect started)."""

    claims: tuple[Claim, ...]
    effects: tuple[Effect, ...]

    def __bool__(self) -> bool:
        return bool(self.claims or self.effects)


@dataclass(frozen=True, slots=True)
class Lookup:
    """What :func:`look_up` found for what the operator typed: the keys it looked under, the
    claims and effect records, the dead-letter queue whose letter named further keys, and
    the dead-letter queues read only in part (each with its depth: more than
    :data:`DEAD_LETTERS_READ`, and the letter not among those read)."""

    keys: tuple[LookupKey, ...]
    found: Found
    dead_letter_queue: str | None = None
    read_in_part: tuple[tuple[str, int], ...] = ()


def look_up(
    engine: Engine,
    claims: Table,
    effects: Table | None,
    text: str,
    *,
    business_key: bool = False,
    handler: str | None = None,
    broker: str | None = None,
    queues: Sequence[str] = (),
) -> Lookup:
    """The claims and effect records under ``text`` (:func:`lookup_keys`). When ``text`` is
    a message id and ``queues`` are given, its dead letter in their dead-letter queues (read
    the first :data:`DEAD_LETTERS_READ` of each, left in place) names the keys its handlers
    claim under, and the claims are looked up under those too: one step from the id to the
    claims."""
    keys = lookup_keys(text, business_key=business_key)
    found = find(engine, claims, effects, keys, handler)
    if not queues or broker is None or keys[0].how != "message id":
        return Lookup(keys, found)
    in_part: list[tuple[str, int]] = []
    letter = keys_in_dead_letters(broker, queues, str(keys[0].key), in_part)
    if letter is None:
        return Lookup(keys, found, read_in_part=tuple(in_part))
    queue, named = letter
    more = tuple(k for k in named if all(k.key != asked.key for asked in keys))
    also = find(engine, claims, effects, more, handler)
    merged = Found(found.claims + also.claims, found.effects + also.effects)
    return Lookup(keys + more, merged, queue, tuple(in_part))


def keys_in_dead_letters(
    broker: str,
    queues: Sequence[str],
    message_id: str,
    read_in_part: list[tuple[str, int]] | None = None,
) -> tuple[str, tuple[LookupKey, ...]] | None:
    """The first dead letter with ``message_id`` in the dead-letter queues of ``queues``
    (the first :data:`DEAD_LETTERS_READ` of each, read without taking them) that names
    claim keys: its queue and those keys (its ``x-inbox-claim-keys``, its
    ``idempotency-key``). None when there is no such letter. A queue read only in part,
    the letter not found, is added to ``read_in_part`` with its depth."""
    for queue in queues:
        dlq = _dead_letters.dead_letter_queue(queue)
        present = _dead_letters.depth_if_present(broker, dlq)
        if not present:
            continue  # none, or no dead-letter queue: nothing was dead-lettered from there
        with _dead_letters.open_channel(broker) as channel:  # closed: the letters are back
            message = _dead_letters.find(channel, queue, message_id, DEAD_LETTERS_READ)
        if message is None:
            if present > DEAD_LETTERS_READ and read_in_part is not None:
                read_in_part.append((dlq, present))
            continue
        keys = _keys_of_headers(message.properties.get("application_headers") or {}, dlq)
        if keys:
            return dlq, keys
    return None


def _keys_of_headers(headers: dict[str, object], dlq: str) -> tuple[LookupKey, ...]:
    handlers: dict[uuid.UUID, list[str]] = {}
    for handler, key in h.parse_claim_keys(headers.get(h.CLAIM_KEYS)).items():
        handlers.setdefault(key, []).append(handler)
    keys = [
        LookupKey(key, f"claim key of {', '.join(names)} (dead letter in {dlq})")
        for key, names in handlers.items()
    ]
    idempotency_key = headers.get(IDEMPOTENCY_KEY_HEADER)
    if isinstance(idempotency_key, bytes):
        idempotency_key = idempotency_key.decode("utf-8", "replace")
    if isinstance(idempotency_key, str) and idempotency_key:
        key = uuid.UUID(bytes=key_bytes(idempotency_key))
        if all(k.key != key for k in keys):
            keys.append(
                LookupKey(key, f"idempotency key {idempotency_key!r} (dead letter in {dlq})")
            )
    return tuple(keys)


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
        c.claim_key,
        c.handler,
        c.step,
        status,
        c.attempts,
        c.error,
        c.started_at,
        c.updated_at,
        c.effect_key,
    ).where(c.claim_key.in_(list(by_key)))
    if handler is not None:
        effect_query = effect_query.where(c.handler == handler)
    rows = connection.execute(effect_query.order_by(c.handler, c.started_at))
    found_effects = tuple(
        Effect(by_key[key], name, step, status, attempts, error, started, updated, effect_key)
        for key, name, step, status, attempts, error, started, updated, effect_key in rows
    )
    return Found(found_claims, found_effects)
