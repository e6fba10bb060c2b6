"""A chord whose callback dispatch is held by a dead process: its completion happens again
once the dead process's lease has passed.

Celery's Redis result backend (5.7) counts a chord's parts in Redis and lets the part that
completes it take a dispatch claim (the group's ``.c`` key, ``SET NX`` with a lease of a few
seconds, extended before the publish); the claim is released, and marked ``done``, after the
callback is published. A process killed between taking the claim and publishing (the pool
child orphaned by a killed main process, then killed itself) leaves the claim held until its
lease ends, and nothing reports a part again after that: the callback is never sent.

An inbox task is redelivered after such a death, and finds its claim taken: it returns its
stored value and Celery reports the part again, which cannot dispatch while the lease
runs. So a redelivered chord part whose claim is taken sends :data:`RECHECK_TASK` before
it returns (before Celery reports it: were its own report's dispatch to die, the recheck is
already sent), due past the lease when a claim is held. The recheck reports the part again
(Celery's ``on_chord_part_return``: a part already counted is not counted twice), which
takes the expired claim and publishes the callback; if the claim is still held it sends
itself again, at most :data:`RECHECKS` times; a chord already dispatched (``done``) or gone
is left alone. The callback keeps the task id Celery froze for it, so an inbox callback
runs once even where a dead process had published it before its cleanup.
"""

from __future__ import annotations

import logging
from typing import Any, Final

from celery import states
from celery.app.task import Context

__all__ = ["FIRST_RECHECK", "RECHECKS", "RECHECK_TASK", "claim_state", "recheck_later", "register"]

logger = logging.getLogger("inbox.celery")

RECHECK_TASK: Final = "inbox.celery.chord_recheck"
"""The task a duplicate chord part sends when the chord's dispatch claim is held."""
RECHECKS: Final = 5
"""How many times a recheck sends itself again while the claim stays held."""
FIRST_RECHECK: Final = 5
"""Seconds before a recheck when no claim is held yet (Celery's shortest lease)."""

_CLAIM: Final = ".c"  # Celery's Redis backend: the chord's dispatch claim key's suffix
_SIZE: Final = ".s"  # and its chord size key's: gone once the chord is cleaned up
_DONE: Final = b"done"  # the claim's value once the callback was published


def register(app: Any) -> None:
    """Register :data:`RECHECK_TASK` on ``app`` (once per app)."""
    if RECHECK_TASK not in app.tasks:
        app.task(
            name=RECHECK_TASK,
            shared=False,
            acks_late=True,
            reject_on_worker_lost=True,
            ignore_result=True,
            bind=True,
        )(_recheck)


def claim_state(backend: Any, group_id: str) -> str:
    """``done`` (the callback was published), ``held`` (a dispatch claim is taken, by a live
    or a dead process), ``open`` (no claim, the chord's data is there), or ``gone``."""
    claim = backend.get(backend.get_key_for_group(group_id, _CLAIM))
    if claim is not None:
        return "done" if _bytes(claim) == _DONE else "held"
    if backend.get(backend.get_key_for_group(group_id, _SIZE)) is None:
        return "gone"
    return "open"


def recheck_later(task: Any, value: Any) -> None:
    """For a redelivered chord part ``task`` whose claim is taken (its stored ``value`` about
    to be reported by Celery): send a recheck of the chord's dispatch, due past the claim's
    lease when one is held, else after :data:`FIRST_RECHECK` seconds. Sent before Celery
    reports the part, so a process that dies in that report's dispatch is covered too; a
    broker that refuses it is logged, and the part is reported as usual."""
    request = task.request
    if not request.chord or not request.group or request.is_eager:
        return
    backend = _redis_backend(task.app)
    if backend is None:
        return
    try:
        _send(task.app, backend, _queue(task), request, value, left=RECHECKS)
    except Exception as exc:
        logger.warning(
            "inbox.celery: chord %s: no recheck of its dispatch sent for part %s: %r",
            request.group,
            request.id,
            exc,
        )


def _recheck(  # noqa: PLR0917 (the part as Celery reports it)
    task: Any,
    group_id: str,
    part_id: str,
    group_index: int | None,
    chord: dict[str, Any],
    value: Any,
    rechecks_left: int,
    queue: str,
) -> str:
    """Report a chord part again once the dispatch claim's lease has passed (see the
    module's docstring); returns the claim's state it found."""
    app = task.app
    backend = _redis_backend(app)
    if backend is None:
        return "gone"
    state = claim_state(backend, group_id)
    part = Context(id=part_id, group=group_id, group_index=group_index, chord=chord)
    if state == "open":
        logger.warning(
            "inbox.celery: chord %s: its dispatch claim was left by a process that died; "
            "reporting part %s again to send its callback",
            group_id,
            part_id,
        )
        backend.on_chord_part_return(part, states.SUCCESS, value)
        state = claim_state(backend, group_id)
    if state == "held":
        if rechecks_left > 0:
            _send(app, backend, queue, part, value, left=rechecks_left - 1)
        else:
            logger.error(
                "inbox.celery: chord %s: its dispatch claim is still held after %d rechecks; "
                "its callback may not be sent: look for a stuck worker",
                group_id,
                RECHECKS,
            )
    return state


def _send(app: Any, backend: Any, queue: str, part: Any, value: Any, *, left: int) -> None:
    lease = int(backend.client.ttl(backend.get_key_for_group(part.group, _CLAIM)))
    countdown = lease + 1 if lease > 0 else FIRST_RECHECK
    app.send_task(
        RECHECK_TASK,
        args=(part.group, part.id, part.group_index, dict(part.chord), value, left, queue),
        countdown=countdown,
        queue=queue,
    )


def _queue(task: Any) -> str:
    routing = (task.request.delivery_info or {}).get("routing_key")
    return str(routing or task.app.conf.task_default_queue)


def _redis_backend(app: Any) -> Any:
    """The app's result backend when it is Celery's Redis one (the only one with this
    claim); else None."""
    from celery.backends.redis import RedisBackend

    backend = app.backend
    return backend if isinstance(backend, RedisBackend) else None


def _bytes(value: Any) -> bytes:
    return value if isinstance(value, bytes) else str(value).encode()
