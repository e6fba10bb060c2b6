"""The FastStream edge on Redis Streams: a consumer-group subscriber, dead letters to the
stream ``<stream>.dlq`` and retries back into the stream, each written before the XACK.

Redis has no dead-letter exchange and no delayed delivery, so the edge does both itself: a
dead letter is an XADD to ``<stream>.dlq``; a retry is held by the consuming task for its
delay (its entry stays pending) and then XADDed back to the stream with the ``x-inbox-*``
headers. What this cannot promise is in docs/faststream.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from faststream.message import StreamMessage
from faststream.middlewares import AckPolicy
from faststream.redis import RedisBroker, StreamSub
from redis.exceptions import RedisError

from inbox.aio import AsyncInbox
from inbox.delivery import headers as h
from inbox.delivery._inbound import Inbound
from inbox.delivery.topology import RetryPolicy
from inbox.errors import ConfigurationError, CopyRefused
from inbox.faststream._edge import FastStreamTransport, InboxEdge, compression_of
from inbox.faststream._subscription import InboxSubscription, check_positive

__all__ = ["subscribe_redis_stream"]


def subscribe_redis_stream(
    broker: RedisBroker,
    inbox: AsyncInbox,
    stream: StreamSub,
    *,
    retry: RetryPolicy | None = None,
    max_workers: int = 1,
    default_content_type: str | None = None,
) -> InboxSubscription:
    """Consume ``stream`` (a consumer group's ``StreamSub``) on ``broker`` through ``inbox``.

    Each entry becomes an :class:`inbox.Message` (headers ``message_id`` and ``type``) and is
    XACKed only after ``await inbox.process()`` committed or found it a duplicate. A failed
    try is held for the delay of ``retry``, then added back to the stream with the
    ``x-inbox-*`` headers; the last one, or an entry that cannot be a message, is added to
    ``<stream>.dlq``. Up to ``max_workers`` entries are processed at once; a held retry
    occupies one of them for its delay.

    CopyRefused: a ``StreamSub`` without a consumer group (nothing would be pending, so nothing
    held by a crashed consumer could be delivered again), with ``no_ack`` (entries would be
    acked before the inbox committed) or with ``batch``.
    """
    if not isinstance(stream, StreamSub):
        raise ConfigurationError(f"stream must be a faststream.redis.StreamSub, got {stream!r}")
    if not stream.group:
        raise ConfigurationError(
            f"stream {stream.name!r}: the inbox needs a consumer group (StreamSub(..., "
            "group=..., consumer=...)); without one Redis acks nothing and a crashed "
            "consumer's entries are lost"
        )
    if stream.no_ack:
        raise ConfigurationError(
            f"stream {stream.name!r}: no_ack=True acks each entry as it is read, before the "
            "inbox commits; the inbox acks after the commit"
        )
    if stream.batch:
        raise ConfigurationError(
            f"stream {stream.name!r}: batch=True is not supported by the inbox edge"
        )
    check_positive("max_workers", max_workers)
    policy = retry or RetryPolicy()
    edge = InboxEdge(
        inbox,
        _RedisTransport(broker, stream.name),
        policy,
        default_content_type=default_content_type,
    )
    subscriber = broker.subscriber(
        stream=stream,
        ack_policy=AckPolicy.MANUAL,
        decoder=_as_is,
        no_reply=True,
        max_workers=max_workers,
        title=f"inbox:{stream.name}",
    )
    subscriber(edge.handle)
    return InboxSubscription(subscriber, edge)


async def _as_is(msg: StreamMessage[Any]) -> StreamMessage[Any]:
    return msg  # the edge decodes the body itself (see _rabbit._as_is)


class _RedisTransport(FastStreamTransport):
    """Dead letters XADDed to ``<stream>.dlq``; a retry held by the edge for its delay, then
    XADDed back to the stream (Redis has neither dead-letter exchange nor delayed delivery)."""

    def __init__(self, broker: RedisBroker, stream: str) -> None:
        super().__init__(stream)
        self.broker = broker

    def read(self, msg: StreamMessage[Any]) -> Inbound:
        headers = dict(msg.headers)
        tries = headers.get(h.TRIES)
        if isinstance(tries, str) and tries.isdigit():
            headers[h.TRIES] = int(tries)  # Redis headers are strings
        return Inbound(
            headers.get("message_id"),
            headers.get("type"),
            headers,
            msg.body,
            headers.get("content-type"),
            headers.get("content-encoding"),
            compression_of(headers),
        )

    def retry_route(self, delay_ms: int) -> tuple[str, float]:
        return self.queue, delay_ms / 1000

    async def send(
        self, msg: StreamMessage[Any], target: str, headers: Mapping[str, Any], delay_ms: int
    ) -> None:
        # Streams come into being with their first entry: nothing to prepare.
        headers = {key: str(value) for key, value in headers.items()}
        correlation_id = headers.pop("correlation_id", None) or msg.correlation_id
        try:
            await self.broker.publish(
                msg.body, stream=target, headers=headers, correlation_id=correlation_id
            )
        except (RedisError, ConnectionError, TimeoutError) as exc:
            raise CopyRefused(f"{type(exc).__name__}: {exc}") from exc

    def settleable(self, msg: StreamMessage[Any]) -> bool:
        return True  # an entry stays pending in its group until XACKed, whatever the connection
