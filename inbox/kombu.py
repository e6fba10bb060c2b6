"""The kombu broker edge under the name the architecture gives it; see :mod:`inbox.broker`."""

from inbox.broker import (
    InvalidReason,
    Publisher,
    QueueTopology,
    QueueType,
    RetryPolicy,
    Worker,
    WorkerStats,
    install_signal_handlers,
)

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
