"""``InboxTask``: the Celery task class whose body runs inside an inbox claim.

Celery's worker calls a task class's own ``__call__`` when it has one (``celery.app.trace``),
and eager mode (``apply()``, ``task_always_eager``) goes through the same tracer, so this
one method is the whole edge: it turns the call into a :class:`~inbox.Message` (id: the
task id; type: the task name) and hands it to :meth:`inbox.Inbox.process`, whose handler
(registered by :class:`~inbox.celery.InboxTasks`) runs the body with the session.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass, field
from inspect import Signature
from typing import Any, ClassVar

from celery import Task
from celery.exceptions import Retry
from sqlalchemy.orm import Session

from inbox import Inbox
from inbox.celery._chords import recheck_later
from inbox.celery._dead_letters import CELERY_CONTROL, settle_failure
from inbox.celery._outage import database_unusable, wait_for_database
from inbox.celery._results import load_result, store_result
from inbox.core._handlers import RegisteredHandler
from inbox.errors import ConfigurationError, HandlerFailed, InvalidBody, InvalidKey
from inbox.message import Message, key_bytes, uuid7
from inbox.result import Outcome
from inbox.telemetry import record_decision

__all__ = ["InboxTask", "TaskBinding", "TaskCall", "current_session", "task_message_id"]

_SESSION: ContextVar[Session] = ContextVar("inbox_celery_session")


def current_session() -> Session:
    """The session of the inbox task running in this context (what its body receives)."""
    try:
        return _SESSION.get()
    except LookupError:
        raise ConfigurationError(
            "no inbox task is running here: the session exists only inside an inbox task's body"
        ) from None


@dataclass(slots=True)
class TaskCall:
    """The body of the message an inbox task call becomes: its arguments, its claim key,
    and (once the body ran) the value it returned."""

    task: Any
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    claim_key: bytes = b""
    returned: Any = field(default=None)


@dataclass(frozen=True, slots=True)
class TaskBinding:
    """What an :class:`InboxTask` needs to run: its inbox, a session factory on the same
    database (to read a stored result back), its result limit and the signature its
    arguments are checked against (``run``'s, without the task and the session)."""

    inbox: Inbox
    sessions: Callable[[], Session]
    max_result_bytes: int
    arguments: Signature

    def handler(self, name: str) -> RegisteredHandler:
        """The inbox handler registered for the task ``name``."""
        for registered in self.inbox.handlers:
            if registered.name == name:
                return registered
        raise ConfigurationError(f"inbox task {name!r} has no handler in {self.inbox!r}")


def task_message_id(task_id: str | None) -> uuid.UUID:
    """The inbox message id of a Celery task id: the id itself when it is a UUID (Celery's
    default), else ``uuid5(KEY_NAMESPACE, task_id)``; a fresh UUIDv7 for a direct call,
    which has no task id."""
    if task_id is None:
        return uuid7()
    try:
        return uuid.UUID(task_id)
    except ValueError:
        return uuid.UUID(bytes=key_bytes(task_id))


class InboxTask(Task):
    """A Celery task whose body runs in the inbox's handler transaction, once per claim.

    Made by :meth:`inbox.celery.InboxTasks.task`; every Celery option (``bind``,
    ``max_retries``, ``autoretry_for``, ``retry_backoff``, queues, time limits...) works as
    on any task. A call claims ``(task id or key=, task name)``: the first run commits the
    body's writes, the claim and the return value together; any later delivery of the same
    claim returns the stored value without running the body. An exception (``self.retry()``
    included) rolls all of it back and reaches Celery as it was raised.
    """

    inbox_binding: ClassVar[TaskBinding]

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Run the task through the inbox (the worker, ``apply()`` and eager mode call this)."""
        binding = self.inbox_binding
        name: str = self.name
        message = Message(task_message_id(self.request.id), name, TaskCall(self, args, kwargs))
        registered = binding.handler(name)
        failure: BaseException  # what Celery sees: the task's own exception
        decided: BaseException  # what the shell decides on: HandlerFailed keeps the reason
        try:
            _check_arguments(binding.arguments, name, message.id, args, kwargs)
            message.body.claim_key = registered.claim_key(message)
            result = binding.inbox.process(message)
        except HandlerFailed as exc:
            failure = exc.failures.get(name, exc)
            if isinstance(failure, CELERY_CONTROL):
                if isinstance(failure, Retry):
                    _record_retry(self)
                raise failure from None
            if fix := database_unusable(exc):
                wait_for_database(self, failure, fix)
            decided = exc
        except (InvalidKey, InvalidBody) as exc:
            failure = decided = exc
        except Exception as exc:  # a setup error, raised as itself before any handler ran
            if fix := database_unusable(exc):
                wait_for_database(self, exc, fix)
            raise
        else:
            if result.outcomes.get(name) is Outcome.DUPLICATE:
                value = _stored_result(self, binding, message.body.claim_key)
                if self.request.chord:  # a chord part again: its dispatch may have died
                    recheck_later(self, value)
                return value
            return message.body.returned
        # Failed for good (Celery's retries are over, or there are none for this error):
        # a dead letter on <queue>.dlq, then Celery sees the task's own exception.
        # HandlerFailed, not the task's exception, so an UncertainEffect or an ended
        # transaction is dead-lettered with its own reason, not as handler-failed.
        settle_failure(self, message, decided)
        raise failure


def _stored_result(task: InboxTask, binding: TaskBinding, claim_key: bytes) -> Any:
    """What the first run of a duplicate's claim returned; a database that cannot be read
    makes the task wait for it, as any other task would."""
    try:
        with binding.sessions() as session:
            return load_result(session, claim_key, task.name)
    except Exception as exc:
        if fix := database_unusable(exc):
            wait_for_database(task, exc, fix)
        raise


def _check_arguments(
    arguments: Signature,
    name: str,
    message_id: uuid.UUID,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> None:
    """Bad arguments (a poison message) are an :class:`~inbox.errors.InvalidBody` before
    any claim or key, not a ``TypeError`` from inside the body."""
    try:
        arguments.bind(*args, **kwargs)
    except TypeError as exc:
        raise InvalidBody(name, message_id, "call", str(exc)) from None


def run_body(binding: TaskBinding, message: Message[TaskCall], session: Session) -> None:
    """The inbox handler of an inbox task: run the task's ``run`` with ``session`` as the
    current session, then store its return value beside the claim, in the same
    transaction."""
    call = message.body
    task = call.task
    token = _SESSION.set(session)
    try:
        value = task.run(*call.args, **call.kwargs)
    finally:
        _SESSION.reset(token)
    store_result(session, call.claim_key, task.name, value, binding.max_result_bytes)
    call.returned = value


def _record_retry(task: InboxTask) -> None:
    """Count a Celery retry (``self.retry()``, ``autoretry_for``) of a broker delivery as the
    kombu worker counts its retries: ``inbox.retries`` and an ``inbox.decision`` event."""
    request = task.request
    if request.is_eager or request.id is None:
        return
    queue = (request.delivery_info or {}).get("routing_key") or task.app.conf.task_default_queue
    record_decision(
        "retry",
        handler=task.name,
        destination=str(queue),
        message_id=str(request.id),
        tries=(request.retries or 0) + 1,
    )
