"""The deliveries ``assert_idempotent`` puts a message through, as the real world would, as
generators of steps that do no I/O: a blocking and an async driver run the same ones.

Failures are injected by :func:`failing_after`: inside its block the inbox's handler table
routes the chosen handler to a wrapper that raises once the user's function has returned (its
writes made in the inbox's transaction). The inbox cannot tell that from the handler failing
at its last line, so it rolls the transaction back exactly as it would in production, in
``process()`` and in ``process_batch()``. The original handler is put back when the block
ends.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Generator, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any, TypeAlias

from sqlalchemy import Connection

from inbox.core._handlers import HandlerFunc, is_coroutine_callable
from inbox.core._registration import AnyInbox
from inbox.errors import HandlerFailed, RegistrationError
from inbox.result import Outcome, ProcessResult

__all__ = [
    "Deliver",
    "InjectedFailure",
    "OnDatabase",
    "Scenario",
    "SimulatedCrash",
    "Steps",
    "failing_after",
    "raising_after",
    "scenarios",
]

_CORE_LOG = logging.getLogger("inbox.core")


class InjectedFailure(Exception):
    """Raised by ``assert_idempotent`` (or :func:`failing_after`) right after a handler ran:
    its transaction rolls back."""


class SimulatedCrash(SystemExit):
    """Raised by ``assert_idempotent`` before a handler's commit, standing for the process
    dying there: like ``SystemExit``, the inbox rolls back and lets it through, so the
    handlers after it do not run in that delivery."""


@dataclass(frozen=True)
class Deliver:
    """Step: run the message through ``inbox.process`` (with ``failing`` raising ``error``
    once it ran); the driver sends back the result or throws in what was raised."""

    failing: str | None = None
    error: type[InjectedFailure] | type[SimulatedCrash] = InjectedFailure


@dataclass(frozen=True)
class OnDatabase:
    """Step: call ``work`` with a connection (in a transaction committed after it) on the
    database ``index`` (0: the inbox's, then the separate effect store); its return value
    is sent back."""

    index: int
    work: Callable[[Connection], Any] = field(repr=False)


Step: TypeAlias = Deliver | OnDatabase
Steps: TypeAlias = Generator[Step, Any, list[str]]
"""Steps that end with remarks on what the inbox reported (empty when nothing is amiss)."""


@dataclass(frozen=True)
class Scenario:
    """A way the message reaches the handlers: ``steps(between)`` makes its steps, where
    ``between()`` makes those to take between two deliveries of one scenario."""

    title: str
    steps: Callable[[Callable[[], Generator[Step, Any, None]]], Steps]


def scenarios(handlers: Sequence[str]) -> Iterator[Scenario]:
    """Twice in a row; then, per handler that takes the message (``handlers``), a
    redelivery after a failure injected once it ran and after a crash before its commit."""
    yield Scenario("delivered twice", _twice)
    for name in handlers:
        yield Scenario(
            f"redelivered after {name} failed once it had run (its transaction rolled back)",
            functools.partial(_after, name, InjectedFailure),
        )
        yield Scenario(
            f"redelivered after a crash before {name} committed",
            functools.partial(_after, name, SimulatedCrash),
        )


def _twice(_between: Callable[[], Generator[Step, Any, None]]) -> Steps:
    yield Deliver()
    again: ProcessResult = yield Deliver()
    return [
        f"the second delivery ran {name} again (its claim key changed between deliveries: "
        "is its key= function a function of the message alone?)"
        for name, outcome in again.outcomes.items()
        if outcome is Outcome.PROCESSED
    ]


def _after(
    name: str,
    error: type[InjectedFailure] | type[SimulatedCrash],
    between: Callable[[], Generator[Step, Any, None]],
) -> Steps:
    remarks = []
    what = "failure injected" if error is InjectedFailure else "crash simulated"
    try:
        yield Deliver(name, error)
    except HandlerFailed as failed:
        if error is SimulatedCrash or not isinstance(failed.failures.get(name), error):
            remarks.append(f"the first delivery failed otherwise: {failed}")
    except SimulatedCrash:
        pass
    else:
        remarks.append(f"the {what} after {name} ran did not reach the inbox")
    yield from between()
    yield Deliver()
    return remarks


@contextmanager
def raising_after(inbox: AnyInbox, step: Deliver) -> Iterator[None]:
    """Run ``inbox`` with handler ``step.failing`` raising ``step.error`` once its function
    returned (as it is, when no handler is to fail)."""
    if step.failing is None:
        yield
        return
    with failing_after(inbox, step.failing, step.error):
        yield


@contextmanager
def failing_after(
    inbox: AnyInbox,
    handler: str,
    error: type[InjectedFailure] | type[SimulatedCrash] = InjectedFailure,
) -> Iterator[None]:
    """Inside the block, the handler named ``handler`` of ``inbox`` raises ``error`` right
    after its function returned, its writes made: its transaction rolls back as it would if
    the handler failed at its last line, in ``process()`` and ``process_batch()`` alike (a
    batch bisects down to the message). The inbox's log of these injected failures is kept
    quiet. Raises :class:`~inbox.RegistrationError` for a name that is not registered.
    """
    registered = {h.name: h for h in inbox.handlers}.get(handler)
    if registered is None:
        raise RegistrationError(f"no handler named {handler!r} is registered on this inbox")
    wrapped = replace(registered, func=_then_raise(registered.func, handler, error))
    _CORE_LOG.addFilter(_hide_injected)
    try:
        with inbox._registry.substituted(wrapped):
            yield
    finally:
        _CORE_LOG.removeFilter(_hide_injected)


def _then_raise(
    func: HandlerFunc, name: str, error: type[InjectedFailure] | type[SimulatedCrash]
) -> HandlerFunc:
    why = f"injected by assert_idempotent after {name} ran"
    if is_coroutine_callable(func):

        async def await_then_raise(message: Any, session: Any) -> object:
            await func(message, session)  # type: ignore[misc]
            raise error(why)

        return await_then_raise

    def run_then_raise(message: Any, session: Any) -> object:
        func(message, session)
        raise error(why)

    return run_then_raise


def _hide_injected(record: logging.LogRecord) -> bool:
    """Keep the inbox's log of a failed handler for real failures only: the ones injected
    here would fill a failing test's captured log with tracebacks of no interest."""
    raised = getattr(record, "inbox_error", None)
    return not isinstance(raised, InjectedFailure | SimulatedCrash)
