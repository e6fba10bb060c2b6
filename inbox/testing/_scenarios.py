"""The deliveries ``assert_idempotent`` puts a message through, as the real world would.

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
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace

from sqlalchemy.orm import Session

from inbox._handlers import HandlerFunc, Registry
from inbox.core import Inbox
from inbox.errors import HandlerFailed
from inbox.message import Message
from inbox.result import Outcome

__all__ = ["InjectedFailure", "Scenario", "SimulatedCrash", "scenarios"]

_CORE_LOG = logging.getLogger("inbox.core")


class InjectedFailure(Exception):
    """Raised by ``assert_idempotent`` right after a handler ran: its transaction rolls back."""


class SimulatedCrash(SystemExit):
    """Raised by ``assert_idempotent`` before a handler's commit, standing for the process
    dying there: like ``SystemExit``, the inbox rolls back and lets it through, so the
    handlers after it do not run in that delivery."""


@dataclass(frozen=True)
class Scenario:
    """A way the message reaches the handlers: ``deliver`` runs it and returns remarks on
    what the inbox reported (empty when nothing is amiss); ``between`` runs between two
    deliveries of one scenario (the caller's reset of auto-increment counters)."""

    title: str
    deliver: Callable[[Callable[[], None]], list[str]]


def scenarios(inbox: Inbox, message: Message) -> Iterator[Scenario]:
    """Twice in a row; then, per handler that takes ``message``, a redelivery after a
    failure injected once it ran, and a redelivery after a crash before its commit."""
    yield Scenario("delivered twice", functools.partial(_twice, inbox, message))
    for handler in inbox._registry.for_type(message.type):
        name = handler.name
        yield Scenario(
            f"redelivered after {name} failed once it had run (its transaction rolled back)",
            functools.partial(_after_failure, inbox, message, name),
        )
        yield Scenario(
            f"redelivered after a crash before {name} committed",
            functools.partial(_after_crash, inbox, message, name),
        )


def _twice(inbox: Inbox, message: Message, _between: Callable[[], None]) -> list[str]:
    inbox.process(message)
    again = inbox.process(message)
    return [
        f"the second delivery ran {name} again (its claim key changed between deliveries: "
        "is its key= function a function of the message alone?)"
        for name, outcome in again.outcomes.items()
        if outcome is Outcome.PROCESSED
    ]


def _after_failure(
    inbox: Inbox, message: Message, name: str, between: Callable[[], None]
) -> list[str]:
    remarks = []
    with _raising_after(inbox, name, InjectedFailure):
        try:
            inbox.process(message)
        except HandlerFailed as failed:
            if not isinstance(failed.failures.get(name), InjectedFailure):
                remarks.append(f"the first delivery failed otherwise: {failed}")
        else:
            remarks.append(f"the failure injected after {name} did not reach the inbox")
    between()
    inbox.process(message)
    return remarks


def _after_crash(
    inbox: Inbox, message: Message, name: str, between: Callable[[], None]
) -> list[str]:
    remarks = []
    with _raising_after(inbox, name, SimulatedCrash):
        try:
            inbox.process(message)
        except SimulatedCrash:
            pass
        else:
            remarks.append(f"the crash simulated before {name} committed did not happen")
    between()
    inbox.process(message)
    return remarks


@contextmanager
def _raising_after(
    inbox: Inbox, name: str, error: type[InjectedFailure] | type[SimulatedCrash]
) -> Iterator[None]:
    """Run ``inbox`` with handler ``name`` raising ``error`` once its function returned."""
    original = inbox._registry
    patched = Registry()
    for handler in original:
        wrapped = _then_raise(handler.func, name, error)
        patched.add(replace(handler, func=wrapped) if handler.name == name else handler)
    # process() routes through this attribute at every call; a test runs one delivery at
    # a time, so swapping it for the delivery is safe.
    inbox._registry = patched
    _CORE_LOG.addFilter(_hide_injected)
    try:
        yield
    finally:
        _CORE_LOG.removeFilter(_hide_injected)
        inbox._registry = original


def _hide_injected(record: logging.LogRecord) -> bool:
    """Keep the inbox's log of a failed handler for real failures only: the ones injected
    here would fill a failing test's captured log with tracebacks of no interest."""
    raised = record.exc_info[1] if record.exc_info else None
    return not isinstance(raised, InjectedFailure | SimulatedCrash)


def _then_raise(
    func: HandlerFunc, name: str, error: type[InjectedFailure] | type[SimulatedCrash]
) -> HandlerFunc:
    def run_then_raise(message: Message, session: Session) -> object:
        func(message, session)
        raise error(f"injected by assert_idempotent after {name} ran")

    return run_then_raise
