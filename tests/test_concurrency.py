"""Competing workers on real PostgreSQL and MariaDB: losing a race is a duplicate, not an error,
and a claim held by a transaction that rolls back passes to the next worker."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session, sessionmaker
from support.databases import Database
from support.effects import Recorder, order, record_effect

import inbox
from inbox import HandlerFailed, Inbox, Message, Outcome

MESSAGES = 100
THREADS = 8
PROCESSES = 4


def test_eight_threads_deliver_the_same_messages_each_effect_commits_once(
    server_db: Database,
) -> None:
    engine = create_engine(server_db.url, pool_size=THREADS, max_overflow=0)
    recorder = Recorder(Inbox(sessionmaker(engine)))
    recorder.add("billing.charge", "order.created")
    messages = [order(i) for i in range(MESSAGES)]
    barrier = threading.Barrier(THREADS)

    def deliver_all() -> Counter[Outcome]:
        barrier.wait()
        return Counter(recorder.inbox.process(m).outcome for m in messages)

    try:
        with ThreadPoolExecutor(THREADS) as pool:
            results = [f.result() for f in [pool.submit(deliver_all) for _ in range(THREADS)]]
    finally:
        engine.dispose()

    total = sum(results, Counter())
    assert total == {Outcome.PROCESSED: MESSAGES, Outcome.DUPLICATE: MESSAGES * (THREADS - 1)}
    assert server_db.effect_counts() == {(str(i), "billing.charge"): 1 for i in range(MESSAGES)}


def test_four_processes_deliver_the_same_messages_each_effect_commits_once(
    server_db: Database,
) -> None:
    ids = [str(order(i).id) for i in range(MESSAGES)]
    script = Path(__file__).with_name("concurrent_worker.py")
    # The workers import the inbox under test (this checkout) and the tests' helpers.
    package_root = Path(inbox.__file__).resolve().parent.parent
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(package_root), str(script.parent)])}
    start_at = time.time() + 3.0
    workers = [
        subprocess.Popen(
            [sys.executable, str(script), server_db.url, str(start_at), *ids],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for _ in range(PROCESSES)
    ]
    reports = []
    for worker in workers:
        out, err = worker.communicate(timeout=120)
        assert worker.returncode == 0, err
        reports.append(json.loads(out))

    assert [r["errors"] for r in reports] == [[]] * PROCESSES
    processed = sum(r["outcomes"].get("processed", 0) for r in reports)
    duplicates = sum(r["outcomes"].get("duplicate", 0) for r in reports)
    assert (processed, duplicates) == (MESSAGES, MESSAGES * (PROCESSES - 1))
    assert server_db.effect_counts() == {(i, "billing.charge"): 1 for i in ids}


@pytest.mark.parametrize("holder_fails", [True, False], ids=["holder-rolls-back", "holder-commits"])
def test_a_waiting_worker_sees_the_holders_outcome(server_db: Database, holder_fails: bool) -> None:
    """Worker B delivers while A holds the uncommitted claim: B blocks on the key, then runs
    the handler if A rolled back, or reports a duplicate if A committed."""
    inbox = Inbox(server_db.sessions)
    claimed = threading.Event()
    hold_seconds = 1.0
    runs: list[str] = []

    @inbox.handler("order.created", name="billing.charge")
    def charge(message: Message, session: Session) -> None:
        first = not runs
        runs.append(threading.current_thread().name)
        record_effect(message, session, "billing.charge")
        if first:
            claimed.set()
            time.sleep(hold_seconds)
            if holder_fails:
                raise RuntimeError("holder fails after holding the claim")

    message = order(1)

    def holder() -> Outcome:
        return inbox.process(message).outcome

    def waiter() -> tuple[Outcome, float]:
        assert claimed.wait(10)
        started = time.monotonic()
        outcome = inbox.process(message).outcome
        return outcome, time.monotonic() - started

    with ThreadPoolExecutor(2) as pool:
        held = pool.submit(holder)
        waited = pool.submit(waiter)
        waiter_outcome, waited_for = waited.result(timeout=30)
        if holder_fails:
            with pytest.raises(HandlerFailed):
                held.result(timeout=30)
        else:
            assert held.result(timeout=30) is Outcome.PROCESSED

    assert waited_for >= hold_seconds * 0.5, "the waiter did not block on the held claim"
    expected = Outcome.PROCESSED if holder_fails else Outcome.DUPLICATE
    assert waiter_outcome is expected
    assert len(runs) == (2 if holder_fails else 1)
    assert server_db.effect_counts() == {("1", "billing.charge"): 1}


def raise_sqlstate(session: Session, sqlstate: str) -> None:
    """Make PostgreSQL itself abort the transaction with ``sqlstate``."""
    session.execute(
        text(f"DO $$ BEGIN RAISE EXCEPTION 'injected' USING ERRCODE = '{sqlstate}'; END $$")
    )


def test_transient_serialization_failure_is_retried_then_commits_once(pg_db: Database) -> None:
    """A real SQLSTATE 40001 from PostgreSQL aborts the transaction; the inbox re-runs it."""
    inbox = Inbox(pg_db.sessions, transient_retries=3)
    attempts: list[int] = []

    @inbox.handler("order.created", name="billing.charge")
    def charge(message: Message, session: Session) -> None:
        attempts.append(1)
        record_effect(message, session, "billing.charge")
        if len(attempts) <= 2:
            raise_sqlstate(session, "40001")

    assert inbox.process(order(1)).outcome is Outcome.PROCESSED
    assert len(attempts) == 3
    assert pg_db.effect_counts() == {("1", "billing.charge"): 1}


def test_transient_retries_are_bounded(pg_db: Database) -> None:
    inbox = Inbox(pg_db.sessions, transient_retries=1)
    attempts: list[int] = []

    @inbox.handler("order.created", name="billing.charge")
    def charge(message: Message, session: Session) -> None:
        attempts.append(1)
        record_effect(message, session, "billing.charge")
        raise_sqlstate(session, "40P01")

    with pytest.raises(HandlerFailed) as failed:
        inbox.process(order(1))

    assert len(attempts) == 2
    error = failed.value.failures["billing.charge"]
    assert isinstance(error, DBAPIError)
    assert getattr(error.orig, "sqlstate", None) == "40P01"
    assert pg_db.effect_counts() == {}


def test_a_real_deadlock_between_two_handlers_is_retried_and_both_commit(
    server_db: Database,
) -> None:
    """Two handlers lock the same two rows in opposite orders; the database kills one of the
    transactions as a deadlock victim, and the inbox re-runs it."""
    with server_db.engine.begin() as connection:
        connection.execute(text("CREATE TABLE accounts (id INTEGER PRIMARY KEY, balance INTEGER)"))
        connection.execute(text("INSERT INTO accounts VALUES (1, 0), (2, 0)"))
    inbox = Inbox(server_db.sessions, transient_retries=5)
    both_hold_first_lock = threading.Barrier(2, timeout=10)
    attempts: Counter[str] = Counter()

    def transfer(message: Message, session: Session) -> None:
        first, second = message.body["order"]
        attempts[message.body["ref"]] += 1
        session.execute(text(f"UPDATE accounts SET balance = balance + 1 WHERE id = {first}"))
        if attempts[message.body["ref"]] == 1:
            both_hold_first_lock.wait()
        session.execute(text(f"UPDATE accounts SET balance = balance - 1 WHERE id = {second}"))
        record_effect(message, session, "ledger.transfer")

    inbox.handler("transfer", name="ledger.transfer")(transfer)
    a = Message.new("transfer", {"ref": "a", "order": [1, 2]})
    b = Message.new("transfer", {"ref": "b", "order": [2, 1]})

    with ThreadPoolExecutor(2) as pool:
        outcomes = [f.result(timeout=60) for f in [pool.submit(inbox.process, m) for m in (a, b)]]

    assert [o.outcome for o in outcomes] == [Outcome.PROCESSED, Outcome.PROCESSED]
    assert sum(attempts.values()) == 3, "exactly one deadlock victim was re-run"
    assert server_db.effect_counts() == {("a", "ledger.transfer"): 1, ("b", "ledger.transfer"): 1}
    with server_db.engine.connect() as connection:
        balances = connection.execute(text("SELECT balance FROM accounts ORDER BY id")).all()
    assert [row[0] for row in balances] == [0, 0]


def test_a_swallowed_mariadb_deadlock_is_not_committed_half_but_retried(
    mariadb_db: Database,
) -> None:
    """InnoDB rolls back the whole transaction on a deadlock, claim included. A handler that
    catches the error and goes on must not get its later writes committed without the claim:
    the inbox re-runs the handler transaction instead."""
    with mariadb_db.engine.begin() as connection:
        connection.execute(text("CREATE TABLE accounts (id INTEGER PRIMARY KEY, balance INTEGER)"))
        connection.execute(text("INSERT INTO accounts VALUES (1, 0), (2, 0)"))
        connection.execute(text("CREATE TABLE bulk (id INTEGER AUTO_INCREMENT PRIMARY KEY, v INT)"))
    inbox = Inbox(mariadb_db.sessions, transient_retries=3)
    handler_holds_row_1 = threading.Event()
    other_holds_row_2 = threading.Event()
    attempts: list[int] = []
    swallowed: list[int] = []

    @inbox.handler("transfer", name="ledger.transfer")
    def transfer(message: Message, session: Session) -> None:
        attempts.append(1)
        record_effect(message, session, "part-1")
        session.execute(text("UPDATE accounts SET balance = balance - 1 WHERE id = 1"))
        if len(attempts) == 1:
            handler_holds_row_1.set()
            time.sleep(0.5)  # the other transaction now waits for row 1
            try:
                session.execute(text("UPDATE accounts SET balance = balance - 1 WHERE id = 2"))
            except DBAPIError as exc:  # "best effort" step: the anti-pattern under test
                swallowed.append(exc.orig.args[0])  # type: ignore[union-attr]
        record_effect(message, session, "part-2")

    def other() -> None:
        with mariadb_db.engine.connect() as connection, connection.begin():
            # Heavier than the handler's transaction, so InnoDB picks the handler as victim.
            connection.execute(text("INSERT INTO bulk (v) SELECT seq FROM seq_1_to_500"))
            connection.execute(text("UPDATE accounts SET balance = balance + 1 WHERE id = 2"))
            other_holds_row_2.set()
            assert handler_holds_row_1.wait(10)
            connection.execute(text("UPDATE accounts SET balance = balance + 1 WHERE id = 1"))

    thread = threading.Thread(target=other)
    thread.start()
    assert other_holds_row_2.wait(10)
    try:
        result = inbox.process(Message.new("transfer", {"ref": "t1"}))
    finally:
        thread.join()

    assert swallowed == [1213], "the scenario must produce a real deadlock in the handler"
    assert result.outcome is Outcome.PROCESSED
    assert len(attempts) == 2
    assert mariadb_db.effect_counts() == {("t1", "part-1"): 1, ("t1", "part-2"): 1}
