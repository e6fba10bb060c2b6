"""A task that failed for good becomes a dead letter, through the shell every edge shares."""

from __future__ import annotations

import logging
from typing import Any, Final

from celery.exceptions import Ignore, Reject, Retry

from inbox.celery._outage import wait_for_database
from inbox.celery._transport import CeleryTransport
from inbox.delivery import headers as h
from inbox.delivery._settling import Settling
from inbox.delivery._stats import WorkerStats
from inbox.delivery.topology import RetryPolicy
from inbox.delivery.transport import deliver
from inbox.message import Message
from inbox.result import ProcessResult

__all__ = ["CELERY_CONTROL", "settle_failure"]

logger = logging.getLogger("inbox.celery")

CELERY_CONTROL: Final = (Retry, Ignore, Reject)
"""Exceptions a task raises to steer Celery (retry, ignore, reject): passed on untouched."""

# Celery retries (self.retry(), autoretry_for): the shell sees a task only once it failed
# for good, so it must not retry it again.
_NO_RETRIES: Final = RetryPolicy(delays=(), max_tries=1)


def settle_failure(task: Any, message: Message, failure: BaseException) -> None:
    """Hand a task that failed for good (``failure``: what the inbox raised) to the shell:
    a dead letter on ``<queue>.dlq`` with the inbox's reason headers, or, for a
    configuration error, the delivery sent again later (:func:`wait_for_database`).
    Nothing happens in eager mode or for a direct call (no broker message)."""
    request = task.request
    if request.is_eager or request.id is None or request.called_directly:
        return
    transport = CeleryTransport(task, request, str(message.id))

    def failed(_: Message) -> ProcessResult:
        raise failure

    settling = Settling(WorkerStats(), _NO_RETRIES, logger)
    deliver(transport, request, settling, failed, default_content_type=None)
    if transport.given_back:  # a configuration error: sent again later, not at once
        wait_for_database(task, failure, f"fix the configuration ({h.describe(failure)})")
