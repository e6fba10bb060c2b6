"""inbox.testing.failing_after: a handler made to fail once it ran reaches every path that runs
handlers, process() and process_batch() alike (issue 23: the earlier injection swapped the
inbox's handler table, which process_batch never read)."""

from __future__ import annotations

import pytest
from sqlalchemy import create_engine
from sqlalchemy.orm import Session, sessionmaker
from support.databases import Database
from support.effects import order, record_effect

from inbox import HandlerFailed, Inbox, Message, Outcome, RegistrationError
from inbox.testing import InjectedFailure, failing_after


def ledger_inbox(db: Database) -> Inbox:
    inbox = Inbox(db.sessions)

    @inbox.handler(name="ledger.post")
    def post(message: Message, session: Session) -> None:
        record_effect(message, session, "ledger.post")

    @inbox.handler(name="mail.queue")
    def queue(message: Message, session: Session) -> None:
        record_effect(message, session, "mail.queue")

    return inbox


def test_an_injected_failure_rolls_back_in_a_batch_and_the_handler_is_itself_again_after(
    db: Database,
) -> None:
    inbox = ledger_inbox(db)
    first, second = order("a"), order("b")

    with failing_after(inbox, "ledger.post"):
        results = inbox.process_batch([first, second])

    for result in results:
        assert isinstance(result, HandlerFailed)
        assert isinstance(result.failures["ledger.post"], InjectedFailure)
        assert result.result.outcomes["mail.queue"] is Outcome.PROCESSED
    # The injected handler's writes rolled back with its claims; the other handler committed.
    assert db.effect_counts() == {("a", "mail.queue"): 1, ("b", "mail.queue"): 1}

    again = inbox.process_batch([first, second])
    assert [r.outcomes for r in again if not isinstance(r, Exception)] == [
        {"ledger.post": Outcome.PROCESSED, "mail.queue": Outcome.DUPLICATE}
    ] * 2
    assert db.effect_counts()[("a", "ledger.post")] == 1


def test_an_injected_failure_reaches_process_too(db: Database) -> None:
    inbox = ledger_inbox(db)
    message = order("c")
    with failing_after(inbox, "mail.queue"), pytest.raises(HandlerFailed) as failed:
        inbox.process(message)
    assert set(failed.value.failures) == {"mail.queue"}
    assert db.effect_counts() == {("c", "ledger.post"): 1}


def test_a_name_that_is_not_registered_is_refused() -> None:
    inbox = Inbox(sessionmaker(create_engine("sqlite://")))
    with (
        pytest.raises(RegistrationError, match="no handler named 'nosuch'"),
        failing_after(inbox, "nosuch"),
    ):
        pass
