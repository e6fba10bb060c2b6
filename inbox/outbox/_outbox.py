"""``Outbox``: publish a message as a row in the caller's own transaction."""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import Table

from inbox.core._run import CURRENT_RUN
from inbox.delivery.headers import CAUSATION_ID, CONVERSATION_ID
from inbox.errors import InvalidMessage
from inbox.message import Message, parse_message_id, uuid7
from inbox.outbox._arguments import InvalidArgumentType, outgoing
from inbox.outbox._celery_task import task_message
from inbox.outbox._mapping import record_class, resolve_outbox_table
from inbox.outbox._row import encoded_headers
from inbox.outbox._session import joined_session
from inbox.schema import DEFAULT_OUTBOX_TABLE_NAME
from inbox.telemetry import inject_context

__all__ = ["Outbox"]


class Outbox:
    """Messages that go out if and only if the transaction that publishes them commits.

    :meth:`publish` adds one row to the outbox table in the session's current transaction;
    the relay (``inbox-relay``, :class:`inbox.broker.Relay`) sends each committed row as a
    persistent, confirmed AMQP message under the row's id, then deletes it. A rolled-back
    transaction leaves no row, so nothing is sent; a row sent twice (a relay crash between
    the broker's confirm and the delete) carries the same ``message_id`` both times, which a
    consumer's inbox deduplicates.

    ``table`` is the outbox table: ``"name"``, ``"schema.name"`` or a SQLAlchemy ``Table``
    made with :func:`inbox.schema.outbox_table`. It must be in the same database as the
    writes it announces, or they do not commit together.
    """

    def __init__(self, table: str | Table = DEFAULT_OUTBOX_TABLE_NAME) -> None:
        self.table: Table = resolve_outbox_table(table)
        self._record = record_class(self.table)

    def publish(
        self,
        session: Any,
        type: str,
        body: object,
        *,
        routing_key: str,
        exchange: str = "",
        idempotency_key: str | None = None,
        headers: Mapping[str, Any] | None = None,
        message_id: uuid.UUID | str | None = None,
        content_type: str | None = None,
    ) -> uuid.UUID:
        """Add the message to ``session``'s current transaction; return its id.

        The row is written with the session's next flush (at the latest, its commit), on
        the session's connection: the message is sent only if that transaction commits.
        Nothing is committed, flushed or begun here; ``session`` is a ``Session``, an
        ``AsyncSession`` (no ``await`` needed) or a scoped session of either.

        The arguments follow :meth:`inbox.broker.Publisher.publish`: ``body`` goes out as
        JSON, or as ``application/octet-stream`` when it is ``bytes``; with
        ``content_type`` it must be ``bytes`` or ``str``. ``idempotency_key`` becomes the
        ``idempotency-key`` header (a consumer's inbox deduplicates on it). With
        OpenTelemetry, the current trace context is stored in the headers (``traceparent``;
        one given in ``headers`` wins). Called while a handler runs (in its transaction), it
        adds ``x-inbox-causation-id`` (the id of the message the handler runs on) and
        ``x-inbox-conversation-id`` (that message's own, else its id): see
        :data:`inbox.delivery.headers.CAUSATION_ID`; one given in ``headers`` wins.
        ``message_id`` (default: a new UUIDv7) must not be in the outbox already: the flush
        would fail with an ``IntegrityError``.

        Raises :class:`~inbox.InvalidMessage` for an argument that cannot be sent (an empty
        type, an id that is no UUID, a body that does not encode, a header AMQP cannot
        carry, an empty ``idempotency_key``, a routing key over 255 bytes...) and
        :class:`~inbox.SessionConfigurationError` for a session in autocommit mode, with no
        bind for the outbox table, or with ``autobegin=False`` and no transaction, in both
        cases before anything is written.
        """
        if not isinstance(type, str) or not type:
            got = "an empty str" if isinstance(type, str) else _name(type)
            raise InvalidArgumentType(
                f"an outbox message needs a type (a non-empty str), got {got}"
            )
        if not isinstance(routing_key, str):
            raise InvalidArgumentType(f"routing_key must be a str, got {_name(routing_key)}")
        message = outgoing(
            type,
            body,
            routing_key=routing_key,
            exchange=exchange,
            idempotency_key=idempotency_key,
            headers=headers,
            message_id=message_id,
            content_type=content_type,
        )
        run = CURRENT_RUN.get()
        if run is not None:  # sent from a handler: which message caused it, in which chain
            # Operators and attribute reads rather than calls: this is every handler's publish.
            cause = str(run.message_id)
            given = run.message_headers
            conversation = None
            if CONVERSATION_ID in given:
                conversation = given[CONVERSATION_ID]
            if conversation.__class__ is not str or not conversation:
                conversation = cause  # it began the conversation (or sent no usable one)
            headers = message.headers
            if CAUSATION_ID not in headers:  # one given in ``headers`` wins
                headers[CAUSATION_ID] = cause
            if CONVERSATION_ID not in headers:
                headers[CONVERSATION_ID] = conversation[:255]
        # The publishing transaction's trace continues in the consumer (a traceparent
        # given in ``headers`` wins); nothing without OpenTelemetry.
        inject_context(message.headers)
        stored_headers = encoded_headers(message.headers)
        target = joined_session(session, self._record.__mapper__)
        now = dt.datetime.now(dt.UTC)
        target.add(
            self._record(
                id=message.id,
                type=type,
                exchange=message.exchange,
                routing_key=message.routing_key,
                content_type=message.content_type,
                content_encoding=message.content_encoding,
                headers=stored_headers,
                body=message.body,
                created_at=now,
                attempts=0,
                available_at=now,
                last_error=None,
            )
        )
        return message.id

    def publish_message(
        self, session: Any, message: Message, *, routing_key: str, exchange: str = ""
    ) -> uuid.UUID:
        """Add an existing :class:`inbox.Message` under its own id (its type, body and
        headers as they are); return the id. Otherwise as :meth:`publish`."""
        if not isinstance(message, Message):
            raise InvalidArgumentType(
                f"publish_message() takes an inbox.Message, got {_name(message)}"
            )
        if message.type is None:
            raise InvalidMessage(f"message {message.id} has no type: an outbox message needs one")
        return self.publish(
            session,
            message.type,
            message.body,
            routing_key=routing_key,
            exchange=exchange,
            headers=message.headers,
            message_id=message.id,
        )

    def send_task(
        self,
        session: Any,
        name: str,
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
        *,
        queue: str = "celery",
        exchange: str = "",
        task_id: uuid.UUID | str | None = None,
        countdown: float | None = None,
        eta: dt.datetime | None = None,
        expires: float | dt.datetime | None = None,
        time_limit: float | None = None,
        soft_time_limit: float | None = None,
        reply_to: str | None = None,
    ) -> str:
        """Send the Celery task ``name(*args, **kwargs)`` if and only if ``session``'s
        transaction commits; return its task id.

        The row holds the task message Celery's own producer would send (task protocol 2,
        JSON): the relay publishes it to ``queue`` (through the default exchange, or
        ``exchange`` with ``queue`` as the routing key) after the commit, and a Celery worker
        consuming ``queue`` runs it. The task id is chosen now (``task_id``, default a new
        UUIDv7) and is the message id too, so a relay that sends a row twice sends the same
        task twice: an inbox task (:mod:`inbox.celery`) runs it once. ``countdown``
        (seconds) or ``eta`` (an aware datetime) delay it; ``expires`` (seconds or an aware
        datetime) drops it when late. The message's AMQP ``correlation_id`` is the task id;
        ``reply_to`` (for the ``rpc://`` result backend: the client app's
        ``app.thread_oid``) is the queue its result goes to. Nothing of Celery is imported.
        Raises as :meth:`publish` does; arguments must be JSON.
        """
        if countdown is not None and eta is not None:
            raise InvalidArgumentType("give countdown or eta, not both")
        now = dt.datetime.now(dt.UTC)
        if countdown is not None:
            eta = now + dt.timedelta(seconds=countdown)
        if expires is not None and not isinstance(expires, dt.datetime):
            expires = now + dt.timedelta(seconds=expires)
        if not isinstance(name, str) or not name:
            raise InvalidArgumentType(f"a task name must be a non-empty str, got {name!r}")
        message_id = uuid7() if task_id is None else parse_message_id(task_id)
        task = task_message(
            message_id,
            name,
            args,
            {} if kwargs is None else kwargs,
            eta=eta,
            expires=expires,
            time_limit=time_limit,
            soft_time_limit=soft_time_limit,
            reply_to=reply_to,
        )
        self.publish(
            session,
            name,
            task.body,
            routing_key=queue,
            exchange=exchange,
            headers=task.headers,
            message_id=message_id,
            content_type="application/json",
        )
        return str(message_id)

    def __repr__(self) -> str:
        return f"Outbox(table={self.table.fullname!r})"


def _name(value: object) -> str:
    return type(value).__name__
