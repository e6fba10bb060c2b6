"""What an edge needs on the broker: the queue, one delayed-retry queue per delay, and the
dead-letter queue (``<queue>``, ``<queue>.retry.<ms>ms``, ``<queue>.dlq``), as names and
arguments: the kombu worker declares them with kombu (``inbox.broker._declare``), the
FastStream edge with FastStream.

One TTL per retry queue rather than per-message TTLs in one queue, because a queue expires
messages only at its head: mixed delays would hold short ones behind long ones. The layout,
the quorum dead-lettering and what happens to queues declared by an older version are in
docs/worker.md, "Retries and dead letters".
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Final

from inbox.errors import ConfigurationError

__all__ = [
    "DEFAULT_MAX_TRIES",
    "DEFAULT_RETRY_DELAYS",
    "QueueSpec",
    "QueueTopology",
    "QueueType",
    "RetryPolicy",
]

DEFAULT_RETRY_DELAYS: Final = (1.0, 5.0, 30.0)
DEFAULT_MAX_TRIES: Final = 4
_MAX_QUEUE_NAME_BYTES: Final = 255


@dataclass(frozen=True, slots=True)
class QueueSpec:
    """One durable queue to declare on the default exchange: its name and its arguments
    (``x-queue-type``, TTL and dead-lettering), as RabbitMQ takes them."""

    name: str
    arguments: Mapping[str, Any]


class QueueType(StrEnum):
    """The RabbitMQ queue type for every queue the worker declares."""

    CLASSIC = "classic"
    QUORUM = "quorum"


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How often a failing delivery is tried and how long it waits between tries.

    ``max_tries`` counts every attempt, the first included: with 3, a delivery whose handler
    keeps failing runs three times and is then dead-lettered. The n-th retry waits
    ``delays[n - 1]`` seconds; when there are more retries than delays, the last one repeats.
    """

    delays: tuple[float, ...] = DEFAULT_RETRY_DELAYS
    max_tries: int = DEFAULT_MAX_TRIES

    def __post_init__(self) -> None:
        if isinstance(self.max_tries, bool) or not isinstance(self.max_tries, int):
            raise ConfigurationError(
                f"max_tries must be an int, got {type(self.max_tries).__name__}"
            )
        if self.max_tries < 1:
            raise ConfigurationError(f"max_tries must be at least 1, got {self.max_tries}")
        delays = tuple(self.delays)
        for delay in delays:
            if isinstance(delay, bool) or not isinstance(delay, int | float):
                raise ConfigurationError(f"retry delays must be numbers of seconds, got {delay!r}")
            if not math.isfinite(delay) or delay < 0.001:
                raise ConfigurationError(
                    f"retry delays must be finite and at least 0.001 s, got {delay}"
                )
        if self.max_tries > 1 and not delays:
            raise ConfigurationError("max_tries > 1 needs at least one retry delay")
        object.__setattr__(self, "delays", delays)

    def exhausted(self, tries: int) -> bool:
        """True when a delivery that has failed ``tries`` times must not be tried again."""
        return tries >= self.max_tries

    def delay_ms(self, tries: int) -> int:
        """The wait, in milliseconds, before the next attempt after failed try ``tries``."""
        return _ms(self.delays[min(tries, len(self.delays)) - 1])

    def used_delays_ms(self) -> tuple[int, ...]:
        """Every distinct wait a delivery can be given, in milliseconds, in order of use."""
        waits = (self.delay_ms(tries) for tries in range(1, self.max_tries))
        return tuple(dict.fromkeys(waits))


def _ms(seconds: float) -> int:
    return max(1, round(seconds * 1000))


@dataclass(frozen=True, slots=True)
class QueueTopology:
    """One consumed queue with its retry queues and dead-letter queue."""

    name: str
    queue_type: QueueType = QueueType.CLASSIC
    retry: RetryPolicy = field(default_factory=RetryPolicy)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name or self.name != self.name.strip():
            raise ConfigurationError(
                f"queue name must be a non-empty string without edge spaces: {self.name!r}"
            )
        if self.name.startswith("amq."):
            raise ConfigurationError(
                f"queue names starting with 'amq.' are reserved: {self.name!r}"
            )
        object.__setattr__(self, "queue_type", QueueType(self.queue_type))
        longest = max(
            (self.retry_queue(ms) for ms in self.retry.used_delays_ms()), key=len, default=""
        )
        for name in (self.dead_letter_queue, longest):
            if len(name.encode("utf-8")) > _MAX_QUEUE_NAME_BYTES:
                raise ConfigurationError(f"queue name {name!r} is longer than 255 bytes")

    @property
    def dead_letter_queue(self) -> str:
        """Where deliveries go that cannot or must no longer be tried: ``<queue>.dlq``."""
        return f"{self.name}.dlq"

    def retry_queue(self, delay_ms: int) -> str:
        """The delayed-retry queue for one wait: ``<queue>.retry.<ms>ms``."""
        return f"{self.name}.retry.{delay_ms}ms"

    def queues(self) -> Iterator[QueueSpec]:
        """Every queue to declare: the consumed queue, its retry queues, its dead letters."""
        yield self.consumed_queue()
        for delay_ms in self.retry.used_delays_ms():
            arguments = {
                "x-message-ttl": delay_ms,
                "x-dead-letter-exchange": "",
                "x-dead-letter-routing-key": self.name,
            }
            if self.queue_type is QueueType.QUORUM:
                arguments["x-dead-letter-strategy"] = "at-least-once"
                arguments["x-overflow"] = "reject-publish"
            yield self._queue(self.retry_queue(delay_ms), arguments)
        yield self._queue(self.dead_letter_queue, {})

    def consumed_queue(self) -> QueueSpec:
        """The queue consumed from (a quorum one dead-letters what RabbitMQ drops from it,
        past a delivery limit, to the dead-letter queue)."""
        if self.queue_type is not QueueType.QUORUM:
            return self._queue(self.name, {})
        arguments = {
            "x-dead-letter-exchange": "",
            "x-dead-letter-routing-key": self.dead_letter_queue,
        }
        return self._queue(self.name, arguments)

    def _queue(self, name: str, arguments: dict[str, Any]) -> QueueSpec:
        if self.queue_type is QueueType.QUORUM:
            arguments = {"x-queue-type": "quorum", **arguments}
        return QueueSpec(name, arguments)
