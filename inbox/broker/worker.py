"""The worker: consume queues, run each delivery through ``Inbox.process``, ack after commit.

Policy for every delivery, in order:

* the worker is stopping → requeued untouched (another worker, or the next start, takes it);
* no ``message_id``, an id that is not a UUID, a body that does not decode under its content
  type, a malformed header → ``<queue>.dlq`` at once, with the reason (retrying cannot help);
* no handler takes its type, or a handler's ``key=`` fails on it → ``<queue>.dlq`` at once;
* every handler committed or was a duplicate → acked;
* a handler failed (after the inbox retried transient database errors in place) → published
  to the retry queue of its backoff delay, or to ``<queue>.dlq`` after the last try, and
  only then acked. A crash in between leaves two copies with one id: the inbox skips one.

Nothing here knows SQL: the worker sees the inbox's outcomes and exceptions only.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import signal
import time
from collections import Counter, deque
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from types import FrameType
from typing import Any, Final

from amqp.exceptions import MessageNacked
from kombu.connection import Connection
from kombu.message import Message as Delivery
from kombu.mixins import ConsumerMixin

from inbox.broker import headers as h
from inbox.broker.codec import JSON, InvalidReason, UndecodableBody, decode_body
from inbox.broker.connection import confirming_connection
from inbox.broker.topology import QueueTopology, QueueType, RetryPolicy
from inbox.core import Inbox
from inbox.errors import HandlerFailed, InboxError, InvalidKey, InvalidMessage, UnhandledMessage
from inbox.message import Message, parse_message_id
from inbox.result import Outcome, ProcessResult

__all__ = ["Worker", "WorkerStats", "install_signal_handlers"]

logger = logging.getLogger("inbox.worker")

# Properties a retry or dead letter carries over. user_id would be refused by RabbitMQ when
# the worker's user differs from the producer's; expiration must not follow a message into
# the dead-letter queue.
_KEPT_PROPERTIES: Final = (
    "message_id",
    "type",
    "correlation_id",
    "reply_to",
    "timestamp",
    "app_id",
)
_PERSISTENT: Final = 2

_Inbound = tuple[QueueTopology, Delivery, BaseException | None]


@dataclass
class WorkerStats:
    """Counters since the worker started; logged periodically and when it stops."""

    deliveries: int = 0
    acked: int = 0
    processed: int = 0
    duplicates: int = 0
    failed_tries: int = 0
    retried: int = 0
    dead_lettered: int = 0
    requeued_on_stop: int = 0
    dead_letter_reasons: Counter[str] = field(default_factory=Counter)

    def summary(self) -> str:
        """One line with every counter."""
        reasons = ", ".join(f"{k}={v}" for k, v in sorted(self.dead_letter_reasons.items()))
        return (
            f"deliveries={self.deliveries} acked={self.acked} processed={self.processed} "
            f"duplicates={self.duplicates} failed_tries={self.failed_tries} "
            f"retried={self.retried} dead_lettered={self.dead_lettered}"
            + (f" ({reasons})" if reasons else "")
            + f" requeued_on_stop={self.requeued_on_stop}"
        )


class _Rejected(Exception):
    def __init__(self, reason: InvalidReason, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


class _Refused(Exception):
    """The broker did not take a retry or dead-letter copy (nacked, or no queue for it)."""


class _StopRequested(Exception):
    """Raised out of kombu's reconnect loop when the worker was told to stop."""


@dataclass(order=True)
class _Held:
    """An unacked delivery the worker forwards later: a retry on a transport without TTL
    queues (forwarded to the consumed queue when its delay is over), or a copy the broker
    refused (tried again with a growing backoff)."""

    due: float
    sequence: int
    delivery: Delivery = field(compare=False)
    target: str = field(compare=False)
    headers: dict[str, Any] = field(compare=False)
    refusals: int = field(default=0, compare=False)


class Worker(ConsumerMixin):
    """Consume ``queues`` and process every delivery exactly once through ``inbox``.

    ``broker`` is a URL (``amqp://guest:guest@localhost//``, ``memory://``) or a kombu
    ``Connection`` (cloned; publisher confirms are switched on for the clone). ``prefetch``
    bounds the unacked deliveries per queue. ``retry`` sets the tries and backoff;
    ``queue_type`` the type of every declared queue. With ``declare=False`` the worker only
    checks that the queues exist (for infrastructure that owns the topology).
    ``default_content_type`` is how a delivery without a content type is decoded (None:
    raw bytes). The worker reconnects for ever after a lost connection; unacked deliveries
    come back from the broker and are deduplicated by the inbox.

    ``batch_size`` above 1 turns on batch mode: up to that many deliveries that are already
    at hand (never waiting for more) go through :meth:`inbox.Inbox.process_batch`, one
    transaction and one claim statement per handler, and are acked after its commit; a
    failing message is isolated by splitting the batch and alone takes the retry path.
    ``prefetch`` must be at least ``batch_size``, or batches could never fill.

    On RabbitMQ (any ``amqp`` transport) a retry waits in a TTL queue on the broker. Other
    kombu transports have no TTL dead-lettering, so there the worker holds the unacked
    delivery until its delay is over, then re-publishes it and acks the original.
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
        if not isinstance(inbox, Inbox):
            raise TypeError(f"inbox must be an inbox.Inbox, got {type(inbox).__name__}")
        if isinstance(queues, str) or not queues:
            raise ValueError("queues must be a non-empty sequence of queue names")
        if len(set(queues)) != len(queues):
            raise ValueError(f"queues must not repeat a name: {list(queues)}")
        if (
            isinstance(prefetch, bool)
            or not isinstance(prefetch, int)
            or not 1 <= prefetch <= 65535
        ):
            raise ValueError(f"prefetch must be an int from 1 to 65535, got {prefetch!r}")
        if (
            isinstance(batch_size, bool)
            or not isinstance(batch_size, int)
            or not 1 <= batch_size <= 65535
        ):
            raise ValueError(f"batch_size must be an int from 1 to 65535, got {batch_size!r}")
        if batch_size > prefetch:
            raise ValueError(
                f"batch_size ({batch_size}) must not exceed prefetch ({prefetch}): a batch "
                "fills only from deliveries the broker has already sent"
            )
        if stats_interval is not None and stats_interval <= 0:
            raise ValueError(f"stats_interval must be positive or None, got {stats_interval}")
        policy = RetryPolicy() if retry is None else retry
        self.connection = confirming_connection(broker)
        self.topologies = tuple(QueueTopology(q, QueueType(queue_type), policy) for q in queues)
        self.retry = policy
        self.prefetch = prefetch
        self.batch_size = batch_size
        self.declare = declare
        self.default_content_type = default_content_type
        self.stats = WorkerStats()
        self._inbox = inbox
        self._stats_interval = stats_interval
        self._publish_channel: Any = None
        self._held: list[_Held] = []
        self._tearing_down = False
        self._sequence = itertools.count()
        self._idle_timeout: float | None = None
        self._live_connection: Connection | None = None
        self._inbound: deque[_Inbound] = deque()
        self._batch: list[_Inbound] = []
        self._busy = False
        self._returned: list[str] = []
        self._last_activity = time.monotonic()
        self._last_stats = time.monotonic()

    @property
    def native_delays(self) -> bool:
        """True when retries wait on the broker (RabbitMQ), False when held by the worker."""
        return bool(self.connection.transport.driver_type == "amqp")

    def stop(self) -> None:
        """Stop after the in-flight delivery: it is finished and acked, the rest requeued."""
        self.should_stop = True

    def run(self, *, idle_timeout: float | None = None) -> None:  # type: ignore[override]
        """Consume until :meth:`stop` (or a signal, see :func:`install_signal_handlers`).

        With ``idle_timeout``, also stop once no delivery arrived for that many seconds and no
        retry is held by the worker (used by the demo and by tests; a production worker runs
        without it).
        """
        self._idle_timeout = idle_timeout
        self._last_activity = time.monotonic()
        interval = 1.0 if self.native_delays else 0.05
        try:
            super().run(safety_interval=interval)
        except _StopRequested:
            pass
        finally:
            logger.info("worker stopped: %s", self.stats.summary())

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
                    with connection.channel() as channel:
                        self._declare(channel)
                return
            except self.connection.recoverable_connection_errors:
                # The connection was lost while declaring (say the server closed it): the
                # topology may be half declared; declaring is idempotent, so do it again.
                attempt += 1
                if max_retries is not None and attempt > max_retries:
                    raise
                time.sleep(min(2.0 * attempt, 10.0))

    def delete_queues(self) -> None:
        """Delete every queue the worker declares, messages and dead letters included.

        For demos and tests that own their queues; never for a production queue.
        """
        with self.connection.clone() as connection, connection.channel() as channel:
            for topology in self.topologies:
                for queue in topology.queues():
                    channel.queue_delete(queue.name)

    # ConsumerMixin hooks -------------------------------------------------------------

    def get_consumers(self, consumer_class: Any, channel: Any) -> list[Any]:
        """One consumer per queue, each with the worker's prefetch; declares the topology.

        Also opens the channel that publishes retries and dead letters, before any consumer
        starts: opening it later would read deliveries in the middle of the handshake.
        """
        self._declare(channel)
        # py-amqp would decode bodies whose content_encoding names a text codec, and the
        # round trip back to bytes is not lossless (UTF-16 gains a BOM): keep the bytes.
        if hasattr(channel, "auto_decode"):
            channel.auto_decode = False
        if self._live_connection is not None:
            self._publish_channel = self._live_connection.channel()
            events = getattr(self._publish_channel, "events", None)
            if self.native_delays and events is not None:
                events["basic_return"].add(self._on_return)
        return [
            consumer_class(
                queues=[topology.consumed_queue()],
                on_message=partial(self._on_delivery, topology),
                # kombu's default acks (drops) a body it cannot decompress: dead-letter it.
                on_decode_error=partial(self._on_undecodable, topology),
                prefetch_count=self.prefetch,
                auto_declare=False,
                no_ack=False,
            )
            for topology in self.topologies
        ]

    @contextmanager
    def establish_connection(self) -> Iterator[Connection]:
        """Connect, retrying for ever unless the worker is told to stop meanwhile; keep the
        connection for the publishing channel."""
        with self.create_connection() as connection:
            connection.ensure_connection(
                self.on_connection_error, self.connect_max_retries, callback=self._stop_check
            )
            # Deliveries queued or held from a lost connection can no longer be acked; the
            # broker gives them back, so forget them instead of running them again.
            self._inbound.clear()
            self._batch.clear()
            self._held.clear()
            self._busy = False
            self._tearing_down = False
            self._live_connection = connection
            try:
                yield connection
            finally:
                self._live_connection = None

    def on_consume_ready(
        self, connection: Connection, channel: Any, consumers: Any, **kwargs: Any
    ) -> None:
        """Log what the worker consumes, once per (re)connection."""
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
        """Take no delivery while kombu tears the consumers down after an error: py-amqp
        dispatches frames while it cancels them, on a connection that may be out of step."""
        try:
            yield
        except BaseException:
            self._tearing_down = True
            raise

    def on_consume_end(self, connection: Connection, channel: Any) -> None:
        """On a clean stop, forward every held delivery now (its delay cut short), or give
        it back to the broker, while the channel is still open: some transports (the
        in-memory one) drop unacked messages when the channel closes."""
        for _, delivery, _ in self._batch:
            delivery.requeue()
            self.stats.requeued_on_stop += 1
        self._batch.clear()
        held, self._held = self._held, []
        for item in held:
            try:
                self._republish(item.delivery, item.target, item.headers)
            except _Refused:
                item.delivery.requeue()
            else:
                item.delivery.ack()
        self._inbound.clear()
        self._publish_channel = None

    def on_iteration(self) -> None:
        """Between deliveries: finish a batch, release due retries, log stats, stop when
        idle."""
        if self._batch:
            self._complete_batch()
        self._release_due_retries()
        now = time.monotonic()
        if self._stats_interval is not None and now - self._last_stats >= self._stats_interval:
            self._last_stats = now
            logger.info("worker stats: %s", self.stats.summary())
        if (
            self._idle_timeout is not None
            and not self._held
            and now - self._last_activity >= self._idle_timeout
        ):
            self.should_stop = True

    def on_connection_error(self, exc: Exception, interval: float) -> None:
        """Log a failed (re)connection attempt; kombu retries it after ``interval``."""
        self._stop_check()
        logger.warning("broker connection failed (%s); retrying in %.1f s", exc, interval)

    def _stop_check(self) -> None:
        if self.should_stop:
            raise _StopRequested

    # One delivery ----------------------------------------------------------------------

    def _on_delivery(
        self, topology: QueueTopology, delivery: Delivery, decode_error: BaseException | None = None
    ) -> None:
        # py-amqp dispatches deliveries that arrive while the worker waits for a publisher
        # confirm, i.e. inside the handling of another delivery. Queue them and handle them
        # one at a time, in order, after the current one.
        if self._tearing_down:
            return  # never acked: the broker gives it back
        self._inbound.append((topology, delivery, decode_error))
        if self._busy:
            return
        self._busy = True
        try:
            while self._inbound:
                if self.batch_size == 1:
                    self._handle(*self._inbound.popleft())
                    continue
                self._batch.append(self._inbound.popleft())
                if len(self._batch) >= self.batch_size:
                    self._flush_batch()
        finally:
            self._busy = False

    def _complete_batch(self) -> None:
        """Top the batch up with every delivery already at hand, without waiting, and
        process it; repeat while deliveries arrived meanwhile (during a copy's confirm)."""
        connection = self._live_connection
        while self._batch and not self._busy:
            while connection is not None and 0 < len(self._batch) < self.batch_size:
                try:
                    connection.drain_events(timeout=0)
                except TimeoutError:  # socket.timeout: nothing more at hand
                    break
            if not self._batch:
                break  # it filled up and was processed while draining
            self._busy = True
            try:
                self._flush_batch()
                while self._inbound:
                    self._batch.append(self._inbound.popleft())
                    if len(self._batch) >= self.batch_size:
                        self._flush_batch()
            finally:
                self._busy = False

    def _on_undecodable(
        self, topology: QueueTopology, delivery: Delivery, exc: BaseException
    ) -> None:
        self._on_delivery(topology, delivery, exc)

    def _handle(
        self, topology: QueueTopology, delivery: Delivery, decode_error: BaseException | None
    ) -> None:
        message = self._admit(topology, delivery, decode_error)
        if message is None:
            return
        try:
            result: ProcessResult | InboxError = self._inbox.process(message)
        except InboxError as exc:
            result = exc
        except Exception as exc:  # outside any handler: counts as a failed try all the same
            self._failed(topology, delivery, message, h.describe(exc), {})
            return
        self._settle(topology, delivery, message, result)

    def _flush_batch(self) -> None:
        batch, self._batch = self._batch, []
        admitted = []
        for topology, delivery, decode_error in batch:
            message = self._admit(topology, delivery, decode_error)
            if message is not None:
                admitted.append((topology, delivery, message))
        if not admitted:
            return
        try:
            results = self._inbox.process_batch([message for _, _, message in admitted])
        except Exception as exc:  # outside any handler: a failed try for every message
            for topology, delivery, message in admitted:
                self._failed(topology, delivery, message, h.describe(exc), {})
            return
        # Every message that committed is acked only now, after the batch's commit.
        for (topology, delivery, message), result in zip(admitted, results, strict=True):
            self._settle(topology, delivery, message, result)

    def _admit(
        self, topology: QueueTopology, delivery: Delivery, decode_error: BaseException | None
    ) -> Message | None:
        """The delivery as a Message, or None when it was requeued (stopping) or
        dead-lettered (not a valid message)."""
        if self.should_stop:
            delivery.requeue()
            self.stats.requeued_on_stop += 1
            return None
        self.stats.deliveries += 1
        self._last_activity = time.monotonic()
        try:
            return self._to_message(delivery, decode_error)
        except _Rejected as rejected:
            self._dead_letter(topology, delivery, rejected.reason, rejected.detail, {})
            return None

    def _settle(
        self,
        topology: QueueTopology,
        delivery: Delivery,
        message: Message,
        result: ProcessResult | InboxError,
    ) -> None:
        """Ack, retry or dead-letter a delivery by what the inbox made of it."""
        self._last_activity = time.monotonic()  # busy until now, however long it took
        if isinstance(result, HandlerFailed):
            self._count(result.result)
            self._failed(topology, delivery, message, describe_failure(result), result.failures)
        elif isinstance(result, UnhandledMessage):
            self._dead_letter(topology, delivery, InvalidReason.UNHANDLED_TYPE, str(result), {})
        elif isinstance(result, InvalidKey):
            self._dead_letter(topology, delivery, InvalidReason.INVALID_KEY, str(result), {})
        elif isinstance(result, InboxError):
            self._failed(topology, delivery, message, h.describe(result), {})
        else:
            self._count(result)
            # Ack only now: every handler's claim and effects are committed (or were
            # committed by an earlier delivery). A crash before this line means a
            # redelivery, which the inbox skips as a duplicate; acking earlier could lose it.
            delivery.ack()
            self.stats.acked += 1

    def _to_message(self, delivery: Delivery, decode_error: BaseException | None) -> Message:
        properties: Mapping[str, Any] = delivery.properties or {}
        headers: Mapping[str, Any] = delivery.headers or {}
        raw_id = properties.get("message_id")
        if raw_id is None or raw_id == "":
            raise _Rejected(InvalidReason.MISSING_ID, "delivery has no message_id property")
        try:
            message_id = parse_message_id(raw_id)
        except InvalidMessage as exc:
            raise _Rejected(InvalidReason.INVALID_ID, str(exc)) from None
        if decode_error is not None:  # kombu could not decompress it (``compression`` header)
            detail = f"cannot decompress ({headers.get('compression')!r}): {decode_error}"
            raise _Rejected(InvalidReason.UNDECODABLE_BODY, detail)
        try:
            body = decode_body(
                _body_bytes(delivery),
                delivery.content_type,
                delivery.content_encoding,
                self.default_content_type,
            )
        except UndecodableBody as exc:
            raise _Rejected(InvalidReason.UNDECODABLE_BODY, str(exc)) from None
        try:
            return Message(id=message_id, type=properties.get("type"), body=body, headers=headers)
        except (InvalidMessage, TypeError, ValueError) as exc:
            raise _Rejected(InvalidReason.INVALID_MESSAGE, str(exc)) from None

    def _count(self, result: ProcessResult) -> None:
        outcomes = result.outcomes.values()
        self.stats.processed += sum(o is Outcome.PROCESSED for o in outcomes)
        self.stats.duplicates += sum(o is Outcome.DUPLICATE for o in outcomes)

    def _failed(
        self,
        topology: QueueTopology,
        delivery: Delivery,
        message: Message,
        error: str,
        failures: Mapping[str, BaseException],
    ) -> None:
        self.stats.failed_tries += 1
        headers: Mapping[str, Any] = delivery.headers or {}
        tries = h.tries_so_far(headers) + 1
        extra = h.failure_headers(headers, tries, error, failures)
        if self.retry.exhausted(tries):
            self._dead_letter(topology, delivery, InvalidReason.HANDLER_FAILED, error, extra)
            return
        delay_ms = self.retry.delay_ms(tries)
        logger.warning(
            "message %s (type %r) on %s: try %d/%d failed (%s); retry in %g s",
            message.id,
            message.type,
            topology.name,
            tries,
            self.retry.max_tries,
            error,
            delay_ms / 1000,
        )
        self.stats.retried += 1
        if self.native_delays:
            self._forward(delivery, topology.retry_queue(delay_ms), extra)
        else:
            self._hold(delivery, topology.name, extra, delay_ms / 1000)

    def _dead_letter(
        self,
        topology: QueueTopology,
        delivery: Delivery,
        reason: InvalidReason,
        detail: str,
        extra: Mapping[str, Any],
    ) -> None:
        headers = {
            **extra,
            h.REASON: str(reason),
            h.SOURCE_QUEUE: topology.name,
            h.DEAD_LETTERED_AT: h.now_utc(),
        }
        if h.ERROR not in headers:
            headers[h.ERROR] = h.truncate(detail)
        self._forward(delivery, topology.dead_letter_queue, headers)
        self.stats.dead_lettered += 1
        self.stats.dead_letter_reasons[str(reason)] += 1
        tries = headers.get(h.TRIES)
        logger.error(
            "message %s (type %r) dead-lettered to %s: %s%s: %s",
            (delivery.properties or {}).get("message_id"),
            (delivery.properties or {}).get("type"),
            topology.dead_letter_queue,
            reason,
            f" after {tries} tries" if tries else "",
            detail,
        )

    def _forward(
        self, delivery: Delivery, target: str, headers: Mapping[str, Any], refusals: int = 0
    ) -> None:
        """Publish a copy of ``delivery`` to ``target`` and, once the broker confirmed it,
        ack the original: the message is in one queue or the other at every moment, and a
        crash in between leaves two copies with one id, which the inbox deduplicates.
        A refused copy leaves the original unacked and is tried again after a backoff."""
        try:
            self._republish(delivery, target, headers)
        except _Refused as refused:
            wait = min(30.0, 2.0**refusals)
            logger.error(
                "message %s: the broker refused its copy for %s (%s); kept unacked, "
                "next attempt in %g s",
                (delivery.properties or {}).get("message_id"),
                target,
                refused,
                wait,
            )
            self._hold(delivery, target, headers, wait, refusals + 1)
            return
        delivery.ack()

    def _hold(
        self,
        delivery: Delivery,
        target: str,
        headers: Mapping[str, Any],
        seconds: float,
        refusals: int = 0,
    ) -> None:
        due = time.monotonic() + seconds
        item = _Held(due, next(self._sequence), delivery, target, dict(headers), refusals)
        heapq.heappush(self._held, item)

    def _release_due_retries(self) -> None:
        now = time.monotonic()
        while self._held and self._held[0].due <= now:
            item = heapq.heappop(self._held)
            self._forward(item.delivery, item.target, item.headers, item.refusals)

    def _republish(self, delivery: Delivery, queue: str, extra: Mapping[str, Any]) -> None:
        """Publish a copy of ``delivery`` (same body, id, type, content type, headers plus
        ``extra``) persistently to ``queue`` and wait for the broker's confirm.

        Raises :class:`_Refused` when the broker nacks it or no queue takes it (a
        ``mandatory`` publish on RabbitMQ: a deleted dead-letter queue must not swallow it).
        """
        channel = self._publish_channel
        properties = delivery.properties or {}
        kept = {k: properties[k] for k in _KEPT_PROPERTIES if properties.get(k) is not None}
        kept["delivery_mode"] = _PERSISTENT
        prepared = channel.prepare_message(
            _body_bytes(delivery),
            properties.get("priority"),
            delivery.content_type,
            delivery.content_encoding,
            # kombu decompressed the body on receipt; the copy goes out uncompressed.
            {k: v for k, v in (delivery.headers or {}).items() if k != "compression"} | dict(extra),
            kept,
        )
        if not self.native_delays:
            channel.basic_publish(prepared, exchange="", routing_key=queue)
            return
        self._returned.clear()
        try:
            channel.basic_publish(prepared, exchange="", routing_key=queue, mandatory=True)
        except MessageNacked as exc:
            raise _Refused(f"nacked: {exc}") from exc
        if self._returned:  # py-amqp dispatches basic.return before the confirm
            raise _Refused(self._returned[0])

    def _on_return(self, exc: BaseException, exchange: str, routing_key: str, message: Any) -> None:
        self._returned.append(f"no queue {routing_key!r}: {exc}")

    def _declare(self, channel: Any) -> None:
        for topology in self.topologies:
            for queue in topology.queues():
                bound = queue(channel)
                if self.declare:
                    bound.declare()
                else:
                    bound.queue_declare(passive=True)


def _body_bytes(delivery: Delivery) -> bytes:
    # py-amqp decodes bodies whose content_encoding names a codec; undo that losslessly.
    body = delivery.body
    if isinstance(body, str):
        return body.encode(delivery.content_encoding or "utf-8")
    return bytes(body)


def describe_failure(failed: HandlerFailed) -> str:
    """``handler: ExceptionType: message`` for each failed handler, joined by ``; ``."""
    return "; ".join(f"{name}: {h.describe(exc)}" for name, exc in failed.failures.items())


def install_signal_handlers(worker: Worker) -> None:
    """Make SIGTERM and SIGINT stop ``worker`` cleanly: the in-flight delivery is finished
    and acked, then the worker returns. A second signal stops at once (the in-flight
    delivery is rolled back and redelivered). Call from the main thread."""

    def first(signum: int, frame: FrameType | None) -> None:
        logger.info(
            "%s: finishing the in-flight message, then stopping", signal.Signals(signum).name
        )
        worker.stop()
        signal.signal(signal.SIGTERM, second)
        signal.signal(signal.SIGINT, second)

    def second(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt(f"second {signal.Signals(signum).name}: stopping at once")

    signal.signal(signal.SIGTERM, first)
    signal.signal(signal.SIGINT, first)
