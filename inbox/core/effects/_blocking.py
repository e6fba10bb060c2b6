"""``Inbox.effect``: the steps of :func:`inbox.core.effects._steps.effect_steps` carried out
blocking: the ledger's writes in transactions of their own, on connections of their own
(:mod:`inbox.core.effects._pool`), the call between them.

What only the store decides lives here too, for both inboxes: which engine the ledger writes
with, and why SQLite needs a store of its own.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Awaitable, Callable
from inspect import CO_COROUTINE
from types import FunctionType
from typing import Any, Final

from sqlalchemy import Engine

from inbox._backends import check_supported, family_of
from inbox.core._steps import Failed
from inbox.core.effects._identity import EffectRef
from inbox.core.effects._pool import LedgerEngines
from inbox.core.effects._steps import Call, EffectsBase, Write
from inbox.errors import ConfigurationError, EffectError, UnsupportedDialect

__all__ = ["EffectCall", "Effects", "ledger_engine", "refuse_sqlite_claim_store"]

EffectCall = Callable[[Any], Any]
"""``call(key)``: makes the effect, passing ``key`` (a UUID) to the other side as its
idempotency key, and returns a JSON-serializable result."""


def refuse_sqlite_claim_store(store_url: object, claim_engine: Engine, has_own: bool) -> None:
    """SQLite lets one transaction write at a time, and the claim's holds that lock while
    the handler runs: effect records written beside it would wait for it for ever."""
    if not family_of(claim_engine).one_writer_at_a_time:
        return
    if not has_own or store_url == claim_engine.url:
        raise UnsupportedDialect(
            "inbox.effect() on SQLite needs an effect store of its own: the claim's "
            "transaction holds SQLite's only write lock while the handler runs. Pass "
            "effect_store=create_engine('sqlite:///effects.db') (another file, with the "
            "effect table created in it) to the inbox"
        )


class Effects(EffectsBase[Engine]):
    """The effects of one blocking inbox: its ledger, its store, its retry policy."""

    @staticmethod
    def _check_store(store: object) -> None:
        if not isinstance(store, Engine):
            raise ConfigurationError(
                "effect_store must be a sqlalchemy Engine (create_engine(...)), got "
                f"{type(store).__name__}"
            )
        check_supported(store.dialect)
        if store.dialect.is_async:
            raise ConfigurationError("effect_store of a blocking Inbox must be a blocking Engine")

    def run(self, step: object, call: EffectCall, mode: object) -> Any:
        """``Inbox.effect``: see its docstring."""
        run, ref, steps = self._begin(step, call, mode)
        # A plain function that is no coroutine function is told without a call.
        plain = call.__class__ is FunctionType and not call.__code__.co_flags & CO_COROUTINE
        if not plain and inspect.iscoroutinefunction(call):
            raise EffectError(
                f"effect {ref.step!r}: call is a coroutine function; the blocking Inbox cannot "
                "await it (use inbox.aio.AsyncInbox and 'await inbox.effect(...)')"
            )
        engine = ledger_engine(self._ledgers, self._store, run.connection.engine)
        reply: object = None
        try:
            while True:
                step = steps.send(reply)
                if step.__class__ is Write:
                    try:
                        with engine.connect() as connection:
                            reply = step.op(connection, *step.args)
                    except BaseException as exc:
                        reply = Failed(exc)
                elif step.__class__ is Call:
                    ref = step.ref
                    run.enter(ref.step)
                    try:
                        reply = call(ref.key)
                    except BaseException as exc:
                        reply = Failed(exc)
                    finally:
                        run.leave(ref.step)
                    if reply.__class__ not in _RESULTS and inspect.isawaitable(reply):
                        reply = _awaitable(reply, ref)
                else:
                    time.sleep(step.seconds)  # type: ignore[union-attr]
                    reply = None
        except StopIteration as stop:
            return stop.value


_RESULTS: Final = frozenset({dict, list, str, int, float, bool, type(None)})
"""Types of results never awaitable: told without asking inspect."""


def _awaitable(result: Awaitable[Any], ref: EffectRef) -> Failed:
    if inspect.iscoroutine(result):
        result.close()  # never run: nothing was called
    return Failed(EffectError(f"effect {ref.step!r}: call returned an awaitable, not a result"))


def ledger_engine(ledgers: LedgerEngines, store: Engine | None, claim_engine: Engine) -> Engine:
    """The engine the ledger writes with: ``store``, or one of ``ledgers`` beside the claim's
    engine (also when the store given is the claim's own engine)."""
    refuse_sqlite_claim_store(None if store is None else store.url, claim_engine, store is not None)
    if store is None:
        return ledgers.beside(claim_engine)
    if store.pool is claim_engine.pool:  # the claim's own engine, given as the store
        return ledgers.beside(store)
    return store
