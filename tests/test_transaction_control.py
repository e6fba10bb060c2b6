"""Handlers that end the inbox's transaction behind its back (raw SQL, the driver, implicit
commits), or raise what is not an Exception: never a silent duplicate, never a doubled effect.
"""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import Callable

import pytest
from sqlalchemy import event, func, insert, select, text
from sqlalchemy.orm import Session
from support.databases import Database, effects
from support.effects import order, record_effect

from inbox import (
    ClaimCommittedEarly,
    HandlerFailed,
    HandlerInterrupted,
    Inbox,
    Message,
    Outcome,
    TransactionControlError,
)
from inbox.schema import inbox_message


def claim_count(db: Database) -> int:
    with db.engine.connect() as connection:
        return int(connection.execute(select(func.count()).select_from(inbox_message)).scalar_one())


def sql(statement: str) -> Callable[[Session], None]:
    def run(session: Session) -> None:
        session.execute(text(statement))

    return run


def driver_commit(session: Session) -> None:
    driver = session.connection().connection.dbapi_connection
    assert driver is not None
    driver.commit()


def driver_rollback(session: Session) -> None:
    driver = session.connection().connection.dbapi_connection
    assert driver is not None
    driver.rollback()


EARLY_COMMITS: dict[str, Callable[[Session], None]] = {
    "sql COMMIT": sql("COMMIT"),
    "driver commit()": driver_commit,
}
# Statements after which MySQL/MariaDB commit the open transaction implicitly.
MYSQL_IMPLICIT_COMMITS: dict[str, Callable[[Session], None]] = {
    "CREATE TABLE IF NOT EXISTS": sql("CREATE TABLE IF NOT EXISTS scratch (id INT)"),
    "TRUNCATE": sql("TRUNCATE TABLE effects"),
    "LOCK TABLES": sql("LOCK TABLES effects WRITE"),
    "SET autocommit=1": sql("SET autocommit=1"),
}
ROLLBACKS: dict[str, Callable[[Session], None]] = {
    "sql ROLLBACK": sql("ROLLBACK"),
    "driver rollback()": driver_rollback,
}


def early_commit_then(
    db: Database, end: Callable[[Session], None], *, fail: bool
) -> tuple[Inbox, Message]:
    inbox = Inbox(db.sessions)

    @inbox.handler("order.created", name="sloppy")
    def sloppy(message: Message, session: Session) -> None:
        end(session)
        record_effect(message, session, "sloppy")
        if fail:
            raise RuntimeError("after the early commit")

    return inbox, order(1)


@pytest.mark.parametrize("how", list(EARLY_COMMITS))
def test_a_failure_after_an_early_commit_is_reported_as_such_never_as_a_plain_failure(
    db: Database, how: str
) -> None:
    inbox, message = early_commit_then(db, EARLY_COMMITS[how], fail=True)
    with pytest.raises(HandlerFailed) as failed:
        inbox.process(message)
    error = failed.value.failures["sloppy"]
    # Not a retryable failure: the claim is committed, so a retry would be skipped as a
    # duplicate and the writes after the commit would be lost without a word.
    assert isinstance(error, ClaimCommittedEarly)
    assert isinstance(error.__cause__, RuntimeError)
    assert error.handler == "sloppy"
    assert error.message_id == message.id
    assert claim_count(db) == 1
    assert db.effect_counts() == {}


@pytest.mark.parametrize("how", list(MYSQL_IMPLICIT_COMMITS))
def test_mariadb_implicit_commits_then_a_failure_are_reported_as_early_commits(
    mariadb_db: Database, how: str
) -> None:
    inbox, message = early_commit_then(mariadb_db, MYSQL_IMPLICIT_COMMITS[how], fail=True)
    with pytest.raises(HandlerFailed) as failed:
        inbox.process(message)
    assert isinstance(failed.value.failures["sloppy"], ClaimCommittedEarly)
    assert claim_count(mariadb_db) == 1


@pytest.mark.parametrize("how", list(EARLY_COMMITS))
def test_an_early_commit_in_a_handler_that_succeeds_keeps_the_claim_with_all_its_writes(
    db: Database, how: str
) -> None:
    inbox, message = early_commit_then(db, EARLY_COMMITS[how], fail=False)
    assert inbox.process(message).outcome is Outcome.PROCESSED
    assert inbox.process(message).outcome is Outcome.DUPLICATE
    assert claim_count(db) == 1
    assert db.effect_counts() == {("1", "sloppy"): 1}


def test_a_handler_switching_mariadb_to_autocommit_does_not_poison_the_pool(
    mariadb_db: Database,
) -> None:
    inbox, message = early_commit_then(
        mariadb_db, MYSQL_IMPLICIT_COMMITS["SET autocommit=1"], fail=False
    )
    assert inbox.process(message).outcome is Outcome.PROCESSED
    assert mariadb_db.effect_counts() == {("1", "sloppy"): 1}
    # The connection it left in autocommit mode was discarded: the next message gets a
    # normal transaction instead of a SessionConfigurationError.
    plain = Inbox(mariadb_db.sessions)

    @plain.handler("order.created", name="plain")
    def write(message: Message, session: Session) -> None:
        record_effect(message, session, "plain")

    for ref in range(2, 6):
        assert plain.process(order(ref)).outcome is Outcome.PROCESSED
    assert sum(mariadb_db.effect_counts().values()) == 5


@pytest.mark.parametrize("how", list(ROLLBACKS))
def test_writes_after_a_rollback_in_a_handler_never_commit_without_the_claim(
    db: Database, how: str
) -> None:
    inbox = Inbox(db.sessions)
    behave = [False]

    @inbox.handler("order.created", name="sloppy")
    def sloppy(message: Message, session: Session) -> None:
        record_effect(message, session, "sloppy")
        if not behave[0]:
            ROLLBACKS[how](session)
            record_effect(message, session, "sloppy")  # would commit alone, claim-less

    message = order(1)
    with pytest.raises(HandlerFailed) as failed:
        inbox.process(message)
    error = failed.value.failures["sloppy"]
    assert isinstance(error, TransactionControlError)
    assert not isinstance(error, ClaimCommittedEarly)
    assert "claim is gone" in str(error)
    assert claim_count(db) == 0
    assert db.effect_counts() == {}
    # The redelivery runs the handler once, and only once.
    behave[0] = True
    assert inbox.process(message).outcome is Outcome.PROCESSED
    for _ in range(3):
        assert inbox.process(message).outcome is Outcome.DUPLICATE
    assert db.effect_counts() == {("1", "sloppy"): 1}


def test_a_batch_whose_handler_commits_early_then_fails_reports_every_message(
    db: Database,
) -> None:
    inbox = Inbox(db.sessions)

    @inbox.handler("order.created", name="sloppy")
    def sloppy(message: Message, session: Session) -> None:
        record_effect(message, session, "sloppy")
        if message.body["ref"] == 2:
            session.execute(text("COMMIT"))
            raise RuntimeError("after the early commit")

    results = inbox.process_batch([order(ref) for ref in range(4)])
    # Which messages' writes went in with the claims cannot be known: none is reported
    # processed (or retried into a silent duplicate); every one is for reconciliation.
    assert all(isinstance(r, HandlerFailed) for r in results)
    assert all(isinstance(r.failures["sloppy"], ClaimCommittedEarly) for r in results)  # type: ignore[union-attr]


def test_a_base_exception_from_a_handler_is_a_handler_failure(db: Database) -> None:
    inbox = Inbox(db.sessions)

    @inbox.handler("order.created", name="cancelled")
    def cancelled(message: Message, session: Session) -> None:
        record_effect(message, session, "cancelled")
        raise asyncio.CancelledError

    @inbox.handler("order.created", name="fine")
    def fine(message: Message, session: Session) -> None:
        record_effect(message, session, "fine")

    message = order(1)
    with pytest.raises(HandlerFailed) as failed:
        inbox.process(message)
    error = failed.value.failures["cancelled"]
    assert isinstance(error, HandlerInterrupted)
    assert isinstance(error.__cause__, asyncio.CancelledError)
    assert failed.value.result.outcomes == {"fine": Outcome.PROCESSED}
    assert db.effect_counts() == {("1", "fine"): 1}
    # Also inside a batch: the batch bisects down to it instead of escaping.
    results = inbox.process_batch([order(2), order(3)])
    assert all(isinstance(r, HandlerFailed) for r in results)
    assert db.effect_counts()[("2", "fine")] == 1


def test_keyboard_interrupt_still_stops_the_process_and_commits_nothing(db: Database) -> None:
    inbox = Inbox(db.sessions)

    @inbox.handler("order.created", name="stopped")
    def stopped(message: Message, session: Session) -> None:
        record_effect(message, session, "stopped")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        inbox.process(order(1))
    assert claim_count(db) == 0
    with db.engine.connect() as connection:
        assert connection.execute(select(func.count()).select_from(effects)).scalar_one() == 0


def test_a_duplicate_that_claims_right_after_the_rollback_is_not_mistaken_for_an_early_commit(
    db: Database,
) -> None:
    """A concurrent delivery of the same message waits on the uncommitted claim, then claims
    and commits the key the moment the failed handler rolls back. That row is the other
    delivery's, not an early commit of ours: the failure stays an ordinary, retryable one."""
    message = order(1)
    other = db.engine  # the concurrent delivery's own connection

    def sessions() -> Session:
        session = db.sessions()
        fired: list[bool] = []

        @event.listens_for(session, "after_rollback")
        def duplicate_wins(rolled_back: Session) -> None:
            if fired:
                return
            fired.append(True)
            with other.begin() as connection:
                connection.execute(
                    insert(inbox_message).values(
                        message_id=message.id.bytes,
                        handler="flaky",
                        processed_at=dt.datetime.now(dt.UTC) + dt.timedelta(seconds=1),
                    )
                )

        return session

    inbox = Inbox(sessions)

    @inbox.handler("order.created", name="flaky")
    def flaky(message: Message, session: Session) -> None:
        record_effect(message, session, "flaky")
        raise RuntimeError("a plain failure")

    with pytest.raises(HandlerFailed) as failed:
        inbox.process(message)
    error = failed.value.failures["flaky"]
    assert not isinstance(error, ClaimCommittedEarly)
    assert isinstance(error, RuntimeError)
    assert claim_count(db) == 1  # the other delivery's claim
