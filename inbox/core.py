"""The Inbox: a handler registry and ``process()``, which runs each handler exactly once."""

from __future__ import annotations

import datetime as dt
import logging
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn, TypeVar, overload

from sqlalchemy import Connection, Dialect, Table
from sqlalchemy.orm import Session

from inbox.claim import BatchClaimer, Claimer, batch_claimer_for, claimer_for
from inbox.errors import (
    HandlerFailed,
    InboxError,
    InvalidKey,
    RegistrationError,
    UnhandledMessage,
)
from inbox.message import Message, key_bytes
from inbox.registry import (
    HandlerFunc,
    KeyFunc,
    RegisteredHandler,
    Registry,
    default_name,
    validate_name,
)
from inbox.result import Outcome, ProcessResult, Unhandled
from inbox.schema import DEFAULT_TABLE_NAME, resolve_table
from inbox.transaction import (
    begin_claim_transaction,
    ensure_committable,
    guard_session,
    refuse_busy_session,
    transaction_guards,
    unguard_session,
)
from inbox._retry import is_transient

__all__ = ["Inbox"]

logger = logging.getLogger(__name__)

H = TypeVar("H", bound=HandlerFunc)

_RETRY_BASE_DELAY = 0.005


class Inbox:
    """A transactional inbox: register handlers, then ``process()`` each delivered message.

    ``session_factory`` makes a new :class:`~sqlalchemy.orm.Session` per handler transaction
    (a ``sessionmaker`` bound to your engine). ``table`` names the inbox table (default
    ``inbox_message``; ``"schema.name"`` or a :class:`~sqlalchemy.Table` also work).
    ``on_unhandled`` says what to do with a message no handler takes. ``transient_retries``
    bounds how many times a handler transaction aborted by a deadlock, serialization failure,
    lock timeout or lost connection is re-run before the error is reported.
    """

    def __init__(
        self,
        session_factory: Callable[[], Session],
        *,
        table: str | Table = DEFAULT_TABLE_NAME,
        on_unhandled: Unhandled | str = Unhandled.RAISE,
        transient_retries: int = 3,
    ) -> None:
        if not callable(session_factory):
            raise TypeError(
                "session_factory must be callable (e.g. sqlalchemy.orm.sessionmaker(engine)), "
                f"got {type(session_factory).__name__}"
            )
        if isinstance(transient_retries, bool) or not isinstance(transient_retries, int):
            raise TypeError("transient_retries must be an int")
        if transient_retries < 0:
            raise ValueError(f"transient_retries must be >= 0, got {transient_retries}")
        self._session_factory = session_factory
        self._table = resolve_table(table)
        # What the session's get_bind() sees, so that binds={inbox_table: engine} route it.
        self._bind_clause = self._table.insert()
        self._on_unhandled = Unhandled(on_unhandled)
        self._transient_retries = transient_retries
        self._registry = Registry()
        # Keyed by dialect class and paramstyle: the claim's SQL is rendered for both.
        self._claimers: dict[tuple[type[Dialect], str], Claimer] = {}
        self._batch_claimers: dict[tuple[type[Dialect], str], BatchClaimer] = {}
        self._guards: dict[str, Mapping[str, Callable[..., NoReturn]]] = {}

    @property
    def table(self) -> Table:
        """The inbox table this inbox claims into."""
        return self._table

    @property
    def handlers(self) -> tuple[RegisteredHandler, ...]:
        """Every registered handler, in registration order."""
        return tuple(self._registry)

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

    def handler(
        self,
        func_or_type: Any = None,
        /,
        *,
        name: str | None = None,
        key: KeyFunc | None = None,
    ) -> Any:
        """Register a handler. Bare ``@inbox.handler`` takes every message; called with a
        type it takes that type only. ``name=`` pins the stored handler name (default:
        ``module.qualname``); ``key=`` derives a business idempotency key from the message.

        The decorator only registers: it returns the function unchanged.
        """
        if callable(func_or_type) and not isinstance(func_or_type, str):
            return self._register(func_or_type, None, name=name, key=key)
        message_type = func_or_type
        if message_type is not None and (not isinstance(message_type, str) or not message_type):
            raise RegistrationError(
                f"handler message type must be a non-empty str or None, got {message_type!r}"
            )

        def decorate(func: H) -> H:
            return self._register(func, message_type, name=name, key=key)

        return decorate

    def _register(
        self, func: H, message_type: str | None, *, name: str | None, key: KeyFunc | None
    ) -> H:
        if not callable(func):
            raise RegistrationError(f"a handler must be callable, got {type(func).__name__}")
        if key is not None and not callable(key):
            raise RegistrationError(f"key= must be callable, got {type(key).__name__}")
        handler_name = validate_name(default_name(func) if name is None else name)
        self._registry.add(RegisteredHandler(handler_name, message_type, func, key))
        self._guards[handler_name] = transaction_guards(handler_name)
        return func

    def process(self, message: Message) -> ProcessResult:
        """Run every handler that takes ``message``, each exactly once, each in its own
        transaction with its own claim, and return one outcome per handler.

        Raises :class:`InvalidKey` (nothing ran) if a handler's key cannot be derived,
        :class:`UnhandledMessage` if no handler takes the type (unless set to ignore), and
        :class:`HandlerFailed` after all handlers ran if any of them failed: the failed ones
        were rolled back, so redelivering the message re-runs only them.
        """
        if not isinstance(message, Message):
            raise TypeError(f"process() takes an inbox.Message, got {type(message).__name__}")
        handlers = self._registry.for_type(message.type)
        if not handlers:
            if self._on_unhandled is Unhandled.RAISE:
                raise UnhandledMessage(message.id, message.type)
            logger.info("message %s of type %r ignored: no handler", message.id, message.type)
            return ProcessResult(message.id, {})
        keys = [_resolve_key(h, message) for h in handlers]
        return self._process_resolved(_Planned(message, handlers, keys))

    def _process_resolved(self, planned: _Planned) -> ProcessResult:
        message = planned.message
        outcomes: dict[str, Outcome] = {}
        failures: dict[str, Exception] = {}
        for handler, key in zip(planned.handlers, planned.keys, strict=True):
            try:
                outcomes[handler.name] = self._run_with_retries(handler, key, message)
            except Exception as exc:
                failures[handler.name] = exc
                logger.warning(
                    "handler %s failed on message %s (type %r); rolled back, claim released",
                    handler.name,
                    message.id,
                    message.type,
                    exc_info=exc,
                )
        result = ProcessResult(message.id, outcomes)
        if failures:
            raise HandlerFailed(message.id, failures, result) from next(iter(failures.values()))
        return result

    def process_batch(self, messages: Sequence[Message]) -> list[ProcessResult | InboxError]:
        """Process many messages in ONE transaction, with one claim statement per handler,
        and return, for each message in order, its result or the error :meth:`process`
        would have raised for it (:class:`HandlerFailed`, :class:`UnhandledMessage`,
        :class:`InvalidKey`).

        Every handler that takes a message runs only if its claim is new, exactly as in
        :meth:`process`, and everything commits together. If the batch transaction fails,
        it is split in halves and each half is tried again, down to single messages, which
        go through :meth:`process`: healthy messages commit and only the failing ones come
        back as errors. A batch that fails with a transient database error (deadlock, lock
        timeout, lost connection...) is re-run whole up to ``transient_retries`` times;
        after that its messages are processed one by one, each with its own retries.

        A key shared by two messages of the batch (the same id delivered twice, or one
        idempotency key) is claimed once: the first message runs, the later one is a
        duplicate. Handlers run in message order, and for each message in registration
        order, as they would one :meth:`process` call after another.
        """
        if isinstance(messages, Message) or not isinstance(messages, Sequence):
            raise TypeError(
                f"process_batch() takes a sequence of inbox.Message, got {type(messages).__name__}"
            )
        for message in messages:
            if not isinstance(message, Message):
                raise TypeError(
                    f"process_batch() takes inbox.Message items, got {type(message).__name__}"
                )
        results: list[ProcessResult | InboxError | None] = [None] * len(messages)
        planned: list[tuple[int, _Planned]] = []
        for index, message in enumerate(messages):
            handlers = self._registry.for_type(message.type)
            if not handlers:
                if self._on_unhandled is Unhandled.RAISE:
                    results[index] = UnhandledMessage(message.id, message.type)
                else:
                    logger.info(
                        "message %s of type %r ignored: no handler", message.id, message.type
                    )
                    results[index] = ProcessResult(message.id, {})
                continue
            try:
                keys = [_resolve_key(h, message) for h in handlers]
            except InvalidKey as exc:
                results[index] = exc
                continue
            planned.append((index, _Planned(message, handlers, keys)))
        settled = self._settle_batch([p for _, p in planned])
        for (index, _), outcome in zip(planned, settled, strict=True):
            results[index] = outcome
        return [r for r in results if r is not None]

    def _settle_batch(self, batch: Sequence[_Planned]) -> list[ProcessResult | InboxError]:
        if len(batch) <= 1:
            return [self._process_alone(planned) for planned in batch]
        try:
            return self._run_batch_with_retries(batch)
        except Exception as exc:
            failure = exc
        # Outside the except block: the halves' own errors must not chain to this one.
        if is_transient(failure):
            # Deadlocks, lock timeouts, a lost connection outlasted the retries: maybe one
            # message's locks, maybe the database. Each message alone then, as without
            # batching: the healthy ones commit, each gets its own retries.
            logger.warning(
                "batch of %d messages failed with a transient database error after %d "
                "retries (%s); processing its messages one by one",
                len(batch),
                self._transient_retries,
                type(failure).__name__,
            )
            del failure
            return [self._process_alone(planned) for planned in batch]
        middle = len(batch) // 2
        logger.info(
            "batch of %d messages rolled back (%s: %s); splitting it in %d + %d",
            len(batch),
            type(failure).__name__,
            failure,
            middle,
            len(batch) - middle,
        )
        del failure
        return self._settle_batch(batch[:middle]) + self._settle_batch(batch[middle:])

    def _process_alone(self, planned: _Planned) -> ProcessResult | InboxError:
        try:
            return self._process_resolved(planned)
        except HandlerFailed as failed:
            return failed

    def _run_batch_with_retries(
        self, batch: Sequence[_Planned]
    ) -> list[ProcessResult | InboxError]:
        attempt = 0
        while True:
            try:
                return list(self._run_batch_once(batch))
            except Exception as exc:
                if attempt >= self._transient_retries or not is_transient(exc):
                    raise
                attempt += 1
                delay = _RETRY_BASE_DELAY * 2**attempt * random.uniform(0.5, 1.5)
                logger.info(
                    "batch of %d messages: transient database error (%s), retry %d/%d in %.3f s",
                    len(batch),
                    type(exc).__name__,
                    attempt,
                    self._transient_retries,
                    delay,
                )
                time.sleep(delay)

    def _run_batch_once(self, batch: Sequence[_Planned]) -> list[ProcessResult]:
        session = self._session_factory()
        refuse_busy_session(session)
        session_type = type(session)
        outcomes: list[dict[str, Outcome]] = [{} for _ in batch]
        try:
            transaction, connection = begin_claim_transaction(session, self._bind_clause)
            won = self._claim_batch(connection, batch)
            ran: list[str] = []
            for planned, message_outcomes in zip(batch, outcomes, strict=True):
                for handler, key in zip(planned.handlers, planned.keys, strict=True):
                    owned = won[handler.name]
                    if key not in owned:
                        message_outcomes[handler.name] = Outcome.DUPLICATE
                        continue
                    owned.discard(key)  # a later message with this key is a duplicate
                    guard_session(session, self._guards[handler.name], connection)
                    try:
                        handler.func(planned.message, session)
                    finally:
                        unguard_session(session, connection)
                    ran.append(handler.name)
                    message_outcomes[handler.name] = Outcome.PROCESSED
            ensure_committable(session, transaction, connection, ", ".join(dict.fromkeys(ran)))
            session_type.commit(session)
        except BaseException:
            _rollback_quietly(session, session_type)
            raise
        finally:
            session_type.close(session)
        results = []
        for planned, message_outcomes in zip(batch, outcomes, strict=True):
            message = planned.message
            for name, outcome in message_outcomes.items():
                if outcome is Outcome.DUPLICATE:
                    logger.info(
                        "duplicate skipped: message %s (type %r) already processed by %s",
                        message.id,
                        message.type,
                        name,
                    )
            results.append(ProcessResult(message.id, message_outcomes))
        return results

    def _claim_batch(
        self, connection: Connection, batch: Sequence[_Planned]
    ) -> dict[str, set[bytes]]:
        """One claim statement per handler for all its keys in the batch; the keys won."""
        keys_by_handler: dict[str, set[bytes]] = {}
        for planned in batch:
            for handler, key in zip(planned.handlers, planned.keys, strict=True):
                keys_by_handler.setdefault(handler.name, set()).add(key)
        claim_many = self._batch_claimer(connection)
        at = _now()
        won: dict[str, set[bytes]] = {}
        for handler in self._registry:  # registration order, as every batch does
            keys = keys_by_handler.get(handler.name)
            if keys:
                won[handler.name] = set(claim_many(connection, sorted(keys), handler.name, at))
        return won

    def _run_with_retries(
        self, handler: RegisteredHandler, key: bytes, message: Message
    ) -> Outcome:
        attempt = 0
        while True:
            try:
                return self._run_once(handler, key, message)
            except Exception as exc:
                if attempt >= self._transient_retries or not is_transient(exc):
                    raise
                attempt += 1
                delay = _RETRY_BASE_DELAY * 2**attempt * random.uniform(0.5, 1.5)
                logger.info(
                    "handler %s on message %s: transient database error (%s), "
                    "retry %d/%d in %.3f s",
                    handler.name,
                    message.id,
                    type(exc).__name__,
                    attempt,
                    self._transient_retries,
                    delay,
                )
                time.sleep(delay)

    def _run_once(self, handler: RegisteredHandler, key: bytes, message: Message) -> Outcome:
        session = self._session_factory()
        refuse_busy_session(session)
        session_type = type(session)
        try:
            transaction, connection = begin_claim_transaction(session, self._bind_clause)
            if not self._claimer(connection)(connection, key, handler.name, _now()):
                session_type.rollback(session)
                logger.info(
                    "duplicate skipped: message %s (type %r) already processed by %s",
                    message.id,
                    message.type,
                    handler.name,
                )
                return Outcome.DUPLICATE
            guard_session(session, self._guards[handler.name], connection)
            try:
                handler.func(message, session)
            finally:
                unguard_session(session, connection)
            ensure_committable(session, transaction, connection, handler.name)
            # The handler's effects and the claim commit together, or not at all.
            session_type.commit(session)
        except BaseException:
            _rollback_quietly(session, session_type)
            raise
        finally:
            session_type.close(session)
        logger.debug("message %s (type %r) processed by %s", message.id, message.type, handler.name)
        return Outcome.PROCESSED

    def _batch_claimer(self, connection: Connection) -> BatchClaimer:
        return _for_dialect(self._batch_claimers, batch_claimer_for, self._table, connection)

    def _claimer(self, connection: Connection) -> Claimer:
        return _for_dialect(self._claimers, claimer_for, self._table, connection)


C = TypeVar("C")


def _for_dialect(
    cache: dict[tuple[type[Dialect], str], C],
    build: Callable[[Table, Dialect], C],
    table: Table,
    connection: Connection,
) -> C:
    """The claim function ``build`` makes for the connection's dialect, built once."""
    dialect = connection.dialect
    key = (type(dialect), dialect.paramstyle)
    made = cache.get(key)
    if made is None:
        made = cache[key] = build(table, dialect)
    return made


@dataclass(frozen=True, slots=True)
class _Planned:
    """A message with the handlers that take it and each handler's claim key."""

    message: Message
    handlers: Sequence[RegisteredHandler]
    keys: Sequence[bytes]


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _resolve_key(handler: RegisteredHandler, message: Message) -> bytes:
    if handler.key is None:
        business_key = message.idempotency_key
        if business_key is None:
            return message.id.bytes
        try:
            return key_bytes(business_key)
        except ValueError as exc:
            raise InvalidKey(handler.name, message.id, f"idempotency-key: {exc}") from None
    try:
        value = handler.key(message)
    except Exception as exc:
        raise InvalidKey(handler.name, message.id, f"key function raised {exc!r}") from exc
    try:
        return key_bytes(value)
    except ValueError as exc:
        raise InvalidKey(handler.name, message.id, str(exc)) from None


def _rollback_quietly(session: Session, session_type: type[Session]) -> None:
    """Roll back after a failure without letting a failing rollback hide the failure."""
    try:
        session_type.rollback(session)
    except Exception:
        logger.exception("rollback after a failed handler transaction failed as well")
