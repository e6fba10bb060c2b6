"""One delivery, or a batch of them, through the inbox and to its end: ack, retry, dead letter.

It reads the delivery (:mod:`inbox.delivery._inbound`), runs the inbox, asks the settle plan
every edge shares (:class:`inbox.delivery._settling.Settling`) what the outcome means, and
carries the decision out: the ack, or a copy through the
:class:`~inbox.broker._forwarder.Forwarder`. Nothing here knows SQL.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

from kombu.message import Message as Delivery

from inbox.broker._acks import AckTracker
from inbox.broker._forwarder import Forwarder
from inbox.broker._observe import observe_decision, traced_batch, traced_delivery
from inbox.core import Inbox
from inbox.delivery._inbound import read_delivery
from inbox.delivery._policy import Ack, DeadLetter, Decision, Halt, Retry
from inbox.delivery._settling import Settling
from inbox.delivery.topology import QueueTopology
from inbox.message import Message
from inbox.result import ProcessResult

__all__ = ["Consumed", "Dispatcher"]

logger = logging.getLogger("inbox.worker")

Consumed = tuple[QueueTopology, Delivery, BaseException | None]
"""A delivery as kombu hands it over: its queue, the message, kombu's decode error if any."""


class Dispatcher:
    """Runs deliveries through ``inbox`` and settles them; calls ``on_halt`` after a
    configuration error (from then on every delivery is given back untouched), and gives
    deliveries back untouched while ``giving_back()`` is true (a stopping worker)."""

    def __init__(
        self,
        inbox: Inbox,
        settling: Settling,
        forwarder: Forwarder,
        *,
        native_delays: bool,
        default_content_type: str | None,
        on_halt: Callable[[], None],
        giving_back: Callable[[], bool],
    ) -> None:
        self._inbox = inbox
        self._settling = settling
        self._forwarder = forwarder
        self._stats = settling.stats
        self._native = native_delays
        self._default_content_type = default_content_type
        self._on_halt = on_halt
        self._giving_back = giving_back
        self.halted_by: BaseException | None = None
        self._system = "rabbitmq" if native_delays else "kombu"  # messaging.system
        self.last_activity = time.monotonic()
        self.acks = AckTracker(multiple=native_delays)
        self._deferred: list[Delivery] | None = None  # a batch's acks, sent together

    def give_back(self, delivery: Delivery) -> None:
        """Requeue ``delivery`` untouched."""
        delivery.requeue()
        self._stats.requeued += 1

    def handle(
        self, topology: QueueTopology, delivery: Delivery, decode_error: BaseException | None
    ) -> None:
        """Process one delivery through ``Inbox.process`` and settle it."""
        with traced_delivery(self._system, topology.name, delivery):
            self._handle(topology, delivery, decode_error)
        self.acks.settled([delivery])

    def _handle(
        self, topology: QueueTopology, delivery: Delivery, decode_error: BaseException | None
    ) -> None:
        message = self._admit(topology, delivery, decode_error)
        if message is None:
            return
        try:
            outcome: ProcessResult | BaseException = self._inbox.process(message)
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as exc:  # any other escape is a failed try, never a dead worker
            outcome = exc
        self._conclude(topology, delivery, message, outcome)

    def handle_batch(self, batch: Sequence[Consumed]) -> None:
        """Process ``batch`` through ``Inbox.process_batch`` and settle each delivery."""
        queues = [topology.name for topology, _, _ in batch]
        deliveries = [delivery for _, delivery, _ in batch]
        with traced_batch(self._system, queues, deliveries):
            deferred: list[Delivery] = []
            self._deferred = deferred
            try:
                self._handle_batch(batch)
            except BaseException:
                for delivery in deferred:  # committed: acked as they would be one by one
                    delivery.ack()
                raise
            finally:
                self._deferred = None
            # One basic.ack(multiple=True) where the tags allow it (see _acks.py).
            self.acks.ack(deliveries, deferred, self._forwarder.holding)

    def _handle_batch(self, batch: Sequence[Consumed]) -> None:
        admitted = []
        for topology, delivery, decode_error in batch:
            message = self._admit(topology, delivery, decode_error)
            if message is not None:
                admitted.append((topology, delivery, message))
        if not admitted:
            return
        outcomes: Sequence[ProcessResult | BaseException]
        try:
            outcomes = self._inbox.process_batch([message for _, _, message in admitted])
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as exc:  # outside any handler: a failed try for every message
            outcomes = [exc] * len(admitted)
        # Every message that committed is acked only now, after the batch's commit.
        for (topology, delivery, message), outcome in zip(admitted, outcomes, strict=True):
            self._conclude(topology, delivery, message, outcome)

    def _admit(
        self, topology: QueueTopology, delivery: Delivery, decode_error: BaseException | None
    ) -> Message | None:
        """The delivery as a Message, or None when it was given back or dead-lettered."""
        if self.halted_by is not None or self._giving_back():
            self.give_back(delivery)
            return None
        self._stats.deliveries += 1
        self.last_activity = time.monotonic()
        read = read_delivery(delivery, decode_error, self._default_content_type)
        if isinstance(read, DeadLetter):
            self._carry_out(topology, delivery, None, read)
            return None
        return read

    def _conclude(
        self,
        topology: QueueTopology,
        delivery: Delivery,
        message: Message,
        outcome: ProcessResult | BaseException,
    ) -> None:
        self.last_activity = time.monotonic()  # busy until now, however long it took
        decision = self._settling.decide(message.id, outcome, delivery.headers or {})
        self._carry_out(topology, delivery, message, decision)

    def _carry_out(
        self,
        topology: QueueTopology,
        delivery: Delivery,
        message: Message | None,
        decision: Decision,
    ) -> None:
        observe_decision(topology.name, delivery, decision)
        if isinstance(decision, Ack):
            # Ack only now: every handler's claim and effects are committed (or were by an
            # earlier delivery). A crash before this line means a redelivery, which the
            # inbox skips as a duplicate; acking earlier could lose the message. In a
            # batch, the acks go out together once every delivery is settled.
            if self._deferred is None:
                delivery.ack()
            else:
                self._deferred.append(delivery)
            self._settling.acked()
        elif isinstance(decision, Halt):
            self._settling.halt(decision)
            self.halted_by = decision.error
            self._on_halt()
            self.give_back(delivery)
        elif isinstance(decision, Retry):
            self._retry(topology, delivery, message, decision)
        else:
            self._dead_letter(topology, delivery, decision)

    def _retry(
        self, topology: QueueTopology, delivery: Delivery, message: Message | None, retry: Retry
    ) -> None:
        extra = self._settling.retry(
            retry,
            message_id=message.id if message else None,
            message_type=message.type if message else None,
            queue=topology.name,
            headers=delivery.headers or {},
        )
        if self._native:
            target = topology.retry_queue(retry.delay_ms)
            self._forwarder.forward(delivery, target, topology.dead_letter_queue, extra)
        else:
            self._forwarder.hold(
                delivery, topology.name, topology.dead_letter_queue, extra, retry.delay_ms / 1000
            )

    def _dead_letter(self, topology: QueueTopology, delivery: Delivery, dead: DeadLetter) -> None:
        properties = delivery.properties or {}
        extra = self._settling.dead_letter(
            dead,
            message_id=properties.get("message_id"),
            message_type=properties.get("type"),
            queue=topology.name,
            dead_letters=topology.dead_letter_queue,
            headers=delivery.headers or {},
        )
        self._forwarder.forward(
            delivery, topology.dead_letter_queue, topology.dead_letter_queue, extra
        )
