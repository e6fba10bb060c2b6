"""An effect's identity, decided before any I/O: its mode, its step name, and its key.

The key is what ``call`` receives and what other services can compute (docs/effects.md):
version 2 length-prefixes every field, version 1 is kept for the effects it names without
ambiguity, so records written by earlier versions stay valid.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from enum import StrEnum
from typing import Final

from inbox.errors import ConfigurationError
from inbox.message import KEY_NAMESPACE
from inbox.schema import HANDLER_NAME_MAX_LENGTH

__all__ = [
    "STEP_MAX_LENGTH",
    "EffectMode",
    "EffectRef",
    "effect_key",
    "is_version_1",
    "parse_mode",
    "validate_step",
    "version_1_key",
]

STEP_MAX_LENGTH: Final = HANDLER_NAME_MAX_LENGTH


class EffectMode(StrEnum):
    """What a later attempt does with an effect an earlier attempt started but did not
    finish (or that failed): call again with the same key, or never call again."""

    AT_LEAST_ONCE = "at-least-once"
    """Call again with the same key: the other side deduplicates by it. The default."""
    AT_MOST_ONCE = "at-most-once"
    """Never call again once started: raise :class:`~inbox.UncertainEffect` instead."""


def parse_mode(mode: object) -> EffectMode:
    """``mode`` as an :class:`EffectMode`; anything else is a :class:`~inbox.ConfigurationError`."""
    if isinstance(mode, EffectMode):
        return mode
    if isinstance(mode, str):
        try:
            return EffectMode(mode)
        except ValueError:
            pass
    choices = ", ".join(repr(m.value) for m in EffectMode)
    raise ConfigurationError(f"effect mode must be one of {choices}, got {mode!r}")


def validate_step(step: object) -> str:
    """Return ``step`` if it can be stored as an effect step name, else raise
    :class:`~inbox.ConfigurationError`."""
    if not isinstance(step, str):
        raise ConfigurationError(f"effect step must be a str, got {type(step).__name__}")
    if not step.strip():
        raise ConfigurationError("effect step must not be empty or blank")
    if len(step) > STEP_MAX_LENGTH:
        raise ConfigurationError(
            f"effect step is {len(step)} characters; the effect table holds at most "
            f"{STEP_MAX_LENGTH}"
        )
    if step != step.strip():
        # MySQL/MariaDB compare "x" and "x " as equal: two such steps would share a record.
        raise ConfigurationError(f"effect step {step!r} has leading or trailing whitespace")
    if "\x00" in step:
        raise ConfigurationError("effect step must not contain NUL characters")
    try:
        step.encode("utf-8")
    except UnicodeEncodeError:
        raise ConfigurationError(
            f"effect step {step!r} is not valid Unicode text (it holds a lone surrogate)"
        ) from None
    return step


def effect_key(claim_key: bytes, handler: str, step: str, tenant: str | None = None) -> uuid.UUID:
    """The key ``call`` receives: the same on every attempt of this (claim, tenant, handler,
    step), different for any other, and computable by other services (docs/effects.md).

    Version 1, ``uuid5(KEY_NAMESPACE, f"{claim}:{handler}:{step}")``, is ambiguous once a
    name holds a ``:``; it is kept for the effects it names unambiguously (no tenant, no
    ``:`` in either name), so the records of earlier versions stay valid for them. Every
    other effect gets version 2: each field length-prefixed (UTF-8 bytes), the tenant one
    of them (empty without one).
    """
    if is_version_1(handler, step, tenant):
        return version_1_key(claim_key, handler, step)
    fields = (claim_key.hex(), tenant or "", handler, step)
    encoded = "".join(f":{len(field.encode('utf-8'))}:{field}" for field in fields)
    return uuid.uuid5(KEY_NAMESPACE, f"v2{encoded}")


def is_version_1(handler: str, step: str, tenant: str | None) -> bool:
    """Whether the effect keeps its version-1 key (which names it unambiguously)."""
    return tenant is None and ":" not in handler and ":" not in step


def version_1_key(claim_key: bytes, handler: str, step: str) -> uuid.UUID:
    """The key earlier versions gave every effect (where a record they wrote may be)."""
    return uuid.uuid5(KEY_NAMESPACE, f"{claim_key.hex()}:{handler}:{step}")


@dataclass(frozen=True, slots=True)
class EffectRef:
    """One effect: its key and what it is the effect of; ``legacy``, when set, is the
    version-1 key under which an earlier version may have recorded this same effect, and
    ``earlier`` (set only with ``legacy``) the key an earlier version gave it before its
    tenant's identity held its searched schema (docs/effects.md, "Tenants")."""

    key: uuid.UUID
    claim_key: bytes
    handler: str
    step: str
    legacy: uuid.UUID | None = None
    earlier: uuid.UUID | None = None
