"""Running a worker until it is idle, and removing its queues: for the demo and for tests.

Not part of the production API: a production worker runs until it is told to stop, and its
queues outlive it.
"""

from __future__ import annotations

from inbox.broker.worker import Worker
from inbox.errors import ConfigurationError

__all__ = ["delete_queues", "run_until_idle"]


def run_until_idle(worker: Worker, idle_timeout: float) -> None:
    """Run ``worker`` until no delivery arrived for ``idle_timeout`` seconds and it holds no
    retry, then stop it cleanly."""
    if idle_timeout <= 0:
        raise ConfigurationError(f"idle_timeout must be positive, got {idle_timeout}")
    worker._idle_timeout = idle_timeout
    try:
        worker.run()
    finally:
        worker._idle_timeout = None


def delete_queues(worker: Worker) -> None:
    """Delete every queue ``worker`` declares, messages and dead letters included."""
    with worker.connection.clone() as connection, connection.channel() as channel:
        for topology in worker.topologies:
            for queue in topology.queues():
                channel.queue_delete(queue.name)
