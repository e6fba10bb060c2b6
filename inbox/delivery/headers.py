"""The headers the worker writes on retried and dead-lettered deliveries.

Every header keeps the delivery's own headers and adds these (``x-inbox-`` prefix), so a
dead letter says why it is there and can be re-published as it is once the cause is fixed.
"""

from __future__ import annotations

import datetime as dt
import re
import uuid
from collections.abc import Iterable, Mapping
from typing import Any, Final

from inbox._oneline import bounded, describe_error

__all__ = [
    "CAUSATION_ID",
    "CLAIM_KEYS",
    "CONVERSATION_ID",
    "DEAD_LETTERED_AT",
    "EDITED_AT",
    "EDITED_BEFORE",
    "EDITED_BY",
    "ERROR",
    "ERROR_FRAME",
    "FAILED_HANDLERS",
    "FIRST_FAILURE",
    "LAST_FAILURE",
    "ORIGINAL_FIRST_FAILURE",
    "REASON",
    "SOURCE_QUEUE",
    "TRIES",
]

TRIES: Final = "x-inbox-tries"
"""Attempts that failed so far (an int); absent on a delivery that never failed."""
FIRST_FAILURE: Final = "x-inbox-first-failure"
"""UTC time of the first failed attempt, ISO 8601."""
LAST_FAILURE: Final = "x-inbox-last-failure"
"""UTC time of the latest failed attempt, ISO 8601."""
ERROR: Final = "x-inbox-error"
"""The latest failure: exception type and the first line of its message, one line of at most
1,000 characters; never SQL text or bound parameters."""
ERROR_FRAME: Final = "x-inbox-error-frame"
"""On a dead letter after a handler failed for good: where in the application's own code
each failed handler's exception happened, ``handler@module:function:line`` (the innermost
frame of the traceback not in the inbox, an installed package or the standard library),
joined by ``; ``, at most 500 characters; absent when no frame was the application's. The
failure groups (``inbox dlq groups``, the console) tell failures apart by it."""
FAILED_HANDLERS: Final = "x-inbox-failed-handlers"
"""Names of the handlers that failed on the latest attempt, comma-separated."""
CLAIM_KEYS: Final = "x-inbox-claim-keys"
"""On a dead letter: the key each of the message's handlers claims under where it is not the
message id (a handler with ``key=``, or a producer's ``idempotency-key``), as
``handler=KEY`` pairs (``KEY`` a UUID) joined by commas; absent when every handler claims
under the message id. ``inbox show`` and the console find the claims by it."""
REASON: Final = "x-inbox-reason"
"""On a dead letter: why it was dead-lettered (an :class:`inbox.broker.DeadLetterReason`)."""
SOURCE_QUEUE: Final = "x-inbox-queue"
"""On a dead letter: the queue it was consumed from."""
DEAD_LETTERED_AT: Final = "x-inbox-dead-lettered-at"
"""On a dead letter: UTC time it was dead-lettered, ISO 8601."""
ORIGINAL_FIRST_FAILURE: Final = "x-inbox-original-first-failure"
"""On a replayed message: UTC time of the first failure of its first delivery, ISO 8601.
A replay removes the failure headers (the tries start again) but writes this one, the
earliest time it knows, and nothing removes it: the retention guard dates a dead letter by
it however often it was replayed (:mod:`inbox.operations._dead_letter_age`)."""
EDITED_AT: Final = "x-inbox-edited-at"
"""On a dead letter replayed after a person edited it (the console's edit and replay): UTC
time of the edit, ISO 8601."""
EDITED_BY: Final = "x-inbox-edited-by"
"""On an edited replay: who edited it (the console's user)."""
EDITED_BEFORE: Final = "x-inbox-edited-before"
"""On an edited replay: ``sha256:<hex>`` of the body and headers before the edit. The
original itself is kept in the dead-letter archive (its id in the console's audit line,
which also shows the before and after, each cut to 200 characters)."""
CAUSATION_ID: Final = "x-inbox-causation-id"
"""On a message sent from a handler (``Outbox.publish`` in its transaction): the id of the
message the handler was running on, the message that caused this one."""
CONVERSATION_ID: Final = "x-inbox-conversation-id"
"""On a message sent from a handler: the conversation's correlation id, the same on every
message of one chain: the incoming message's own ``x-inbox-conversation-id``, or, when it
has none (it began the conversation), its id."""

_MAX_ERROR_CHARS: Final = 1000
_MAX_TRIES_HEADER: Final = 2**31 - 1  # a signed 32-bit AMQP field: room to add one


def now_utc() -> str:
    """The current UTC time as ISO 8601, the format of every time header."""
    return dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds")


def tries_so_far(headers: Mapping[str, Any]) -> int:
    """The failed attempts recorded on a delivery (0 when the header is absent or garbled)."""
    value = headers.get(TRIES)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < _MAX_TRIES_HEADER:
        return 0  # absent, or not written by a worker: count from here
    return value


def failure_headers(
    headers: Mapping[str, Any], tries: int, error: str, failed_handlers: Iterable[str]
) -> dict[str, Any]:
    """The bookkeeping headers after failed attempt number ``tries``."""
    now = now_utc()
    first = headers.get(FIRST_FAILURE)
    return {
        TRIES: tries,
        FIRST_FAILURE: first if isinstance(first, str) and tries > 1 else now,
        LAST_FAILURE: now,
        ERROR: truncate(error),
        FAILED_HANDLERS: ",".join(failed_handlers),
    }


def claim_keys_value(keys: Iterable[tuple[str, uuid.UUID]]) -> str:
    """The :data:`CLAIM_KEYS` header of (handler, key) pairs."""
    return ",".join(f"{handler}={key}" for handler, key in keys)


_CLAIM_KEY: Final = re.compile(
    r"(.+?)=([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})(?:,|$)"
)


def parse_claim_keys(value: object) -> dict[str, uuid.UUID]:
    """The (handler, key) pairs of a :data:`CLAIM_KEYS` header; what does not parse is left
    out (a header not written by a worker). A handler name may hold commas: a key ends each."""
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    if not isinstance(value, str):
        return {}
    return {m.group(1): uuid.UUID(m.group(2)) for m in _CLAIM_KEY.finditer(value)}


def describe(exc: BaseException) -> str:
    """``ExceptionType: first line of the message``, the form every error header uses: one
    line, and for a database error the driver's message without SQL or bound parameters."""
    return describe_error(exc)


def truncate(text: str) -> str:
    """``text`` on one line, cut to the length a header carries, marking the cut."""
    return bounded(text, _MAX_ERROR_CHARS)


def parse_time(value: object) -> dt.datetime | None:
    """A time header's value as an aware datetime (UTC when it names no zone), or None when
    it is absent or not a time."""
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    if not isinstance(value, str):
        return None
    try:
        at = dt.datetime.fromisoformat(value)
    except ValueError:
        return None
    return at if at.tzinfo is not None else at.replace(tzinfo=dt.UTC)


def earliest_failure(headers: Mapping[str, Any]) -> dt.datetime | None:
    """The earliest failure the headers of a dead letter (or a replayed copy) record: the
    first failure of its first delivery, else of this one, else when it was dead-lettered."""
    times = [parse_time(headers.get(n)) for n in (ORIGINAL_FIRST_FAILURE, FIRST_FAILURE)]
    times.append(parse_time(headers.get(DEAD_LETTERED_AT)))
    return min((t for t in times if t is not None), default=None)
