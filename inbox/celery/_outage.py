"""An inbox task whose database is unusable waits for it: never lost, never looping.

When the inbox's database cannot be used (its tables missing or at an older revision, the
server unreachable, a session the inbox cannot own), rejecting the task back to its queue
would bring it back at once, forever. Instead the task is not run: it is sent again under
the same task id with a countdown that doubles on each wait (1 s, 2 s, 4 s... at most
:data:`LONGEST_WAIT`, or half the Redis ``visibility_timeout``), carrying the number of
waits in the header :data:`OUTAGE_WAITS`, and the delivery in hand is acked once the broker
took the new one. Celery's ``retries`` is left as it was: a wait is not one of the task's
``max_retries``. Each wait logs one error line on ``inbox.celery`` naming the task, the
error and the fix, and counts an ``inbox.retries`` with the reason
:data:`DATABASE_UNUSABLE`. When the database answers, the task runs once (a second copy,
sent by a wait whose worker died before its ack, is a duplicate of the same claim).
"""

from __future__ import annotations

import logging
from typing import Any, Final, NoReturn

from celery.exceptions import Ignore, Reject
from sqlalchemy.exc import DBAPIError

from inbox._backends import is_missing_table
from inbox.celery._settings import REDIS_DEFAULT_VISIBILITY_TIMEOUT, driver
from inbox.core._startup import MIGRATE_HINT, SchemaNotReady, server_unreachable
from inbox.delivery import headers as h
from inbox.errors import SETUP_ERRORS, HandlerFailed
from inbox.telemetry import record_decision

__all__ = [
    "DATABASE_UNUSABLE",
    "FIRST_WAIT",
    "LONGEST_WAIT",
    "OUTAGE_WAITS",
    "database_unusable",
    "wait_for_database",
]

logger = logging.getLogger("inbox.celery")

OUTAGE_WAITS: Final = "x-inbox-outage-waits"
"""The header counting the times a task was sent again because its database was unusable."""
DATABASE_UNUSABLE: Final = "database-unusable"
"""The reason recorded with the ``retry`` decision of such a wait."""
FIRST_WAIT: Final = 1.0
"""Seconds before the first new delivery; each further wait doubles it."""
LONGEST_WAIT: Final = 300.0
"""The longest wait, in seconds: a task whose database stays unusable comes back this often."""

_CHAIN_DEPTH: Final = 8  # causes and contexts followed when reading an error


def database_unusable(error: BaseException) -> str | None:
    """When ``error`` (or a handler failure in it, or an error it was raised from) says the
    database cannot be used at all, whatever the task: the fix to name, else None."""
    for seen in _errors(error):
        if isinstance(seen, SchemaNotReady):
            return str(seen)
        if isinstance(seen, SETUP_ERRORS):
            return f"fix the inbox's session factory ({seen})"
        if isinstance(seen, DBAPIError) and is_missing_table(seen.orig):
            return MIGRATE_HINT + " (or create the table your task's body uses)"
        if isinstance(seen, DBAPIError) and server_unreachable(seen):
            return "check the database URL and that the database server is up"
    return None


def wait_for_database(task: Any, error: BaseException, fix: str) -> NoReturn:
    """Send ``task``'s delivery again later (see the module's docstring) and leave it with
    Celery's :class:`~celery.exceptions.Ignore` (acked, no state stored). In eager mode, or
    for a direct call, there is no delivery: ``error`` is raised. When the broker does not
    take the new delivery, the one in hand is rejected back to its queue (never lost)."""
    request = task.request
    if request.is_eager or request.id is None or request.called_directly:
        raise error
    headers = dict(request.headers or {})
    waits = _waits(request, headers)
    countdown = min(FIRST_WAIT * 2**waits, _longest_wait(task.app))
    queue = (request.delivery_info or {}).get("routing_key") or task.app.conf.task_default_queue
    logger.error(
        "inbox task %r [%s]: its database is unusable (%s); not run, sent again in %g s "
        "(wait %d); fix: %s",
        task.name,
        request.id,
        h.describe(error),
        countdown,
        waits + 1,
        fix,
    )
    try:
        again = task.signature_from_request(request, headers={**headers, OUTAGE_WAITS: waits + 1})
        again.apply_async(countdown=countdown)
    except Exception as exc:
        logger.error(
            "inbox task %r [%s]: could not send it again (%r); given back to its queue",
            task.name,
            request.id,
            exc,
        )
        raise Reject(exc, requeue=True) from None
    record_decision(
        "retry",
        handler=task.name,
        destination=str(queue),
        message_id=str(request.id),
        reason=DATABASE_UNUSABLE,
        tries=waits + 1,
    )
    raise Ignore()


def _longest_wait(app: Any) -> float:
    """:data:`LONGEST_WAIT`, or on Redis half the ``visibility_timeout`` when that is
    shorter: a delayed task held longer than the timeout would be delivered a second time
    while it waits (and each copy would send another)."""
    if driver(app) != "redis":
        return LONGEST_WAIT
    options = app.conf.broker_transport_options or {}
    visibility = float(options.get("visibility_timeout", REDIS_DEFAULT_VISIBILITY_TIMEOUT))
    return max(FIRST_WAIT, min(LONGEST_WAIT, visibility / 2))


def _waits(request: Any, headers: dict[str, Any]) -> int:
    """The waits so far: the header, as Celery hands it over (an attribute of the request,
    or in its headers)."""
    value = headers.get(OUTAGE_WAITS, getattr(request, OUTAGE_WAITS.replace("-", "_"), None))
    if value is None:
        value = getattr(request, OUTAGE_WAITS, None)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def _errors(error: BaseException) -> list[BaseException]:
    found: list[BaseException] = []
    pending: list[BaseException] = [error]
    while pending and len(found) < _CHAIN_DEPTH * 4:
        seen = pending.pop(0)
        if any(seen is other for other in found):
            continue
        found.append(seen)
        if isinstance(seen, HandlerFailed):
            pending.extend(seen.failures.values())
        for linked in (seen.__cause__, seen.__context__):
            if linked is not None:
                pending.append(linked)
    return found
