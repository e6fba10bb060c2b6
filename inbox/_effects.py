"""``Inbox.effect``: a call outside the database made once per (claim, handler, step), its
record kept by :mod:`inbox._effect_ledger` in the effect store, in transactions of its own.

What the blocking and the async inbox share lives here too: checking the arguments and the
store, naming the effect, the result's JSON round trip and the failure's one-line text.
"""

from __future__ import annotations

import datetime as dt
import inspect
import json
import logging
from collections.abc import Callable
from typing import Any, Final

from sqlalchemy import Engine, Table

from inbox._backends import check_supported
from inbox._effect_ledger import (
    Call,
    EffectMode,
    EffectRef,
    Ledger,
    Stored,
    effect_key,
    parse_mode,
    validate_step,
)
from inbox._effect_run import HandlerRun, current_run
from inbox._retry import Backoff, is_transient, run_with_retries
from inbox.errors import EffectError, UnsupportedDialect
from inbox.schema import resolve_effect_table

__all__ = [
    "EffectCall",
    "Effects",
    "begin_effect",
    "describe_error",
    "encode_result",
    "refuse_sqlite_claim_store",
    "result_refused",
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
    owner: object, step: object, call: object, mode: object
) -> tuple[HandlerRun, EffectRef, EffectMode]:
    """Check ``effect()``'s arguments and that a handler of ``owner`` runs here; name the
    effect. Raises before anything is written."""
    checked_mode = parse_mode(mode)
    checked_step = validate_step(step)
    if not callable(call):
        raise TypeError(f"effect call must be callable, got {type(call).__name__}")
    run = current_run(owner)
    if run.inside(checked_step):
        raise EffectError(
            f"effect {checked_step!r} of handler {run.handler!r} was entered again from "
            "inside its own call: nothing was called a second time. Use another step name "
            "for a nested effect"
        )
    key = effect_key(run.claim_key, run.handler, checked_step)
    return run, EffectRef(key, run.claim_key, run.handler, checked_step), checked_mode


def encode_result(ref: EffectRef, result: object) -> tuple[str | None, EffectError | None]:
    """The JSON text to store for ``result``, or (None, the error to raise) when it cannot
    be stored: the call was made, so that is recorded as done without a result."""
    try:
        # ASCII escapes: any text (a lone surrogate too) fits every column and driver.
        return json.dumps(result, allow_nan=False), None
    except (TypeError, ValueError, RecursionError) as exc:
        error = EffectError(
            f"effect {ref.step!r} of handler {ref.handler!r} returned a result that cannot "
            f"be stored as JSON ({type(exc).__name__}: {exc}). The call was made and is "
            "recorded done without its result: it will not be made again, and every later "
            "attempt raises UncertainEffect until a person releases the record"
        )
        error.__cause__ = exc
        return None, error


def result_refused(ref: EffectRef, exc: Exception) -> EffectError:
    """The error for a result the database refused to store (too large for the column or
    the connection): the call was made, so it is recorded done without its result."""
    return EffectError(
        f"effect {ref.step!r} of handler {ref.handler!r}: the database refused to store its "
        f"result ({describe_error(exc)}). The call was made and is recorded done without its "
        "result: it will not be made again, and every later attempt raises UncertainEffect "
        "until a person releases the record"
    )


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
        self, owner: object, store: Engine | None, table: str | Table, backoff: Backoff
    ) -> None:
        if store is not None:
            if not isinstance(store, Engine):
                raise TypeError(
                    "effect_store must be a sqlalchemy Engine (create_engine(...)), got "
                    f"{type(store).__name__}"
                )
            check_supported(store.dialect)
            if store.dialect.is_async:
                raise TypeError("effect_store of a blocking Inbox must be a blocking Engine")
        self._owner = owner
        self._store = store
        self.ledger = Ledger(resolve_effect_table(table))
        self._backoff = backoff

    def run(self, step: object, call: EffectCall, mode: object) -> Any:
        """``Inbox.effect``: see its docstring."""
        run, ref, checked_mode = begin_effect(self._owner, step, call, mode)
        if inspect.iscoroutinefunction(call):
            raise EffectError(
                f"effect {ref.step!r}: call is a coroutine function; the blocking Inbox cannot "
                "await it (use inbox.aio.AsyncInbox and 'await inbox.effect(...)')"
            )
        engine = self._engine(run)
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
        text, unstorable = encode_result(ref, result)
        try:
            self._retrying(ref, lambda: self._finish(engine, ref, begun, text))
        except Exception as refused:
            if text is None or is_transient(refused):
                raise  # still 'started': the next attempt decides by the mode
            self._retrying(ref, lambda: self._finish(engine, ref, begun, None))
            raise result_refused(ref, refused) from refused
        if unstorable is not None:
            raise unstorable
        assert text is not None
        return json.loads(text)

    def _engine(self, run: HandlerRun) -> Engine:
        claim_engine = run.connection.engine
        store = self._store
        refuse_sqlite_claim_store(
            None if store is None else store.url, claim_engine, store is not None
        )
        return claim_engine if store is None else store

    def _start(
        self, engine: Engine, ref: EffectRef, mode: EffectMode, at: dt.datetime
    ) -> Call | Stored:
        with engine.connect() as connection:
            return self.ledger.start(connection, ref, mode, at)

    def _finish(self, engine: Engine, ref: EffectRef, begun: Call, text: str | None) -> None:
        with engine.connect() as connection:
            if not self.ledger.finish(connection, ref, begun.attempt, text, now()):
                log_superseded(ref, begun)

    def _record_failure(
        self, engine: Engine, ref: EffectRef, begun: Call, exc: BaseException
    ) -> None:
        error = describe_error(exc)
        try:
            with engine.connect() as connection:
                if not self.ledger.fail(connection, ref, begun.attempt, error, now()):
                    log_superseded(ref, begun)
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


def log_superseded(ref: EffectRef, begun: Call) -> None:
    """A later attempt took the record over while this one's call ran: this attempt lost
    its claim (its database connection went), so its handler cannot commit anyway."""
    logger.warning(
        "effect %r of %r: attempt %d ended after a later attempt took the record over "
        "(this attempt's claim was lost); its outcome is not recorded",
        ref.step,
        ref.handler,
        begun.attempt,
    )
