"""MariaDB through PyMySQL: the claim row is no longer read before the COMMIT when nothing
since the claim could have ended the transaction (inbox/_backends/mysql/_pymysql.py); every
way a handler can end it, including the ones the server's status flags do not show, still
reads the row and is decided as before.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import pymysql
import pytest
from pymysql.connections import Connection as PyMySQLConnection
from sqlalchemy import Engine, create_engine, event, func, select, text
from sqlalchemy.orm import Session, sessionmaker
from support.databases import Database
from support.effects import order, record_effect

from inbox import (
    ClaimCommittedEarly,
    HandlerFailed,
    Inbox,
    Message,
    Outcome,
    TransactionControlError,
)
from inbox._backends import backend_for
from inbox._backends.mysql import FAMILY
from inbox._backends.mysql._pymysql import PyMySQLBackend, still_open, watch
from inbox.schema import inbox_message


def claim_count(db: Database) -> int:
    with db.engine.connect() as connection:
        return int(connection.execute(select(func.count()).select_from(inbox_message)).scalar_one())


@pytest.fixture
def engine(mariadb_db: Database) -> Iterator[Engine]:
    """An engine of its own (its connections may be left with session settings)."""
    made = create_engine(mariadb_db.url)
    yield made
    made.dispose()


def claim_reads(engine: Engine) -> list[str]:
    """The claim-row reads sent on ``engine`` from now on."""
    seen: list[str] = []

    def remember(conn: Any, cursor: Any, statement: str, *rest: Any) -> None:
        if statement.startswith("SELECT count(*)") and "inbox_message.message_id" in statement:
            seen.append(statement)

    event.listen(engine, "before_cursor_execute", remember)
    return seen


def sql(*statements: str) -> Callable[[Session], None]:
    def run(session: Session) -> None:
        for statement in statements:
            session.execute(text(statement))

    return run


def raw(*statements: str) -> Callable[[Session], None]:
    """Statements on the driver's own cursor, past SQLAlchemy (and its listeners)."""

    def run(session: Session) -> None:
        driver = session.connection().connection.dbapi_connection
        assert driver is not None
        with driver.cursor() as cursor:
            for statement in statements:
                cursor.execute(statement)

    return run


def test_pymysql_gets_the_watching_backend_and_asyncmy_keeps_the_read(
    mariadb_db: Database,
) -> None:
    assert isinstance(backend_for(mariadb_db.engine.dialect), PyMySQLBackend)
    assert not isinstance(FAMILY.backend("asyncmy"), PyMySQLBackend)


def test_a_handler_that_only_writes_commits_without_reading_its_claim(
    mariadb_db: Database, engine: Engine
) -> None:
    inbox = Inbox(sessionmaker(engine))

    @inbox.handler("order.created", name="writer")
    def writer(message: Message, session: Session) -> None:
        record_effect(message, session, "writer")
        session.execute(text("SELECT ref FROM effects FOR UPDATE"))
        with session.begin_nested():
            record_effect(message, session, "nested")
        try:
            with session.begin_nested():
                record_effect(message, session, "undone")
                raise LookupError("rolled back to the savepoint")
        except LookupError:
            pass

    reads = claim_reads(engine)
    message = order(1)
    assert inbox.process(message).outcome is Outcome.PROCESSED
    assert inbox.process(message).outcome is Outcome.DUPLICATE
    assert reads == []
    assert mariadb_db.effect_counts() == {("1", "writer"): 1, ("1", "nested"): 1}
    assert claim_count(mariadb_db) == 1


# A ROLLBACK that leaves the server "in a transaction" in its very answer: the status flags
# cannot tell these from a transaction that never ended (MariaDB 10.11 answers each with
# SERVER_STATUS_IN_TRANS set).
FLAG_HIDDEN_ROLLBACKS: dict[str, Callable[[Session], None]] = {
    "ROLLBACK AND CHAIN": sql("ROLLBACK AND CHAIN"),
    "completion_type CHAIN": sql("SET SESSION completion_type = 1", "ROLLBACK"),
    "compound statement": sql("BEGIN NOT ATOMIC ROLLBACK; END"),
    "lower case": sql("rollback and chain"),
    "raw driver cursor": raw("ROLLBACK AND CHAIN"),
    "driver rollback() then a write": lambda session: (
        session.connection().connection.dbapi_connection.rollback()
    ),  # type: ignore[union-attr]
}


@pytest.mark.parametrize("how", list(FLAG_HIDDEN_ROLLBACKS))
def test_a_rollback_the_flags_do_not_show_still_leaves_nothing_committed(
    mariadb_db: Database, engine: Engine, how: str
) -> None:
    inbox = Inbox(sessionmaker(engine))
    behave = [False]

    @inbox.handler("order.created", name="sloppy")
    def sloppy(message: Message, session: Session) -> None:
        record_effect(message, session, "sloppy")
        if not behave[0]:
            FLAG_HIDDEN_ROLLBACKS[how](session)
            record_effect(message, session, "sloppy")  # would commit alone, claim-less

    message = order(1)
    with pytest.raises(HandlerFailed) as failed:
        inbox.process(message)
    error = failed.value.failures["sloppy"]
    assert isinstance(error, TransactionControlError)
    assert "claim is gone" in str(error)
    assert claim_count(mariadb_db) == 0
    assert mariadb_db.effect_counts() == {}
    engine.dispose()  # a connection left with completion_type = 1
    behave[0] = True
    assert inbox.process(message).outcome is Outcome.PROCESSED
    assert inbox.process(message).outcome is Outcome.DUPLICATE
    assert mariadb_db.effect_counts() == {("1", "sloppy"): 1}


def test_a_stored_procedure_that_rolls_back_and_writes_again_commits_nothing(
    mariadb_db: Database, engine: Engine
) -> None:
    with engine.begin() as connection:
        connection.execute(
            text(
                "CREATE PROCEDURE undo_and_write() BEGIN ROLLBACK; "
                "INSERT INTO effects (ref, handler) VALUES ('p', 'procedure'); END"
            )
        )
    inbox = Inbox(sessionmaker(engine))

    @inbox.handler("order.created", name="caller")
    def caller(message: Message, session: Session) -> None:
        record_effect(message, session, "caller")
        session.execute(text("CALL undo_and_write()"))

    with pytest.raises(HandlerFailed) as failed:
        inbox.process(order(1))
    assert "claim is gone" in str(failed.value.failures["caller"])
    assert claim_count(mariadb_db) == 0
    assert mariadb_db.effect_counts() == {}


@pytest.mark.parametrize("begin", ["BEGIN", "START TRANSACTION"])
def test_a_begin_that_commits_the_claim_then_a_failure_is_an_early_commit(
    mariadb_db: Database, engine: Engine, begin: str
) -> None:
    # BEGIN commits the open transaction and answers "in a transaction" (a new one).
    inbox = Inbox(sessionmaker(engine))

    @inbox.handler("order.created", name="sloppy")
    def sloppy(message: Message, session: Session) -> None:
        session.execute(text(begin))
        record_effect(message, session, "sloppy")
        raise RuntimeError("after the implicit commit")

    with pytest.raises(HandlerFailed) as failed:
        inbox.process(order(1))
    assert isinstance(failed.value.failures["sloppy"], ClaimCommittedEarly)
    assert claim_count(mariadb_db) == 1


def test_after_a_failed_statement_the_claim_row_is_read_before_the_commit(
    mariadb_db: Database, engine: Engine
) -> None:
    # Past SQLAlchemy, so no handle_error listener sees it: the watch must.
    inbox = Inbox(sessionmaker(engine))

    @inbox.handler("order.created", name="careless")
    def careless(message: Message, session: Session) -> None:
        with contextlib.suppress(pymysql.err.ProgrammingError):
            raw("SELECT * FROM no_such_table")(session)
        record_effect(message, session, "careless")

    reads = claim_reads(engine)
    assert inbox.process(order(1)).outcome is Outcome.PROCESSED
    assert len(reads) == 1
    assert mariadb_db.effect_counts() == {("1", "careless"): 1}


def test_a_failed_last_statement_reads_the_claim_row_too(
    mariadb_db: Database, engine: Engine
) -> None:
    inbox = Inbox(sessionmaker(engine))

    @inbox.handler("order.created", name="careless")
    def careless(message: Message, session: Session) -> None:
        record_effect(message, session, "careless")
        with contextlib.suppress(pymysql.err.ProgrammingError):
            raw("SELECT * FROM no_such_table")(session)

    reads = claim_reads(engine)
    assert inbox.process(order(1)).outcome is Outcome.PROCESSED
    assert len(reads) == 1


# -- the watch itself, on a real connection --------------------------------------------------


@pytest.fixture
def driver(mariadb_db: Database) -> Iterator[Any]:
    url = mariadb_db.engine.url
    connection = pymysql.connect(
        host=url.host, port=url.port or 3306, user=url.username, database=url.database
    )
    yield connection
    connection.close()


def started(driver: Any) -> bool:
    with driver.cursor() as cursor:
        cursor.execute("INSERT INTO effects (ref, handler) VALUES ('w', 'watch')")
    return bool(watch(driver))


@pytest.mark.parametrize(
    "statement",
    [
        "INSERT INTO effects (ref, handler) VALUES ('x', 'watch')",
        "UPDATE effects SET ref = 'y'",
        "SELECT 1",
        "SAVEPOINT s1",
        "DELETE FROM effects WHERE ref = 'nothing'",
    ],
)
def test_statements_that_cannot_end_a_transaction_keep_the_watch(
    driver: Any, statement: str
) -> None:
    assert started(driver)
    with driver.cursor() as cursor:
        cursor.execute(statement)
    assert still_open(driver)
    assert type(driver) is PyMySQLConnection  # the watch ended there
    driver.rollback()


@pytest.mark.parametrize(
    "end",
    [
        lambda d: d.rollback(),
        lambda d: d.commit(),
        lambda d: d.ping(),
        lambda d: d.cursor().execute("SET @x = 1"),
        lambda d: d.cursor().execute("select 1"),
        lambda d: d.cursor().execute("COMMIT AND CHAIN"),
    ],
    ids=["rollback()", "commit()", "ping()", "SET", "lower case", "COMMIT AND CHAIN"],
)
def test_anything_else_ends_the_watch(driver: Any, end: Callable[[Any], object]) -> None:
    assert started(driver)
    end(driver)
    assert type(driver) is PyMySQLConnection
    assert not still_open(driver)
    driver.rollback()


def test_no_watch_without_a_transaction_or_with_multi_statements(
    driver: Any, mariadb_db: Database
) -> None:
    assert not watch(driver)  # nothing sent: not in a transaction
    url = mariadb_db.engine.url
    multi = pymysql.connect(
        host=url.host,
        port=url.port or 3306,
        user=url.username,
        database=url.database,
        client_flag=pymysql.constants.CLIENT.MULTI_STATEMENTS,
    )
    try:
        assert not started(multi)
    finally:
        multi.close()


def test_a_subclass_of_the_driver_connection_is_never_watched(mariadb_db: Database) -> None:
    class Own(PyMySQLConnection):  # type: ignore[misc]
        pass

    url = mariadb_db.engine.url
    own = Own(host=url.host, port=url.port or 3306, user=url.username, database=url.database)
    try:
        assert not started(own)
        assert type(own) is Own
    finally:
        own.close()


# -- canaries: the PyMySQL internals the watch reads (docs/architecture.md) -------------------


def test_pymysql_keeps_a_successful_query_result_and_drops_a_failed_one(driver: Any) -> None:
    with driver.cursor() as cursor:
        cursor.execute("SELECT 1")
        assert driver._result is not None
        with pytest.raises(pymysql.err.ProgrammingError):
            cursor.execute("SELECT * FROM no_such_table")
        assert driver._result is None
        cursor.execute("INSERT INTO effects (ref, handler) VALUES ('c', 'canary')")
        assert driver._result is not None


def test_pymysql_sends_every_command_through_execute_command(
    driver: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    sent: list[tuple[int, object]] = []
    original = PyMySQLConnection._execute_command

    def spy(self: Any, command: int, sql: object) -> Any:
        sent.append((command, sql))
        return original(self, command, sql)

    monkeypatch.setattr(PyMySQLConnection, "_execute_command", spy)
    with driver.cursor() as cursor:
        cursor.execute("SELECT %s", ("a",))
    driver.commit()
    driver.rollback()
    driver.ping()
    query = pymysql.constants.COMMAND.COM_QUERY
    assert sent == [
        (query, b"SELECT 'a'"),
        (query, "COMMIT"),
        (query, "ROLLBACK"),
        (pymysql.constants.COMMAND.COM_PING, ""),
    ]


def test_pymysql_server_status_follows_each_answer(driver: Any) -> None:
    in_trans = pymysql.constants.SERVER_STATUS.SERVER_STATUS_IN_TRANS
    with driver.cursor() as cursor:
        cursor.execute("INSERT INTO effects (ref, handler) VALUES ('s', 'status')")
        assert driver.server_status & in_trans
        driver.rollback()
        assert not driver.server_status & in_trans
