"""``Inbox.effect``: a call outside the database made once per (claim, tenant, handler,
step), its record kept by :mod:`inbox.core.effects._ledger` in the effect store, in transactions of
their own, on connections of their own (:mod:`inbox.core.effects._pool`).

What the blocking and the async inbox share lives here too: checking the arguments and the
store, naming the effect, and the failure's one-line text; the result's way into the
ledger is :mod:`inbox.core.effects._results`.
"""

from __future__ import annotations

import datetime as dt
import inspect
import json
import logging
from collections.abc import Callable
from typing import Any, Final

from sqlalchemy import Engine, Table

from inbox.core._backends import check_supported
from inbox.core._retry import Backoff, run_with_retries
from inbox.core._run import HandlerRun, current_run
from inbox.core.effects._identity import (
    EffectMode,
    EffectRef,
    effect_key,
    is_version_1,
    parse_mode,
    validate_step,
    version_1_key,
)
from inbox.core.effects._ledger import Call, Ledger, Stored
from inbox.core.effects._pool import LedgerEngines
from inbox.core.effects._results import (
    Kept,
    KeptResults,
    encode_result,
    refuses_result,
    result_refused,
)
from inbox.core.effects._tenant import tenant_of
from inbox.errors import ConfigurationError, EffectError, UnsupportedDialect
from inbox.schema import resolve_effect_table

__all__ = [
    "EffectCall",
    "Effects",
    "begin_effect",
    "describe_error",
    "log_superseded",
    "log_unrecorded",
    "refuse_sqlite_claim_store",
]

logger = logging.getLogger("inbox.effects")

EffectCall = Callable[[Any], Any]
"""``call(key)``: makes the effect, passing ``key`` (a UUID) to the other side as its
idempotency key, and returns a JSON-serializable result."""

_ERROR_MAX_CHARS: Final = 500


def refuse_sqlite_claim_store(store_url: object, claim_engine: Engine, has_own: bool) -> None:
    """SQLite lets one transaction write at a time, and the claim's holds that lock while
    the handler runs: effect records written beside it would wait for it for ever."""
    if claim_engine.dialect.name != "sqlite":
        return
    if not has_own or store_url == claim_engine.url:
        raise UnsupportedDialect(
            "inbox.effect() on SQLite needs an effect store of its own: the claim's "
            "transaction holds SQLite's only write lock while the handler runs. Pass "
            "effect_store=create_engine('sqlite:///effects.db') (another file, with the "
            "effect table created in it) to the inbox"
        )


def begin_effect(
    owner: object, step: object, call: object, mode: object, *, tenants: bool, shared_store: bool
) -> tuple[HandlerRun, EffectRef, EffectMode]:
    """Check ``effect()``'s arguments and that a handler of ``owner`` runs here; name the
    effect. Raises before anything is written.

    ``tenants``: ``owner`` takes its sessions per message (``sessions_for``), so the run's
    tenant is part of the effect. ``shared_store``: the records of every tenant share one
    store, where a record of an earlier version (keyed without the tenant) cannot be told
    to be this tenant's, so it is not looked for.
    """
    checked_mode = parse_mode(mode)
    checked_step = validate_step(step)
    if not callable(call):
        raise ConfigurationError(f"effect call must be callable, got {type(call).__name__}")
    run = current_run(owner)
    if run.inside(checked_step):
        raise EffectError(
            f"effect {checked_step!r} of handler {run.handler!r} was entered again from "
            "inside its own call: nothing was called a second time. Use another step name "
            "for a nested effect"
        )
    tenant = tenant_of(run.connection, per_message_sessions=tenants)
    key = effect_key(run.claim_key, run.handler, checked_step, tenant)
    legacy = None
    shared = tenant is not None and shared_store
    if not shared and not is_version_1(run.handler, checked_step, tenant):
        legacy = version_1_key(run.claim_key, run.handler, checked_step)
    ref = EffectRef(key, run.claim_key, run.handler, checked_step, legacy)
    return run, ref, checked_mode


def describe_error(exc: BaseException) -> str:
    """The failure as the record keeps it: one line, bounded (no traceback, no SQL)."""
    lines = str(exc).strip().splitlines()
    text = f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__
    return text if len(text) <= _ERROR_MAX_CHARS else text[: _ERROR_MAX_CHARS - 1] + "…"


def now() -> dt.datetime:
    """The stamp of one ledger write (microseconds: it tells attempts apart)."""
    return dt.datetime.now(dt.UTC)


class Effects:
    """The effects of one blocking inbox: its ledger, its store, its retry policy."""

    def __init__(
        self,
        owner: object,
        store: Engine | None,
        table: str | Table,
        backoff: Backoff,
        *,
        tenants: bool = False,
    ) -> None:
        if store is not None:
            if not isinstance(store, Engine):
                raise ConfigurationError(
                    "effect_store must be a sqlalchemy Engine (create_engine(...)), got "
                    f"{type(store).__name__}"
                )
            check_supported(store.dialect)
            if store.dialect.is_async:
                raise ConfigurationError(
                    "effect_store of a blocking Inbox must be a blocking Engine"
                )
        self._owner = owner
        self._store = store
        self._tenants = tenants
        self._ledgers = LedgerEngines()
        self._kept = KeptResults()
        self.ledger = Ledger(resolve_effect_table(table))
        self._backoff = backoff

    def run(self, step: object, call: EffectCall, mode: object) -> Any:
        """``Inbox.effect``: see its docstring."""
        run, ref, checked_mode = begin_effect(
            self._owner,
            step,
            call,
            mode,
            tenants=self._tenants,
            shared_store=self._store is not None,
        )
        if inspect.iscoroutinefunction(call):
            raise EffectError(
                f"effect {ref.step!r}: call is a coroutine function; the blocking Inbox cannot "
                "await it (use inbox.aio.AsyncInbox and 'await inbox.effect(...)')"
            )
        engine = self._engine(run)
        if ref.legacy is not None:
            ref = self._retrying(ref, lambda: self._resolve(engine, ref))
        kept = self._kept.take(ref.key)
        if kept is not None and self._record(engine, ref, kept):
            return kept.result()  # made by an earlier attempt here, recorded only now
        at = now()
        begun = self._retrying(ref, lambda: self._start(engine, ref, checked_mode, at))
        if isinstance(begun, Stored):
            return json.loads(begun.result)
        if begun.attempt > 1:
            logger.info("effect %r of %r: attempt %d", ref.step, ref.handler, begun.attempt)
        run.enter(ref.step)
        try:
            result = call(ref.key)
        except BaseException as exc:
            self._record_failure(engine, ref, begun, exc)
            raise
        finally:
            run.leave(ref.step)
        if inspect.isawaitable(result):
            if inspect.iscoroutine(result):
                result.close()  # never run: nothing was called
            error = EffectError(f"effect {ref.step!r}: call returned an awaitable, not a result")
            self._record_failure(engine, ref, begun, error)
            raise error
        made = Kept(begun.attempt, *encode_result(ref, result))
        if not self._record(engine, ref, made):
            log_superseded(ref, begun.attempt)
        return made.result()

    def _record(self, engine: Engine, ref: EffectRef, made: Kept) -> bool:
        """Record the call ``made`` done: False if a later attempt took the record over. A
        result the database refuses is recorded done without it (and raises EffectError);
        any other failure leaves the record 'started', keeps the result for the next
        attempt here, and propagates."""
        try:
            return bool(self._retrying(ref, lambda: self._finish(engine, ref, made, made.text)))
        except BaseException as exc:  # a cancellation too: the call was made all the same
            if made.text is None or not isinstance(exc, Exception) or not refuses_result(exc):
                self._kept.keep(ref.key, made)
                log_unrecorded(ref, made, exc)
                raise
            self._retrying(ref, lambda: self._finish(engine, ref, made, None))
            raise result_refused(ref, exc) from exc

    def _engine(self, run: HandlerRun) -> Engine:
        claim_engine = run.connection.engine
        store = self._store
        refuse_sqlite_claim_store(
            None if store is None else store.url, claim_engine, store is not None
        )
        if store is None:
            return self._ledgers.beside(claim_engine)
        if store.pool is claim_engine.pool:  # the claim's own engine, given as the store
            return self._ledgers.beside(store)
        return store

    def _resolve(self, engine: Engine, ref: EffectRef) -> EffectRef:
        with engine.connect() as connection:
            return self.ledger.resolve(connection, ref)

    def _start(
        self, engine: Engine, ref: EffectRef, mode: EffectMode, at: dt.datetime
    ) -> Call | Stored:
        with engine.connect() as connection:
            return self.ledger.start(connection, ref, mode, at)

    def _finish(self, engine: Engine, ref: EffectRef, made: Kept, text: str | None) -> bool:
        with engine.connect() as connection:
            return self.ledger.finish(connection, ref, made.attempt, text, now())

    def _record_failure(
        self, engine: Engine, ref: EffectRef, begun: Call, exc: BaseException
    ) -> None:
        error = describe_error(exc)
        try:
            with engine.connect() as connection:
                if not self.ledger.fail(connection, ref, begun.attempt, error, now()):
                    log_superseded(ref, begun.attempt)
        except Exception:
            # The call's own failure is what the handler raises; the record stays 'started',
            # which the next attempt resolves by the mode just the same.
            logger.warning(
                "effect %r of %r: could not record the failure of attempt %d",
                ref.step,
                ref.handler,
                begun.attempt,
                exc_info=True,
            )

    def _retrying(self, ref: EffectRef, work: Callable[[], Any]) -> Any:
        return run_with_retries(
            work, self._backoff, lambda: f"effect {ref.step!r} of {ref.handler!r}"
        )


def log_superseded(ref: EffectRef, attempt: int) -> None:
    """A later attempt took the record over while this one's call ran: this attempt lost
    its claim (its database connection went), so its handler cannot commit anyway."""
    logger.warning(
        "effect %r of %r: attempt %d ended after a later attempt took the record over "
        "(this attempt's claim was lost); its outcome is not recorded",
        ref.step,
        ref.handler,
        attempt,
    )


def log_unrecorded(ref: EffectRef, made: Kept, exc: BaseException) -> None:
    """The call was made but its end could not be recorded: say so, and that it is kept."""
    logger.warning(
        "effect %r of %r: attempt %d was made, but recording it done failed (%s); the record "
        "stays 'started' and this process keeps the result for the next attempt",
        ref.step,
        ref.handler,
        made.attempt,
        describe_error(exc),
    )
