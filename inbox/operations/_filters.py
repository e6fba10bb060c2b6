"""Which dead letters a replay or a purge takes (:class:`Filters`), and the words a person
gives them in: a duration like ``7d`` and a dead-letter reason, read the same from the
``inbox dlq`` command line and the console's forms."""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass
from typing import Final

from inbox._oneline import bounded
from inbox.delivery._policy import DeadLetterReason
from inbox.errors import ConfigurationError
from inbox.operations._dead_letters import DeadLetterRecord
from inbox.operations._failure_groups import GROUP_PREFIX, fingerprint_of

__all__ = [
    "MAX_DURATION",
    "REASONS",
    "Filters",
    "dead_letter_reason",
    "duration",
    "failure_group",
]

_DURATION = re.compile(r"(\d+)([smhd])")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}
MAX_DURATION: Final = dt.timedelta(days=36500)
"""The longest ``--older-than``: a hundred years (a cutoff before that is no filter)."""
REASONS: Final = tuple(reason.value for reason in DeadLetterReason)
"""The reasons the worker writes in ``x-inbox-reason``, in the order they are documented."""


def duration(text: str) -> dt.timedelta:
    """``90s``, ``30m``, ``12h`` or ``7d``, at most :data:`MAX_DURATION` (``--older-than
    9999999999d`` is a usage error, not an overflow); ``ValueError`` for anything else."""
    found = _DURATION.fullmatch(text.strip())
    if found is None:
        raise ConfigurationError(f"expected a duration like 30m, 12h or 7d, got {text!r}")
    number, unit = int(found.group(1)), _UNITS[found.group(2)]
    if number > MAX_DURATION / dt.timedelta(**{unit: 1}):
        raise ConfigurationError(
            f"at most {MAX_DURATION.days}d (a hundred years), got {bounded(text.strip(), 40)}"
        )
    return dt.timedelta(**{unit: number})


def dead_letter_reason(text: str) -> str:
    """One of the reasons the worker writes in ``x-inbox-reason``; ``ValueError`` else."""
    if text not in REASONS:
        raise ConfigurationError(
            f"unknown reason {bounded(text, 60)!r}: one of {', '.join(REASONS)}"
        )
    return text


_GROUP_ID: Final = re.compile(re.escape(GROUP_PREFIX) + "[0-9a-f]{12}")


def failure_group(text: str) -> str:
    """A failure group's id as ``inbox dlq groups`` prints it (``fp-`` and 12 hex digits);
    ``ValueError`` else."""
    if _GROUP_ID.fullmatch(text) is None:
        raise ConfigurationError(
            f"expected a failure group like {GROUP_PREFIX}0123456789ab "
            f"(inbox dlq groups lists them), got {bounded(text, 60)!r}"
        )
    return text


@dataclass(frozen=True, slots=True)
class Filters:
    """Which dead letters to take: all of these that are given must hold."""

    reasons: frozenset[str] = frozenset()
    """``x-inbox-reason`` is one of these."""
    handlers: frozenset[str] = frozenset()
    """One of these is among ``x-inbox-failed-handlers``."""
    older_than: dt.timedelta | None = None
    """``x-inbox-dead-lettered-at`` is at least this long ago (unknown: not taken)."""
    message_ids: frozenset[str] = frozenset()
    """The message id (its :attr:`~inbox.operations._dead_letters.DeadLetterRecord.ref`
    for one without) is one of these: one dead letter, or a chosen few."""
    groups: frozenset[str] = frozenset()
    """The failure group's id (:attr:`~inbox.operations._failure_groups.Fingerprint.id`) is
    one of these: every dead letter that failed the same way."""

    def take(self, letter: DeadLetterRecord, now: dt.datetime) -> bool:
        """Whether ``letter`` passes every filter given."""
        if self.message_ids and letter.ref not in self.message_ids:
            return False
        if self.reasons and letter.reason not in self.reasons:
            return False
        if self.handlers and not self.handlers & set(letter.failed_handlers):
            return False
        if self.groups and fingerprint_of(letter).id not in self.groups:
            return False
        if self.older_than is None:
            return True
        at = letter.dead_lettered()
        return at is not None and now - at >= self.older_than
