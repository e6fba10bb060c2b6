"""Retry and dead-letter copies: published with confirms, the original acked only after.

A copy of a delivery goes to its target queue (a retry queue, the ``.dlq``, or the consumed
queue itself on transports without TTL queues); once the broker confirmed it, the original is
acked. The message is in one queue or the other at every moment; a crash in between leaves
two copies with one id, which the inbox deduplicates. A copy the broker refuses leaves the
original unacked and is held, to be tried again after a backoff.

One copy is in flight at a time, and each confirm is matched to its publish by its delivery
tag (:class:`inbox._amqp.confirms.ConfirmTracker`, the relay's tracker too): a confirm is never
credited to the wrong copy (that would ack a message whose copy was refused). The worker
guarantees the one-at-a-time part by never calling in re-entrantly.
"""

from __future__ import annotations

import base64
import heapq
import itertools
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from kombu.message import Message as Delivery

from inbox._amqp.confirms import PERSISTENT, ConfirmTracker, fits_in_frame
from inbox.delivery._inbound import RAW_PROPERTIES, UNREADABLE, body_bytes, sent_headers
from inbox.delivery._settling import Settling
from inbox.errors import CopyRefused

__all__ = ["Forwarder"]

logger = logging.getLogger("inbox.worker")

# Properties a copy carries over. user_id would be refused by RabbitMQ when the worker's user
# differs from the producer's; expiration must not follow a message into the dead letters.
_KEPT_PROPERTIES: Final = (
    "message_id",
    "type",
    "correlation_id",
    "reply_to",
    "timestamp",
    "app_id",
)


@dataclass(order=True)
class _Held:
    due: float
    sequence: int
    delivery: Delivery = field(compare=False)
    target: str = field(compare=False)
    dead_letters: str = field(compare=False)
    headers: dict[str, Any] = field(compare=False)
    refusals: int = field(default=0, compare=False)


class Forwarder:
    """Publishes copies on one channel, acks originals, holds what waits or was refused.

    ``confirms`` is True on RabbitMQ: every copy is published ``mandatory`` and waits for its
    own confirm (at most ``confirm_timeout`` seconds). Other transports take copies as sent.
    """

    def __init__(self, settling: Settling, *, confirms: bool, confirm_timeout: float = 30.0):
        self._settling = settling
        self.stats = settling.stats
        self.confirms = confirms
        self.confirm_timeout = confirm_timeout
        self._connection: Any = None
        self._channel: Any = None
        self._held: list[_Held] = []
        self._sequence = itertools.count()
        self._tracker = ConfirmTracker()

    @property
    def holding(self) -> int:
        """Deliveries held unacked by the worker (waiting for their delay, or refused)."""
        return len(self._held)

    def attach(self, connection: Any, channel: Any) -> None:
        """Publish on ``channel`` of ``connection`` from now on (after a (re)connection)."""
        self._connection, self._channel = connection, channel
        if self.confirms:
            self._tracker.attach(channel)

    def detach(self) -> None:
        """Forget the channel and every held delivery (they can no longer be acked; the
        broker gives them back)."""
        self._connection = self._channel = None
        self._held.clear()

    def forward(
        self, delivery: Delivery, target: str, dead_letters: str, headers: Mapping[str, Any]
    ) -> None:
        """Copy ``delivery`` with ``headers`` added to ``target``, then ack it; a refused copy
        is held and tried again later. A copy too large for the broker's frame goes to
        ``dead_letters`` instead, its own headers trimmed."""
        self._forward(delivery, target, dead_letters, dict(headers), 0)

    def hold(
        self,
        delivery: Delivery,
        target: str,
        dead_letters: str,
        headers: Mapping[str, Any],
        seconds: float,
        *,
        refusals: int = 0,
    ) -> None:
        """Keep ``delivery`` unacked and forward it after ``seconds``."""
        due = time.monotonic() + seconds
        item = _Held(
            due, next(self._sequence), delivery, target, dead_letters, dict(headers), refusals
        )
        heapq.heappush(self._held, item)

    def release_due(self) -> None:
        """Forward every held delivery whose time has come."""
        now = time.monotonic()
        while self._held and self._held[0].due <= now:
            item = heapq.heappop(self._held)
            self._forward(
                item.delivery, item.target, item.dead_letters, item.headers, item.refusals
            )

    def flush(self) -> None:
        """On a clean stop: forward every held delivery now, or give it back to the broker."""
        held, self._held = self._held, []
        for item in held:
            try:
                self._send(item.delivery, item.target, item.dead_letters, item.headers)
            except CopyRefused:
                item.delivery.requeue()
                self.stats.requeued += 1
            else:
                self._ack(item.delivery)

    def _forward(
        self,
        delivery: Delivery,
        target: str,
        dead_letters: str,
        headers: dict[str, Any],
        refusals: int,
    ) -> None:
        try:
            self._send(delivery, target, dead_letters, headers)
        except CopyRefused as refused:
            message_id = (delivery.properties or {}).get("message_id")
            wait = self._settling.refused(message_id, target, refused, refusals)
            self.hold(delivery, target, dead_letters, headers, wait, refusals=refusals + 1)
            return
        self._ack(delivery)

    def _ack(self, delivery: Delivery) -> None:
        delivery.ack()
        self._settling.acked()

    def _send(
        self, delivery: Delivery, target: str, dead_letters: str, extra: dict[str, Any]
    ) -> None:
        prepared = self._prepare(delivery, extra, trimmed=False)
        if self.confirms and not self._fits(prepared):
            trimmed = self._settling.too_large(
                message_id=(delivery.properties or {}).get("message_id"),
                target=target,
                dead_letters=dead_letters,
                own=sent_headers(delivery),
                added=extra,
            )
            prepared = self._prepare(delivery, trimmed, trimmed=True)
            target = dead_letters
        if not self.confirms:
            self._channel.basic_publish(prepared, exchange="", routing_key=target)
            return
        if self._tracker.unsettled:
            raise RuntimeError("a copy was published while another waited for its confirm")
        properties = delivery.properties or {}
        key = str(properties.get("message_id") or f"copy-{next(self._sequence)}")
        self._tracker.reset()
        self._channel.basic_publish(prepared, exchange="", routing_key=target, mandatory=True)
        self._tracker.sent(key)
        # Raises TimeoutError when the broker never answers: the connection is out of step,
        # and reconnecting gives every unacked delivery back.
        self._tracker.wait(self._connection, self.confirm_timeout)
        refused = self._tracker.refused.get(key)
        if refused is not None:
            raise CopyRefused(refused)

    def _prepare(self, delivery: Delivery, extra: Mapping[str, Any], *, trimmed: bool) -> Any:
        properties = delivery.properties or {}
        kept = {k: properties[k] for k in _KEPT_PROPERTIES if properties.get(k) is not None}
        kept["delivery_mode"] = PERSISTENT
        if trimmed:
            headers = dict(extra)
        elif self.confirms:
            headers = sent_headers(delivery) | dict(extra)  # the body goes out as it came
        else:
            # kombu decompressed the body on receipt: the copy goes out uncompressed.
            headers = {k: v for k, v in sent_headers(delivery).items() if k != "compression"}
            headers |= dict(extra)
        if UNREADABLE in properties:
            raw = base64.b64encode(properties[RAW_PROPERTIES]).decode("ascii")
            headers[RAW_PROPERTIES] = raw
        return self._channel.prepare_message(
            body_bytes(delivery),
            properties.get("priority"),
            delivery.content_type,
            delivery.content_encoding,
            headers,
            kept,
        )

    def _fits(self, prepared: Any) -> bool:
        return fits_in_frame(self._connection, prepared)
