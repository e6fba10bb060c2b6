"""What subscribing an inbox to a FastStream broker gives back, and the option checks the
two brokers share."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from inbox.delivery._stats import WorkerStats
from inbox.errors import ConfigurationError
from inbox.faststream._edge import InboxEdge

__all__ = ["InboxSubscription", "check_positive"]


@dataclass(frozen=True, slots=True)
class InboxSubscription:
    """One FastStream subscriber that runs its deliveries through an ``AsyncInbox``."""

    subscriber: Any
    """FastStream's subscriber object (its ``start``/``stop``, AsyncAPI entry, test hooks)."""
    edge: InboxEdge
    """The edge that settles each delivery."""

    @property
    def stats(self) -> WorkerStats:
        """The counters of the kombu worker, for this subscriber since it was made."""
        return self.edge.stats

    @property
    def halted_by(self) -> BaseException | None:
        """The configuration error (or, on NATS, the closed connection) that stopped this
        subscriber, if one did."""
        return self.edge.halted_by


def check_positive(name: str, value: object) -> None:
    """Refuse an option that must be a positive number."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ConfigurationError(f"{name} must be a positive number, got {value!r}")
