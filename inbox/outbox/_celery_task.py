"""A Celery task call as the message Celery's own producer sends (task protocol 2), made
without importing Celery: what :meth:`inbox.Outbox.send_task` stores for the relay.

The layout follows ``celery.app.amqp.AMQP.as_task_v2``: the headers name the task, its id
(also the root id of a task sent from outside any task), its ETA and expiry as ISO 8601,
the retries so far (0), the time limits, the origin and the arguments' reprs; the body is
the JSON ``[args, kwargs, {"callbacks", "errbacks", "chain", "chord"}]``.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import socket
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from inbox.errors import InvalidMessage
from inbox.outbox._arguments import InvalidArgumentType
from inbox.outbox._row import PROPERTY_HEADERS

__all__ = ["TaskMessage", "task_message"]

_REPR_MAX: Final = 1024  # Celery's argsrepr_maxsize and kwargsrepr_maxsize
_CORRELATION_ID, _REPLY_TO = PROPERTY_HEADERS  # the relay sends them as AMQP properties
_SHORTSTR_MAX: Final = 255


@dataclass(frozen=True, slots=True)
class TaskMessage:
    """A task call ready for the outbox: its headers and its JSON body."""

    headers: dict[str, Any]
    body: str


def task_message(
    task_id: uuid.UUID,
    name: str,
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    *,
    eta: dt.datetime | None,
    expires: dt.datetime | None,
    time_limit: float | None,
    soft_time_limit: float | None,
    reply_to: str | None = None,
) -> TaskMessage:
    """The protocol-2 message of the call ``name(*args, **kwargs)`` with id ``task_id``; its
    AMQP ``correlation_id`` is the task id and ``reply_to`` the queue named, as Celery's
    producer sets them (what the ``rpc://`` result backend replies to and matches on)."""
    if reply_to is not None and (
        not isinstance(reply_to, str)
        or not reply_to
        or len(reply_to.encode("utf-8")) > _SHORTSTR_MAX
    ):
        raise InvalidMessage(
            f"reply_to must be a queue name (a non-empty str of at most {_SHORTSTR_MAX} "
            f"bytes), got {reply_to!r}"
        )
    if not isinstance(args, list | tuple):
        raise InvalidArgumentType(f"task args must be a list or tuple, got {type(args).__name__}")
    if not isinstance(kwargs, Mapping):
        raise InvalidArgumentType(f"task kwargs must be a mapping, got {type(kwargs).__name__}")
    for label, when in (("eta", eta), ("expires", expires)):
        if when is not None and (not isinstance(when, dt.datetime) or when.tzinfo is None):
            raise InvalidMessage(f"{label} must be a timezone-aware datetime, got {when!r}")
    embed = {"callbacks": None, "errbacks": None, "chain": None, "chord": None}
    try:
        body = json.dumps([list(args), dict(kwargs), embed], allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InvalidArgumentType(f"task arguments must be JSON: {exc}") from exc
    task = str(task_id)
    headers: dict[str, Any] = {
        "lang": "py",
        "task": name,
        "id": task,
        "root_id": task,
        "retries": 0,
        "timelimit": [time_limit, soft_time_limit],
        "argsrepr": repr(tuple(args))[:_REPR_MAX],
        "kwargsrepr": repr(dict(kwargs))[:_REPR_MAX],
        "origin": f"gen{os.getpid()}@{socket.gethostname()}",
        "ignore_result": False,
        "replaced_task_nesting": 0,
        _CORRELATION_ID: task,
    }
    if reply_to is not None:
        headers[_REPLY_TO] = reply_to
    if eta is not None:
        headers["eta"] = eta.isoformat()
    if expires is not None:
        headers["expires"] = expires.isoformat()
    return TaskMessage(headers, body)
