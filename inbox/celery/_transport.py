"""The Celery edge's :class:`~inbox.delivery.transport.Transport`: what the shell needs to
dead-letter a task message from inside the task, with no policy of its own.

Celery owns the delivery (its worker acks it when the task returns, its ``retry()`` sends
the retries), so the transport is used once a task has failed for good: the shell
(:func:`~inbox.delivery.transport.deliver`) decides with no retries of its own and, for a
dead letter, copies the task message to ``<queue>.dlq`` with the inbox's headers, confirmed.
The copy is the task's protocol-2 message rebuilt from its request (``app.amqp.as_task_v2``),
so ``inbox dlq replay`` sends back a message a plain Celery worker runs.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kombu.connection import Connection
from kombu.entity import Queue
from kombu.utils.json import dumps

from inbox.delivery import headers as h
from inbox.delivery.transport import CopyRefused, Inbound
from inbox.telemetry import record_decision

__all__ = ["CeleryTransport", "publish_copy"]

JSON = "application/json"


class CeleryTransport:
    """The transport of one task delivery (``task.request``, in the worker's pool child)."""

    def __init__(self, task: Any, request: Any, message_id: str) -> None:
        self._task = task
        self._message_id = message_id
        routing = (request.delivery_info or {}).get("routing_key")
        self.queue: str = routing or task.app.conf.task_default_queue
        self.dead_letters = f"{self.queue}.dlq"
        self.given_back = False
        """Set when the shell gave the delivery back: the task then rejects it, requeued."""

    def read(self, request: Any) -> Inbound:
        """The task message as Celery's own producer would write it for this request."""
        limits = request.timelimit or (None, None)
        sent = self._task.app.amqp.as_task_v2(
            request.id,
            self._task.name,
            args=request.args,
            kwargs=request.kwargs,
            group_id=request.group,
            group_index=request.group_index,
            retries=request.retries or 0,
            chord=request.chord,
            callbacks=request.callbacks,
            errbacks=request.errbacks,
            chain=request.chain,
            reply_to=request.reply_to,
            time_limit=limits[0],
            soft_time_limit=limits[1],
            root_id=request.root_id,
            parent_id=request.parent_id,
            origin=request.origin,
            ignore_result=bool(request.ignore_result),
        )
        headers = {k: v for k, v in sent.headers.items() if v is not None}
        if request.retries:  # Celery's retries so far are the failed tries so far
            headers[h.TRIES] = request.retries
        body = dumps(sent.body).encode("utf-8")
        return Inbound(self._message_id, self._task.name, headers, body, JSON, "utf-8")

    def retry_route(self, delay_ms: int) -> tuple[str, float]:
        """Unused (Celery retries the task itself): the consumed queue, held."""
        return self.queue, delay_ms / 1000

    def ack(self, request: Any) -> bool:
        """Nothing to do: Celery acks the message when the task returns (``acks_late``)."""
        return True

    def give_back(self, request: Any) -> bool:
        """Mark the delivery to be rejected with requeue when the task returns."""
        self.given_back = True
        return True

    def copy(self, request: Any, target: str, headers: Mapping[str, Any], *, delay_ms: int) -> None:
        """Publish the task message to ``target`` with ``headers``, confirmed by the broker."""
        inbound = self.read(request)
        publish_copy(self._task.app, target, inbound.data, headers, JSON, "utf-8", request.id)
        if target == self.dead_letters:  # counted once the broker took it
            tries = headers.get(h.TRIES)
            record_decision(
                "dead-letter",
                handler=self._task.name,
                destination=self.queue,
                message_id=self._message_id,
                reason=str(headers.get(h.REASON, "")),
                tries=tries if isinstance(tries, int) else None,
            )

    def fits(self, request: Any, headers: Mapping[str, Any]) -> bool:
        """Celery's own messages carry these headers already: no limit is checked here."""
        return True

    def settleable(self, request: Any) -> bool:
        """The delivery stays Celery's until the task returns."""
        return True

    def stop(self, error: BaseException) -> None:
        """Nothing to stop from a task: the delivery was given back (the log says why)."""


def publish_copy(  # noqa: PLR0917 (one publish: the message's parts)
    app: Any,
    target: str,
    body: bytes,
    headers: Mapping[str, Any],
    content_type: str | None,
    content_encoding: str | None,
    correlation_id: str | None,
) -> None:
    """Publish ``body`` as it is to queue ``target`` (declared durable) with ``headers``, on
    a connection of its own to ``app``'s broker, confirmed (RabbitMQ's publisher confirms;
    Redis answers each push); :class:`CopyRefused` when the broker does not take it."""
    options = {**(app.conf.broker_transport_options or {}), "confirm_publish": True}
    try:
        with Connection(app.conf.broker_url, transport_options=options) as connection:
            connection.Producer().publish(
                body,
                exchange="",
                routing_key=target,
                headers=dict(headers),
                correlation_id=correlation_id,
                content_type=content_type or "application/data",
                content_encoding=content_encoding or "binary",
                delivery_mode=2,
                declare=[Queue(target, routing_key=target, durable=True)],
                retry=True,
                retry_policy={"max_retries": 3},
            )
    except Exception as exc:
        raise CopyRefused(f"copy to {target!r} not taken: {exc!r}") from exc
