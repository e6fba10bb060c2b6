"""The Celery settings an inbox task relies on, checked when a worker starts.

Each problem is one line naming the task, the setting and the fix. What they guard:

* ``acks_late``: the message is acked after the task ran, so a worker that dies mid-task
  leaves it to be delivered again (the inbox makes that second run a no-op if the first
  committed). Early acks lose the task instead.
* ``reject_on_worker_lost``: a pool child killed mid-task gives the message back instead of
  acking it as failed (which loses it when the child died before its commit).
* On Redis, a task delivered but not acked within ``visibility_timeout`` is delivered again
  while the first run may still hold its claim; the prefetched tasks a worker holds count
  toward that timeout, hence ``worker_prefetch_multiplier = 1`` and a ``time_limit`` below
  the timeout.

And the database: a worker whose inbox tables are missing, or at an older revision than this
version of the library needs, would take tasks it cannot run (each then waits for the
database: :mod:`inbox.celery._outage`); it refuses to start instead.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Final

from sqlalchemy import Engine
from sqlalchemy.exc import DBAPIError

from inbox import Inbox
from inbox.celery._results import task_result_table
from inbox.core._startup import SchemaNotReady, wait_for_schema, worker_tables

__all__ = [
    "REDIS_DEFAULT_VISIBILITY_TIMEOUT",
    "driver",
    "schema_problems",
    "setting_problems",
]

REDIS_DEFAULT_VISIBILITY_TIMEOUT: Final = 3600  # kombu's Redis transport default, seconds


def setting_problems(app: Any, tasks: Iterable[Any]) -> list[str]:
    """One line per setting of ``app`` or of one of ``tasks`` (inbox tasks) that breaks
    exactly-once; empty when all is well."""
    problems: list[str] = []
    conf = app.conf
    on_redis = driver(app) == "redis"
    visibility = float(
        (conf.broker_transport_options or {}).get(
            "visibility_timeout", REDIS_DEFAULT_VISIBILITY_TIMEOUT
        )
    )
    inbox_tasks = list(tasks)
    for task in inbox_tasks:
        name = task.name
        if not task.acks_late:
            problems.append(
                f"inbox task {name!r}: acks_late is off, so a worker lost mid-task loses the "
                "task; fix: remove acks_late=False from the task (or set task_acks_late=True)"
            )
        if not task.reject_on_worker_lost:
            problems.append(
                f"inbox task {name!r}: reject_on_worker_lost is off, so a killed pool child "
                "acks the task as failed; fix: remove reject_on_worker_lost=False from the "
                "task (or set task_reject_on_worker_lost=True)"
            )
        if on_redis:
            limit = task.time_limit or conf.task_time_limit
            if limit is None or float(limit) >= visibility:
                problems.append(
                    f"inbox task {name!r}: time_limit={limit} is not below the Redis "
                    f"visibility_timeout={visibility:g} s, so a slow run is delivered again "
                    "while it runs; fix: set time_limit (seconds) below visibility_timeout "
                    "(broker_transport_options)"
                )
    if inbox_tasks and on_redis and conf.worker_prefetch_multiplier != 1:
        problems.append(
            f"worker_prefetch_multiplier={conf.worker_prefetch_multiplier}: on Redis, tasks "
            "prefetched by a busy worker count toward visibility_timeout and are delivered "
            "again; fix: set worker_prefetch_multiplier = 1 for a worker running inbox tasks"
        )
    return problems


def driver(app: Any) -> str:
    """The transport of ``app``'s broker (``amqp``, ``redis``...), without connecting."""
    # Making a Connection object does not connect.
    with app.connection_for_read() as connection:
        return str(connection.transport.driver_type)


def schema_problems(engine: Engine, inbox: Inbox) -> list[str]:
    """One line when the inbox's tables behind ``engine`` (its claims, its effects, the task
    results) are missing, incomplete or at an older revision, or the database does not
    answer (tried for about 12 s); empty when they are ready. The engine's pool is emptied
    afterwards: no connection is left for a fork to copy."""
    try:
        wait_for_schema(engine, [*worker_tables(inbox), task_result_table])
    except SchemaNotReady as exc:
        return [f"the inbox's database is not ready: {exc}"]
    except DBAPIError as exc:
        return [
            f"the inbox's database cannot be used ({type(exc.orig or exc).__name__}: "
            f"{str(exc.orig or exc).strip().splitlines()[0]}); fix: check the database URL, "
            "the role's rights and that the server is up"
        ]
    finally:
        engine.dispose()
    return []
