"""The deliveries ``assert_idempotent`` puts a message through, as the real world would, as
generators of steps that do no I/O: a blocking and an async driver run the same ones.

Failures are injected by running the inbox with a patched copy of its handler table: the
chosen handler's function is wrapped so that, once the user's function has returned (its
writes made in the inbox's transaction), the wrapper raises. The inbox cannot tell that from
the handler failing at its last line, so it rolls the transaction back exactly as it would
in production; nothing in the inbox's own modules knows about tests. The original table is
put back when the delivery is over.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Generator, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any, TypeAlias

from sqlalchemy import Connection

from inbox.core._handlers import HandlerFunc, Registry, is_coroutine_callable
from inbox.core._registration import AnyInbox
from inbox.errors import HandlerFailed
from inbox.result import Outcome, ProcessResult

__all__ = [
    "Deliver",
    "InjectedFailure",
    "OnDatabase",
    "Scenario",
    "SimulatedCrash",
    "Steps",
    "raising_after",
    "scenarios",
]

_CORE_LOG = logging.getLogger("inbox.core")


class InjectedFailure(Exception):
    """Raised by ``assert_idempotent`` right after a handler ran: its transaction rolls back."""


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
    original = inbox._registry
    patched = Registry()
    for handler in original:
        wrapped = _then_raise(handler.func, step.failing, step.error)
        patched.add(replace(handler, func=wrapped) if handler.name == step.failing else handler)
    # process() routes through this attribute at every call; a test runs one delivery at
    # a time, so swapping it for the delivery is safe.
    inbox._registry = patched
    _CORE_LOG.addFilter(_hide_injected)
    try:
        yield
    finally:
        _CORE_LOG.removeFilter(_hide_injected)
        inbox._registry = original


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
