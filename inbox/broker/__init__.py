"""The broker edge: a kombu worker that feeds deliveries to ``Inbox.process`` and acks after
commit, its retry and dead-letter policy, a publisher that stamps UUIDv7 ids, and the outbox
relay."""

from inbox.broker.publisher import Publisher
from inbox.broker.worker import Worker, WorkerStats, install_signal_handlers
from inbox.delivery._policy import DeadLetterReason
from inbox.delivery.topology import QueueTopology, QueueType, RetryPolicy
from inbox.errors import PublishError
from inbox.outbox.relay import OutboxStatus, Relay, RelayStats, outbox_status

__all__ = [
    "DeadLetterReason",
    "OutboxStatus",
    "PublishError",
    "Publisher",
    "QueueTopology",
    "QueueType",
    "Relay",
    "RelayStats",
    "RetryPolicy",
    "Worker",
    "WorkerStats",
    "install_signal_handlers",
    "outbox_status",
]
