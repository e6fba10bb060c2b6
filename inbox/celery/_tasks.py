"""``InboxTasks``: the decorator that makes inbox tasks, and the worker signals they need."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterable
from typing import Any, overload

from celery import Celery, signals
from sqlalchemy import Engine
from sqlalchemy.orm import Session

from inbox import Inbox
from inbox.celery import _beat, _chords
from inbox.celery._poison import PoisonLetters
from inbox.celery._results import DEFAULT_MAX_RESULT_BYTES
from inbox.celery._settings import schema_problems, setting_problems
from inbox.celery._task import InboxTask, TaskBinding, TaskCall, current_session, run_body
from inbox.errors import ConfigurationError
from inbox.message import Message

__all__ = ["InboxTasks", "TaskKey"]

TaskKey = Callable[..., str | bytes | Any]
"""A ``key=`` function: called with the task's arguments, returns its business key (a
non-empty str, a UUID or 16 bytes), as an inbox handler's ``key=`` does."""


class InboxTasks:
    """Inbox tasks of one Celery ``app``, claimed in ``inbox``.

    ``session_factory`` makes sessions on the inbox's database (the same ``sessionmaker``
    the inbox was given): a redelivered task reads its stored result with it. ``engines``
    are more engines the tasks use (an effect store, your own): with ``session_factory``'s
    engine they are disposed without closing in each prefork child (``worker_process_init``),
    so no pooled connection crosses a fork. ``max_result_bytes`` bounds a return value's
    JSON (a task may lower or raise it).

    Making one connects two worker signals for ``app``: the settings and schema check at
    ``worker_init`` (the worker refuses to start, one line per problem, when a setting is
    against an inbox task or the inbox's tables are missing or at an older revision: see
    :mod:`inbox.celery._settings`) and the engine disposal; and adds a consumer bootstep
    that dead-letters the messages Celery refuses before any task runs
    (:mod:`inbox.celery._poison`).
    """

    def __init__(
        self,
        app: Celery,
        inbox: Inbox,
        session_factory: Callable[[], Session],
        *,
        engines: Iterable[Engine] = (),
        max_result_bytes: int = DEFAULT_MAX_RESULT_BYTES,
    ) -> None:
        if not isinstance(inbox, Inbox):
            raise ConfigurationError(f"InboxTasks takes an inbox.Inbox, got {type(inbox).__name__}")
        if not callable(session_factory):
            raise ConfigurationError(
                "session_factory must be callable (the inbox's sessionmaker), got "
                f"{type(session_factory).__name__}"
            )
        _check_limit(max_result_bytes)
        self.app = app
        self.inbox = inbox
        self._sessions = session_factory
        self._max_result_bytes = max_result_bytes
        with session_factory() as session:  # a new session does not connect
            bind = session.get_bind()
        self._bind = bind if isinstance(bind, Engine) else None
        self._engines = _unique([bind, *engines] if isinstance(bind, Engine) else [*engines])
        self._names: list[str] = []
        self._keys: dict[str, TaskKey | None] = {}
        app.steps["consumer"].add(PoisonLetters)
        _chords.register(app)
        signals.worker_init.connect(self._check_worker, weak=False)
        signals.worker_process_init.connect(self._after_fork, weak=False)

    @property
    def names(self) -> tuple[str, ...]:
        """The names of the inbox tasks made here, in the order they were made."""
        return tuple(self._names)

    @overload
    def task(self, func: Callable[..., Any], /) -> Any: ...

    @overload
    def task(
        self,
        func: None = None,
        /,
        *,
        key: TaskKey | None = None,
        name: str | None = None,
        max_result_bytes: int | None = None,
        **options: Any,
    ) -> Callable[[Callable[..., Any]], Any]: ...

    def task(
        self,
        func: Callable[..., Any] | None = None,
        /,
        *,
        key: TaskKey | None = None,
        name: str | None = None,
        max_result_bytes: int | None = None,
        **options: Any,
    ) -> Any:
        """Make ``func(session, *args, **kwargs)`` a Celery task that runs in the inbox's
        handler transaction and is called as ``func.delay(*args, **kwargs)``.

        The claim is ``(task id, task name)``, or ``(key(*args, **kwargs), task name)`` with
        ``key=``. ``name`` is the task name, also the claim's handler name (default:
        Celery's, ``module.function``): keep it stable. ``options`` are Celery's
        (``bind=True`` passes the task first, before the session; ``max_retries``,
        ``autoretry_for``, queues, time limits; ``base=`` a subclass of
        :class:`~inbox.celery.InboxTask`); ``acks_late`` and
        ``reject_on_worker_lost`` default to True. Bare ``@tasks.task`` works too.
        """
        if func is not None:
            return self._make(func, key, name, max_result_bytes, options)

        def decorate(fun: Callable[..., Any]) -> Any:
            return self._make(fun, key, name, max_result_bytes, options)

        return decorate

    def _make(
        self,
        fun: Callable[..., Any],
        key: TaskKey | None,
        name: str | None,
        max_result_bytes: int | None,
        options: dict[str, Any],
    ) -> Any:
        if not callable(fun):
            raise ConfigurationError(f"an inbox task must be callable, got {type(fun).__name__}")
        if key is not None and not callable(key):
            raise ConfigurationError(f"key= must be callable, got {type(key).__name__}")
        limit = self._max_result_bytes if max_result_bytes is None else max_result_bytes
        _check_limit(limit)
        # shared=False: the task belongs to this app and inbox, not to every app made later.
        options = {"acks_late": True, "reject_on_worker_lost": True, "shared": False, **options}
        base = options.pop("base", InboxTask)
        if not (isinstance(base, type) and issubclass(base, InboxTask)):
            raise ConfigurationError(f"base= must be a subclass of InboxTask, got {base!r}")
        bound = bool(options.get("bind"))
        run = _with_session(fun, bound=bound)
        task_name = name or self.app.gen_task_name(fun.__name__, fun.__module__)
        binding = TaskBinding(self.inbox, self._sessions, limit, _arguments(run, bound=bound))

        def handle(message: Message[TaskCall], session: Session) -> None:
            run_body(binding, message, session)

        claim_key = None if key is None else _claim_key(key)
        self.inbox.handler(task_name, name=task_name, key=claim_key)(handle)
        self._names.append(task_name)
        self._keys[task_name] = key
        return self.app.task(name=task_name, base=base, inbox_binding=binding, **options)(run)

    def beat_entry(
        self,
        task: Any,
        schedule: Any,
        *,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """A ``beat_schedule`` entry that runs ``task`` once per scheduled slot, however
        many beats send it: beat puts the slot (the schedule's latest time at or before the
        send, ISO 8601 UTC) in the ``slot`` keyword argument, and ``task`` (an inbox task
        of this app made with ``key=beat_slot``) claims ``(slot, task name)``.
        ``schedule``: a crontab, an interval (seconds or a timedelta, slots aligned on
        1970-01-01 UTC) or a celery ``schedule``."""
        name = getattr(task, "name", task)
        if self._keys.get(name, None) is not _beat.beat_slot:
            raise ConfigurationError(
                f"beat_entry({name!r}): the task must be an inbox task of this app made with "
                "key=inbox.celery.beat_slot, so its claim is (scheduled slot, task name)"
            )
        return _beat.entry(self.app, self.app.tasks[name], schedule, args, kwargs)

    def problems(self) -> list[str]:
        """The settings problems a worker of this app would refuse to start with (one line
        each, naming the task, the setting and the fix); empty when all is well."""
        return setting_problems(self.app, [self.app.tasks[name] for name in self._names])

    def _check_worker(self, sender: Any = None, **_: Any) -> None:
        if getattr(sender, "app", None) is not self.app:
            return
        problems = self.problems()
        if self._bind is not None and self._names:
            problems += schema_problems(self._bind, self.inbox)
        if problems:
            # SystemExit, because Celery logs and ignores what a signal receiver raises.
            raise SystemExit(
                "\n".join(f"inbox.celery refuses to start the worker: {p}" for p in problems)
            )

    def _after_fork(self, **_: Any) -> None:
        # SQLAlchemy's advice for pools across fork: the child starts with fresh pools and
        # leaves the parent's connections open for the parent.
        for engine in self._engines:
            engine.dispose(close=False)

    def __repr__(self) -> str:
        return f"InboxTasks(app={self.app.main!r}, tasks={len(self._names)})"


def _with_session(fun: Callable[..., Any], *, bound: bool) -> Callable[..., Any]:
    """``fun`` as Celery calls it: without the session argument, which comes from the
    running inbox task. Its signature (what Celery checks ``delay()`` against) drops it."""

    def run(*args: Any, **kwargs: Any) -> Any:
        if bound:  # Celery passes the task first: the session goes second
            return fun(args[0], current_session(), *args[1:], **kwargs)
        return fun(current_session(), *args, **kwargs)

    functools.update_wrapper(run, fun)
    signature = inspect.signature(fun)
    parameters = list(signature.parameters.values())
    at = 1 if bound else 0
    if len(parameters) <= at or parameters[at].kind not in (
        inspect.Parameter.POSITIONAL_ONLY,
        inspect.Parameter.POSITIONAL_OR_KEYWORD,
    ):
        where = "second, after the task" if bound else "first"
        raise ConfigurationError(
            f"inbox task {fun.__qualname__} must take the session as its {where} argument"
        )
    del parameters[at]
    run.__signature__ = signature.replace(parameters=parameters)  # type: ignore[attr-defined]
    return run


def _arguments(run: Callable[..., Any], *, bound: bool) -> inspect.Signature:
    """The arguments a call of the task takes, built once per task (each call only binds
    them): ``run``'s, without the task itself when Celery passes it first."""
    signature = inspect.signature(run)
    if not bound:
        return signature
    return signature.replace(parameters=list(signature.parameters.values())[1:])


def _claim_key(key: TaskKey) -> Callable[[Message[TaskCall]], Any]:
    def claim_key(message: Message[TaskCall]) -> Any:
        return key(*message.body.args, **message.body.kwargs)

    return claim_key


def _check_limit(limit: object) -> None:
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise ConfigurationError(f"max_result_bytes must be a positive int, got {limit!r}")


def _unique(engines: list[Engine]) -> list[Engine]:
    seen: list[Engine] = []
    for engine in engines:
        if not any(engine is other for other in seen):
            seen.append(engine)
    return seen
