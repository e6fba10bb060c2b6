"""The effect ledger for a person: list its records by status, read one, and settle an
uncertain one the two ways docs/effects.md ("Releasing an effect by hand") describes:

* the call happened: :func:`mark_done` records ``done`` with the result the provider gave,
  and the replayed delivery gets that result without calling;
* it did not: :func:`release_effect` deletes the record, and the replayed delivery calls
  again (a new first attempt under the same key).

Both refuse a record that is ``done`` with its result already: there is nothing uncertain
about it, and changing it would change what a committed handler saw.
"""

from __future__ import annotations

import datetime as dt
import json
import uuid
from dataclasses import dataclass
from typing import Any, Final

from sqlalchemy import ColumnElement, Engine, Table, delete, func, select, update

from inbox.errors import ConfigurationError
from inbox.operations._status import DONE, DONE_WITHOUT_RESULT, effect_status

__all__ = [
    "EffectRecord",
    "NotUncertain",
    "count_by_status",
    "get_effect",
    "list_effects",
    "mark_done",
    "parse_effect_key",
    "release_effect",
]

_RESULT_SHOWN: Final = 4096


class NotUncertain(ValueError):
    """The record is done with its result (or gone): nothing for a person to settle."""


@dataclass(frozen=True, slots=True)
class EffectRecord:
    """One effect record; ``status`` as ``inbox`` shows it (``done without result``
    included); ``result`` the stored JSON text, cut after 4096 characters."""

    effect_key: uuid.UUID
    claim_key: uuid.UUID
    handler: str
    step: str
    status: str
    attempts: int
    result: str | None
    error: str | None
    started_at: dt.datetime
    updated_at: dt.datetime

    @property
    def uncertain(self) -> bool:
        """Whether a person may settle it: not done, or done without its result."""
        return self.status != DONE


def parse_effect_key(text: str) -> uuid.UUID:
    """An effect key as shown (a UUID, canonical or 32 hex digits); ``ValueError`` else."""
    try:
        return uuid.UUID(text.strip())
    except ValueError:
        raise ConfigurationError(f"not an effect key (a UUID): {text[:60]!r}") from None


def _columns(effects: Table) -> tuple[ColumnElement[Any], ...]:
    c = effects.c
    return (
        c.effect_key,
        c.claim_key,
        c.handler,
        c.step,
        effect_status(c.status, c.result),
        c.attempts,
        func.substr(c.result, 1, _RESULT_SHOWN),
        c.error,
        c.started_at,
        c.updated_at,
    )


def count_by_status(engine: Engine, effects: Table) -> dict[str, int]:
    """How many records there are of each status."""
    status = effect_status(effects.c.status, effects.c.result)
    with engine.connect() as connection:
        return {
            str(name): int(n)
            for name, n in connection.execute(
                select(status, func.count()).group_by(status).order_by(status)
            )
        }


def list_effects(
    engine: Engine, effects: Table, status: str | None = None, limit: int = 100
) -> list[EffectRecord]:
    """Records of ``status`` (None: every status; ``"uncertain"``: every one not done, or
    done without result), the most recently updated first, at most ``limit``."""
    status_column = effect_status(effects.c.status, effects.c.result)
    query = select(*_columns(effects))
    if status == "uncertain":
        query = query.where(status_column != DONE)
    elif status is not None:
        query = query.where(status_column == status)
    query = query.order_by(effects.c.updated_at.desc()).limit(limit)
    with engine.connect() as connection:
        return [EffectRecord(*row) for row in connection.execute(query)]


def get_effect(engine: Engine, effects: Table, effect_key: uuid.UUID) -> EffectRecord | None:
    """The record of ``effect_key``, or None."""
    query = select(*_columns(effects)).where(effects.c.effect_key == effect_key)
    with engine.connect() as connection:
        row = connection.execute(query).one_or_none()
    return None if row is None else EffectRecord(*row)


def mark_done(engine: Engine, effects: Table, effect_key: uuid.UUID, result_json: str) -> None:
    """Record the effect ``done`` with ``result_json`` (the provider's answer, as JSON text):
    the next attempt returns it without calling. ``ValueError`` for text that is not JSON;
    :class:`NotUncertain` for a record done with its result, or one that is not there."""
    try:
        value = json.loads(result_json)
    except ValueError as exc:
        raise ConfigurationError(f"the result is not JSON: {exc}") from None
    stored = json.dumps(value, allow_nan=False)  # as the ledger stores a result
    c = effects.c
    uncertain = effect_status(c.status, c.result) != DONE
    with engine.begin() as connection:
        changed = connection.execute(
            update(effects)
            .where(c.effect_key == effect_key, uncertain)
            .values(status=DONE, result=stored, error=None, updated_at=dt.datetime.now(dt.UTC))
        ).rowcount
    if changed != 1:
        raise NotUncertain(f"effect {effect_key} is not uncertain (done with its result, or gone)")


def release_effect(engine: Engine, effects: Table, effect_key: uuid.UUID) -> None:
    """Delete the record: the next attempt calls again, as a first attempt under the same
    key. :class:`NotUncertain` for a record done with its result, or one not there."""
    c = effects.c
    uncertain = effect_status(c.status, c.result) != DONE
    with engine.begin() as connection:
        deleted = connection.execute(
            delete(effects).where(c.effect_key == effect_key, uncertain)
        ).rowcount
    if deleted != 1:
        raise NotUncertain(f"effect {effect_key} is not uncertain (done with its result, or gone)")


# How a record done without its result reads, for templates and lines.
UNCERTAIN_STATUSES: Final = ("started", "failed", DONE_WITHOUT_RESULT)
