"""The broker edge: a kombu worker that feeds deliveries to ``Inbox.process`` and acks after
commit, its retry and dead-letter policy, and a publisher that stamps UUIDv7 ids."""

from inbox.broker.codec import InvalidReason
from inbox.broker.publisher import Publisher
from inbox.broker.topology import QueueTopology, QueueType, RetryPolicy
from inbox.broker.worker import Worker, WorkerStats, install_signal_handlers

__all__ = [
    "InvalidReason",
    "Publisher",
    "QueueTopology",
    "QueueType",
    "RetryPolicy",
    "Worker",
    "WorkerStats",
    "install_signal_handlers",
]
