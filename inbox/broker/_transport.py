"""The kombu worker's :class:`~inbox.delivery.transport.Transport`, one per consumed queue:
what acking, giving back and copying mean for a kombu delivery. The copies themselves go
through the worker's one :class:`~inbox.broker._forwarder.Forwarder` (its channel, its
confirms); the decisions are the shared plan's (:mod:`inbox.delivery._plan`).
"""

from __future__ import annotations

from collections.abc import Callable

from kombu.message import Message as Delivery

from inbox.broker._forwarder import Forwarder
from inbox.delivery._inbound import inbound_of
from inbox.delivery.topology import QueueTopology

__all__ = ["AckBatch", "KombuTransport"]


class AckBatch:
    """The acks of the batch being settled, sent together once every delivery of it is
    settled (``deferred``), or None: each ack goes at once."""

    __slots__ = ("deferred",)

    def __init__(self) -> None:
        self.deferred: list[Delivery] | None = None


class KombuTransport:
    """A kombu delivery of ``topology``'s queue acked, requeued and copied (see the module).

    ``native_delays``: the broker delays a retry in a TTL queue of its own (RabbitMQ); else
    the worker holds the delivery for the delay and copies it back into the queue."""

    __slots__ = (
        "_batch",
        "_native",
        "_on_halt",
        "copy",
        "dead_letters",
        "fits",
        "queue",
        "read",
        "topology",
    )

    def __init__(
        self,
        topology: QueueTopology,
        forwarder: Forwarder,
        batch: AckBatch,
        *,
        native_delays: bool,
        on_halt: Callable[[], None],
    ) -> None:
        self.topology = topology
        self.queue = topology.name
        self.dead_letters = topology.dead_letter_queue
        # The delivery's properties, headers as sent and body as it came; the copy,
        # confirmed on RabbitMQ; whether its header frame fits the connection's frame_max:
        # functions bound as they are, no wrapper (the worker's per-delivery calls are
        # budgeted).
        self.read = inbound_of
        self.copy = forwarder.send
        self.fits = forwarder.fits
        self._batch = batch
        self._native = native_delays
        self._on_halt = on_halt

    def retry_route(self, delay_ms: int) -> tuple[str, float]:
        """A TTL queue for the delay (RabbitMQ), or the queue itself after a hold."""
        if self._native:
            return self.topology.retry_queue(delay_ms), 0.0
        return self.queue, delay_ms / 1000

    def ack(self, delivery: Delivery) -> bool:
        """Ack now, or with the rest of the batch being settled."""
        deferred = self._batch.deferred
        if deferred is None:
            delivery.ack()
        else:
            deferred.append(delivery)
        return True

    def give_back(self, delivery: Delivery) -> bool:
        """Requeue the delivery untouched."""
        delivery.requeue()
        return True

    def settleable(self, delivery: Delivery) -> bool:
        """Always: a lost connection drops every held delivery (``Forwarder.detach``)."""
        return True

    def stop(self, error: BaseException) -> None:
        """Stop the worker."""
        self._on_halt()
