"""Transient errors produced by the real servers and SQLite are recognised and retried."""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
import uuid
from pathlib import Path

import pytest
from sqlalchemy import Engine, create_engine, event, insert, text
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker
from support.databases import Database, effects
from support.effects import Recorder, order, record_effect

from inbox import Inbox, Message, Outcome
from inbox.core._retry import is_transient


def test_mariadb_lock_wait_timeout_is_retried_until_the_lock_is_released(
    mariadb_db: Database,
) -> None:
    """Another transaction holds a row lock past innodb_lock_wait_timeout (error 1205); the
    inbox re-runs the handler transaction, which succeeds once the lock is released."""
    with mariadb_db.engine.begin() as connection:
        connection.execute(insert(effects).values(id=1, ref="seed", handler="seed"))
    impatient = create_engine(
        mariadb_db.url, connect_args={"init_command": "SET SESSION innodb_lock_wait_timeout=1"}
    )
    inbox = Inbox(sessionmaker(impatient), transient_retries=5)
    attempts: list[float] = []

    @inbox.handler("order.created", name="billing.charge")
    def charge(message: Message, session: Session) -> None:
        attempts.append(time.monotonic())
        session.execute(text("UPDATE effects SET handler = 'charged' WHERE id = 1"))
        record_effect(message, session, "billing.charge")

    locked = threading.Event()

    def hold_the_row() -> None:
        with mariadb_db.engine.connect() as connection, connection.begin():
            connection.execute(text("UPDATE effects SET ref = 'held' WHERE id = 1"))
            locked.set()
            time.sleep(1.6)

    holder = threading.Thread(target=hold_the_row)
    holder.start()
    try:
        assert locked.wait(10)
        assert inbox.process(order(1)).outcome is Outcome.PROCESSED
    finally:
        holder.join()
        impatient.dispose()
    assert len(attempts) >= 2, "the lock wait timeout was not retried"
    assert mariadb_db.effect_counts()[("1", "billing.charge")] == 1


def test_sqlite_busy_is_retried_until_the_writer_finishes(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "busy.db"
    engine = create_engine(f"sqlite:///{path}", connect_args={"timeout": 0})
    from inbox.schema import metadata

    metadata.create_all(engine)
    effects.metadata.create_all(engine)
    inbox = Inbox(sessionmaker(engine), transient_retries=8)

    @inbox.handler("order.created", name="billing.charge")
    def charge(message: Message, session: Session) -> None:
        record_effect(message, session, "billing.charge")

    writer = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    writer.execute("BEGIN IMMEDIATE")
    releaser = threading.Timer(0.3, writer.execute, args=("COMMIT",))
    caplog.set_level(logging.INFO, logger="inbox")
    releaser.start()
    try:
        assert inbox.process(order(1)).outcome is Outcome.PROCESSED
    finally:
        releaser.join()
        writer.close()
        engine.dispose()
    assert any("transient database error" in r.getMessage() for r in caplog.records)


def test_a_real_duplicate_key_error_is_not_transient(db: Database) -> None:
    with db.engine.begin() as connection:
        connection.execute(insert(effects).values(id=1, ref="a", handler="a"))
    with pytest.raises(IntegrityError) as error, db.engine.begin() as connection:
        connection.execute(insert(effects).values(id=1, ref="a", handler="a"))
    assert not is_transient(error.value)
    assert not is_transient(RuntimeError("deadlock"))


def test_a_transient_error_wrapped_by_a_handler_is_still_recognised(pg_db: Database) -> None:
    def payment_step() -> None:
        with pg_db.engine.begin() as connection:
            try:
                connection.execute(
                    text("DO $$ BEGIN RAISE EXCEPTION 'x' USING ERRCODE = '40001'; END $$")
                )
            except Exception as exc:
                raise RuntimeError("payment step failed") from exc

    with pytest.raises(RuntimeError) as error:
        payment_step()
    assert is_transient(error.value)


def test_a_connection_killed_by_the_server_is_replaced_and_the_message_processed(
    pg_db: Database, admin_engines: dict[str, Engine]
) -> None:
    """pg_terminate_backend on the pooled connection: the claim fails with a lost
    connection, which is invalidated and retried on a fresh one."""
    name = f"inbox-kill-{uuid.uuid4().hex[:8]}"
    engine = create_engine(
        pg_db.url, pool_size=1, max_overflow=0, connect_args={"application_name": name}
    )
    recorder = Recorder(Inbox(sessionmaker(engine)))
    recorder.add("billing.charge")
    try:
        recorder.inbox.process(order(0))  # the pool now holds one idle connection
        with admin_engines["postgresql"].connect() as admin:
            killed = admin.execute(
                text(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                    "WHERE application_name = :name"
                ),
                {"name": name},
            ).scalar_one()
        assert killed == 1
        assert recorder.inbox.process(order(1)).outcome is Outcome.PROCESSED
    finally:
        engine.dispose()
    assert pg_db.effect_counts() == {("0", "billing.charge"): 1, ("1", "billing.charge"): 1}


@pytest.mark.parametrize("instrumented", [False, True], ids=["plain", "with-listener"])
def test_statement_listeners_see_the_claim(db: Database, instrumented: bool) -> None:
    seen: list[str] = []
    engine = create_engine(db.url)
    if instrumented:
        event.listen(
            engine, "before_cursor_execute", lambda conn, cur, sql, *rest: seen.append(sql)
        )
    recorder = Recorder(Inbox(sessionmaker(engine)))
    recorder.add("billing.charge")
    try:
        assert recorder.inbox.process(order(1)).outcome is Outcome.PROCESSED
        assert recorder.inbox.process(order(1, **{"idempotency-key": "k"})).outcome is (
            Outcome.PROCESSED
        )
    finally:
        engine.dispose()
    claims_seen = [s for s in seen if s.startswith("INSERT INTO inbox_message")]
    checks_seen = [s for s in seen if s.startswith("SELECT") and "inbox_message" in s]
    assert len(claims_seen) == (2 if instrumented else 0)
    # Before each commit, one check that the transaction still holds its claim; none on
    # PostgreSQL, where the server's reported marker tells it
    # (inbox/_backends/postgresql/_psycopg2.py), nor on MariaDB through PyMySQL, where the
    # commands since the claim and the server's status flags do
    # (inbox/_backends/mysql/_pymysql.py).
    checks = 2 if db.backend == "sqlite" else 0
    assert len(checks_seen) == (checks if instrumented else 0)
