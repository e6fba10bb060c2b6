"""Failure groups: dead letters that failed the same way, together. A dead letter's failure
fingerprint is its reason, the handlers that failed, the exception type and the error's text
with its ids and numbers normalised (``order 17 not found`` and ``order 9 not found`` are one
failure), and, where the worker recorded it, the first application frame of each failed
handler's traceback (``x-inbox-error-frame``: the same exception raised from two lines is
two failures); ``inbox dlq groups`` and the console's groups page list the groups of the dead
letters read, with a count, the first and last seen and a sample, and a replay or purge
takes one group by its id (:attr:`Filters.groups <inbox.operations._filters.Filters>`).

A dead letter written before the worker recorded frames has no ``x-inbox-error-frame``: its
fingerprint, and so its group's id, is what it was without one."""

from __future__ import annotations

import datetime as dt
import hashlib
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Final

from inbox.operations._dead_letters import DeadLetterRecord

__all__ = ["GROUP_PREFIX", "FailureGroup", "Fingerprint", "fingerprint_of", "groups", "normalised"]

GROUP_PREFIX: Final = "fp-"
"""What a group's id starts with: ``fp-`` and 12 hex digits."""

# Most specific first: a UUID before a run of hex digits, that before a number.
_NORMALISED: Final = (
    (re.compile(r"\b[0-9a-fA-F]{8}(?:-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}\b"), "<id>"),
    (re.compile(r"\bsha256:[0-9a-f]+\b"), "<id>"),
    (re.compile(r"\b0x[0-9a-fA-F]+\b"), "<hex>"),
    # Eight or more hex digits with a digit and a letter among them: a hash, an object id.
    (re.compile(r"\b(?=[0-9a-fA-F]*[0-9])(?=[0-9a-fA-F]*[a-fA-F])[0-9a-fA-F]{8,}\b"), "<hex>"),
    (re.compile(r"\d+(?:\.\d+)?"), "<n>"),
)
_EXCEPTION: Final = re.compile(r"([A-Za-z_][\w.]*): ")
"""An exception's (dotted) type before its message, as the worker writes it."""


def normalised(text: str) -> str:
    """``text`` with its UUIDs and ``sha256:`` refs as ``<id>``, hex strings as ``<hex>`` and
    numbers as ``<n>``, its spaces collapsed: what the same failure of other messages
    shares."""
    for pattern, placeholder in _NORMALISED:
        text = pattern.sub(placeholder, text)
    return " ".join(text.split())


@dataclass(frozen=True, slots=True)
class Fingerprint:
    """How a dead letter failed, alike for every dead letter that failed the same way."""

    reason: str
    handlers: tuple[str, ...]
    exception_type: str | None
    message: str
    """The error's first line, the handlers' and exception's names left out, normalised."""
    frame: str | None = None
    """The ``x-inbox-error-frame`` header, as the worker wrote it (None: not recorded)."""

    @property
    def id(self) -> str:
        """:data:`GROUP_PREFIX` and 12 hex digits of the fingerprint: what ``--group`` and
        the console's forms name a group by."""
        parts = [self.reason, ",".join(self.handlers), self.exception_type or "", self.message]
        if self.frame is not None:  # absent: the id a letter without a frame always had
            parts.append(self.frame)
        digest = hashlib.sha256("\0".join(parts).encode())
        return f"{GROUP_PREFIX}{digest.hexdigest()[:12]}"


def fingerprint_of(letter: DeadLetterRecord) -> Fingerprint:
    """The fingerprint of one dead letter, from its headers."""
    handlers = tuple(sorted(letter.failed_handlers))
    lines = (letter.error or "").strip().splitlines()
    text = lines[0].strip() if lines else ""
    # The worker writes "HANDLER: Type: message" for each failed handler, joined by "; ".
    for handler in handlers:
        if text.startswith(f"{handler}: "):
            text = text[len(handler) + 2 :]
            break
    exception_type = None
    found = _EXCEPTION.match(text)
    if found is not None:
        exception_type = found.group(1)
        text = text[found.end() :]
    return Fingerprint(
        letter.reason or "unknown", handlers, exception_type, normalised(text), letter.error_frame
    )


@dataclass(slots=True)
class FailureGroup:
    """The dead letters read that share one :class:`Fingerprint`."""

    fingerprint: Fingerprint
    sample: DeadLetterRecord
    """The first of them read (the oldest in the queue)."""
    count: int = 0
    first_seen: dt.datetime | None = None
    last_seen: dt.datetime | None = None
    """The earliest and latest dead-lettered times among them (None: no readable time)."""
    refs: list[str] = field(default_factory=list)
    """The refs of the first :data:`_REFS_KEPT` of them."""

    @property
    def id(self) -> str:
        """The fingerprint's id."""
        return self.fingerprint.id

    def add(self, letter: DeadLetterRecord) -> None:
        """Count ``letter`` in the group."""
        self.count += 1
        if len(self.refs) < _REFS_KEPT:
            self.refs.append(letter.ref)
        at = letter.dead_lettered()
        if at is not None:
            self.first_seen = at if self.first_seen is None else min(self.first_seen, at)
            self.last_seen = at if self.last_seen is None else max(self.last_seen, at)


_REFS_KEPT: Final = 20


def groups(letters: Iterable[DeadLetterRecord]) -> list[FailureGroup]:
    """``letters`` grouped by fingerprint: the largest group first, ties by the latest
    seen first."""
    found: dict[str, FailureGroup] = {}
    for letter in letters:
        print_ = fingerprint_of(letter)
        group = found.get(print_.id)
        if group is None:
            group = found[print_.id] = FailureGroup(print_, letter)
        group.add(letter)
    oldest = dt.datetime.min.replace(tzinfo=dt.UTC)
    return sorted(found.values(), key=lambda g: (-g.count, -(g.last_seen or oldest).timestamp()))
