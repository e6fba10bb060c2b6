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
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from kombu.message import Message as Delivery

from inbox._amqp.confirms import PERSISTENT, ConfirmTracker, fits_in_frame
from inbox.delivery._inbound import RAW_PROPERTIES, UNREADABLE, body_bytes
from inbox.delivery._plan import CopyResult, Plan
from inbox.delivery.transport import Transport, carry_out
from inbox.errors import CopyRefused

__all__ = ["Forwarder"]

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
    transport: Transport[Delivery] = field(compare=False)
    delivery: Delivery = field(compare=False)
    steps: Plan = field(compare=False)


class Forwarder:
    """Publishes copies on one channel, and holds what waits (a retry's delay where the
    transport has no TTL queues, a copy the broker refused) without blocking the consumer.

    It carries a delivery's plan out (:func:`inbox.delivery.transport.carry_out`); at a hold
    the plan is parked on a heap and resumed when due (:meth:`release_due`), so the worker
    keeps consuming meanwhile. ``confirms`` is True on RabbitMQ: every copy is published
    ``mandatory`` and waits for its own confirm (at most ``confirm_timeout`` seconds).
    Other transports take copies as sent.
    """

    def __init__(self, *, confirms: bool, confirm_timeout: float = 30.0):
        self.confirms = confirms
        self.confirm_timeout = confirm_timeout
        self._connection: Any = None
        self._channel: Any = None
        self._held: list[_Held] = []
        self._sequence = itertools.count()
        self._tracker = ConfirmTracker()
        self._measured: tuple[Delivery, Mapping[str, Any], Any] | None = None

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

    def run(self, transport: Transport[Delivery], delivery: Delivery, steps: Plan) -> None:
        """Carry ``steps`` out for ``delivery`` on ``transport``; at a hold, park them."""
        hold = carry_out(transport, delivery, steps)
        if hold is not None:
            self.park(transport, delivery, steps, hold.seconds)

    def park(
        self, transport: Transport[Delivery], delivery: Delivery, steps: Plan, seconds: float
    ) -> None:
        """Hold ``delivery`` unsettled and resume ``steps`` in ``seconds``."""
        due = time.monotonic() + seconds
        heapq.heappush(self._held, _Held(due, next(self._sequence), transport, delivery, steps))

    def release_due(self) -> None:
        """Resume every held plan whose time has come."""
        now = time.monotonic()
        while self._held and self._held[0].due <= now:
            item = heapq.heappop(self._held)
            self.run(item.transport, item.delivery, item.steps)

    def flush(self) -> None:
        """On a clean stop: try every held copy now, once; a refused one is given back."""
        held, self._held = self._held, []
        for item in held:
            carry_out(item.transport, item.delivery, item.steps, CopyResult.STOPPING)

    def fits(self, delivery: Delivery, headers: Mapping[str, Any]) -> bool:
        """Whether the copy of ``delivery`` with ``headers`` fits in one frame (RabbitMQ;
        elsewhere there is no frame to measure). The copy prepared is kept for
        :meth:`send`."""
        if not self.confirms:
            return True
        prepared = self._prepare(delivery, headers)
        self._measured = (delivery, headers, prepared)
        return fits_in_frame(self._connection, prepared)

    def send(
        self, delivery: Delivery, target: str, headers: Mapping[str, Any], *, delay_ms: int = 0
    ) -> None:
        """Publish the copy of ``delivery`` with ``headers`` to ``target`` and wait for its
        confirm; raise :class:`CopyRefused` when the broker did not take it. (``delay_ms``
        is the transport protocol's: a retry's delay here is its queue's TTL.)"""
        measured, self._measured = self._measured, None
        if measured is not None and measured[0] is delivery and measured[1] is headers:
            prepared = measured[2]
        else:
            prepared = self._prepare(delivery, headers)
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

    def _prepare(self, delivery: Delivery, headers: Mapping[str, Any]) -> Any:
        properties = delivery.properties or {}
        kept = {k: properties[k] for k in _KEPT_PROPERTIES if properties.get(k) is not None}
        kept["delivery_mode"] = PERSISTENT
        if self.confirms:
            sent = dict(headers)  # the body goes out as it came
        else:
            # kombu decompressed the body on receipt: the copy goes out uncompressed.
            sent = {k: v for k, v in headers.items() if k != "compression"}
        if UNREADABLE in properties:
            sent[RAW_PROPERTIES] = base64.b64encode(properties[RAW_PROPERTIES]).decode("ascii")
        return self._channel.prepare_message(
            body_bytes(delivery),
            properties.get("priority"),
            delivery.content_type,
            delivery.content_encoding,
            sent,
            kept,
        )
