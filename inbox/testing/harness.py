"""``WorkerHarness``: an inbox's real worker on kombu's in-memory broker, for testing retries
and dead letters without RabbitMQ.

The worker is :class:`inbox.broker.Worker` itself, run until it has been idle for a moment;
on ``memory://`` it holds retries in the process instead of in delayed queues (see
docs/worker.md), so the tries, their order and the dead letters are the production ones.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from queue import Empty
from types import TracebackType
from typing import Any, Self

from kombu.connection import Connection

from inbox.broker import Publisher, RetryPolicy, Worker, WorkerStats
from inbox.broker._idle import delete_queues, run_until_idle
from inbox.core import Inbox
from inbox.delivery import headers as h
from inbox.delivery.codec import decode_body

__all__ = ["DeadLetterCopy", "WorkerHarness"]

MEMORY_BROKER = "memory://"
QUICK_RETRIES = RetryPolicy((0.02, 0.05), max_tries=3)
"""The harness's default: three tries, a few hundredths of a second apart."""


@dataclass(frozen=True)
class DeadLetterCopy:
    """A delivery the worker sent to the dead-letter queue, as it lies there."""

    message_id: str | None
    type: str | None
    body: object
    headers: Mapping[str, Any]

    @property
    def reason(self) -> str | None:
        """``x-inbox-reason``: why it was dead-lettered (``handler-failed``, ...)."""
        reason = self.headers.get(h.REASON)
        return None if reason is None else str(reason)

    @property
    def error(self) -> str | None:
        """``x-inbox-error``: the last failure, one line."""
        error = self.headers.get(h.ERROR)
        return None if error is None else str(error)

    @property
    def tries(self) -> int | None:
        """``x-inbox-tries``: the failed tries, when it was dead-lettered after trying."""
        tries = self.headers.get(h.TRIES)
        return None if tries is None else int(tries)


class WorkerHarness:
    """A :class:`~inbox.broker.Worker` for ``inbox`` on a queue of its own on the in-memory
    broker: :meth:`publish` messages, :meth:`run` the worker until it is idle, then read
    :attr:`stats` and :meth:`dead_letters`. Use it as a context manager (or call
    :meth:`close`) to delete its queues.

    ``retry`` defaults to :data:`QUICK_RETRIES`; ``batch_size`` > 1 processes the deliveries
    at hand through ``process_batch``; ``idle_timeout`` is how long the worker must see
    nothing before :meth:`run` returns.
    """

    def __init__(
        self,
        inbox: Inbox,
        *,
        retry: RetryPolicy = QUICK_RETRIES,
        batch_size: int = 1,
        idle_timeout: float = 0.3,
    ) -> None:
        self.queue = f"inbox-testing-{uuid.uuid4().hex[:12]}"
        self.idle_timeout = idle_timeout
        self.worker = Worker(
            inbox,
            MEMORY_BROKER,
            [self.queue],
            retry=retry,
            batch_size=batch_size,
            prefetch=max(10, batch_size),
            stats_interval=None,
        )
        self.worker.prepare()

    @property
    def stats(self) -> WorkerStats:
        """The worker's counters so far (deliveries, acked, retried, dead-lettered...)."""
        return self.worker.stats

    def publish(
        self,
        type: str | None,
        body: object,
        *,
        idempotency_key: str | None = None,
        headers: Mapping[str, Any] | None = None,
        message_id: uuid.UUID | str | None = None,
        content_type: str | None = None,
    ) -> uuid.UUID:
        """Publish a message to the harness's queue with :class:`~inbox.broker.Publisher`,
        as a producer would (a dataclass or pydantic body goes as its JSON values); return
        its id."""
        with Publisher(MEMORY_BROKER, routing_key=self.queue) as publisher:
            return publisher.publish(
                type,
                body,
                idempotency_key=idempotency_key,
                headers=headers,
                message_id=message_id,
                content_type=content_type,
            )

    def run(self) -> WorkerStats:
        """Run the worker until it saw nothing for ``idle_timeout`` seconds and holds no
        retry; return its counters. A configuration error that stopped it is raised."""
        run_until_idle(self.worker, self.idle_timeout)
        return self.stats

    def dead_letters(self) -> list[DeadLetterCopy]:
        """Take every delivery out of the dead-letter queue, oldest first."""
        taken = []
        with Connection(MEMORY_BROKER) as connection:  # type: ignore[no-untyped-call]
            queue = connection.SimpleQueue(f"{self.queue}.dlq")
            try:
                while True:
                    try:
                        delivery = queue.get(timeout=0.05)
                    except Empty:
                        break
                    delivery.ack()
                    taken.append(_copy(delivery))
            finally:
                queue.close()
        return taken

    def close(self) -> None:
        """Delete the harness's queues (messages and dead letters with them)."""
        delete_queues(self.worker)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()


def _copy(delivery: Any) -> DeadLetterCopy:
    properties = delivery.properties or {}
    body = decode_body(delivery.body, delivery.content_type, delivery.content_encoding, None)
    return DeadLetterCopy(
        message_id=properties.get("message_id"),
        type=properties.get("type"),
        body=body,
        headers=dict(delivery.headers or {}),
    )
