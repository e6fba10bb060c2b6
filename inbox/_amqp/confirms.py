"""Publisher confirms for many publishes in flight on one channel, matched by delivery tag.

A channel in confirm mode numbers its publishes 1, 2, ...; the broker answers each with
``basic.ack`` or ``basic.nack`` (one tag, or every tag up to it with ``multiple``), and a
``mandatory`` publish no queue took comes back as ``basic.return`` before its ack. A return
carries the message, not the tag, so it is matched by the ``message_id`` each publish has.
The relay (many publishes in flight) and the worker's forwarder (one copy at a time) both
track their confirms here.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Final

from amqp.method_framing import frame_writer

__all__ = ["PERSISTENT", "ConfirmTracker", "corked", "fits_in_frame"]

PERSISTENT: Final = 2
_FRAME_OVERHEAD: Final = 8 + 12  # frame envelope, then class id, weight and body size


@dataclass
class ConfirmTracker:
    """The confirms of the publishes made on one channel since :meth:`attach`.

    :meth:`sent` records each publish under its ``message_id``; :meth:`wait` reads the
    broker's answers until every recorded publish is settled. ``confirmed`` and ``refused``
    (``message_id`` -> reason) accumulate until :meth:`reset`.
    """

    confirmed: set[str] = field(default_factory=set)
    refused: dict[str, str] = field(default_factory=dict)
    _pending: dict[int, str] = field(default_factory=dict)
    _returned: dict[str, str] = field(default_factory=dict)
    _tag: int = 0

    def attach(self, channel: Any) -> None:
        """Put ``channel`` in confirm mode and listen to its answers; numbering restarts."""
        self._tag = 0
        self._pending.clear()
        channel.confirm_select()
        channel.events["basic_ack"].add(self._on_ack)
        channel.events["basic_nack"].add(self._on_nack)
        channel.events["basic_return"].add(self._on_return)

    @property
    def unsettled(self) -> list[str]:
        """The message ids published and neither confirmed nor refused yet, in publish order."""
        return [self._pending[tag] for tag in sorted(self._pending)]

    def sent(self, message_id: str) -> None:
        """Record that the message ``message_id`` was just published on the channel."""
        self._tag += 1
        self._pending[self._tag] = message_id

    def reset(self) -> None:
        """Forget every answer and every pending publish (numbering goes on)."""
        self.confirmed.clear()
        self.refused.clear()
        self._pending.clear()
        self._returned.clear()

    def wait(self, connection: Any, timeout: float) -> None:
        """Read the broker's answers on ``connection`` until nothing is pending.

        Raises ``TimeoutError`` after ``timeout`` seconds (the connection is out of step and
        must be dropped), and whatever the connection raises (a channel or connection error).
        """
        deadline = time.monotonic() + timeout
        while self._pending:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(
                    f"no publisher confirm for {len(self._pending)} publish(es) within "
                    f"{timeout:g} s"
                )
            try:
                connection.drain_events(timeout=min(remaining, 1.0))
            except TimeoutError:  # socket.timeout: nothing arrived yet
                continue

    def _on_ack(self, delivery_tag: int, multiple: bool) -> None:
        for message_id in self._answered(delivery_tag, multiple):
            returned = self._returned.pop(message_id, None)
            if returned is None:
                self.confirmed.add(message_id)
            else:
                self.refused[message_id] = returned

    def _on_nack(self, delivery_tag: int, multiple: bool) -> None:
        for message_id in self._answered(delivery_tag, multiple):
            self._returned.pop(message_id, None)
            self.refused[message_id] = "nacked by the broker (a queue refused it: full?)"

    def _answered(self, delivery_tag: int, multiple: bool) -> list[str]:
        tags = [t for t in self._pending if t <= delivery_tag] if multiple else [delivery_tag]
        return [self._pending.pop(t) for t in tags if t in self._pending]

    def _on_return(self, exc: BaseException, exchange: str, routing_key: str, message: Any) -> None:
        message_id = (getattr(message, "properties", None) or {}).get("message_id")
        if message_id is None and len(self._pending) == 1:
            # Without an id it can only be the one publish in flight (the worker's copies).
            message_id = next(iter(self._pending.values()))
        if message_id is not None:
            where = f"exchange {exchange!r}" if exchange else "the default exchange ''"
            self._returned[str(message_id)] = (
                f"returned unroutable by {where} with routing key {routing_key!r}: {exc}"
            )


def fits_in_frame(connection: Any, prepared: Any) -> bool:
    """True when the properties (headers included) of the ``prepared`` py-amqp message fit
    in one frame of the kombu ``connection``: the broker closes the connection otherwise."""
    frame_max = getattr(connection.connection, "frame_max", None)
    if not frame_max:
        return True
    return bool(len(prepared._serialize_properties()) + _FRAME_OVERHEAD <= frame_max)


class _Gathered:
    """A stand-in transport that keeps what is written (copied: py-amqp hands out a view
    of the buffer it reuses for every frame)."""

    def __init__(self) -> None:
        self.chunks: list[bytes] = []

    def write(self, data: Any) -> None:
        self.chunks.append(bytes(data))


@contextmanager
def corked(connection: Any) -> Iterator[None]:
    """Publishes made on the kombu ``connection`` inside the block go to the socket in one
    write at its end, not one system call each. Only publishes: a call that waits for the
    broker's reply inside the block would wait for a request not sent yet."""
    amqp_connection = connection.connection
    gathered = _Gathered()
    writer = amqp_connection.frame_writer
    amqp_connection.frame_writer = frame_writer(amqp_connection, gathered)
    try:
        yield
    finally:
        amqp_connection.frame_writer = writer
        if gathered.chunks:  # published from the relay's point of view: they go out
            amqp_connection.transport.write(b"".join(gathered.chunks))
