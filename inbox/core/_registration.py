"""What the blocking and the async inbox share before any I/O: their options, the handler
decorator with its checks, and the routing of a message to its handlers and keys.

Only running the handler transactions differs between the two; that lives in
:mod:`inbox.core._inbox` and :mod:`inbox.aio`.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Iterable
from typing import Any, ClassVar, Generic, TypeVar, cast

from sqlalchemy import Table

from inbox._backends import Claims
from inbox.core._batch_handlers import check_batch_handler, one_element
from inbox.core._bodies import body_parser
from inbox.core._chain import check_layers, wrap_delivery, wrap_handler
from inbox.core._guards import Guards, transaction_guards
from inbox.core._handlers import (
    KeyFunc,
    RegisteredHandler,
    Registry,
    default_name,
    refuse_async,
    validate_name,
)
from inbox.core._retry import Backoff
from inbox.core._routing import Planned, plan
from inbox.errors import ConfigurationError, RegistrationError
from inbox.message import Message
from inbox.result import ProcessResult, Unhandled
from inbox.schema import DEFAULT_EFFECT_TABLE_NAME, DEFAULT_TABLE_NAME, resolve_table

__all__ = ["AnyInbox", "InboxBase"]

S = TypeVar("S")  # the session a handler gets: Session or AsyncSession
E = TypeVar("E")  # the effect store: Engine or AsyncEngine
MW = TypeVar("MW")  # a middleware layer, blocking or async
DH = TypeVar("DH")  # an around_delivery hook, blocking or async
F = TypeVar("F", bound=Callable[..., Any])


class InboxBase(abc.ABC, Generic[S, E, MW, DH]):
    """The options and handlers of an inbox whose session factory makes ``S`` sessions,
    whose effect store is an ``E``, with ``MW`` middleware and ``DH`` delivery hooks.

    Subclasses say which callables they accept as handlers (:meth:`_check_handler`), make
    their batch processor and effect ledger, and run the transactions; everything here is
    decided once, at construction or registration.
    """

    _EXAMPLE_FACTORY: ClassVar[str]
    _ASYNCHRONOUS: ClassVar[bool]

    def __init__(
        self,
        session_factory: Callable[[], S] | None = None,
        *,
        sessions_for: Callable[[Message], S] | None = None,
        table: str | Table = DEFAULT_TABLE_NAME,
        on_unhandled: Unhandled | str = Unhandled.RAISE,
        transient_retries: int = 3,
        effect_store: E | None = None,
        effect_table: str | Table = DEFAULT_EFFECT_TABLE_NAME,
        middleware: Iterable[MW] | None = None,
        around_delivery: Iterable[DH] | None = None,
    ) -> None:
        if (session_factory is None) == (sessions_for is None):
            raise ConfigurationError(
                "give exactly one of session_factory (e.g. "
                f"{self._EXAMPLE_FACTORY}) and sessions_for= (a function of the message)"
            )
        for option, factory in (
            ("session_factory", session_factory),
            ("sessions_for", sessions_for),
        ):
            if factory is not None and not callable(factory):
                raise ConfigurationError(
                    f"{option} must be callable (e.g. {self._EXAMPLE_FACTORY}), "
                    f"got {type(factory).__name__}"
                )
        if isinstance(transient_retries, bool) or not isinstance(transient_retries, int):
            raise ConfigurationError("transient_retries must be an int")
        if transient_retries < 0:
            raise ConfigurationError(f"transient_retries must be >= 0, got {transient_retries}")
        self._session_factory = session_factory
        self._sessions_for = sessions_for
        asynchronous = self._ASYNCHRONOUS
        self._middleware = check_layers(middleware, "middleware", asynchronous=asynchronous)
        self._hooks = check_layers(around_delivery, "around_delivery", asynchronous=asynchronous)
        self._claims = Claims(resolve_table(table))
        self._on_unhandled = Unhandled(on_unhandled)
        self._backoff = Backoff(transient_retries)
        self._registry = Registry()
        self._guards: dict[str, Guards] = {}
        self._deliver: Callable[[Message], Any] | None = (
            wrap_delivery(self._process, self._hooks, asynchronous=asynchronous)
            if self._hooks
            else None
        )
        if session_factory is not None:
            self._check_factory(session_factory)
        self._start(effect_store, effect_table, tenants=sessions_for is not None)

    @abc.abstractmethod
    def _check_factory(self, session_factory: Callable[[], S]) -> None:
        """Raise :class:`~inbox.SessionConfigurationError` if the sessions of
        ``session_factory`` cannot hold the inbox's transaction (connects to nothing)."""

    @abc.abstractmethod
    def _start(self, effect_store: E | None, effect_table: str | Table, *, tenants: bool) -> None:
        """Make the batch processor and the effect ledger (on ``effect_store``)."""

    @abc.abstractmethod
    def _process(self, message: Message) -> Any:
        """``process()`` without the ``around_delivery`` hooks (what the hooks wrap)."""

    @property
    def table(self) -> Table:
        """The inbox table this inbox claims into."""
        return self._claims.table

    @property
    def handlers(self) -> tuple[RegisteredHandler, ...]:
        """Every registered handler, in registration order."""
        return tuple(self._registry)

    def _decorator(
        self,
        func_or_type: Any,
        name: str | None,
        key: KeyFunc | None,
        body: object = None,
        *,
        batch: bool = False,
    ) -> Any:
        """The body of ``handler()`` (``batch_handler()`` with ``batch=True``): register a
        bare function, or return the decorator."""
        if callable(func_or_type) and not isinstance(func_or_type, str):
            return self._register(func_or_type, None, name=name, key=key, body=body, batch=batch)
        message_type = func_or_type
        if message_type is not None and (not isinstance(message_type, str) or not message_type):
            raise RegistrationError(
                f"handler message type must be a non-empty str or None, got {message_type!r}"
            )

        def decorate(func: F) -> F:
            return self._register(func, message_type, name=name, key=key, body=body, batch=batch)

        return decorate

    def _register(
        self,
        func: F,
        message_type: str | None,
        *,
        name: str | None,
        key: KeyFunc | None,
        body: object = None,
        batch: bool = False,
    ) -> F:
        if not callable(func):
            raise RegistrationError(f"a handler must be callable, got {type(func).__name__}")
        self._check_handler(func)
        if key is not None and not callable(key):
            raise RegistrationError(f"key= must be callable, got {type(key).__name__}")
        if key is not None:
            refuse_async(key, what="key function")  # keys are derived before any I/O
        handler_name = validate_name(default_name(func) if name is None else name)
        one: Callable[..., Any] = func
        if batch:  # called once per batch with a list; with [message] per message
            check_batch_handler(handler_name, self._middleware)
            one = one_element(func, asynchronous=self._ASYNCHRONOUS)
        # The async inbox calls it as what it is; the middleware chain is built here, once.
        handler_func = wrap_handler(one, self._middleware, asynchronous=self._ASYNCHRONOUS)
        body_type = None if body is None else cast("type[Any]", body)
        parse = None if body is None else body_parser(body)
        self._registry.add(
            RegisteredHandler(
                handler_name,
                message_type,
                handler_func,
                key,
                body_type,
                parse,
                batch=func if batch else None,
            )
        )
        self._guards[handler_name] = transaction_guards(handler_name)
        return func

    @abc.abstractmethod
    def _check_handler(self, func: Callable[..., Any]) -> None:
        """Raise :class:`~inbox.RegistrationError` if this inbox cannot run ``func``."""

    def _plan(self, message: Message) -> Planned | ProcessResult:
        return plan(message, self._registry, self._on_unhandled)

    def _new_session(self, message: Message | None) -> S:
        """A session for a handler transaction: ``sessions_for(message)`` (``message`` is
        None only for a batch, which an inbox with ``sessions_for`` never makes), else
        ``session_factory()``."""
        if self._sessions_for is not None and message is not None:
            return self._sessions_for(message)
        assert self._session_factory is not None
        return self._session_factory()

    def _one_by_one(self) -> bool:
        """Whether ``process_batch`` must run its messages as ``process()`` calls: each
        through the delivery hooks, or each in its own tenant's database."""
        return bool(self._hooks) or self._sessions_for is not None


AnyInbox = InboxBase[Any, Any, Any, Any]
"""An :class:`~inbox.Inbox` or an :class:`~inbox.aio.AsyncInbox`, for code that takes either."""
