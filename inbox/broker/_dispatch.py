"""One delivery, or a batch of them, through the inbox and to its end: ack, retry, dead letter.

It reads the delivery (:mod:`inbox.delivery._inbound`), runs the inbox, lets the
:class:`~inbox.delivery._settling.Settling` every edge shares decide what the outcome means,
and hands the decision's plan (:func:`inbox.delivery._plan.plan`) to the
:class:`~inbox.broker._forwarder.Forwarder`, which carries it out on the queue's
:class:`~inbox.broker._transport.KombuTransport`. Nothing here knows SQL, and nothing here
decides.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

from kombu.message import Message as Delivery

from inbox.broker._acks import AckTracker
from inbox.broker._forwarder import Forwarder
from inbox.broker._observe import DecisionEvents, observing, traced_batch, traced_delivery
from inbox.broker._transport import AckBatch, KombuTransport
from inbox.core import Inbox
from inbox.delivery._inbound import Inbound, read_inbound
from inbox.delivery._plan import giving_back, plan
from inbox.delivery._policy import ACK, DeadLetter, Decision
from inbox.delivery._settling import Settling
from inbox.delivery.topology import QueueTopology
from inbox.delivery.transport import carry_out
from inbox.message import Message
from inbox.result import ProcessResult

__all__ = ["Consumed", "Dispatcher"]

logger = logging.getLogger("inbox.worker")

Consumed = tuple[QueueTopology, Delivery, BaseException | None]
"""A delivery as kombu hands it over: its queue, the message, kombu's decode error if any."""
_Admitted = tuple[KombuTransport, Delivery, Inbound, Message]
"""A delivery read, to be processed: its queue's transport, the delivery, its parts, the
message."""
_Read = tuple[KombuTransport, Delivery, Inbound, Message | None]


class Dispatcher:
    """Runs deliveries through ``inbox`` and settles them; calls ``on_halt`` after a
    configuration error (from then on every delivery is given back untouched), and gives
    deliveries back untouched while ``giving_back()`` is true (a stopping worker).

    ``ack_every`` > 0: one delivery at a time, the acks of deliveries decided "ack" (each
    after its commit) are held back and sent together (:meth:`flush_acks`, one multiple ack
    where :mod:`inbox.broker._acks` allows) once ``ack_every`` are held, or when the worker
    finds no more deliveries at hand, stops or takes a batch."""

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
        ack_every: int = 0,
    ) -> None:
        self._inbox = inbox
        self._settling = settling
        self._forwarder = forwarder
        self._stats = settling.stats
        self._native = native_delays
        self._default_content_type = default_content_type
        self._on_halt = on_halt
        self._giving_back = giving_back
        self._system = "rabbitmq" if native_delays else "kombu"  # messaging.system
        self.last_activity = time.monotonic()
        self.acks = AckTracker(multiple=native_delays)
        self._batch = AckBatch()  # a batch's acks, sent together
        self._transports: dict[str, KombuTransport] = {}
        self._observer: DecisionEvents | None = None  # asked once per delivery or batch
        self._ack_every = ack_every
        self._held_acks: list[Delivery] = []  # committed, decided "ack", not acked yet

    @property
    def halted_by(self) -> BaseException | None:
        """The configuration error that stopped the worker, once one did."""
        return self._settling.halted_by

    def _transport(self, topology: QueueTopology) -> KombuTransport:
        transport = self._transports.get(topology.name)
        if transport is None:
            transport = KombuTransport(
                topology,
                self._forwarder,
                self._batch,
                native_delays=self._native,
                on_halt=self._on_halt,
            )
            self._transports[topology.name] = transport
        return transport

    def give_back(self, topology: QueueTopology, delivery: Delivery) -> None:
        """Requeue ``delivery`` of ``topology``'s queue untouched."""
        self._forwarder.run(self._transport(topology), delivery, giving_back(self._settling))

    def handle(
        self, topology: QueueTopology, delivery: Delivery, decode_error: BaseException | None
    ) -> None:
        """Process one delivery through ``Inbox.process`` and settle it."""
        self._observer = observing()
        holding_back = self._ack_every > 0
        if holding_back:  # transport.ack appends to it: sent by flush_acks
            self._batch.deferred = self._held_acks
        try:
            with traced_delivery(self._system, topology.name, delivery):
                admitted = self._admit(topology, delivery, decode_error)
                if admitted is not None:
                    message = admitted[3]
                    try:
                        outcome: ProcessResult | BaseException = self._inbox.process(message)
                    except (KeyboardInterrupt, SystemExit):
                        raise
                    # Any other escape is a failed try, never a dead worker.
                    except BaseException as exc:
                        outcome = exc
                    self.last_activity = time.monotonic()  # busy until now
                    headers = admitted[2].headers
                    self._settle(admitted, self._settling.decide(message.id, outcome, headers))
        finally:
            self._batch.deferred = None
        self.acks.settled([delivery])
        if holding_back and len(self._held_acks) >= self._ack_every:
            self.flush_acks()

    @property
    def acks_held(self) -> int:
        """How many acks of committed deliveries wait for :meth:`flush_acks`."""
        return len(self._held_acks)

    def flush_acks(self) -> None:
        """Send the held acks: one multiple ack where the rule allows, else one by one."""
        held = self._held_acks
        if held:
            self._held_acks = []
            self.acks.ack_settled(held, self._forwarder.holding)

    def drop_held_acks(self) -> None:
        """Forget the held acks: their channel is gone, the broker gives the deliveries
        back (duplicates, skipped)."""
        self._held_acks = []

    def handle_batch(self, batch: Sequence[Consumed]) -> None:
        """Process ``batch`` through ``Inbox.process_batch`` and settle each delivery."""
        self.flush_acks()
        queues = [topology.name for topology, _, _ in batch]
        deliveries = [delivery for _, delivery, _ in batch]
        self._observer = observing()
        with traced_batch(self._system, queues, deliveries):
            deferred: list[Delivery] = []
            self._batch.deferred = deferred
            try:
                self._handle_batch(batch)
            except BaseException:
                for delivery in deferred:  # committed: acked as they would be one by one
                    delivery.ack()
                raise
            finally:
                self._batch.deferred = None
            # One basic.ack(multiple=True) where the tags allow it (see _acks.py).
            self.acks.ack(deliveries, deferred, self._forwarder.holding)

    def _handle_batch(self, batch: Sequence[Consumed]) -> None:
        admitted = []
        for topology, delivery, decode_error in batch:
            read = self._admit(topology, delivery, decode_error)
            if read is not None:
                admitted.append(read)
        if not admitted:
            return
        outcomes: Sequence[ProcessResult | BaseException]
        try:
            outcomes = self._inbox.process_batch([read[3] for read in admitted])
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as exc:  # outside any handler: a failed try for every message
            outcomes = [exc] * len(admitted)
        # Every message that committed is acked only now, after the batch's commit.
        for read, outcome in zip(admitted, outcomes, strict=True):
            self.last_activity = time.monotonic()  # busy until now, however long it took
            decision = self._settling.decide(read[3].id, outcome, read[2].headers)
            self._settle(read, decision)

    def _admit(
        self, topology: QueueTopology, delivery: Delivery, decode_error: BaseException | None
    ) -> _Admitted | None:
        """The delivery read, to be processed; None when it was given back or
        dead-lettered."""
        if self._settling.halted_by is not None or self._giving_back():
            self.give_back(topology, delivery)
            return None
        try:  # a subscript, not .get(): the worker's per-delivery calls are budgeted
            transport = self._transports[topology.name]
        except KeyError:
            transport = self._transport(topology)
        self._stats.deliveries += 1
        self.last_activity = time.monotonic()
        inbound = transport.read(delivery)
        read = read_inbound(inbound, self._default_content_type, decode_error)
        if isinstance(read, DeadLetter):
            self._settle((transport, delivery, inbound, None), read)
            return None
        return transport, delivery, inbound, read

    def _settle(self, read: _Read, decision: Decision) -> None:
        """Carry ``decision`` out on the delivery ``read``: its plan, parked at a hold (the
        worker keeps consuming while the delivery waits)."""
        transport, delivery, inbound, message = read
        steps = plan(
            decision, self._settling, transport, inbound, message=message, observer=self._observer
        )
        batch = self._batch
        deferred = batch.deferred
        if deferred is not None and decision is not ACK:
            # A batch defers only the acks of deliveries decided "ack"; an original whose
            # copy is confirmed is acked at once, as one by one.
            batch.deferred = None
            try:
                hold = carry_out(transport, delivery, steps)
            finally:
                batch.deferred = deferred
        else:
            hold = carry_out(transport, delivery, steps)
        if hold is not None:
            self._forwarder.park(transport, delivery, steps, hold.seconds)
