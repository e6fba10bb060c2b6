"""The publisher: send messages an inbox worker can deduplicate.

Every message gets a UUIDv7 ``message_id`` (unless one is given, for a deliberate re-send),
its ``type``, a content type, persistent delivery, and waits for the broker's confirm. A
message no queue takes is reported as :class:`inbox.PublishError` (``mandatory`` publish),
never dropped silently. A publish that failed on a lost connection is retried; if the first
attempt had in fact arrived, the consumer sees the same ``message_id`` twice and its inbox
skips the second.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from types import TracebackType
from typing import Any, Final, Self

from amqp.exceptions import ChannelError as AMQPChannelError
from amqp.exceptions import MessageNacked
from kombu.connection import Connection
from kombu.entity import Exchange
from kombu.exceptions import ChannelError as KombuChannelError
from kombu.exceptions import OperationalError
from kombu.messaging import Producer

from inbox._amqp.connections import confirming_connection
from inbox.broker._observe import traced_publish
from inbox.errors import ConfigurationError, PublishError
from inbox.message import Message
from inbox.outbox._arguments import outgoing

__all__ = ["Publisher"]

_PERSISTENT: Final = 2
_RETRY_POLICY: Final = {"max_retries": 3, "interval_start": 0.2, "interval_step": 0.5}


class Publisher:
    """Publish persistent, confirmed messages with UUIDv7 ids. One per thread.

    Every failure to publish raises :class:`inbox.PublishError`: the broker unreachable
    (after a few reconnects), the message nacked, an exchange that does not exist, or (on
    RabbitMQ) no queue bound for the routing key. Publishing the same message again is safe.

    ``broker`` is a URL or a kombu ``Connection`` (cloned; the publisher owns the clone and
    closes it in :meth:`close`). ``exchange`` and ``routing_key`` are the defaults for
    :meth:`publish`: with the default exchange (``""``) the routing key is the queue name.
    """

    def __init__(
        self,
        broker: str | Connection,
        *,
        exchange: str = "",
        routing_key: str | None = None,
        confirm_timeout: float = 30.0,
    ) -> None:
        if not isinstance(exchange, str):
            raise ConfigurationError(f"exchange must be a str, got {type(exchange).__name__}")
        if confirm_timeout <= 0:
            raise ConfigurationError(f"confirm_timeout must be positive, got {confirm_timeout}")
        self.connection = confirming_connection(broker)
        self.exchange = exchange
        self.routing_key = routing_key
        self.confirm_timeout = confirm_timeout
        self._returned: list[str] = []
        self._producer: Producer | None = None

    def publish(
        self,
        type: str | None,
        body: object,
        *,
        routing_key: str | None = None,
        exchange: str | None = None,
        idempotency_key: str | None = None,
        headers: Mapping[str, Any] | None = None,
        message_id: uuid.UUID | str | None = None,
        content_type: str | None = None,
    ) -> uuid.UUID:
        """Publish one message and return its id once the broker confirmed it.

        ``body`` is sent as JSON, or as ``application/octet-stream`` when it is ``bytes``;
        with ``content_type`` it must be ``bytes`` or ``str``. ``idempotency_key`` goes in the
        ``idempotency-key`` header: re-sends of one business operation with fresh ids are then
        deduplicated too. ``message_id`` re-sends a message under the id it already has.
        An argument that cannot be sent raises :class:`inbox.InvalidMessage` (also a
        ``TypeError`` for a wrong type) before anything is sent: the rules of
        :meth:`inbox.Outbox.publish`, checked in one place (``inbox.outbox._arguments``).
        """
        message = outgoing(
            type,
            body,
            routing_key=self.routing_key if routing_key is None else routing_key,
            exchange=self.exchange if exchange is None else exchange,
            idempotency_key=idempotency_key,
            headers=headers,
            message_id=message_id,
            content_type=content_type,
        )
        chosen_id = message.id
        merged = message.headers
        system = "rabbitmq" if self.connection.transport.driver_type == "amqp" else "kombu"
        with traced_publish(
            system, message.exchange or message.routing_key, str(chosen_id), merged
        ):
            self._send(
                message.body,
                routing_key=message.routing_key,
                exchange=message.exchange,
                content_type=message.content_type,
                content_encoding=message.content_encoding,
                headers=merged,
                message_id=str(chosen_id),
                type=message.type,
            )
        return chosen_id

    def publish_message(
        self, message: Message, *, routing_key: str | None = None, exchange: str | None = None
    ) -> None:
        """Publish an existing :class:`inbox.Message` under its own id (a re-send)."""
        if not isinstance(message, Message):
            raise ConfigurationError(
                f"publish_message() takes an inbox.Message, got {_name(message)}"
            )
        self.publish(
            message.type,
            message.body,
            routing_key=routing_key,
            exchange=exchange,
            headers=message.headers,
            message_id=message.id,
        )

    def close(self) -> None:
        """Close the publisher's connection."""
        self._producer = None
        self.connection.release()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _send(self, data: bytes, *, routing_key: str, exchange: str, **properties: Any) -> None:
        producer = self._producer
        if producer is None:
            producer = Producer(self.connection, on_return=self._on_return)
            self._producer = producer
        message_id = properties["message_id"]
        self._returned.clear()
        try:
            producer.publish(
                data,
                routing_key=routing_key,
                exchange=Exchange(exchange) if exchange else "",
                delivery_mode=_PERSISTENT,
                mandatory=True,
                retry=True,
                retry_policy=_RETRY_POLICY,
                confirm_timeout=self.confirm_timeout,
                **properties,
            )
        except MessageNacked as exc:
            raise PublishError(f"the broker refused (nacked) message {message_id}") from exc
        except OperationalError as exc:
            # kombu counts a nack as recoverable: it reconnects, re-sends, then gives up.
            if isinstance(exc.__cause__ or exc.__context__, MessageNacked):
                raise PublishError(f"the broker refused (nacked) message {message_id}") from exc
            raise PublishError(f"could not publish message {message_id}: {exc}") from exc
        except (AMQPChannelError, KombuChannelError) as exc:
            raise PublishError(f"the broker refused message {message_id}: {exc}") from exc
        if self._returned:
            raise PublishError(
                f"message {message_id} was not routed to any queue "
                f"(exchange {exchange!r}, routing key {routing_key!r}): {self._returned[0]}"
            )

    def _on_return(self, exc: BaseException, exchange: str, routing_key: str, message: Any) -> None:
        self._returned.append(str(exc))


def _name(value: object) -> str:
    return type(value).__name__
