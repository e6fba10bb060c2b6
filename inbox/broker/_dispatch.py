"""One delivery, or a batch of them, through the inbox and to its end: ack, retry, dead letter.

The kombu-free half of the worker: it reads the delivery (:mod:`inbox.delivery._inbound`), runs
the inbox, asks :func:`inbox.delivery._policy.decide`, and carries the decision out, sending
copies through the :class:`~inbox.broker._forwarder.Forwarder`. Nothing here knows SQL.
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
from inbox.delivery import headers as h
from inbox.delivery._inbound import read_delivery
from inbox.delivery._policy import (
    Ack,
    DeadLetter,
    Decision,
    Halt,
    Retry,
    dead_letter_headers,
    decide,
    retry_headers,
)
from inbox.delivery._stats import WorkerStats
from inbox.delivery.topology import QueueTopology, RetryPolicy
from inbox.errors import HandlerFailed
from inbox.message import Message
from inbox.result import Outcome, ProcessResult

__all__ = ["Dispatcher", "Inbound"]

logger = logging.getLogger("inbox.worker")

Inbound = tuple[QueueTopology, Delivery, BaseException | None]
"""A delivery as kombu hands it over: its queue, the message, kombu's decode error if any."""


class Dispatcher:
    """Runs deliveries through ``inbox`` and settles them; calls ``on_halt`` after a
    configuration error (from then on every delivery is given back untouched), and gives
    deliveries back untouched while ``giving_back()`` is true (a stopping worker)."""

    def __init__(
        self,
        inbox: Inbox,
        policy: RetryPolicy,
        forwarder: Forwarder,
        stats: WorkerStats,
        *,
        native_delays: bool,
        default_content_type: str | None,
        on_halt: Callable[[], None],
        giving_back: Callable[[], bool],
    ) -> None:
        self._inbox = inbox
        self._policy = policy
        self._forwarder = forwarder
        self._stats = stats
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
        self._settle(topology, delivery, message, outcome)

    def handle_batch(self, batch: Sequence[Inbound]) -> None:
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

    def _handle_batch(self, batch: Sequence[Inbound]) -> None:
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
            self._settle(topology, delivery, message, outcome)

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

    def _settle(
        self,
        topology: QueueTopology,
        delivery: Delivery,
        message: Message,
        outcome: ProcessResult | BaseException,
    ) -> None:
        self.last_activity = time.monotonic()  # busy until now, however long it took
        result = outcome.result if isinstance(outcome, HandlerFailed) else outcome
        if isinstance(result, ProcessResult):
            for o in result.outcomes.values():
                if o is Outcome.PROCESSED:
                    self._stats.processed += 1
                elif o is Outcome.DUPLICATE:
                    self._stats.duplicates += 1
                    logger.info("message %s: %s skipped (duplicate)", message.id, _name(result, o))
        tries = h.tries_so_far(delivery.headers or {})
        self._carry_out(topology, delivery, message, decide(outcome, tries, self._policy))

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
            self._stats.acked += 1
        elif isinstance(decision, Halt):
            logger.critical("configuration error, stopping: %s", h.describe(decision.error))
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
        self._stats.failed_tries += 1
        self._stats.retried += 1
        logger.warning(
            "message %s (type %r) on %s: try %d/%d failed (%s); retry in %g s",
            message.id if message else None,
            message.type if message else None,
            topology.name,
            retry.tries,
            self._policy.max_tries,
            retry.error,
            retry.delay_ms / 1000,
        )
        extra = retry_headers(delivery.headers or {}, retry)
        if self._native:
            target = topology.retry_queue(retry.delay_ms)
            self._forwarder.forward(delivery, target, topology.dead_letter_queue, extra)
        else:
            self._forwarder.hold(
                delivery, topology.name, topology.dead_letter_queue, extra, retry.delay_ms / 1000
            )

    def _dead_letter(self, topology: QueueTopology, delivery: Delivery, dead: DeadLetter) -> None:
        if dead.tries is not None:
            self._stats.failed_tries += 1
        extra = dead_letter_headers(delivery.headers or {}, dead, topology.name)
        self._stats.dead_lettered += 1
        self._stats.dead_letter_reasons[str(dead.reason)] += 1
        properties = delivery.properties or {}
        logger.error(
            "message %s (type %r) dead-lettered to %s: %s%s: %s",
            properties.get("message_id"),
            properties.get("type"),
            topology.dead_letter_queue,
            dead.reason,
            f" after {dead.tries} tries" if dead.tries else "",
            dead.detail,
        )
        self._forwarder.forward(
            delivery, topology.dead_letter_queue, topology.dead_letter_queue, extra
        )


def _name(result: ProcessResult, outcome: Outcome) -> str:
    names = [name for name, o in result.outcomes.items() if o is outcome]
    return ", ".join(names)
