"""A claim that fails at COMMIT with error 1213, as Galera reports a certification conflict
(two nodes claimed the same key; the one certified second is rolled back at COMMIT, not made
to wait on the unique index): the inbox re-runs the transaction and the re-run finds the
winner's claim, a duplicate. Never a second commit, never an error for the delivery.

The conflict is made on the suite's MariaDB by the driver's COMMIT: it rolls the transaction
back and raises the error Galera raises. tools/cluster/galera_conflicts.py shows the same on
a real three-node cluster."""

from __future__ import annotations

from typing import Any

import pymysql
import pytest
from sqlalchemy import create_engine
from sqlalchemy.orm import Session, sessionmaker
from support.databases import Database
from support.effects import record_effect

from inbox import Inbox, Message, Outcome

HANDLER = "billing.charge"


def _galera_commit(engine: Any, monkeypatch: pytest.MonkeyPatch, before_raising: Any) -> list[int]:
    """The engine's next COMMIT is rolled back and fails with 1213, after ``before_raising``
    (the other node's commit) ran; later ones commit. Returns the list of failed commits."""
    failed: list[int] = []
    do_commit = engine.dialect.do_commit

    def certification_conflict(dbapi_connection: Any) -> None:
        if failed:
            do_commit(dbapi_connection)
            return
        failed.append(1213)
        dbapi_connection.rollback()
        before_raising()
        raise pymysql.err.OperationalError(
            1213, "Deadlock found when trying to get lock; try restarting transaction"
        )

    monkeypatch.setattr(engine.dialect, "do_commit", certification_conflict)
    return failed


def test_a_claim_that_loses_certification_at_commit_is_re_run_and_is_a_duplicate(
    mariadb_db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    message = Message.new("order.created", {"ref": "o1"})
    runs: list[str] = []

    def charge(message: Message, session: Session) -> None:
        runs.append("loser")
        record_effect(message, session, HANDLER)

    def winner_charge(message: Message, session: Session) -> None:
        runs.append("winner")
        record_effect(message, session, HANDLER)

    winner = Inbox(sessionmaker(mariadb_db.engine))
    winner.handler("order.created", name=HANDLER)(winner_charge)
    loser_engine = create_engine(mariadb_db.url)
    loser = Inbox(sessionmaker(loser_engine))
    loser.handler("order.created", name=HANDLER)(charge)
    failed = _galera_commit(loser_engine, monkeypatch, lambda: winner.process(message))
    try:
        result = loser.process(message)
    finally:
        loser_engine.dispose()

    assert failed == [1213], "the scenario must fail one COMMIT with 1213"
    assert result.outcomes == {HANDLER: Outcome.DUPLICATE}
    # The loser ran once (rolled back at COMMIT); its re-run stopped at the winner's claim.
    assert runs == ["loser", "winner"]
    assert mariadb_db.effect_counts() == {("o1", HANDLER): 1}


def test_a_claim_rolled_back_at_commit_with_no_winner_is_re_run_and_commits_once(
    mariadb_db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The certification conflict was on another row of the handler's writes: nobody holds
    the claim, so the re-run processes it, once."""
    message = Message.new("order.created", {"ref": "o2"})
    runs: list[str] = []

    def charge(message: Message, session: Session) -> None:
        runs.append("run")
        record_effect(message, session, HANDLER)

    engine = create_engine(mariadb_db.url)
    inbox = Inbox(sessionmaker(engine))
    inbox.handler("order.created", name=HANDLER)(charge)
    failed = _galera_commit(engine, monkeypatch, lambda: None)
    try:
        result = inbox.process(message)
    finally:
        engine.dispose()

    assert failed == [1213]
    assert result.outcomes == {HANDLER: Outcome.PROCESSED}
    assert runs == ["run", "run"]
    assert mariadb_db.effect_counts() == {("o2", HANDLER): 1}
