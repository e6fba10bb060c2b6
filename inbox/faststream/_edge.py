"""One FastStream delivery through an :class:`~inbox.aio.AsyncInbox` and to its end.

The broker-independent half of the FastStream edge: :class:`InboxEdge` hands each delivery
to the asyncio shell every edge shares (:func:`inbox.delivery.transport.deliver_async`),
which reads it, runs the inbox and carries the decision out on a :class:`FastStreamTransport`:
what acking, giving back and copying mean on one broker, and nothing else. Nothing here
knows SQL, and nothing here decides.
"""

from __future__ import annotations

import asyncio
import logging
from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any

from faststream.exceptions import StopConsume
from faststream.message import StreamMessage

from inbox.aio import AsyncInbox
from inbox.delivery._inbound import Inbound
from inbox.delivery._settling import Settling
from inbox.delivery._stats import WorkerStats
from inbox.delivery.topology import RetryPolicy
from inbox.delivery.transport import deliver_async
from inbox.errors import ConfigurationError, CopyRefused

__all__ = ["FastStreamTransport", "InboxEdge", "compression_of"]

logger = logging.getLogger("inbox.faststream")


def compression_of(headers: Mapping[str, Any]) -> str | None:
    """The delivery's ``compression`` header, the edge decompresses by it."""
    compression = headers.get("compression")
    return None if compression is None else str(compression)


class FastStreamTransport(ABC):
    """An :class:`~inbox.delivery.transport.AsyncTransport` on one FastStream broker: the
    ack and give-back of a ``StreamMessage`` (a channel gone is not an error: the broker
    gives the delivery back), the stop (``StopConsume``), and the queues a copy needs
    declared once before the first copy. A broker adds how it reads, routes and sends."""

    queue: str
    """The consumed queue, stream or subject; the dead letters go to ``<queue>.dlq``."""

    def __init__(self, queue: str) -> None:
        self.queue = queue
        self.dead_letters = f"{queue}.dlq"
        self._prepared = False
        self._prepare_lock = asyncio.Lock()

    @abstractmethod
    def read(self, msg: StreamMessage[Any]) -> Inbound:
        """The delivery's parts."""

    @abstractmethod
    def retry_route(self, delay_ms: int) -> tuple[str, float]:
        """Where a retry copy goes, and how long the edge holds the delivery before."""

    @abstractmethod
    async def send(
        self, msg: StreamMessage[Any], target: str, headers: Mapping[str, Any], delay_ms: int
    ) -> None:
        """Send the copy, confirmed; raise :class:`CopyRefused` when it was not taken."""

    @abstractmethod
    def settleable(self, msg: StreamMessage[Any]) -> bool:
        """Whether the delivery can still be acked (its channel or connection is alive)."""

    async def prepare(self) -> None:  # noqa: B027 (a hook: most brokers declare nothing)
        """Make sure every queue a copy may go to exists (before the first copy)."""

    def fits(self, msg: StreamMessage[Any], headers: Mapping[str, Any]) -> bool:
        """Whether the copy fits the broker's size limit: yes unless a broker says no."""
        return True

    async def copy(
        self, msg: StreamMessage[Any], target: str, headers: Mapping[str, Any], *, delay_ms: int
    ) -> None:
        """The queues declared once, then the confirmed copy."""
        if not self._prepared:
            async with self._prepare_lock:
                if not self._prepared:
                    try:
                        await self.prepare()
                    except Exception as exc:  # a queue the broker would not declare: no copy
                        raise CopyRefused(
                            f"declaring the queues: {type(exc).__name__}: {exc}"
                        ) from exc
                    self._prepared = True
        await self.send(msg, target, headers, delay_ms)

    async def ack(self, msg: StreamMessage[Any]) -> bool:
        """Ack the delivery; False when its channel is gone."""
        return await self._answer(msg, msg.ack())

    async def give_back(self, msg: StreamMessage[Any]) -> bool:
        """Nack the delivery back untouched; False when its channel is gone."""
        return await self._answer(msg, msg.nack())

    async def _answer(self, msg: StreamMessage[Any], answer: Any) -> bool:
        try:
            await answer
        except Exception:
            if self.settleable(msg):
                raise
            # The connection went away under the delivery: the broker gives it back, and the
            # inbox skips what was already committed when it comes again.
            logger.warning(
                "message %s: its channel is gone; the broker gives it back", msg.message_id
            )
            return False
        return True

    def stop(self, error: BaseException) -> None:
        """Stop this subscriber (FastStream's ``StopConsume``)."""
        raise StopConsume


class InboxEdge:
    """Runs each delivery through ``inbox`` and settles it on ``transport``: ack after
    commit, a confirmed copy (retry or dead letter) before the ack, given back untouched
    after a configuration error (and the subscriber stops).

    ``stand_ins`` maps a class of ``raw_message`` to the transport its deliveries are
    settled on instead: a test broker's (``TestRabbitBroker`` hands over its own class)."""

    def __init__(
        self,
        inbox: AsyncInbox,
        transport: FastStreamTransport,
        policy: RetryPolicy,
        *,
        default_content_type: str | None,
        stand_ins: Mapping[type, FastStreamTransport] | None = None,
    ) -> None:
        if not isinstance(inbox, AsyncInbox):
            raise ConfigurationError(
                f"the FastStream edge runs an inbox.aio.AsyncInbox, got {type(inbox).__name__}"
            )
        if not isinstance(policy, RetryPolicy):
            raise ConfigurationError(f"retry must be an inbox.broker.RetryPolicy, got {policy!r}")
        self.inbox = inbox
        self.transport = transport
        self.policy = policy
        self.stats = WorkerStats()
        self._settling = Settling(self.stats, policy, logger)
        self._default_content_type = default_content_type
        self._stand_ins = dict(stand_ins or {})

    @property
    def halted_by(self) -> BaseException | None:
        """The configuration error (or, on NATS, the closed connection) that stopped this
        edge, if one did."""
        return self._settling.halted_by

    async def handle(self, msg: StreamMessage[Any]) -> None:
        """Process one delivery and settle it."""
        transport = self.transport
        if self._stand_ins:
            transport = self._stand_ins.get(msg.raw_message.__class__, transport)
        await deliver_async(
            transport,
            msg,
            self._settling,
            self.inbox.process,
            default_content_type=self._default_content_type,
        )
