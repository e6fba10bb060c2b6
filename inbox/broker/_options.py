"""The worker's options, checked once at construction with one clear error each."""

from __future__ import annotations

from collections.abc import Sequence

from inbox.core import Inbox
from inbox.errors import ConfigurationError

__all__ = ["check_options"]


def check_options(
    inbox: Inbox,
    queues: Sequence[str],
    prefetch: int,
    batch_size: int,
    stats_interval: float | None,
) -> None:
    """Raise ``TypeError`` or ``ValueError`` naming the first option that is not usable."""
    if not isinstance(inbox, Inbox):
        raise ConfigurationError(f"inbox must be an inbox.Inbox, got {type(inbox).__name__}")
    if isinstance(queues, str) or not queues:
        raise ConfigurationError("queues must be a non-empty sequence of queue names")
    if len(set(queues)) != len(queues):
        raise ConfigurationError(f"queues must not repeat a name: {list(queues)}")
    for name, value in (("prefetch", prefetch), ("batch_size", batch_size)):
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 65535:
            raise ConfigurationError(f"{name} must be an int from 1 to 65535, got {value!r}")
    if batch_size > prefetch:
        raise ConfigurationError(
            f"batch_size ({batch_size}) must not exceed prefetch ({prefetch}): a batch "
            "fills only from deliveries the broker has already sent"
        )
    if stats_interval is not None and stats_interval <= 0:
        raise ConfigurationError(f"stats_interval must be positive or None, got {stats_interval}")
