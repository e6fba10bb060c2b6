"""The worker: the kombu wiring that feeds deliveries to :mod:`inbox.broker._dispatch` (read,
process, decide, ack or copy) one at a time, never re-entrantly. Nothing here knows SQL."""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from functools import partial
from typing import Any

from kombu.connection import Connection
from kombu.message import Message as Delivery
from kombu.mixins import ConsumerMixin

from inbox._amqp.connections import consuming_connection
from inbox._cli.signals import install_signal_handlers
from inbox.broker._declare import declare_topology, kombu_queue
from inbox.broker._dispatch import Consumed, Dispatcher
from inbox.broker._forwarder import Forwarder
from inbox.broker._options import check_options
from inbox.core import Inbox
from inbox.delivery._settling import Settling
from inbox.delivery._stats import WorkerStats
from inbox.delivery.codec import JSON
from inbox.delivery.topology import QueueTopology, QueueType, RetryPolicy

__all__ = ["Worker", "WorkerStats", "install_signal_handlers"]

logger = logging.getLogger("inbox.worker")


class _StopRequested(Exception):
    """Raised out of kombu's reconnect loop when the worker was told to stop."""


class Worker(ConsumerMixin):
    """Consume ``queues`` and process every delivery exactly once through ``inbox``.

    ``broker``: a URL or a kombu ``Connection`` (cloned). ``prefetch``: unacked deliveries
    per queue; ``retry``: tries and backoff; ``declare=False``: only check the queues exist;
    ``default_content_type``: for deliveries without one (None: bytes); ``batch_size`` > 1:
    the deliveries at hand go through :meth:`inbox.Inbox.process_batch`. Reconnects for ever.
    The manual is ``docs/worker.md``.
    """

    def __init__(
        self,
        inbox: Inbox,
        broker: str | Connection,
        queues: Sequence[str],
        *,
        prefetch: int = 10,
        retry: RetryPolicy | None = None,
        queue_type: QueueType | str = QueueType.CLASSIC,
        declare: bool = True,
        default_content_type: str | None = JSON,
        stats_interval: float | None = 60.0,
        batch_size: int = 1,
    ) -> None:
        check_options(inbox, queues, prefetch, batch_size, stats_interval)
        policy = RetryPolicy() if retry is None else retry
        self.connection = consuming_connection(broker)
        self.topologies = tuple(QueueTopology(q, QueueType(queue_type), policy) for q in queues)
        self.retry = policy
        self.prefetch = prefetch
        self.batch_size = batch_size
        self.declare = declare
        self.default_content_type = default_content_type
        self.stats = WorkerStats()
        self._stats_interval = stats_interval
        settling = Settling(self.stats, policy, logger)
        self._forwarder = Forwarder(confirms=self.native_delays)
        self._dispatch = Dispatcher(
            inbox,
            settling,
            self._forwarder,
            native_delays=self.native_delays,
            default_content_type=default_content_type,
            on_halt=self.stop,
            giving_back=self._giving_back,
            # One delivery at a time on RabbitMQ, up to a quarter of the prefetch committed
            # deliveries are acked together (one multiple ack): see _acks.py.
            ack_every=prefetch // 4 if batch_size == 1 and self.native_delays else 0,
        )
        self._tearing_down = False
        self._idle_timeout: float | None = None  # set by test support and the demo only
        self._live_connection: Connection | None = None
        self._inbound: deque[Consumed] = deque()
        self._batch: list[Consumed] = []
        self._busy = False
        self._last_stats = time.monotonic()
        self.heartbeat = time.monotonic()
        """When the consume loop last turned (``time.monotonic()``), for ``/healthz``."""
        self.consuming = False
        """Connected and consuming, for ``/readyz``."""

    @property
    def native_delays(self) -> bool:
        """True when retries wait on the broker (RabbitMQ), False when held by the worker."""
        return bool(self.connection.transport.driver_type == "amqp")

    def stop(self) -> None:
        """Stop cleanly: the in-flight delivery is finished and acked; the others in hand
        are requeued, or on quorum queues finished too (a requeue burns a delivery)."""
        self.should_stop = True

    def run(self) -> None:  # type: ignore[override]
        """Consume until :meth:`stop` (or a signal, see :func:`install_signal_handlers`).

        Raises the configuration error that made the worker stop, if one did.
        """
        self._dispatch.last_activity = time.monotonic()
        try:
            super().run(safety_interval=1.0 if self.native_delays else 0.05)
        except _StopRequested:
            pass
        finally:
            logger.info("worker stopped: %s", self.stats.summary())
        if self._dispatch.halted_by is not None:
            raise self._dispatch.halted_by

    def prepare(self, max_retries: int | None = 3) -> None:
        """Connect once (up to ``max_retries`` retries) and declare or check the topology.

        Raises the broker's error when it is unreachable or a queue cannot be declared: call
        this before :meth:`run` to fail fast on a bad configuration.
        """
        attempt = 0
        while True:
            try:
                with self.connection.clone() as connection:
                    connection.ensure_connection(max_retries=max_retries)
                    self._declare(connection)
                return
            except self.connection.recoverable_connection_errors:
                # The connection was lost while declaring: declaring is idempotent, again.
                attempt += 1
                if max_retries is not None and attempt > max_retries:
                    raise
                time.sleep(min(2.0 * attempt, 10.0))

    # ConsumerMixin hooks -------------------------------------------------------------

    def get_consumers(self, consumer_class: Any, channel: Any) -> list[Any]:
        """One consumer per queue with the worker's prefetch; declares the topology and
        opens the publishing channel first (opening it later would read deliveries in the
        middle of its handshake)."""
        assert self._live_connection is not None
        self._declare(self._live_connection)
        if hasattr(channel, "auto_decode"):
            channel.auto_decode = False  # keep the bytes: decoding is not lossless
        self._forwarder.attach(self._live_connection, self._live_connection.channel())
        return [
            consumer_class(
                queues=[kombu_queue(topology.consumed_queue())],
                on_message=partial(self._on_delivery, topology),
                # kombu's default acks (drops) a body it cannot decompress: dead-letter it.
                on_decode_error=partial(self._on_delivery, topology),
                prefetch_count=self.prefetch,
                auto_declare=False,
                no_ack=False,
            )
            for topology in self.topologies
        ]

    @contextmanager
    def establish_connection(self) -> Iterator[Connection]:
        """Connect, retrying for ever unless the worker is told to stop meanwhile."""
        with self.create_connection() as connection:
            connection.ensure_connection(
                self.on_connection_error, self.connect_max_retries, callback=self._stop_check
            )
            # Deliveries from a lost connection can no longer be acked; the broker gives
            # them back, so forget them instead of running them again.
            self._inbound.clear()
            self._batch.clear()
            self._dispatch.drop_held_acks()
            self._forwarder.detach()
            self._busy = self._tearing_down = False
            self._live_connection = connection
            try:
                yield connection
            finally:
                self._live_connection = None
                self.consuming = False

    def on_consume_ready(
        self, connection: Connection, channel: Any, consumers: Any, **kwargs: Any
    ) -> None:
        """Log what the worker consumes, once per (re)connection."""
        self.consuming = True
        logger.info(
            "consuming %s (prefetch %d, batch size %d, %s queues, max tries %d, retry delays %s)",
            ", ".join(t.name for t in self.topologies),
            self.prefetch,
            self.batch_size,
            self.topologies[0].queue_type,
            self.retry.max_tries,
            ", ".join(f"{d:g}s" for d in self.retry.delays) or "none",
        )

    @contextmanager
    def extra_context(self, connection: Connection, channel: Any) -> Iterator[None]:
        """Take no delivery while kombu tears the consumers down after an error."""
        try:
            yield
        except BaseException:
            self._tearing_down = True
            raise

    def on_consume_end(self, connection: Connection, channel: Any) -> None:
        """After a clean stop (the consumers are cancelled: nothing more arrives), finish
        the deliveries in hand and forward the held ones, while the channel is open.
        Requeueing them instead would count against a quorum queue's delivery limit."""
        self.consuming = False
        self._exclusive(self._finish_in_hand)
        self._dispatch.flush_acks()  # committed: acked even when halted
        if self._dispatch.halted_by is None:
            self._forwarder.flush()
        self._forwarder.detach()

    def on_iteration(self) -> None:
        """Between deliveries: finish a batch, release due retries, log stats."""
        self.heartbeat = time.monotonic()
        self._exclusive(self._between_deliveries)
        now = time.monotonic()
        if self._stats_interval is not None and now - self._last_stats >= self._stats_interval:
            self._last_stats = now
            logger.info("worker stats: %s", self.stats.summary())
        idle = now - self._dispatch.last_activity
        if self._idle_timeout is not None and idle >= self._idle_timeout:
            self.should_stop = self.should_stop or not self._forwarder.holding

    def on_connection_error(self, exc: Exception, interval: float) -> None:
        """Log a failed (re)connection attempt; kombu retries it after ``interval``."""
        self.heartbeat = time.monotonic()  # reconnecting is the loop turning: /readyz says so
        self._stop_check()
        logger.warning("broker connection failed (%s); retrying in %.1f s", exc, interval)

    def _stop_check(self) -> None:
        if self.should_stop:
            raise _StopRequested

    # Deliveries ------------------------------------------------------------------------

    def _on_delivery(
        self, topology: QueueTopology, delivery: Delivery, decode_error: BaseException | None = None
    ) -> None:
        # py-amqp dispatches deliveries that arrive while a copy waits for its confirm, i.e.
        # inside the handling of another delivery: queue them, handle them after it, in
        # order. Nothing may publish re-entrantly (a confirm must never be mis-credited).
        if self._tearing_down:
            return  # never acked: the broker gives it back
        self._inbound.append((topology, delivery, decode_error))
        self._exclusive(lambda: None)

    def _exclusive(self, work: Any) -> None:
        """Run ``work``, then every delivery queued meanwhile, unless already inside."""
        if self._busy:
            return
        self._busy = True
        try:
            work()
            self._drain_inbound()
        finally:
            self._busy = False

    def _drain_inbound(self) -> None:
        while self._inbound:
            if self.batch_size == 1:
                self._dispatch.handle(*self._inbound.popleft())
                continue
            self._batch.append(self._inbound.popleft())
            if len(self._batch) >= self.batch_size:
                self._flush_batch()

    def _between_deliveries(self) -> None:
        if self._batch:
            self._top_up_batch()
            self._flush_batch()
        if self._dispatch.acks_held:
            self._take_at_hand()
        self._forwarder.release_due()

    def _take_at_hand(self) -> None:
        """Handle the deliveries already at hand (at most until the held acks go out), then
        send the held acks before the loop waits for the broker: an ack is never held
        while the worker waits."""
        connection = self._live_connection
        while connection is not None and self._dispatch.acks_held and not self.should_stop:
            try:
                connection.drain_events(timeout=0)
            except TimeoutError:  # socket.timeout: nothing more at hand
                break
            self._drain_inbound()
        self._dispatch.flush_acks()

    def _giving_back(self) -> bool:
        # Every requeue counts against a quorum queue's delivery limit: a stopping worker
        # finishes what it has in hand there. Elsewhere it gives that back, to stop sooner.
        quorum = self.topologies[0].queue_type is QueueType.QUORUM
        return bool(self.should_stop) and not quorum

    def _finish_in_hand(self) -> None:
        if self._dispatch.halted_by is not None or self._giving_back():
            for topology, delivery, _ in [*self._batch, *self._inbound]:
                self._dispatch.give_back(topology, delivery)
            self._batch.clear()
            self._inbound.clear()
            return
        self._drain_inbound()
        while self._batch:
            self._flush_batch()

    def _top_up_batch(self) -> None:
        """Add every delivery already at hand to the batch, without waiting for more."""
        connection = self._live_connection
        while connection is not None and 0 < len(self._batch) < self.batch_size:
            try:
                connection.drain_events(timeout=0)
            except TimeoutError:  # socket.timeout: nothing more at hand
                break
            self._batch.extend(self._inbound)
            self._inbound.clear()

    def _flush_batch(self) -> None:
        batch, self._batch = self._batch[: self.batch_size], self._batch[self.batch_size :]
        self._dispatch.handle_batch(batch)

    def _declare(self, connection: Connection) -> None:
        for topology in self.topologies:
            declare_topology(connection, topology, passive=not self.declare)
