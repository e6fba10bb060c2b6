"""Handler records: their stable names, their claim keys, and the type → handlers routing."""

from __future__ import annotations

import functools
import inspect
import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any, TypeAlias

from sqlalchemy.orm import Session

from inbox.errors import InvalidKey, RegistrationError
from inbox.message import IDEMPOTENCY_KEY_HEADER, Message, key_bytes
from inbox.schema import HANDLER_NAME_MAX_LENGTH

__all__ = [
    "HandlerFunc",
    "KeyFunc",
    "RegisteredHandler",
    "Registry",
    "default_name",
    "is_coroutine_callable",
    "refuse_async",
    "require_async",
    "validate_name",
]

HandlerFunc: TypeAlias = Callable[[Message, Session], object]
"""A handler: called with the message and the session whose transaction holds the claim."""

KeyFunc: TypeAlias = Callable[[Message], str | uuid.UUID | bytes]
"""A business-key function: a non-empty str, a UUID, or exactly 16 bytes per message."""


@dataclass(frozen=True, slots=True)
class RegisteredHandler:
    """A handler as registered: its stable name, the type it takes (None: all), its key,
    and its ``body=`` type with the parser that checks a body against it (None: any body).

    A batch handler (``batch_handler``) also keeps its list-taking function in ``batch``
    (``func`` calls it with one message); ``typed`` is the message with its validated body
    on a copy made by :meth:`bound_to`."""

    name: str
    message_type: str | None
    func: HandlerFunc
    key: KeyFunc | None
    body_type: type[Any] | None = None
    parse_body: Callable[[object], object] | None = None
    batch: Callable[[list[Message], Any], object] | None = None
    typed: Message | None = None

    def bound_to(self, message: Message) -> RegisteredHandler:
        """A copy whose ``func`` and ``key`` are called with ``message`` (the delivered
        message with its body validated) whatever message they are given: what planning
        hands on for a handler with ``body=``, so every way of running handlers passes it."""
        key = None if self.key is None else functools.partial(_key_with, self.key, message)
        func = functools.partial(_call_with, self.func, message)
        return replace(self, func=func, key=key, typed=message)

    def claim_key(self, message: Message) -> bytes:
        """The 16 bytes this handler claims ``message`` under: its ``key=`` function's value,
        else the producer's idempotency key, else the message id.

        Raises :class:`~inbox.InvalidKey` when the key cannot be derived.
        """
        if self.key is None:
            business_key = message.headers.get(IDEMPOTENCY_KEY_HEADER)  # .idempotency_key
            if business_key is None:
                return message.id.bytes
            try:
                return key_bytes(business_key)
            except ValueError as exc:
                raise InvalidKey(self.name, message.id, f"idempotency-key: {exc}") from None
        try:
            value = self.key(message)
        except Exception as exc:
            raise InvalidKey(self.name, message.id, f"key function raised {exc!r}") from exc
        try:
            return key_bytes(value)
        except ValueError as exc:
            raise InvalidKey(self.name, message.id, str(exc)) from None


def _call_with(func: HandlerFunc, typed: Message, _delivered: Message, session: Session) -> object:
    return func(typed, session)


def _key_with(key: KeyFunc, typed: Message, _delivered: Message) -> str | uuid.UUID | bytes:
    return key(typed)


def default_name(func: Callable[..., Any]) -> str:
    """Return ``module.qualname`` for ``func``, or raise if that name is not stable.

    A stable name is what the claim is stored under, so it must come out the same in every
    process and every release: lambdas, functions defined inside functions, partials and
    callable objects do not have one and must be registered with ``name=``.
    """
    if isinstance(func, functools.partial):
        raise RegistrationError(
            "a functools.partial has no stable name: register it with name='...'"
        )
    target = func.__func__ if inspect.ismethod(func) else func
    module = getattr(target, "__module__", None)
    qualname = getattr(target, "__qualname__", None)
    if not inspect.isfunction(target) or not module or not qualname:
        raise RegistrationError(
            f"{type(func).__name__} object {func!r} has no stable name: register it with name='...'"
        )
    if "<lambda>" in qualname:
        raise RegistrationError("a lambda has no stable name: register it with name='...'")
    if "<locals>" in qualname:
        raise RegistrationError(
            f"{module}.{qualname} is defined inside a function, so its name is not stable "
            "across processes: register it with name='...'"
        )
    return f"{module}.{qualname}"


def refuse_async(func: Callable[..., Any], *, what: str = "handler") -> None:
    """Refuse a coroutine function where a blocking callable is needed.

    Called, a coroutine function returns a coroutine that nobody awaits: the inbox would
    commit the claim for work that never ran, and the message would be lost.
    """
    target = func.func if isinstance(func, functools.partial) else func
    if is_coroutine_callable(func) or inspect.isasyncgenfunction(target):
        raise RegistrationError(
            f"{what} {target!r} is a coroutine function: the blocking Inbox would never await "
            "it (its claim would commit for work that never ran). Register async handlers on "
            "an async inbox, or make it a plain function."
        )


def require_async(func: Callable[..., Any]) -> None:
    """Refuse a handler that is not a coroutine function where an async one is needed.

    The async inbox awaits what a handler returns; a plain function would run its blocking
    I/O on the event loop (or fail on the first statement of an ``AsyncSession``).
    """
    if not is_coroutine_callable(func):
        raise RegistrationError(
            f"handler {func!r} is not a coroutine function: the async inbox awaits its "
            "handlers. Make it 'async def', or register it on the blocking inbox.Inbox."
        )


def is_coroutine_callable(func: Callable[..., Any]) -> bool:
    """Whether calling ``func`` (a function, a partial of one, or an object with an async
    ``__call__``) returns an awaitable instead of running."""
    target = func.func if isinstance(func, functools.partial) else func
    call = (
        None
        if inspect.isroutine(target)
        else inspect.getattr_static(type(target), "__call__", None)
    )
    return inspect.iscoroutinefunction(target) or (
        call is not None and inspect.iscoroutinefunction(call)
    )


def validate_name(name: object) -> str:
    """Return ``name`` if it can be stored as a handler name, else raise RegistrationError."""
    if not isinstance(name, str):
        raise RegistrationError(f"handler name must be a str, got {type(name).__name__}")
    if not name.strip():
        raise RegistrationError("handler name must not be empty or blank")
    if name != name.strip():
        # MySQL/MariaDB compare "x" and "x " as equal: two such names would share claims.
        raise RegistrationError(f"handler name {name!r} has leading or trailing whitespace")
    if len(name) > HANDLER_NAME_MAX_LENGTH:
        raise RegistrationError(
            f"handler name is {len(name)} characters; the inbox column holds at most "
            f"{HANDLER_NAME_MAX_LENGTH}: register it with a shorter name='...'"
        )
    if "\x00" in name:
        raise RegistrationError("handler name must not contain NUL characters")
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        raise RegistrationError(
            f"handler name {name!r} is not valid Unicode text (it holds a lone surrogate)"
        ) from None
    return name


class Registry:
    """The handlers of one inbox, in registration order, with a cached routing table."""

    def __init__(self) -> None:
        self._handlers: dict[str, RegisteredHandler] = {}
        self._by_type: dict[str, tuple[RegisteredHandler, ...]] = {}
        self._catch_all: tuple[RegisteredHandler, ...] = ()
        self._lock = threading.Lock()
        self.typed = False
        """Whether any handler has a ``body=`` type (else no body is ever parsed)."""

    def add(self, handler: RegisteredHandler) -> None:
        """Register ``handler``; a second handler under the same name is an error."""
        with self._lock:
            existing = self._handlers.get(handler.name)
            if existing is not None:
                raise RegistrationError(
                    f"a handler named {handler.name!r} is already registered "
                    f"({existing.func!r}); give one of them a different name='...'"
                )
            self._handlers[handler.name] = handler
            self._route()

    @contextmanager
    def substituted(self, handler: RegisteredHandler) -> Iterator[None]:
        """Run the handler registered under ``handler.name`` as ``handler`` inside the
        block, everywhere the registry routes (``process()`` and ``process_batch()``): for
        the failure injection of :mod:`inbox.testing`."""
        with self._lock:
            original = self._handlers.get(handler.name)
            if original is None:
                raise RegistrationError(f"no handler named {handler.name!r} is registered")
            self._handlers[handler.name] = handler
            self._route()
        try:
            yield
        finally:
            with self._lock:
                self._handlers[handler.name] = original
                self._route()

    def _route(self) -> None:
        handlers = tuple(self._handlers.values())
        # Routes are rebuilt here, once per registration, and only for registered
        # types: message types arrive from outside and must not grow a cache.
        types = {h.message_type for h in handlers if h.message_type is not None}
        self._by_type = {
            t: tuple(h for h in handlers if h.message_type in (None, t)) for t in types
        }
        self._catch_all = tuple(h for h in handlers if h.message_type is None)
        self.typed = any(h.parse_body is not None for h in handlers)

    def for_type(self, message_type: str | None) -> tuple[RegisteredHandler, ...]:
        """The handlers that take ``message_type``: its own plus the catch-alls, in order."""
        if message_type is None:
            return self._catch_all
        return self._by_type.get(message_type, self._catch_all)

    def __len__(self) -> int:
        return len(self._handlers)

    def __iter__(self) -> Iterator[RegisteredHandler]:
        return iter(tuple(self._handlers.values()))
