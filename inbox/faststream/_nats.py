"""The FastStream edge on NATS JetStream: a durable pull consumer, JetStream's own redelivery
for a failed try (a NAK with the retry's delay), dead letters to a stream of their own.

JetStream counts the deliveries of each message itself, so the tries are not carried in a
header: a delivery's ``num_delivered`` minus one is the number of tries before it, and a
failed try is given back with ``NAK {delay}`` (the transport's "copy" to the consumed
subject is that redelivery; nothing is published). The consumer's
``max_deliver`` bounds the deliveries that ended without any decision (a consumer that died,
``ack_wait`` that ran out); a message that fails ``max_tries`` times is dead-lettered by the
edge before JetStream would give up on it (an existing durable's lower ``max_deliver`` is
raised first). A NAK carries no headers: a retry's failure headers are kept in a key-value
bucket and read back on the redelivery (:mod:`inbox.faststream._nats_consumer`). A dead
letter is published to ``<subject>.dlq``, captured by the stream ``<stream>_dlq``, and
acknowledged by JetStream (its ``PubAck``) before the delivery is acked; one over the
server's ``max_payload`` goes trimmed (without its body when that alone leaves no room).
The transport and the edge are in :mod:`inbox.faststream._nats_transport`; what this
cannot promise is in docs/faststream.md.
"""

from __future__ import annotations

from typing import Any, Final

from faststream.message import StreamMessage
from faststream.middlewares import AckPolicy
from faststream.nats import JStream, NatsBroker, PullSub
from nats.js.api import ConsumerConfig, DeliverPolicy

from inbox.aio import AsyncInbox
from inbox.delivery.topology import RetryPolicy
from inbox.errors import ConfigurationError
from inbox.faststream._nats_consumer import RetryHistory
from inbox.faststream._nats_transport import NatsEdge, NatsTransport
from inbox.faststream._subscription import InboxSubscription, check_positive

__all__ = ["subscribe_nats_stream"]

DEAD_LETTER_STREAM_SUFFIX: Final = "_dlq"
"""The dead-letter stream of stream ``orders`` is ``orders_dlq`` (stream names take no dot)."""
_UNDECIDED_DELIVERIES: Final = 3
"""``max_deliver``'s default headroom past ``max_tries``: deliveries that died undecided."""


def subscribe_nats_stream(
    broker: NatsBroker,
    inbox: AsyncInbox,
    subject: str,
    *,
    stream: JStream | str,
    durable: str,
    retry: RetryPolicy | None = None,
    max_workers: int = 1,
    ack_wait: float = 30.0,
    max_deliver: int | None = None,
    default_content_type: str | None = "application/json",
) -> InboxSubscription:
    """Consume ``subject`` of the JetStream ``stream`` on ``broker`` through ``inbox``, with
    the durable pull consumer ``durable``.

    Each message becomes an :class:`inbox.Message` (header ``message_id``, else
    ``Nats-Msg-Id``; header ``type``) and is acked only after ``await inbox.process()``
    committed or found it a duplicate. A failed try is NAKed with the delay of ``retry`` and
    JetStream delivers it again; the last one (``retry.max_tries``), or a message that cannot
    be a message, is published to ``<subject>.dlq`` (stream ``<stream>_dlq``) with the
    ``x-inbox-*`` headers (a retry's kept in the bucket ``<stream>_inbox_retries`` across
    the NAKs; trimmed when over the server's ``max_payload``) and acked once JetStream stored
    it. Every delivery counts as a try, one that died without a decision too.
    ``max_deliver`` (default ``max_tries + 3``) is the consumer's bound on deliveries, raised
    on an existing durable below it before the first delivery; ``ack_wait`` (seconds) how
    long JetStream waits for a decision before it delivers again. Up to ``max_workers``
    messages are processed at once. A closed connection stops the subscriber
    (``.halted_by``).

    Raises :class:`~inbox.ConfigurationError` for a wildcard ``subject`` (its ``.dlq`` would
    be captured by the consumed stream), or ``max_deliver`` below ``max_tries`` (JetStream
    would stop before the edge dead-letters).
    """
    if not isinstance(subject, str) or not subject or any(c in subject for c in "*> "):
        raise ConfigurationError(
            f"subject must be one literal subject (no wildcard), got {subject!r}"
        )
    if not isinstance(durable, str) or not durable:
        raise ConfigurationError("durable must name the consumer: a nameless one forgets its acks")
    check_positive("max_workers", max_workers)
    check_positive("ack_wait", ack_wait)
    policy = retry or RetryPolicy()
    if max_deliver is None:
        max_deliver = policy.max_tries + _UNDECIDED_DELIVERIES
    check_positive("max_deliver", max_deliver)
    if max_deliver < policy.max_tries:
        raise ConfigurationError(
            f"max_deliver={max_deliver} is below the retry policy's max_tries="
            f"{policy.max_tries}: JetStream would stop delivering before the dead letter"
        )
    consumed = stream if isinstance(stream, JStream) else JStream(stream)
    dead_letters = JStream(
        f"{consumed.name}{DEAD_LETTER_STREAM_SUFFIX}",
        subjects=[f"{subject}.dlq"],
        num_replicas=consumed.config.num_replicas,
    )
    # A publisher declares the dead-letter stream when the broker starts, beside the
    # consumed one the subscriber declares.
    broker.publisher(f"{subject}.dlq", stream=dead_letters, include_in_schema=False)
    replicas = consumed.config.num_replicas or 1
    history = RetryHistory(broker, consumed.name, durable, replicas)
    edge = NatsEdge(
        inbox,
        NatsTransport(broker, subject, dead_letters.name, history),
        policy,
        default_content_type=default_content_type,
    )
    edge.consumer = (consumed.name, durable, max_deliver)
    subscriber = broker.subscriber(
        subject,
        stream=consumed,
        durable=durable,
        config=ConsumerConfig(
            ack_wait=ack_wait,
            max_deliver=max_deliver,
            max_ack_pending=max(1000, 2 * max_workers),
            deliver_policy=DeliverPolicy.ALL,
        ),
        pull_sub=PullSub(batch_size=max_workers),
        max_workers=max_workers,
        ack_policy=AckPolicy.MANUAL,
        decoder=_as_is,
        no_reply=True,
        title=f"inbox:{subject}",
    )
    subscriber(edge.handle)
    return InboxSubscription(subscriber, edge)


async def _as_is(msg: StreamMessage[Any]) -> StreamMessage[Any]:
    return msg  # the edge decodes the body itself (see _rabbit._as_is)
