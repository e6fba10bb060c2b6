"""MariaDB through PyMySQL: the claim sent on the driver's own connection
(inbox/_backends/mysql/_claim.py) decides and fails exactly as through SQLAlchemy, and no
``ROLLBACK`` goes out when the pool takes back a connection whose transaction the inbox has
just ended (inbox/_backends/mysql/_pymysql.py, ``_Ending`` / ``_Ended``).
"""

from __future__ import annotations

import threading
from typing import Any

import pymysql
import pytest
import test_mysql_watch
from pymysql.connections import Connection as PyMySQLConnection
from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.exc import ProgrammingError
from sqlalchemy.orm import Session, registry, sessionmaker
from support.databases import Database
from support.effects import effects, order, record_effect

from inbox import HandlerFailed, Inbox, Message, Outcome
from inbox._backends.mysql import _claim
from inbox._backends.mysql._backend import duplicate_primary_key
from inbox._backends.mysql._pymysql import _Ended, ending
from inbox.testing.round_trips import RoundTripCounter

IN_TRANS = pymysql.constants.SERVER_STATUS.SERVER_STATUS_IN_TRANS

# test_mysql_watch's fixtures: an engine of the test's own, a PyMySQL connection of its own.
engine = test_mysql_watch.engine
driver = test_mysql_watch.driver


def driver_claims(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """The outcomes of the claims sent on the driver's connection from now on."""
    seen: list[bool] = []
    original = _claim.DriverClaim.claim

    def spy(self: Any, *args: Any) -> bool:
        won = original(self, *args)
        seen.append(won)
        return won

    monkeypatch.setattr(_claim.DriverClaim, "claim", spy)
    return seen


def test_the_claim_goes_on_the_driver_and_a_duplicate_never_runs_the_handler(
    mariadb_db: Database, engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    inbox = Inbox(sessionmaker(engine))
    ran: list[str] = []

    @inbox.handler("order.created", name="writer")
    def writer(message: Message, session: Session) -> None:
        ran.append(str(message.body["ref"]))
        record_effect(message, session, "writer")

    claims = driver_claims(monkeypatch)
    message = order(1)
    assert inbox.process(message).outcome is Outcome.PROCESSED
    assert inbox.process(message).outcome is Outcome.DUPLICATE
    assert claims == [True, False]
    assert ran == ["1"]
    assert mariadb_db.effect_counts() == {("1", "writer"): 1}


def test_concurrent_deliveries_of_one_message_commit_it_once(
    mariadb_db: Database, engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    inbox = Inbox(sessionmaker(engine))
    inside = threading.Barrier(2, timeout=30)

    @inbox.handler("order.created", name="writer")
    def writer(message: Message, session: Session) -> None:
        record_effect(message, session, "writer")
        # The winner holds its uncommitted claim while the others wait on its row lock.
        if message.body["ref"] == "held":
            inside.wait()

    claims = driver_claims(monkeypatch)
    outcomes: list[Outcome] = []
    message = Message.new("order.created", {"ref": "held"})

    def deliver() -> None:
        outcomes.append(inbox.process(message).outcome)

    threads = [threading.Thread(target=deliver) for _ in range(4)]
    for thread in threads:
        thread.start()
    inside.wait()  # one delivery is in its handler, holding the claim
    for thread in threads:
        thread.join(60)
    assert sorted(o.value for o in outcomes) == sorted(
        [Outcome.PROCESSED.value] + [Outcome.DUPLICATE.value] * 3
    )
    assert sorted(claims) == [False, False, False, True]
    assert mariadb_db.effect_counts() == {("held", "writer"): 1}


def test_a_failing_first_statement_commits_nothing_and_the_redelivery_runs(
    mariadb_db: Database, engine: Engine
) -> None:
    inbox = Inbox(sessionmaker(engine))
    fail = [True]

    @inbox.handler("order.created", name="writer")
    def writer(message: Message, session: Session) -> None:
        if fail[0]:
            session.execute(text("INSERT INTO no_such_table VALUES (1)"))
        record_effect(message, session, "writer")

    message = order(2)
    with pytest.raises(HandlerFailed) as failed:
        inbox.process(message)
    assert "no_such_table" in str(failed.value.__cause__)
    assert mariadb_db.effect_counts() == {}
    fail[0] = False
    assert inbox.process(message).outcome is Outcome.PROCESSED
    assert mariadb_db.effect_counts() == {("2", "writer"): 1}


def test_a_claim_error_is_raised_as_through_sqlalchemy(
    mariadb_db: Database, engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    with engine.begin() as connection:
        connection.execute(text("DROP TABLE inbox_message"))
    seen: list[BaseException] = []
    event.listen(engine, "handle_error", lambda context: seen.append(context.original_exception))
    inbox = Inbox(sessionmaker(engine))
    inbox.handler("order.created", name="writer")(lambda message, session: None)
    claims = driver_claims(monkeypatch)
    with pytest.raises(HandlerFailed) as failed:
        inbox.process(order(3))
    raised = failed.value.__cause__
    assert claims == []  # raised, not decided
    assert isinstance(raised, ProgrammingError)  # SQLAlchemy's, wrapping PyMySQL's
    assert raised.orig is not None
    assert raised.orig.args[0] == 1146
    assert str(raised.statement).startswith("INSERT INTO inbox_message (message_id, handler")
    assert seen == [raised.orig]  # handle_error listeners told


def test_a_connection_killed_before_the_claim_is_invalidated_and_the_message_retried(
    mariadb_db: Database, engine: Engine
) -> None:
    inbox = Inbox(sessionmaker(engine))
    inbox.handler("order.created", name="writer")(
        lambda message, session: record_effect(message, session, "writer")
    )
    assert inbox.process(order(4)).outcome is Outcome.PROCESSED
    with engine.connect() as connection:  # the pooled connection the next message gets
        thread_id = connection.connection.dbapi_connection.thread_id()  # type: ignore[union-attr]
    with mariadb_db.engine.connect() as admin:
        admin.execute(text(f"KILL {int(thread_id)}"))
    lost: list[bool] = []
    event.listen(engine, "handle_error", lambda context: lost.append(context.is_disconnect))
    assert inbox.process(order(5)).outcome is Outcome.PROCESSED  # on a fresh connection
    assert lost == [True]
    assert mariadb_db.effect_counts() == {("4", "writer"): 1, ("5", "writer"): 1}


def test_only_a_duplicate_primary_key_is_a_duplicate() -> None:
    assert duplicate_primary_key((1062, "Duplicate entry 'x' for key 'PRIMARY'"))
    assert duplicate_primary_key((1062, "Duplicate entry 'x' for key 'inbox_message.PRIMARY'"))
    assert not duplicate_primary_key((1062, "Duplicate entry 'x' for key 'ix_other'"))
    assert not duplicate_primary_key((1452, "Cannot add or update a child row: PRIMARY'"))
    assert not duplicate_primary_key((1062,))


def test_statement_listeners_see_the_claim(
    mariadb_db: Database, engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    statements: list[str] = []
    event.listen(engine, "before_cursor_execute", lambda c, cur, s, *rest: statements.append(s))
    inbox = Inbox(sessionmaker(engine))
    inbox.handler("order.created", name="writer")(lambda message, session: None)
    claims = driver_claims(monkeypatch)
    message = order(6)
    assert inbox.process(message).outcome is Outcome.PROCESSED
    assert inbox.process(message).outcome is Outcome.DUPLICATE
    assert claims == []
    assert sum(s.startswith("INSERT INTO inbox_message") for s in statements) == 2


# -- the pool's ROLLBACK after the inbox ended the transaction --------------------------------


def test_a_message_costs_the_round_trips_of_a_plain_transaction(mariadb_db: Database) -> None:
    url = mariadb_db.engine.url
    with RoundTripCounter(url.host or "127.0.0.1", url.port or 3306) as counter:
        engine = create_engine(counter.url(mariadb_db.url))
        sessions = sessionmaker(engine)
        inbox = Inbox(sessions)
        inbox.handler("order.created", name="writer")(
            lambda message, session: record_effect(message, session, "writer")
        )
        inbox.handler("order.created", name="quiet")(lambda message, session: None)
        warm = order(7)
        inbox.process(warm)  # connects
        counter.reset()
        with sessions() as session, session.begin():
            record_effect(order(8), session, "plain")
        plain = counter.count  # the statement, COMMIT, the pool's ROLLBACK
        counter.reset()
        inbox.process(order(9))
        both = counter.count  # per handler: claim (+ statement), COMMIT
        counter.reset()
        inbox.process(warm)
        duplicate = counter.count  # per handler: claim, ROLLBACK
        engine.dispose()
    assert plain == 3
    assert both == 3 + 2
    assert duplicate == 2 + 2
    assert mariadb_db.effect_counts() == {
        ("7", "writer"): 1,
        ("8", "plain"): 1,
        ("9", "writer"): 1,
    }


def sent(driver: Any, monkeypatch: pytest.MonkeyPatch) -> list[object]:
    seen: list[object] = []
    original = PyMySQLConnection._execute_command

    def spy(self: Any, command: int, sql: object) -> Any:
        seen.append(sql)
        return original(self, command, sql)

    monkeypatch.setattr(PyMySQLConnection, "_execute_command", spy)
    return seen


def in_transaction(driver: Any) -> bool:
    with driver.cursor() as cursor:
        cursor.execute("SELECT @@in_transaction")
        return bool(cursor.fetchone()[0])


@pytest.mark.parametrize("end", ["commit", "rollback"])
def test_only_the_rollback_right_after_the_inbox_ended_it_is_not_sent(
    driver: Any, monkeypatch: pytest.MonkeyPatch, end: str
) -> None:
    seen = sent(driver, monkeypatch)
    with driver.cursor() as cursor:
        cursor.execute("INSERT INTO effects (ref, handler) VALUES ('e', 'ending')")
    ending(driver)
    getattr(driver, end)()
    assert type(driver) is _Ended
    driver.rollback()  # the pool's: nothing open, nothing sent
    assert type(driver) is PyMySQLConnection
    driver.rollback()  # any later one is sent
    assert seen == [
        b"INSERT INTO effects (ref, handler) VALUES ('e', 'ending')",
        end.upper(),
        "ROLLBACK",
    ]
    assert not in_transaction(driver)


def test_statements_before_the_end_do_not_matter_only_its_answer(
    driver: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    ending(driver)
    with driver.cursor() as cursor:  # the session's flush, say
        cursor.execute("INSERT INTO effects (ref, handler) VALUES ('f', 'flushed')")
    seen = sent(driver, monkeypatch)
    driver.commit()
    driver.rollback()
    assert seen == ["COMMIT"]
    assert not in_transaction(driver)
    with driver.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM effects WHERE handler = 'flushed'")
        assert cursor.fetchone()[0] == 1


class Effect:
    """An ORM object on the effects table: written by the session's flush at the commit."""

    def __init__(self, ref: str, handler: str) -> None:
        self.ref, self.handler = ref, handler


registry().map_imperatively(Effect, effects)


def test_an_orm_handler_flushed_by_the_commit_saves_the_pools_rollback_too(
    mariadb_db: Database,
) -> None:
    url = mariadb_db.engine.url
    with RoundTripCounter(url.host or "127.0.0.1", url.port or 3306) as counter:
        engine = create_engine(counter.url(mariadb_db.url))
        inbox = Inbox(sessionmaker(engine))

        @inbox.handler("order.created", name="orm")
        def orm(message: Message, session: Session) -> None:
            session.add(Effect(str(message.body["ref"]), "orm"))  # no flush: the commit's

        inbox.process(order(11))  # connects
        counter.reset()
        assert inbox.process(order(12)).outcome is Outcome.PROCESSED
        first = counter.count  # claim, the flush's INSERT, COMMIT
        engine.dispose()
    assert first == 3
    assert mariadb_db.effect_counts() == {("11", "orm"): 1, ("12", "orm"): 1}


def test_any_command_after_the_end_turns_the_skip_off(
    driver: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    ending(driver)
    driver.commit()
    assert type(driver) is _Ended
    with driver.cursor() as cursor:
        cursor.execute("INSERT INTO effects (ref, handler) VALUES ('w', 'after')")
    assert type(driver) is PyMySQLConnection
    seen = sent(driver, monkeypatch)
    driver.rollback()
    assert seen == ["ROLLBACK"]
    assert not in_transaction(driver)


@pytest.mark.parametrize("end", ["commit", "rollback"])
def test_an_end_that_leaves_a_transaction_open_keeps_the_pools_rollback(
    driver: Any, monkeypatch: pytest.MonkeyPatch, end: str
) -> None:
    with driver.cursor() as cursor:
        cursor.execute("SET SESSION completion_type = 'CHAIN'")
        cursor.execute("INSERT INTO effects (ref, handler) VALUES ('c', 'chain')")
    ending(driver)
    getattr(driver, end)()  # ... AND CHAIN: a new transaction is open
    assert driver.server_status & IN_TRANS
    assert type(driver) is PyMySQLConnection
    seen = sent(driver, monkeypatch)
    driver.rollback()
    assert seen == ["ROLLBACK"]


def test_a_savepoint_handler_commits_and_leaves_no_transaction_open(
    mariadb_db: Database, engine: Engine
) -> None:
    inbox = Inbox(sessionmaker(engine))

    @inbox.handler("order.created", name="writer")
    def writer(message: Message, session: Session) -> None:
        with session.begin_nested():
            record_effect(message, session, "nested")
        try:
            with session.begin_nested():
                record_effect(message, session, "undone")
                raise LookupError("to the savepoint")
        except LookupError:
            pass

    assert inbox.process(order(10)).outcome is Outcome.PROCESSED
    with engine.connect() as connection:
        driver = connection.connection.dbapi_connection
        assert type(driver) is PyMySQLConnection or type(driver) is _Ended
        assert not connection.exec_driver_sql("SELECT @@in_transaction").scalar()
    assert mariadb_db.effect_counts() == {("10", "nested"): 1}
