"""One FastStream delivery through an :class:`~inbox.aio.AsyncInbox` and to its end.

The broker-independent half of the FastStream edge, on the settle plan the kombu worker
carries out too: the delivery's parts become a Message or a dead-letter reason
(:func:`inbox.delivery._inbound.read_message`), and :class:`inbox.delivery._settling.Settling`
counts, decides (ack / retry / dead letter / halt), logs and writes the copies' headers. A
:class:`Transport` carries the decision out on one broker. Nothing here knows SQL.
"""

from __future__ import annotations

import asyncio
import logging
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from faststream.exceptions import StopConsume
from faststream.message import StreamMessage

from inbox.aio import AsyncInbox
from inbox.delivery._inbound import read_id, read_message
from inbox.delivery._policy import (
    Ack,
    DeadLetter,
    Halt,
    Retry,
)
from inbox.delivery._settling import Settling
from inbox.delivery._stats import WorkerStats
from inbox.delivery.topology import RetryPolicy
from inbox.errors import ConfigurationError, CopyRefused
from inbox.message import Message
from inbox.result import ProcessResult

__all__ = ["Inbound", "InboxEdge", "Transport"]

logger = logging.getLogger("inbox.faststream")


@dataclass(frozen=True, slots=True)
class Inbound:
    """What the edge reads from one delivery, as the broker handed it over."""

    raw_id: object
    message_type: object
    headers: Mapping[str, Any]
    data: bytes
    content_type: str | None
    content_encoding: str | None


class Transport(ABC):
    """How one broker reads, acks, gives back and copies a FastStream delivery."""

    queue: str
    """The consumed queue or stream; the dead letters go to ``<queue>.dlq``."""

    @abstractmethod
    def read(self, msg: StreamMessage[Any]) -> Inbound:
        """The delivery's parts."""

    @abstractmethod
    def retry_route(self, msg: StreamMessage[Any], delay_ms: int) -> tuple[str, float]:
        """Where a retry copy goes and how long, in seconds, the edge holds the delivery
        before sending it (0 when the broker itself delays the copy)."""

    @abstractmethod
    async def prepare(self) -> None:
        """Make sure every queue a copy may go to exists (called before the first copy)."""

    @abstractmethod
    async def copy(self, msg: StreamMessage[Any], target: str, headers: Mapping[str, Any]) -> None:
        """Send the delivery to ``target`` with ``headers`` (all of them: its own and the
        inbox's), confirmed by the broker; raise :class:`CopyRefused` when it was not taken."""

    def fits(self, msg: StreamMessage[Any], headers: Mapping[str, Any]) -> bool:
        """Whether the copy of the delivery with ``headers`` is one the broker can take
        (on RabbitMQ: its properties fit in one frame). Yes unless a broker says no."""
        return True

    @abstractmethod
    def settleable(self, msg: StreamMessage[Any]) -> bool:
        """Whether the delivery can still be acked (its channel or connection is alive)."""


class InboxEdge:
    """Runs each delivery through ``inbox`` and settles it on ``transport``: ack after
    commit, a confirmed copy (retry or dead letter) before the ack, given back untouched
    after a configuration error (and the subscriber stops)."""

    def __init__(
        self,
        inbox: AsyncInbox,
        transport: Transport,
        policy: RetryPolicy,
        *,
        default_content_type: str | None,
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
        self.halted_by: BaseException | None = None
        self._default_content_type = default_content_type
        self._prepared = False
        self._prepare_lock = asyncio.Lock()

    async def handle(self, msg: StreamMessage[Any]) -> None:
        """Process one delivery and settle it."""
        if self.halted_by is not None:
            await self._give_back(msg)
            return
        self.stats.deliveries += 1
        inbound = self.transport.read(msg)
        read = self._message(inbound)
        if isinstance(read, DeadLetter):
            await self._dead_letter(msg, inbound, read)
            return
        try:
            outcome: ProcessResult | BaseException = await self.inbox.process(read)
        except (KeyboardInterrupt, SystemExit, asyncio.CancelledError):
            raise  # the task is ending: nothing is acked, the broker gives the delivery back
        except BaseException as exc:  # any other escape is a failed try, never a dead consumer
            outcome = exc
        decision = self._settling.decide(read.id, outcome, inbound.headers)
        if isinstance(decision, Ack):
            # Ack only now: every handler's claim and effects are committed (or were by an
            # earlier delivery). A crash before this line means a redelivery, which the inbox
            # skips as a duplicate; acking earlier could lose the message.
            await self._ack(msg)
        elif isinstance(decision, Halt):
            self._settling.halt(decision)
            self.halted_by = decision.error
            await self._give_back(msg)
            raise StopConsume
        elif isinstance(decision, Retry):
            await self._retry(msg, inbound, read, decision)
        else:
            await self._dead_letter(msg, inbound, decision)

    def _message(self, inbound: Inbound) -> Message | DeadLetter:
        message_id = read_id(inbound.raw_id)
        if isinstance(message_id, DeadLetter):
            return message_id
        compression = inbound.headers.get("compression")
        return read_message(
            message_id,
            inbound.message_type,
            inbound.headers,
            inbound.data,
            content_type=inbound.content_type,
            content_encoding=inbound.content_encoding,
            compression=None if compression is None else str(compression),
            default_content_type=self._default_content_type,
        )

    async def _retry(
        self, msg: StreamMessage[Any], inbound: Inbound, message: Message, retry: Retry
    ) -> None:
        added = self._settling.retry(
            retry,
            message_id=message.id,
            message_type=message.type,
            queue=self.transport.queue,
            headers=inbound.headers,
        )
        target, hold = self.transport.retry_route(msg, retry.delay_ms)
        if hold:
            await asyncio.sleep(hold)
        await self._forward(msg, inbound, target, added)

    async def _dead_letter(
        self, msg: StreamMessage[Any], inbound: Inbound, dead: DeadLetter
    ) -> None:
        queue = self.transport.queue
        added = self._settling.dead_letter(
            dead,
            message_id=inbound.raw_id,
            message_type=inbound.message_type,
            queue=queue,
            dead_letters=f"{queue}.dlq",
            headers=inbound.headers,
        )
        await self._forward(msg, inbound, f"{queue}.dlq", added)

    async def _forward(
        self, msg: StreamMessage[Any], inbound: Inbound, target: str, added: dict[str, Any]
    ) -> None:
        """The confirmed copy, then the ack; a refused copy is tried again after a backoff
        while the delivery is held (the handlers do not run again). A copy the broker
        cannot take at all (too large for a frame) goes to the .dlq trimmed instead."""
        headers = {**inbound.headers, **added}
        if not self.transport.fits(msg, headers):
            dead_letters = f"{self.transport.queue}.dlq"
            headers = self._settling.too_large(
                message_id=inbound.raw_id,
                target=target,
                dead_letters=dead_letters,
                own=inbound.headers,
                added=added,
            )
            target = dead_letters
        refusals = 0
        while True:
            try:
                await self._prepare()
                await self.transport.copy(msg, target, headers)
            except CopyRefused as refused:
                if not self.transport.settleable(msg):
                    logger.error(
                        "message %s: its channel is gone; the broker gives it back", msg.message_id
                    )
                    return
                wait = self._settling.refused(msg.message_id, target, refused, refusals)
                refusals += 1
                await asyncio.sleep(wait)
                continue
            break
        await self._ack(msg)

    async def _prepare(self) -> None:
        if self._prepared:
            return
        async with self._prepare_lock:
            if not self._prepared:
                try:
                    await self.transport.prepare()
                except Exception as exc:  # a queue the broker would not declare: no copy yet
                    raise CopyRefused(f"declaring the queues: {type(exc).__name__}: {exc}") from exc
                self._prepared = True

    async def _ack(self, msg: StreamMessage[Any]) -> None:
        if await self._answer_broker(msg, ack=True):
            self._settling.acked()

    async def _give_back(self, msg: StreamMessage[Any]) -> None:
        if await self._answer_broker(msg, ack=False):
            self.stats.requeued += 1

    async def _answer_broker(self, msg: StreamMessage[Any], *, ack: bool) -> bool:
        try:
            await (msg.ack() if ack else msg.nack())
        except Exception:
            if self.transport.settleable(msg):
                raise
            # The connection went away under the delivery: the broker gives it back, and the
            # inbox skips what was already committed when it comes again.
            logger.warning(
                "message %s: its channel is gone; the broker gives it back", msg.message_id
            )
            return False
        return True
