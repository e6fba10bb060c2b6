"""An effect call's decisions, written once for the blocking and the async inbox.

:func:`effect_steps` is a generator of the steps one ``effect()`` takes (a ledger write, the
call, a wait before a retry), sent each step's outcome: the record started before the call,
done or failed after it; a stored result returned without calling; a result made by an
earlier attempt here recorded now; a result the database refuses recorded done without it.
What a record started but not ended means (call again, or :class:`~inbox.UncertainEffect`) is
the ledger's (:mod:`inbox.core.effects._ledger`). The shells (:mod:`inbox.core.effects._blocking`,
:mod:`inbox.aio._effects`) only carry the steps out, one blocking, one awaiting.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import uuid
from collections.abc import Callable, Generator
from dataclasses import dataclass
from datetime import UTC
from typing import Any, Final, Generic, NoReturn, TypeAlias, TypeVar

from sqlalchemy import Table

from inbox.core._retry import Backoff, rerun
from inbox.core._run import HandlerRun, current_run
from inbox.core._steps import Failed, Pause, outcome
from inbox.core.effects._identity import (
    EffectMode,
    EffectRef,
    effect_key,
    is_version_1,
    parse_mode,
    validate_step,
    version_1_key,
)
from inbox.core.effects._ledger import Ledger, Stored
from inbox.core.effects._pool import LedgerEngines
from inbox.core.effects._results import (
    Kept,
    KeptResults,
    encode_result,
    refuses_result,
    result_refused,
)
from inbox.core.effects._tenant import tenant_of
from inbox.errors import ConfigurationError, EffectError
from inbox.schema import resolve_effect_table

__all__ = [
    "Call",
    "EffectSteps",
    "EffectsBase",
    "Write",
    "describe_error",
    "effect_steps",
    "now",
]

logger = logging.getLogger("inbox.effects")

_ERROR_MAX_CHARS: Final = 500

StoreT = TypeVar("StoreT")


@dataclass(frozen=True, slots=True)
class Write:
    """Step: ``op(connection, *args)``, one of the ledger's writes, on a connection of the
    effect store; send back what it returns, or :class:`~inbox.core._steps.Failed`.
    ``to_completion``: an awaiting caller finishes it even when its task is cancelled
    meanwhile (the record of a call's failure)."""

    op: Callable[..., Any]
    args: tuple[Any, ...]
    to_completion: bool = False


@dataclass(frozen=True, slots=True)
class Call:
    """Step: make the call with ``ref.key`` as the running handler's effect ``ref.step``;
    send back its result, or :class:`~inbox.core._steps.Failed` with what it raised."""

    ref: EffectRef


EffectSteps: TypeAlias = Generator[Write | Call | Pause, Any, Any]


def effect_steps(
    ledger: Ledger,
    kept: KeptResults,
    ref: EffectRef,
    mode: EffectMode,
    backoff: Backoff,
    *,
    message_id: uuid.UUID,
) -> EffectSteps:
    """The steps of one effect ``ref`` in ``mode``, made by a handler running on the message
    ``message_id``; returns the call's result (stored, made now, or made by an earlier
    attempt here), or raises what the call raised, or the ledger's verdict
    (:class:`~inbox.UncertainEffect`, :class:`~inbox.EffectError`). Each ledger write but
    the failure's is retried as ``backoff`` allows."""

    def what() -> str:
        return f"effect {ref.step!r} of {ref.handler!r}"

    # The replies are told apart by class, not isinstance(), and the stamps taken without
    # now(): calls less on the budgeted effect path (tests/test_cost_budgets.py), as is the
    # record written inline below.
    if ref.legacy is not None:
        write = Write(ledger.resolve, (ref,))
        if (done := (yield write)).__class__ is Failed:
            done = outcome((yield from rerun(write, done, backoff, what)))
        ref = done
    made = kept.take(ref.key)  # made by an earlier attempt here, not recorded done yet
    begun = None
    while True:
        if made is None:
            write = Write(ledger.start, (ref, mode, dt.datetime.now(UTC)))
            if (begun := (yield write)).__class__ is Failed:
                begun = outcome((yield from rerun(write, begun, backoff, what)))
            if isinstance(begun, Stored):
                return json.loads(begun.result)
            if begun.attempt > 1:
                logger.info(
                    "effect %r of %r: attempt %d (message %s, effect key %s)",
                    ref.step,
                    ref.handler,
                    begun.attempt,
                    message_id,
                    ref.key,
                )
            if (result := (yield Call(ref))).__class__ is Failed:
                yield from _record_failure(ledger, ref, begun.attempt, result)
            made = Kept(begun.attempt, *encode_result(ref, result))
        write = Write(ledger.finish, (ref, made.attempt, made.text, dt.datetime.now(UTC)))
        if (done := (yield write)).__class__ is Failed:
            done = yield from rerun(write, done, backoff, what)
            if done.__class__ is Failed:
                yield from _unrecorded(ledger, kept, ref, made, done, backoff=backoff, what=what)
        if done or begun is not None:
            if not done:
                log_superseded(ref, made.attempt)
            return made.result()
        made = None  # a later attempt took over the record of the kept one: start anew


def _record_failure(
    ledger: Ledger, ref: EffectRef, attempt: int, failed: Failed
) -> Generator[Write, Any, NoReturn]:
    """Record the call's failure, to the end, and raise it."""
    fail = Write(ledger.fail, (ref, attempt, describe_error(failed.error), now()), True)
    recorded = yield fail
    if isinstance(recorded, Failed):
        if not isinstance(recorded.error, Exception):
            raise recorded.error
        # The call's own failure is what the handler raises; the record stays 'started',
        # which the next attempt resolves by the mode just the same.
        logger.warning(
            "effect %r of %r: could not record the failure of attempt %d",
            ref.step,
            ref.handler,
            attempt,
            exc_info=recorded.error,
        )
    elif not recorded:
        log_superseded(ref, attempt)
    raise failed.error


def _unrecorded(
    ledger: Ledger,
    kept: KeptResults,
    ref: EffectRef,
    made: Kept,
    failed: Failed,
    *,
    backoff: Backoff,
    what: Callable[[], str],
) -> Generator[Write | Pause, Any, NoReturn]:
    """The call ``made`` could not be recorded done. A result the database refuses is
    recorded done without it (and raises EffectError); any other failure (a cancellation
    too: the call was made all the same) leaves the record 'started', keeps the result for
    the next attempt here, and propagates."""
    error = failed.error
    if made.text is None or not isinstance(error, Exception) or not refuses_result(error):
        kept.keep(ref.key, made)
        log_unrecorded(ref, made, error)
        raise error
    write = Write(ledger.finish, (ref, made.attempt, None, now()))
    if isinstance(done := (yield write), Failed):
        outcome((yield from rerun(write, done, backoff, what)))
    raise result_refused(ref, error) from error


class EffectsBase(Generic[StoreT]):
    """The effects of one inbox, whichever way its shell carries out their steps: its
    ledger, its store (``None``: beside the claim's engine), its retry policy, the results
    it keeps for a later attempt, its ledger engines."""

    def __init__(
        self,
        owner: object,
        store: StoreT | None,
        table: str | Table,
        backoff: Backoff,
        *,
        tenants: bool = False,
        claims: Table | None = None,
    ) -> None:
        if store is not None:
            self._check_store(store)
        self._owner = owner
        self._store = store
        # The claim table when the tenant is part of the effect (sessions_for): where the
        # claim went names an unnamed tenant.
        self._tenant_claims = claims if tenants else None
        self._ledgers = LedgerEngines()
        self._kept = KeptResults()
        self._proxies: dict[int, Any] = {}  # what a shell keeps per ledger engine
        self.ledger = Ledger(resolve_effect_table(table))
        self._backoff = backoff

    @staticmethod
    def _check_store(store: object) -> None:
        """Refuse a store this inbox cannot write with."""
        raise NotImplementedError

    def _begin(
        self, step: object, call: object, mode: object
    ) -> tuple[HandlerRun, EffectRef, EffectSteps]:
        """Check ``effect()``'s arguments and that a handler of the inbox runs here; name
        the effect; its steps. Raises before anything is written.

        With sessions per message (``sessions_for``) the run's tenant is part of the
        effect. With a store of its own, the records of every tenant share it, where a
        record of an earlier version (keyed without the tenant) cannot be told to be this
        tenant's, so it is not looked for. Nor is a record under the key an earlier version
        gave an unnamed tenant before its searched schema joined its identity, unless the
        effect table is the tenant's own (found in that schema); there it is taken over, so
        an effect started before the upgrade is not called again under a new key.
        """
        checked_mode = parse_mode(mode)
        checked_step = validate_step(step)
        if not callable(call):
            raise ConfigurationError(f"effect call must be callable, got {type(call).__name__}")
        run = current_run(self._owner)
        if run.inside(checked_step):
            raise EffectError(
                f"effect {checked_step!r} of handler {run.handler!r} was entered again from "
                "inside its own call: nothing was called a second time. Use another step name "
                "for a nested effect"
            )
        store = self._store
        tenant, was = tenant_of(
            run.connection,
            claims=self._tenant_claims,
            effects=self.ledger.table if store is None else None,
        )
        key = effect_key(run.claim_key, run.handler, checked_step, tenant)
        legacy = earlier = None
        shared = tenant is not None and store is not None
        if not shared and not is_version_1(run.handler, checked_step, tenant):
            legacy = version_1_key(run.claim_key, run.handler, checked_step)
            if was is not None:
                earlier = effect_key(run.claim_key, run.handler, checked_step, was)
        ref = EffectRef(key, run.claim_key, run.handler, checked_step, legacy, earlier)
        return (
            run,
            ref,
            effect_steps(
                self.ledger, self._kept, ref, checked_mode, self._backoff, message_id=run.message_id
            ),
        )


def describe_error(exc: BaseException) -> str:
    """The failure as the record keeps it: one line, bounded (no traceback, no SQL)."""
    lines = str(exc).strip().splitlines()
    text = f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__
    return text if len(text) <= _ERROR_MAX_CHARS else text[: _ERROR_MAX_CHARS - 1] + "…"


def now() -> dt.datetime:
    """The stamp of one ledger write (microseconds: it tells attempts apart)."""
    return dt.datetime.now(dt.UTC)


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
