"""The Inbox: handlers registered once, then ``process()``, which runs each exactly once."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any, TypeVar, overload

from sqlalchemy import Engine, Table
from sqlalchemy.orm import Session

from inbox.core._batch import BatchProcessor
from inbox.core._batch_handlers import BatchHandlerFunc
from inbox.core._chain import DeliveryHook, Middleware
from inbox.core._handlers import HandlerFunc, KeyFunc, RegisteredHandler, refuse_async
from inbox.core._registration import InboxBase
from inbox.core._routing import Planned, plan, require_messages
from inbox.core._sessions import check_session_factory
from inbox.core._settlement import Failed, Pause, Run, advance, settle, settled
from inbox.core._transaction import HandlerTransaction
from inbox.core.effects._blocking import EffectCall, Effects
from inbox.core.effects._identity import EffectMode
from inbox.errors import SETUP_ERRORS, InboxError
from inbox.message import Message
from inbox.result import Outcome, ProcessResult
from inbox.telemetry._core import watched

__all__ = ["Inbox"]

H = TypeVar("H", bound=HandlerFunc)
BH = TypeVar("BH", bound=BatchHandlerFunc)
B = TypeVar("B")  # a handler's body= type
R = TypeVar("R")


class Inbox(InboxBase[Session, Engine, Middleware, DeliveryHook]):
    """A transactional inbox: register handlers, then ``process()`` each delivered message.

    ``session_factory`` makes a new :class:`~sqlalchemy.orm.Session` per handler transaction
    (a ``sessionmaker`` bound to your engine). ``table`` names the inbox table (default
    ``inbox_message``; ``"schema.name"`` or a :class:`~sqlalchemy.Table` also work).
    ``on_unhandled`` says what to do with a message no handler takes. ``transient_retries``
    bounds how many times a handler transaction aborted by a deadlock, serialization failure,
    lock timeout or lost connection is re-run before the error is reported.

    ``effect_store`` is the :class:`~sqlalchemy.Engine` whose ``effect_table`` (default
    ``inbox_effect``) keeps the records of :meth:`effect`; by default the inbox's own
    database. SQLite needs one of its own (another file): see docs/effects.md.

    ``middleware`` wraps every handler, inside its transaction after the claim
    (``mw(message, session, call_next)``); ``around_delivery`` wraps each ``process()``
    before any claim (``hook(message, call_next)``): see docs/middleware.md.
    ``sessions_for=`` (instead of ``session_factory``) makes each handler transaction's
    session from the message, to claim in its tenant's schema or database: see
    docs/tenants.md.
    """

    _EXAMPLE_FACTORY = "sqlalchemy.orm.sessionmaker(engine)"
    _ASYNCHRONOUS = False

    def _check_factory(self, session_factory: Callable[[], Session]) -> None:
        check_session_factory(session_factory, self._claims.bind_clause)

    def _start(
        self, effect_store: Engine | None, effect_table: str | Table, *, tenants: bool
    ) -> None:
        self._batches = BatchProcessor(
            self._registry, self._transaction, self._guards, self._backoff, self._run_planned
        )
        self._effects = Effects(
            self,
            effect_store,
            effect_table,
            self._backoff,
            tenants=tenants,
            claims=self._claims.table,
        )

    @overload
    def handler(self, func: H, /) -> H: ...

    @overload
    def handler(
        self,
        message_type: str | None = None,
        /,
        *,
        name: str | None = None,
        key: KeyFunc | None = None,
    ) -> Callable[[H], H]: ...

    @overload
    def handler(
        self,
        message_type: str | None = None,
        /,
        *,
        body: type[B],
        name: str | None = None,
        key: Callable[[Message[B]], str | uuid.UUID | bytes] | None = None,
    ) -> Callable[[Callable[[Message[B], Session], R]], Callable[[Message[B], Session], R]]: ...

    def handler(
        self,
        func_or_type: Any = None,
        /,
        *,
        name: str | None = None,
        key: KeyFunc | None = None,
        body: type[Any] | None = None,
    ) -> Any:
        """Register a handler. Bare ``@inbox.handler`` takes every message; called with a
        type it takes that type only. ``name=`` pins the stored handler name (default:
        ``module.qualname``); ``key=`` derives a business idempotency key from the message.
        ``body=`` (a dataclass or pydantic model) validates each body before any claim: the
        handler gets a ``Message[that type]``, and a body that does not validate is
        :class:`InvalidBody` (docs/guide.md, "Typed bodies").

        The decorator only registers: it returns the function unchanged.
        """
        return self._decorator(func_or_type, name, key, body)

    @overload
    def batch_handler(self, func: BH, /) -> BH: ...

    @overload
    def batch_handler(
        self,
        message_type: str | None = None,
        /,
        *,
        name: str | None = None,
        key: KeyFunc | None = None,
    ) -> Callable[[BH], BH]: ...

    @overload
    def batch_handler(
        self,
        message_type: str | None = None,
        /,
        *,
        body: type[B],
        name: str | None = None,
        key: Callable[[Message[B]], str | uuid.UUID | bytes] | None = None,
    ) -> Callable[
        [Callable[[list[Message[B]], Session], R]], Callable[[list[Message[B]], Session], R]
    ]: ...

    def batch_handler(
        self,
        func_or_type: Any = None,
        /,
        *,
        name: str | None = None,
        key: KeyFunc | None = None,
        body: type[Any] | None = None,
    ) -> Any:
        """Register a batch handler: ``func(messages, session)``, called with a LIST of
        messages, to write them all with one ``executemany`` or multi-row statement.

        In :meth:`process_batch` (the worker's ``--batch-size``) it is called once per batch
        transaction with the messages whose claims the batch won, in batch order: each
        message still has its own claim ``(key, name)``, duplicates never reach it, and a
        failure rolls the batch back and bisects it down to the failing message, as for
        per-message handlers. :meth:`process` calls it with a one-element list. The options
        (bare or with a type, ``name=``, ``key=``, ``body=``) are those of :meth:`handler`;
        ``inbox.effect`` is not available inside it, and an inbox with ``middleware=`` refuses
        it. See docs/guide.md, "Batch handlers".

        The decorator only registers: it returns the function unchanged.
        """
        return self._decorator(func_or_type, name, key, body, batch=True)

    def _check_handler(self, func: Callable[..., Any]) -> None:
        refuse_async(func)

    def process(self, message: Message) -> ProcessResult:
        """Run every handler that takes ``message``, each exactly once, each in its own
        transaction with its own claim, and return one outcome per handler.

        Raises :class:`InvalidKey` (nothing ran) if a handler's key cannot be derived,
        :class:`UnhandledMessage` if no handler takes the type (unless set to ignore), and
        :class:`HandlerFailed` after all handlers ran if any of them failed: the failed ones
        were rolled back, so redelivering the message re-runs only them. A session factory or
        database the inbox cannot use raises :class:`SessionConfigurationError` or
        :class:`UnsupportedDialect` as itself.
        """
        if self._deliver is not None:
            return self._deliver(message)  # type: ignore[no-any-return]
        planned = plan(message, self._registry, self._on_unhandled)
        if planned.__class__ is ProcessResult:  # no handler takes it, and that is ignored
            return planned
        return self._run_planned(planned)  # type: ignore[arg-type]

    def _process(self, message: Message) -> ProcessResult:
        planned = self._plan(message)
        if isinstance(planned, ProcessResult):
            return planned
        return self._run_planned(planned)

    def process_batch(self, messages: Sequence[Message]) -> list[ProcessResult | InboxError]:
        """Process many messages in ONE transaction, with one claim statement per handler,
        and return, for each message in order, its result or the error :meth:`process`
        would have raised for it.

        Handlers run exactly as one :meth:`process` call after another would run them. A
        failing batch is split in halves down to the failing messages, which come back as
        :class:`HandlerFailed`; the healthy ones commit. See docs/guide.md, "Batches".

        With ``around_delivery`` hooks or ``sessions_for``, the messages run one
        :meth:`process` call after another (each through the hooks, each in its tenant's
        database), with the same results.
        """
        batch = require_messages(messages, "process_batch")
        if self._one_by_one():
            return [self._process_or_error(message) for message in batch]
        return self._batches.process(batch, self._plan)

    def _process_or_error(self, message: Message) -> ProcessResult | InboxError:
        try:
            return self.process(message)
        except SETUP_ERRORS:
            raise
        except InboxError as exc:
            return exc

    def effect(
        self, step: str, call: EffectCall, *, mode: EffectMode | str = EffectMode.AT_LEAST_ONCE
    ) -> Any:
        """Make ``call(key)``, an effect outside the database (an SMS, a payment, an
        e-mail), once for this handler's claim across all its attempts, and return its
        result; callable only from inside a handler of this inbox.

        The effect is (this handler's claim key, the tenant with ``sessions_for=``, its name,
        ``step``); ``key`` is a UUIDv5 of those fields, each prefixed by its length (the
        exact rule, and the version-1 keys that stay valid, in docs/effects.md), the same
        on every attempt: pass it to the other side as its idempotency key. The record is committed
        as started before the call (in its own transaction, not the handler's), as done
        with the result (JSON) after it; on every later attempt a done effect returns the
        stored result without calling. An error from ``call`` is recorded and re-raised as
        it is. ``mode`` says what a later attempt does with an effect started but not done,
        or failed: ``"at-least-once"`` calls again with the same key,
        ``"at-most-once"`` raises :class:`~inbox.UncertainEffect`. See docs/effects.md.
        """
        return self._effects.run(step, call, mode)

    def _run_planned(self, planned: Planned) -> ProcessResult:
        # The decisions are settle()'s (inbox/core/_settlement.py); here they are carried out.
        first = None
        if len(planned.handlers) == 1 and not watched():
            # The common case: one handler, no telemetry. Its first run needs no steps
            # when it settles the message; a failure goes on through settle() as any run.
            handler, key, message = planned.handlers[0], planned.keys[0], planned.message
            try:
                outcome = self._run_once(handler, key, message)
            except BaseException as exc:  # settle() raises an exit exception again
                first = Failed(exc)
            else:
                return settled(message, handler.name, outcome, key)
        steps, reply = settle(planned, self._backoff, first=first), None
        while not isinstance(step := advance(steps, reply), ProcessResult):
            reply = self._attempt(step) if isinstance(step, Run) else _pause(step)
        return step

    def _attempt(self, run: Run) -> Outcome | Failed:
        try:
            return self._run_once(run.handler, run.key, run.message)
        except BaseException as exc:  # settle() raises an exit exception again
            return Failed(exc)

    def _run_once(self, handler: RegisteredHandler, key: bytes, message: Message) -> Outcome:
        # HandlerTransaction's ``with`` block written out: this runs once per message.
        factory, sessions_for = self._session_factory, self._sessions_for
        session = sessions_for(message) if sessions_for is not None else factory()  # type: ignore[misc]
        transaction = HandlerTransaction(session, self._claims, self)
        try:
            if transaction.begin_and_claim(key, handler.name):
                transaction.run(handler, message, self._guards[handler.name], key)
                transaction.check_and_commit()
                outcome = Outcome.PROCESSED
            else:
                outcome = Outcome.DUPLICATE  # finish() rolls back: nothing of ours to keep
        except BaseException as exc:
            transaction.finish(exc)
            raise
        transaction.finish(None)
        return outcome

    def _transaction(self, message: Message | None = None) -> HandlerTransaction:
        return HandlerTransaction(self._new_session(message), self._claims, self)


def _pause(pause: Pause) -> Failed | None:
    time.sleep(pause.seconds)
    return None
