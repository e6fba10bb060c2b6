"""What :meth:`inbox.Inbox.process` reports: one outcome per handler."""

from __future__ import annotations

import enum
import uuid
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["Outcome", "ProcessResult", "Unhandled"]


class Outcome(enum.StrEnum):
    """What happened to one (message, handler) pair, or to a message no handler takes.

    A ``StrEnum``: ``Outcome.PROCESSED == "processed"``, handy in logs and JSON.
    """

    PROCESSED = "processed"
    """The claim was new: the handler ran and its transaction committed."""
    DUPLICATE = "duplicate"
    """The claim already existed: the handler was skipped and nothing was committed."""
    IGNORED = "ignored"
    """No handler takes the message's type and the inbox is set to ignore such messages."""


class Unhandled(enum.StrEnum):
    """What :meth:`inbox.Inbox.process` does with a message whose type no handler takes."""

    RAISE = "raise"
    """Raise :class:`inbox.UnhandledMessage` (the default: the message was misrouted)."""
    IGNORE = "ignore"
    """Return a result whose outcome is :attr:`Outcome.IGNORED`."""


@dataclass(frozen=True, slots=True)
class ProcessResult:
    """The outcome of processing one message: ``outcomes`` maps handler name to outcome."""

    message_id: uuid.UUID
    outcomes: Mapping[str, Outcome]

    @property
    def outcome(self) -> Outcome:
        """The message as a whole: IGNORED with no handlers, DUPLICATE if every handler was
        a duplicate, else PROCESSED."""
        if not self.outcomes:
            return Outcome.IGNORED
        for outcome in self.outcomes.values():  # a loop: no generator per result
            if outcome is not Outcome.DUPLICATE:
                return Outcome.PROCESSED
        return Outcome.DUPLICATE

    @property
    def processed(self) -> tuple[str, ...]:
        """Names of the handlers that ran and committed."""
        return tuple(n for n, o in self.outcomes.items() if o is Outcome.PROCESSED)

    @property
    def duplicates(self) -> tuple[str, ...]:
        """Names of the handlers skipped because their claim already existed."""
        return tuple(n for n, o in self.outcomes.items() if o is Outcome.DUPLICATE)
