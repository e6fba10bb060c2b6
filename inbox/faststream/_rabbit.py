"""The FastStream edge on RabbitMQ: a subscriber on the consumed queue, copies to the retry
queues and ``<queue>.dlq`` of :class:`inbox.broker.QueueTopology`, each publish confirmed.

The queue layout is the kombu worker's (retry queues with a TTL that dead-letter back into
the consumed queue), so a queue can move between the two consumers. Under FastStream's
``TestRabbitBroker`` there are no TTL queues: a retry copy goes straight back to the consumed
queue after the delay, and a dead letter to a test's own subscriber on ``<queue>.dlq``.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any, Final, cast

import aio_pika
import aiormq
from aio_pika.exceptions import AMQPError, ChannelInvalidStateError, DeliveryError
from faststream.exceptions import SubscriberNotFound
from faststream.message import StreamMessage
from faststream.middlewares import AckPolicy
from faststream.rabbit import Channel, RabbitBroker, RabbitQueue
from faststream.rabbit import QueueType as FastStreamQueueType
from faststream.rabbit.subscriber import RabbitSubscriber
from faststream.rabbit.testing import PatchedMessage
from pamqp.header import ContentHeader

from inbox.aio import AsyncInbox
from inbox.delivery._inbound import Inbound
from inbox.delivery.topology import QueueTopology, QueueType, RetryPolicy
from inbox.errors import CopyRefused
from inbox.faststream._edge import FastStreamTransport, InboxEdge, compression_of, logger
from inbox.faststream._subscription import InboxSubscription, check_positive

__all__ = ["subscribe_rabbit"]

_FRAME_ENVELOPE: Final = 8  # frame type, channel, size; the frame-end octet
# What FastStream may set that the copy measured here lacks (an app_id, a correlation id of
# its own making): short strings, 255 bytes each at most.
_ADDED_BY_FASTSTREAM: Final = 1024


def subscribe_rabbit(
    broker: RabbitBroker,
    inbox: AsyncInbox,
    queue: str,
    *,
    retry: RetryPolicy | None = None,
    queue_type: QueueType | str = QueueType.CLASSIC,
    prefetch: int = 32,
    confirm_timeout: float = 30.0,
    default_content_type: str | None = "application/json",
) -> InboxSubscription:
    """Consume ``queue`` on ``broker`` through ``inbox``, as the kombu worker would.

    Each delivery becomes an :class:`inbox.Message` (AMQP ``message_id`` and ``type``) and is
    acked only after ``await inbox.process()`` committed or found it a duplicate. A failed
    try goes to ``<queue>.retry.<ms>ms`` (which dead-letters it back after the delay of
    ``retry``), the last one, or a delivery that cannot be a message, to ``<queue>.dlq`` with
    the ``x-inbox-*`` headers; every copy is published ``mandatory`` and confirmed before
    the original is acked. Up to ``prefetch`` deliveries are processed at once. A delivery
    without a content type is read as ``default_content_type`` (None: raw bytes), as the
    worker's ``--default-content-type``.
    """
    topology = QueueTopology(queue, QueueType(queue_type), retry or RetryPolicy())
    check_positive("prefetch", prefetch)
    check_positive("confirm_timeout", confirm_timeout)
    # TestRabbitBroker hands over its own class of message: its deliveries are settled on
    # the test broker's transport (no frames, no TTL queues, no confirms).
    stand_in = TestRabbitTransport(broker, topology, confirm_timeout)
    edge = InboxEdge(
        inbox,
        _RabbitTransport(broker, topology, confirm_timeout),
        topology.retry,
        default_content_type=default_content_type,
        stand_ins={PatchedMessage: stand_in},
    )
    subscriber: RabbitSubscriber = broker.subscriber(
        _faststream_queue(topology, topology.name),
        channel=Channel(prefetch_count=prefetch),
        ack_policy=AckPolicy.MANUAL,
        decoder=_as_is,
        no_reply=True,
        title=f"inbox:{queue}",
    )
    subscriber(edge.handle)
    return InboxSubscription(subscriber, edge)


async def _as_is(msg: StreamMessage[Any]) -> StreamMessage[Any]:
    # The edge decodes the body itself (inbox.delivery.codec), so an undecodable one is
    # dead-lettered with its reason instead of failing inside FastStream before any ack.
    return msg


def _faststream_queue(topology: QueueTopology, name: str) -> RabbitQueue:
    """The queue ``name`` of ``topology`` as FastStream declares it, with the kombu
    worker's arguments (FastStream adds ``x-queue-type`` itself)."""
    declared = {queue.name: queue for queue in topology.queues()}[name]
    arguments: dict[str, Any] = dict(declared.arguments)
    arguments.pop("x-queue-type", None)
    if topology.queue_type is QueueType.QUORUM:
        return RabbitQueue(name, FastStreamQueueType.QUORUM, arguments=cast(Any, arguments))
    return RabbitQueue(name, durable=True, arguments=cast(Any, arguments or None))


class _RabbitTransport(FastStreamTransport):
    """Copies to the retry queues (RabbitMQ delays them) and the ``.dlq``, each published
    ``mandatory`` and confirmed; a copy whose header frame would pass ``frame_max`` does
    not fit."""

    def __init__(self, broker: RabbitBroker, topology: QueueTopology, timeout: float) -> None:
        super().__init__(topology.name)
        self.broker = broker
        self.topology = topology
        self.timeout = timeout

    def read(self, msg: StreamMessage[Any]) -> Inbound:
        raw: aio_pika.abc.AbstractIncomingMessage = msg.raw_message
        headers = dict(raw.headers or {})
        return Inbound(
            raw.message_id,
            raw.type,
            headers,
            raw.body,
            raw.content_type,
            raw.content_encoding,
            compression_of(headers),
        )

    def retry_route(self, delay_ms: int) -> tuple[str, float]:
        return self.topology.retry_queue(delay_ms), 0.0

    async def prepare(self) -> None:
        for queue in self.topology.queues():
            if queue.name != self.queue:
                await self.broker.declare_queue(_faststream_queue(self.topology, queue.name))

    def fits(self, msg: StreamMessage[Any], headers: Mapping[str, Any]) -> bool:
        raw: aio_pika.abc.AbstractIncomingMessage = msg.raw_message
        try:
            frame_max = raw.channel.connection.connection_tune.frame_max
        except Exception:  # the channel is gone: the copy is refused, and the delivery returns
            return True
        if not frame_max:
            return True
        copy = aio_pika.Message(
            raw.body,
            headers=dict(headers),
            content_type=raw.content_type,
            content_encoding=raw.content_encoding,
            delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
            priority=raw.priority,
            correlation_id=raw.correlation_id,
            reply_to=raw.reply_to,
            timestamp=raw.timestamp,
            message_id=raw.message_id,
            type=raw.type,
        )
        header = ContentHeader(0, len(raw.body), copy.properties).marshal()
        return len(header) + _FRAME_ENVELOPE + _ADDED_BY_FASTSTREAM <= frame_max

    def publishing(self, msg: StreamMessage[Any], target: str, headers: Mapping[str, Any]) -> Any:
        """``broker.publish`` of the copy, its properties the delivery's, still to call."""
        raw: aio_pika.abc.AbstractIncomingMessage = msg.raw_message
        return functools.partial(
            self.broker.publish,
            raw.body,
            queue=target,
            persist=True,
            headers=dict(headers),
            content_type=raw.content_type,
            content_encoding=raw.content_encoding,
            message_id=raw.message_id,
            message_type=raw.type,
            correlation_id=raw.correlation_id,
            reply_to=raw.reply_to,
            timestamp=raw.timestamp,
            priority=raw.priority,
        )

    async def send(
        self, msg: StreamMessage[Any], target: str, headers: Mapping[str, Any], delay_ms: int
    ) -> None:
        publish = self.publishing(msg, target, headers)
        try:
            confirmed = await publish(mandatory=True, timeout=self.timeout)
        except DeliveryError as exc:
            raise CopyRefused(f"nacked by the broker: {exc}") from exc
        except TimeoutError as exc:
            raise CopyRefused(f"no publisher confirm within {self.timeout:g} s") from exc
        except (AMQPError, ChannelInvalidStateError, ConnectionError) as exc:
            raise CopyRefused(f"{type(exc).__name__}: {exc}") from exc
        if isinstance(confirmed, aiormq.spec.Basic.Ack):
            return
        if confirmed is None:
            raise CopyRefused("not confirmed: the broker's channel has publisher confirms off")
        raise CopyRefused(f"no queue {target!r}: returned unroutable")

    def settleable(self, msg: StreamMessage[Any]) -> bool:
        channel = getattr(msg.raw_message, "channel", None)
        return channel is not None and not getattr(channel, "is_closed", True)


class TestRabbitTransport(_RabbitTransport):
    """The transport under FastStream's ``TestRabbitBroker``: there are no TTL queues (a
    retry goes straight back to the consumed queue after the delay, the edge holding the
    delivery meanwhile), no frames to measure, and a copy runs the target queue's
    subscriber in place of a confirm (a dead letter reaches a test's own subscriber on
    ``<queue>.dlq``)."""

    def retry_route(self, delay_ms: int) -> tuple[str, float]:
        return self.queue, delay_ms / 1000

    def fits(self, msg: StreamMessage[Any], headers: Mapping[str, Any]) -> bool:
        return True

    async def send(
        self, msg: StreamMessage[Any], target: str, headers: Mapping[str, Any], delay_ms: int
    ) -> None:
        try:
            await self.publishing(msg, target, headers)()
        except SubscriberNotFound:
            logger.error(
                "under TestRabbitBroker nothing subscribes to %r: subscribe to it in the test "
                "to receive the copies the edge sends there",
                target,
            )
            raise
