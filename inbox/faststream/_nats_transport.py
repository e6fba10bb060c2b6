"""The NATS edge's transport: how a JetStream delivery is read, retried (a NAK after its
failure headers are kept, :mod:`inbox.faststream._nats_consumer`), dead-lettered (published
to ``<subject>.dlq``, fitted to the server's ``max_payload``) and settled; and the edge that
wraps each delivery with what only JetStream needs (see :class:`NatsEdge`)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any, Final

from faststream.exceptions import IncorrectState
from faststream.message import AckStatus, StreamMessage
from faststream.nats import NatsBroker
from faststream.nats.message import NatsMessage
from nats.errors import ConnectionClosedError as NatsConnectionClosed
from nats.errors import Error as NatsError
from nats.errors import NotJSMessageError
from nats.js.errors import Error as JetStreamError

from inbox.aio import AsyncInbox
from inbox.delivery import headers as h
from inbox.delivery._inbound import Inbound
from inbox.delivery._policy import DeadLetterReason, Halt
from inbox.delivery.topology import RetryPolicy
from inbox.errors import ConfigurationError, CopyRefused
from inbox.faststream._edge import FastStreamTransport, InboxEdge, compression_of, logger
from inbox.faststream._nats_consumer import RetryHistory, ensure_max_deliver

__all__ = ["NatsEdge", "NatsTransport"]

_HEADER_LINE: Final = b"NATS/1.0\r\n"
_ADDED_BY_FASTSTREAM: Final = 256  # its content-type, nats-py's Nats-Expected-Stream
# What a dead letter without its body no longer says (an empty body has no encoding).
_DESCRIBE_THE_BODY: Final = frozenset(("content-type", "content-encoding", "compression"))


class NatsTransport(FastStreamTransport):
    """A retry is JetStream's redelivery (a NAK with the delay) after its failure headers
    are kept (:class:`RetryHistory`); a dead letter is published to ``<subject>.dlq`` and
    acknowledged by JetStream, and fits the server's ``max_payload`` (headers and body) or
    is planned trimmed, its error cut or its body dropped to fit. Both streams are declared
    when the broker starts."""

    def __init__(
        self,
        broker: NatsBroker,
        subject: str,
        dead_letter_stream: str,
        history: RetryHistory,
    ) -> None:
        super().__init__(subject)
        self.broker = broker
        self.dead_letter_stream = dead_letter_stream
        self.history = history

    def read(self, msg: StreamMessage[Any]) -> Inbound:
        headers: dict[str, Any] = dict(msg.headers)
        delivered = _num_delivered(msg)
        if delivered is not None:
            # JetStream's own count: a try that died with its consumer counts too.
            headers[h.TRIES] = delivered - 1
        else:
            tries = headers.get(h.TRIES)
            if isinstance(tries, str) and tries.isdigit():
                headers[h.TRIES] = int(tries)
        return Inbound(
            headers.get("message_id") or headers.get("Nats-Msg-Id"),
            headers.get("type"),
            headers,
            msg.body,
            headers.get("content-type") or None,
            headers.get("content-encoding"),
            compression_of(headers),
        )

    def retry_route(self, delay_ms: int) -> tuple[str, float]:
        return self.queue, 0.0  # JetStream holds it: the "copy" is a NAK with the delay

    def max_payload(self) -> int | None:
        """The server's limit on a message, headers and body (its INFO ``max_payload``)."""
        try:
            limit = self.broker.connection.max_payload
        except IncorrectState:  # not connected: the copy is refused, the delivery comes back
            return None
        return limit if isinstance(limit, int) else None  # a test broker's mock has none

    def fits(self, msg: StreamMessage[Any], headers: Mapping[str, Any]) -> bool:
        if headers.get(h.REASON) is None:
            return True  # a retry (a replay strips the reason): a NAK, nothing published
        limit = self.max_payload()
        if limit is None:
            return True
        return _wire_size(msg.body, self._dead_letter_headers(msg, headers)) <= limit

    def _dead_letter_headers(
        self, msg: StreamMessage[Any], headers: Mapping[str, Any]
    ) -> dict[str, str]:
        sent = {key: str(value) for key, value in headers.items()}
        metadata = _metadata(msg)
        if metadata is not None:
            # A consumer that dies between this publish and the ack publishes it again
            # on the redelivery: JetStream drops the second within its duplicate window.
            sequence = metadata.sequence.stream
            sent["Nats-Msg-Id"] = f"{metadata.stream}:{sequence}:dead-letter"
        if not sent.get("correlation_id"):
            sent["correlation_id"] = str(msg.correlation_id or "")
        return sent

    async def send(
        self, msg: StreamMessage[Any], target: str, headers: Mapping[str, Any], delay_ms: int
    ) -> None:
        try:
            if target == self.queue:
                # The retry: its failure headers kept, then JetStream delivers this message
                # again after the delay and counts the delivery; the edge's ack that
                # follows is then a no-op.
                metadata = _metadata(msg)
                if metadata is not None:
                    await self.history.remember(metadata.sequence.stream, headers)
                delay = delay_ms / 1000
                await (msg.nack(delay=delay) if isinstance(msg, NatsMessage) else msg.nack())
                return
            sent = self._dead_letter_headers(msg, headers)
            body = msg.body
            limit = self.max_payload()
            if limit is not None:
                # A trimmed dead letter is not measured by the plan; one over the limit
                # would make the server close the connection, for good.
                body, sent = _fitted(body, sent, limit)
            correlation_id = sent.pop("correlation_id")
            await self.broker.publish(
                body,
                target,
                headers=sent,
                correlation_id=correlation_id,
                stream=self.dead_letter_stream,
            )
        except (NatsError, JetStreamError, ConnectionError, TimeoutError) as exc:
            raise CopyRefused(f"{type(exc).__name__}: {exc}") from exc

    def settleable(self, msg: StreamMessage[Any]) -> bool:
        # A message stays pending on its consumer until acked or ack_wait passes, unless
        # the connection is closed: nats-py does not reconnect a closed client.
        return not self.closed()

    def closed(self) -> bool:
        """Whether the broker's connection is closed for good."""
        try:
            closed = self.broker.connection.is_closed
        except IncorrectState:  # never connected, or stopped: nothing says it closed
            return False
        return closed is True  # a test broker's mock connection answers a mock


class NatsEdge(InboxEdge):
    """The edge with what only JetStream needs around each delivery: the consumer's
    ``max_deliver`` checked once before the first (before the next one too while JetStream
    does not answer the lookup), a retried message's failure history
    read before and purged after it is settled, and a stop when the connection is closed
    (FastStream's pull loop would otherwise spin on it)."""

    transport: NatsTransport

    def __init__(
        self, inbox: AsyncInbox, transport: NatsTransport, policy: RetryPolicy, **kwargs: Any
    ) -> None:
        super().__init__(inbox, transport, policy, **kwargs)
        self.transport = transport
        self.consumer: tuple[str, str, int] | None = None
        """(stream, durable, max_deliver) to check before the first delivery; None once done."""
        self._consumer_lock = asyncio.Lock()

    async def handle(self, msg: StreamMessage[Any]) -> None:
        """Process one delivery and settle it (see the class)."""
        transport = self.transport
        metadata = _metadata(msg)
        if metadata is None:  # not from JetStream (FastStream's TestNatsBroker)
            await super().handle(msg)
            return
        if self.consumer is not None and not await self._consumer_checked(msg):
            return
        recalled = False
        if metadata.num_delivered > 1:
            kept = await transport.history.recall(metadata.sequence.stream)
            recalled = bool(kept)
            msg.headers.update(kept)
        await super().handle(msg)
        if recalled and msg.committed is AckStatus.ACKED:
            await transport.history.forget(metadata.sequence.stream)
        if self.halted_by is None and transport.closed():
            error = NatsConnectionClosed(
                "the NATS connection is closed; nats-py does not reopen it"
            )
            self._settling.halted_by = error
            logger.critical("subject %s: %s; stopping the subscriber", transport.queue, error)
            transport.stop(error)

    async def _consumer_checked(self, msg: StreamMessage[Any]) -> bool:
        async with self._consumer_lock:
            if self.consumer is None:
                return True
            stream, durable, wanted = self.consumer
            try:
                checked = await ensure_max_deliver(
                    self.transport.broker,
                    stream,
                    durable,
                    wanted=wanted,
                    max_tries=self.policy.max_tries,
                )
            except ConfigurationError as exc:
                self.consumer = None
                self._settling.halt(Halt(exc))
                await self.transport.give_back(msg)
                self.transport.stop(exc)  # raises StopConsume
                return False
            if checked:
                self.consumer = None
            # Not checked (JetStream did not answer): this delivery goes on, the next one
            # checks again. Giving each back instead would spend their max_deliver while
            # JetStream stays unreachable.
            return True


def _wire_size(body: bytes, headers: Mapping[str, str]) -> int:
    """What the server counts against ``max_payload``: the header block and the body, plus
    what FastStream adds to a publish (a content type)."""
    block = sum(len(k.encode()) + len(v.encode()) + 4 for k, v in headers.items())
    return len(_HEADER_LINE) + block + 2 + len(body) + _ADDED_BY_FASTSTREAM


def _fitted(body: bytes, headers: dict[str, str], limit: int) -> tuple[bytes, dict[str, str]]:
    """The dead letter's body and headers, fitted to ``limit``: as they are, with the error
    cut short, or, when the body leaves no room for the headers, without the body (named in
    the error; the message stays in its stream, at the sequence its ``Nats-Msg-Id`` names).
    :class:`CopyRefused` only when the headers alone are over the limit."""
    cut = _cut_to_fit(body, headers, limit)
    if cut is not None:
        return body, cut
    unread = {k: v for k, v in headers.items() if k not in _DESCRIBE_THE_BODY}
    unread[h.REASON] = str(DeadLetterReason.COPY_TOO_LARGE)
    unread[h.ERROR] = (
        f"the body ({len(body)} bytes) was dropped: the dead letter did not fit the "
        f"broker's size limit; {headers.get(h.ERROR, '')}"
    )
    cut = _cut_to_fit(b"", unread, limit)
    if cut is not None:
        return b"", cut
    raise CopyRefused(
        f"the dead letter's headers alone are over the server's max_payload={limit}, even trimmed"
    )


def _cut_to_fit(body: bytes, headers: dict[str, str], limit: int) -> dict[str, str] | None:
    """``headers`` with the error cut short enough for the dead letter to fit ``limit``;
    None when even that is not enough."""
    over = _wire_size(body, headers) - limit
    if over <= 0:
        return headers
    error = headers.get(h.ERROR, "").encode()
    if over + len("…".encode()) < len(error):
        cut = error[: len(error) - over - len("…".encode())]
        return {**headers, h.ERROR: cut.decode("utf-8", "ignore") + "…"}
    return None


def _metadata(msg: StreamMessage[Any]) -> Any:
    try:
        return msg.raw_message.metadata
    except NotJSMessageError:  # not a JetStream delivery (a test broker's message)
        return None


def _num_delivered(msg: StreamMessage[Any]) -> int | None:
    metadata = _metadata(msg)
    return None if metadata is None else int(metadata.num_delivered)
