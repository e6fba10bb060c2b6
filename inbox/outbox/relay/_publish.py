"""The relay's broker side: a batch of outbox rows published with confirms, answered together.

Every row goes out as a persistent, ``mandatory`` publish carrying the row's id as its
``message_id``; the whole batch is published, then its confirms are awaited at once (one
round trip for the batch, not one per row). Each row ends confirmed, refused (nacked,
returned unroutable, an exchange that does not exist, headers too large for a frame, a
channel error it caused) or unconfirmed (the connection was lost before its answer: it may
have arrived, and goes out again). Nothing here touches the database.
"""

from __future__ import annotations

import contextlib
import logging
import struct
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from amqp.exceptions import ChannelError, FrameSyntaxError
from kombu.connection import Connection

from inbox._amqp.confirms import PERSISTENT, ConfirmTracker, corked, fits_in_frame
from inbox.errors import InboxError
from inbox.outbox._row import PROPERTY_HEADERS, OutboxRow
from inbox.outbox.relay._refusals import error_line

__all__ = ["BatchPublisher", "BrokerLost", "Sent"]

logger = logging.getLogger("inbox.relay")

# Type, content type and encoding (255 bytes each at most), message id, delivery mode, the
# property flags and the frame envelope.
_OTHER_PROPERTIES: Final = 4096
# What py-amqp raises for a property or header it cannot encode, before it writes anything
# of that publish (the relay checks the rows first; this keeps one it missed from killing it).
_UNENCODABLE: Final = (struct.error, FrameSyntaxError, ValueError, TypeError, OverflowError)


class BrokerLost(InboxError):
    """The broker connection broke; the relay reconnects."""


@dataclass
class Sent:
    """What became of a batch: ids confirmed, refused (with the reason), unconfirmed."""

    confirmed: list[uuid.UUID] = field(default_factory=list)
    refused: dict[uuid.UUID, str] = field(default_factory=dict)
    unconfirmed: list[uuid.UUID] = field(default_factory=list)
    lost: BaseException | None = None
    repeated: int = 0
    """Rows published again one at a time after a channel closed before their answer (the
    first copy may have arrived)."""


class BatchPublisher:
    """Publishes batches of outbox rows on one kombu ``connection`` (it owns it)."""

    def __init__(self, connection: Connection, *, confirm_timeout: float) -> None:
        self._connection = connection
        self.confirm_timeout = confirm_timeout
        self._channel: Any = None
        self._probe: Any = None
        self._tracker = ConfirmTracker()
        self._exchanges: set[str] = {""}
        self._published: set[str] = set()
        self._header_sizes: Mapping[uuid.UUID, int] = {}

    @property
    def connection(self) -> Connection:
        """The kombu connection in use (a new one after each reconnection)."""
        return self._connection

    @property
    def connection_errors(self) -> tuple[type[BaseException], ...]:
        """The errors that mean the broker connection is gone."""
        return (
            *self._connection.connection_errors,
            *self._connection.recoverable_connection_errors,
            BrokerLost,
        )

    def connect(self, on_retry: Callable[[], None], max_retries: int | None = None) -> None:
        """Connect (again), retrying with a growing interval; ``on_retry`` runs between tries
        and may raise to give up (a stop)."""
        if self._connection.connected and self._channel is not None:
            return

        def errback(exc: Exception, interval: float) -> None:
            on_retry()
            logger.warning(
                "broker connection failed (%s); retrying in %.1f s", error_line(exc), interval
            )

        self._connection.ensure_connection(
            errback,
            max_retries,
            interval_start=0.5,
            interval_step=1,
            interval_max=10,
            callback=on_retry,
        )
        self._open_channel()

    def check_alive(self) -> None:
        """Read what the broker sent while the relay was idle (a close, heartbeats), and send
        a heartbeat when one is due (with ``?heartbeat=N`` in the broker URL)."""
        if not self._connection.connected:
            raise BrokerLost("not connected")
        self._connection.heartbeat_check()
        try:
            self._connection.drain_events(timeout=0)
        except TimeoutError:  # socket.timeout: nothing waiting
            pass
        except ChannelError:
            self._channel = self._probe = None

    def drop(self) -> None:
        """Forget the broken connection; :meth:`connect` makes a new one."""
        broken, self._connection = self._connection, self._connection.clone()
        self._channel = self._probe = None
        self._exchanges = {""}
        with contextlib.suppress(Exception):  # the connection is gone either way
            broken.collect()

    def close(self) -> None:
        """Close the connection."""
        self._channel = self._probe = None
        self._connection.release()

    def publish(
        self, rows: Sequence[OutboxRow], header_sizes: Mapping[uuid.UUID, int] | None = None
    ) -> Sent:
        """Publish ``rows`` in order and wait for every confirm together. ``header_sizes``:
        the length of each row's stored headers, which spares measuring small ones."""
        self._header_sizes = header_sizes or {}
        sent = Sent()
        self._published.clear()
        ready: list[tuple[OutboxRow, Any]] = []
        try:
            for row in rows:
                prepared = self._ready(row, sent)
                if prepared is not None:
                    ready.append((row, prepared))
            self._publish_together(ready, sent)
        except self.connection_errors as exc:
            sent.lost = exc
        settled = set(sent.confirmed) | set(sent.refused)
        sent.unconfirmed = [
            row.id for row, _ in ready if row.id not in settled and str(row.id) in self._published
        ]
        return sent

    # --- internals ---------------------------------------------------------------------

    def _publish_together(self, ready: list[tuple[OutboxRow, Any]], sent: Sent) -> None:
        if not ready:
            return
        rows = [row for row, _ in ready]
        channel = self._open_channel()
        self._tracker.reset()
        try:
            with corked(self._connection):
                for row, prepared in ready:
                    self._send_or_refuse(channel, row, prepared, sent)
            self._tracker.wait(self._connection, self.confirm_timeout)
        except ChannelError as exc:
            # The channel is closed and which publish caused it is not certain (confirms
            # may come out of order): every unanswered row goes again, one at a time.
            self._channel = None
            self._collect(rows, sent)
            answered = set(sent.confirmed) | set(sent.refused)
            sent.repeated = sum(1 for row in rows if row.id not in answered)
            logger.warning(
                "the broker closed the publishing channel (%s); sending the %d unanswered "
                "rows one at a time to find the one it refused",
                error_line(exc),
                sent.repeated,
            )
            self._isolate(ready, sent)
            return
        except TimeoutError as exc:
            self._collect(rows, sent)
            raise BrokerLost(str(exc)) from exc
        except BaseException:
            self._collect(rows, sent)
            raise
        self._collect(rows, sent)

    def _isolate(self, ready: list[tuple[OutboxRow, Any]], sent: Sent) -> None:
        answered = set(sent.confirmed) | set(sent.refused)
        for row, prepared in ready:
            if row.id in answered:
                continue
            self._tracker.reset()
            try:
                self._send_or_refuse(self._open_channel(), row, prepared, sent)
                self._tracker.wait(self._connection, self.confirm_timeout)
            except ChannelError as exc:
                self._channel = None
                self._exchanges.discard(row.exchange)
                sent.refused[row.id] = f"channel closed by the broker: {error_line(exc)}"
                continue
            except TimeoutError as exc:
                raise BrokerLost(str(exc)) from exc
            finally:
                self._collect([row], sent)

    def _send_or_refuse(self, channel: Any, row: OutboxRow, prepared: Any, sent: Sent) -> None:
        message_id = str(row.id)
        self._published.add(message_id)
        try:
            channel.basic_publish(
                prepared, exchange=row.exchange, routing_key=row.routing_key, mandatory=True
            )
        except _UNENCODABLE as exc:
            self._published.discard(message_id)
            sent.refused[row.id] = f"AMQP cannot carry the row: {error_line(exc)}"
            return
        self._tracker.sent(message_id)

    def _collect(self, rows: Sequence[OutboxRow], sent: Sent) -> None:
        confirmed, refused = self._tracker.confirmed, self._tracker.refused
        done = {*sent.confirmed, *sent.refused}
        for row in rows:
            if row.id in done:
                continue
            key = str(row.id)
            if key in confirmed:
                sent.confirmed.append(row.id)
            elif key in refused:
                sent.refused[row.id] = refused[key]
        confirmed.clear()
        refused.clear()

    def _prepare(self, channel: Any, row: OutboxRow) -> Any:
        headers = dict(row.headers)
        properties = {"message_id": str(row.id), "type": row.type, "delivery_mode": PERSISTENT}
        for header, name in PROPERTY_HEADERS.items():
            if header in headers:
                properties[name] = headers.pop(header)
        return channel.prepare_message(
            row.body, None, row.content_type, row.content_encoding, headers, properties
        )

    def _ready(self, row: OutboxRow, sent: Sent) -> Any:
        """The message to publish for ``row``, or None when it is refused before it is sent
        (recorded in ``sent``)."""
        if row.exchange not in self._exchanges:
            missing = self._probe_exchange(row.exchange)
            if missing is not None:
                sent.refused[row.id] = missing
                return None
        prepared = self._prepare(self._open_channel(), row)
        try:
            fits = not self._may_overflow(row) or fits_in_frame(self._connection, prepared)
        except _UNENCODABLE as exc:
            sent.refused[row.id] = f"AMQP cannot carry the row: {error_line(exc)}"
            return None
        if not fits:
            sent.refused[row.id] = (
                "its properties (headers included) do not fit in one AMQP frame "
                f"({self._connection.connection.frame_max} bytes)"
            )
            return None
        return prepared

    def _may_overflow(self, row: OutboxRow) -> bool:
        """False when the row's headers are certainly small enough for a frame. An AMQP
        table takes at most a few bytes per character of the JSON text it is stored as (an
        integer: 9 bytes for ``1,``): eight per character, plus the other properties, is safe."""
        stored = self._header_sizes.get(row.id)
        if stored is None:
            return True
        frame_max = getattr(self._connection.connection, "frame_max", None) or 0
        return stored * 8 + _OTHER_PROPERTIES > frame_max

    def _probe_exchange(self, exchange: str) -> str | None:
        """None when ``exchange`` exists, else why not (a passive declare, on a channel of
        its own: a missing exchange closes the channel it was asked on)."""
        if self._probe is None:
            self._probe = self._connection.channel()
        try:
            self._probe.exchange_declare(exchange=exchange, type="direct", passive=True)
        except ChannelError as exc:
            self._probe = None
            return f"exchange {exchange!r} does not exist: {error_line(exc)}"
        self._exchanges.add(exchange)
        return None

    def _open_channel(self) -> Any:
        if self._channel is None:
            channel = self._connection.channel()
            self._tracker.attach(channel)
            self._channel = channel
        return self._channel
