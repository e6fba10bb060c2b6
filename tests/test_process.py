"""Inbox.process on every backend: dedup, rollback, fan-out, keys, routing, misuse, logging."""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Index, MetaData, create_engine, event, func, select, text, update
from sqlalchemy.exc import DBAPIError, IntegrityError
from sqlalchemy.orm import Session, scoped_session, sessionmaker
from support.databases import Database, effects
from support.effects import Recorder, order, record_effect

from inbox import (
    HandlerFailed,
    Inbox,
    InvalidKey,
    Message,
    Outcome,
    SessionConfigurationError,
    TransactionControlError,
    UnhandledMessage,
)
from inbox.message import KEY_NAMESPACE
from inbox.schema import inbox_message, inbox_table, metadata


def claims(db: Database) -> list[tuple[uuid.UUID, str, dt.datetime]]:
    with db.engine.connect() as connection:
        rows = connection.execute(
            select(
                inbox_message.c.message_id, inbox_message.c.handler, inbox_message.c.processed_at
            )
        )
        return [(m, h, p) for m, h, p in rows]


def test_first_delivery_runs_handler_and_commits_claim_with_effect(db: Database) -> None:
    recorder = Recorder(Inbox(db.sessions))
    recorder.add("billing.charge", "order.created")
    message = order(1)
    before = dt.datetime.now(dt.UTC)

    result = recorder.inbox.process(message)

    assert result.outcomes == {"billing.charge": Outcome.PROCESSED}
    assert result.outcome is Outcome.PROCESSED
    assert db.effect_counts() == {("1", "billing.charge"): 1}
    [(message_id, handler, processed_at)] = claims(db)
    assert (message_id, handler) == (message.id, "billing.charge")
    assert processed_at.tzinfo is not None
    assert before - dt.timedelta(seconds=1) <= processed_at <= dt.datetime.now(dt.UTC)


def test_duplicate_delivery_skips_handler_and_commits_nothing(db: Database) -> None:
    recorder = Recorder(Inbox(db.sessions))
    recorder.add("billing.charge")
    message = order(1)
    recorder.inbox.process(message)

    again = recorder.inbox.process(message)
    third = recorder.inbox.process(Message(id=str(message.id).upper(), type=None, body={"ref": 1}))

    assert again.outcomes == {"billing.charge": Outcome.DUPLICATE}
    assert third.outcome is Outcome.DUPLICATE
    assert recorder.calls["billing.charge"] == 1
    assert db.effect_counts() == {("1", "billing.charge"): 1}
    assert len(claims(db)) == 1


def test_failing_handler_leaves_no_claim_and_no_effect_then_retry_succeeds_once(
    db: Database,
) -> None:
    recorder = Recorder(Inbox(db.sessions))
    recorder.add("billing.charge")
    recorder.fail["billing.charge"] = 1
    message = order(7)

    with pytest.raises(HandlerFailed) as failed:
        recorder.inbox.process(message)

    assert set(failed.value.failures) == {"billing.charge"}
    assert isinstance(failed.value.__cause__, RuntimeError)
    assert claims(db) == []
    assert db.effect_counts() == {}

    assert recorder.inbox.process(message).outcome is Outcome.PROCESSED
    assert recorder.inbox.process(message).outcome is Outcome.DUPLICATE
    assert recorder.calls["billing.charge"] == 2
    assert db.effect_counts() == {("7", "billing.charge"): 1}


def test_fan_out_failure_of_one_handler_reruns_only_that_handler(db: Database) -> None:
    recorder = Recorder(Inbox(db.sessions))
    for name in ("a.first", "b.second", "c.third"):
        recorder.add(name, "order.created")
    recorder.fail["b.second"] = 1
    message = order(3)

    with pytest.raises(HandlerFailed) as failed:
        recorder.inbox.process(message)

    error = failed.value
    assert list(error.failures) == ["b.second"]
    assert isinstance(error.failures["b.second"], RuntimeError)
    assert error.__cause__ is error.failures["b.second"]
    assert error.message_id == message.id
    assert error.result.outcomes == {"a.first": Outcome.PROCESSED, "c.third": Outcome.PROCESSED}

    redelivered = recorder.inbox.process(message)

    assert redelivered.outcomes == {
        "a.first": Outcome.DUPLICATE,
        "b.second": Outcome.PROCESSED,
        "c.third": Outcome.DUPLICATE,
    }
    assert recorder.calls == {"a.first": 1, "b.second": 2, "c.third": 1}
    assert db.effect_counts() == {("3", n): 1 for n in ("a.first", "b.second", "c.third")}


def test_business_key_dedups_two_different_message_ids(db: Database) -> None:
    recorder = Recorder(Inbox(db.sessions))
    recorder.add("billing.invoice", key=lambda m: f"invoice-{m.body['ref']}")
    first, resent = order(42), order(42)
    assert first.id != resent.id

    assert recorder.inbox.process(first).outcome is Outcome.PROCESSED
    assert recorder.inbox.process(resent).outcome is Outcome.DUPLICATE

    assert db.effect_counts() == {("42", "billing.invoice"): 1}
    [(stored_key, _, _)] = claims(db)
    assert stored_key == uuid.uuid5(KEY_NAMESPACE, "invoice-42")


@pytest.mark.parametrize(
    "key",
    [uuid.UUID("0191e5b4-0000-7000-8000-000000000042"), b"0123456789abcdef"],
    ids=["uuid", "bytes"],
)
def test_business_key_as_uuid_or_16_bytes_is_stored_as_is(db: Database, key: object) -> None:
    recorder = Recorder(Inbox(db.sessions))
    recorder.add("billing.invoice", key=lambda m: key)

    recorder.inbox.process(order(1))
    assert recorder.inbox.process(order(2)).outcome is Outcome.DUPLICATE

    [(stored_key, _, _)] = claims(db)
    assert stored_key.bytes == (key.bytes if isinstance(key, uuid.UUID) else key)


def test_header_idempotency_key_dedups_a_producer_retry_with_a_fresh_id(db: Database) -> None:
    recorder = Recorder(Inbox(db.sessions))
    recorder.add("billing.charge")
    first = order(5, **{"idempotency-key": "order-created-5"})
    retry = order(5, **{"idempotency-key": "order-created-5"})
    other = order(6, **{"idempotency-key": "order-created-6"})

    outcomes = [recorder.inbox.process(m).outcome for m in (first, retry, other)]

    assert outcomes == [Outcome.PROCESSED, Outcome.DUPLICATE, Outcome.PROCESSED]
    assert db.effect_counts() == {("5", "billing.charge"): 1, ("6", "billing.charge"): 1}


def test_handler_key_takes_precedence_over_the_header(db: Database) -> None:
    recorder = Recorder(Inbox(db.sessions))
    recorder.add("billing.invoice", key=lambda m: f"invoice-{m.body['ref']}")
    recorder.inbox.process(order(1, **{"idempotency-key": "shared"}))

    result = recorder.inbox.process(order(2, **{"idempotency-key": "shared"}))

    assert result.outcome is Outcome.PROCESSED
    assert db.effect_counts() == {("1", "billing.invoice"): 1, ("2", "billing.invoice"): 1}


def test_same_message_id_under_two_handler_names_runs_both(db: Database) -> None:
    recorder = Recorder(Inbox(db.sessions))
    recorder.add("billing.charge", "order.created")
    recorder.add("shipping.reserve", "order.created")
    message = order(9)

    result = recorder.inbox.process(message)

    assert result.processed == ("billing.charge", "shipping.reserve")
    assert sorted((m, h) for m, h, _ in claims(db)) == [
        (message.id, "billing.charge"),
        (message.id, "shipping.reserve"),
    ]
    assert recorder.inbox.process(message).duplicates == ("billing.charge", "shipping.reserve")


@pytest.mark.parametrize(
    ("key", "reason"),
    [
        (lambda m: m.body["missing"], "raised"),
        (lambda m: None, "NoneType"),
        (lambda m: "", "empty"),
        (lambda m: b"short", "16 bytes"),
        (lambda m: 42, "int"),
    ],
    ids=["raises", "none", "empty", "short-bytes", "int"],
)
def test_bad_key_function_raises_invalid_key_and_runs_nothing(
    db: Database, key: object, reason: str
) -> None:
    recorder = Recorder(Inbox(db.sessions))
    recorder.add("audit.log")
    recorder.add("billing.invoice", key=key)  # type: ignore[arg-type]
    message = order(1)

    with pytest.raises(InvalidKey, match=reason) as error:
        recorder.inbox.process(message)

    assert error.value.handler == "billing.invoice"
    assert error.value.message_id == message.id
    assert recorder.calls == {}
    assert claims(db) == []


def test_unhandled_type_raises_by_default_and_is_ignored_when_configured(db: Database) -> None:
    strict = Recorder(Inbox(db.sessions))
    strict.add("billing.charge", "order.created")
    message = order(1, message_type="order.cancelled")

    with pytest.raises(UnhandledMessage) as error:
        strict.inbox.process(message)
    assert (error.value.message_id, error.value.message_type) == (message.id, "order.cancelled")

    lenient = Recorder(Inbox(db.sessions, on_unhandled="ignore"))
    lenient.add("billing.charge", "order.created")
    result = lenient.inbox.process(message)
    assert result.outcome is Outcome.IGNORED
    assert result.outcomes == {}
    assert claims(db) == []


def test_catch_all_handler_takes_every_type_and_typed_handler_only_its_own(db: Database) -> None:
    inbox = Inbox(db.sessions)
    seen: list[tuple[str, str | None]] = []

    @inbox.handler(name="audit")
    def audit(message: Message, session: Session) -> None:
        seen.append(("audit", message.type))

    @inbox.handler("order.created", name="create")
    def create(message: Message, session: Session) -> None:
        seen.append(("create", message.type))

    inbox.process(order(1, message_type="order.created"))
    inbox.process(order(2, message_type="user.deleted"))
    inbox.process(Message.new(None, {"ref": 3}))

    assert seen == [
        ("audit", "order.created"),
        ("create", "order.created"),
        ("audit", "user.deleted"),
        ("audit", None),
    ]


@pytest.mark.parametrize("method", ["commit", "rollback", "close", "reset"])
def test_handler_that_ends_the_transaction_gets_a_clear_error_and_nothing_commits(
    db: Database, method: str
) -> None:
    inbox = Inbox(db.sessions)

    @inbox.handler("order.created", name="rogue")
    def rogue(message: Message, session: Session) -> None:
        record_effect(message, session, "rogue")
        getattr(session, method)()

    with pytest.raises(HandlerFailed) as failed:
        inbox.process(order(1))

    error = failed.value.failures["rogue"]
    assert isinstance(error, TransactionControlError)
    assert f"session.{method}()" in str(error)
    assert claims(db) == []
    assert db.effect_counts() == {}


def test_handler_may_use_a_savepoint(db: Database) -> None:
    inbox = Inbox(db.sessions)

    @inbox.handler("order.created", name="careful")
    def careful(message: Message, session: Session) -> None:
        record_effect(message, session, "kept")
        try:
            with session.begin_nested():
                record_effect(message, session, "undone")
                raise LookupError("optional part failed")
        except LookupError:
            pass

    assert inbox.process(order(1)).outcome is Outcome.PROCESSED
    assert db.effect_counts() == {("1", "kept"): 1}


def test_decisions_are_logged_on_the_inbox_logger(
    db: Database, caplog: pytest.LogCaptureFixture
) -> None:
    recorder = Recorder(Inbox(db.sessions))
    recorder.add("billing.charge")
    recorder.fail["billing.charge"] = 1
    message = order(1)
    caplog.set_level(logging.DEBUG, logger="inbox")

    with pytest.raises(HandlerFailed):
        recorder.inbox.process(message)
    recorder.inbox.process(message)
    recorder.inbox.process(message)

    failed = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(failed) == 1
    assert failed[0].name.startswith("inbox")
    assert failed[0].exc_info is not None
    assert "billing.charge" in failed[0].getMessage()
    duplicate = [r for r in caplog.records if "duplicate" in r.getMessage()]
    assert len(duplicate) == 1
    assert duplicate[0].levelno == logging.INFO
    text = duplicate[0].getMessage()
    assert str(message.id) in text
    assert "order.created" in text
    assert "billing.charge" in text


def test_effects_written_through_the_orm_commit_with_the_claim(db: Database) -> None:
    inbox = Inbox(db.sessions)

    @inbox.handler("order.created", name="orm.writer")
    def writer(message: Message, session: Session) -> None:
        session.execute(update(effects).values(handler="never"))  # no rows yet: a no-op
        record_effect(message, session, "orm.writer")
        session.flush()

    inbox.process(order(1))
    assert db.effect_counts() == {("1", "orm.writer"): 1}


def test_handler_names_differing_in_case_or_accents_are_distinct_claims(db: Database) -> None:
    recorder = Recorder(Inbox(db.sessions))
    names = ("billing.charge", "billing.Charge", "café.notify", "cafe.notify")
    for name in names:
        recorder.add(name)

    result = recorder.inbox.process(order(1))

    assert result.processed == names
    assert {h for _, h, _ in claims(db)} == set(names)


def test_a_violation_of_another_unique_constraint_is_an_error_not_a_duplicate(
    db: Database,
) -> None:
    custom = inbox_table(MetaData(), "strict_inbox")
    Index("ux_strict_inbox_handler", custom.c.handler, unique=True)
    custom.create(db.engine)
    recorder = Recorder(Inbox(db.sessions, table=custom))
    recorder.add("billing.charge")
    recorder.inbox.process(order(1))

    with pytest.raises(HandlerFailed) as failed:
        recorder.inbox.process(order(2))

    assert isinstance(failed.value.failures["billing.charge"], IntegrityError)
    assert recorder.calls["billing.charge"] == 1
    assert db.effect_counts() == {("1", "billing.charge"): 1}


def test_a_swallowed_database_error_never_reports_uncommitted_work_as_processed(
    db: Database,
) -> None:
    """On PostgreSQL a failed statement aborts the whole transaction and COMMIT silently
    rolls back: the inbox must report a failure. Elsewhere only the statement is undone and
    the rest commits. Either way the reported outcome matches what is in the database."""
    inbox = Inbox(db.sessions)
    swallow = [True]

    @inbox.handler("order.created", name="sloppy")
    def sloppy(message: Message, session: Session) -> None:
        record_effect(message, session, "sloppy")
        if swallow[0]:
            with contextlib.suppress(DBAPIError):
                session.execute(
                    text("INSERT INTO effects (id, ref, handler) VALUES (NULL, NULL, NULL)")
                )

    message = order(1)
    if db.backend == "postgresql":
        with pytest.raises(HandlerFailed) as failed:
            inbox.process(message)
        assert isinstance(failed.value.failures["sloppy"], TransactionControlError)
        assert claims(db) == []
        assert db.effect_counts() == {}
        swallow[0] = False
        assert inbox.process(message).outcome is Outcome.PROCESSED
    else:
        assert inbox.process(message).outcome is Outcome.PROCESSED
    assert len(claims(db)) == 1
    assert db.effect_counts() == {("1", "sloppy"): 1}


@pytest.mark.parametrize("how", ["session transaction", "connection"])
def test_a_handler_committing_behind_the_guards_is_refused_and_nothing_commits(
    db: Database, how: str
) -> None:
    inbox = Inbox(db.sessions)

    @inbox.handler("order.created", name="sneaky")
    def sneaky(message: Message, session: Session) -> None:
        record_effect(message, session, "sneaky")
        if how == "connection":
            session.connection().commit()
            return
        transaction = session.get_transaction()
        assert transaction is not None
        transaction.commit()

    with pytest.raises(HandlerFailed) as failed:
        inbox.process(order(1))
    assert isinstance(failed.value.failures["sneaky"], TransactionControlError)
    assert "ended the inbox's transaction" in str(failed.value.failures["sneaky"])
    # The commit never reached the database: no claim, no half of the effects.
    assert claims(db) == []
    assert db.effect_counts() == {}


def test_sessions_the_inbox_cannot_own_are_refused_before_writing(db: Database) -> None:
    autocommit = create_engine(db.url, isolation_level="AUTOCOMMIT")
    busy = db.sessions()
    busy.begin()
    record_effect(order("pending"), busy, "application")
    try:
        with db.engine.connect() as outer:
            outer.begin()
            # Refused when the inbox is made: nothing about them needs a connection.
            refused_at_once: dict[str, Callable[[], Session]] = {
                "already in a transaction": lambda: busy,
                "bound to a Connection": sessionmaker(outer),
            }
            for fragment, factory in refused_at_once.items():
                with pytest.raises(SessionConfigurationError, match=fragment):
                    Inbox(factory)
            # Seen only once connected: refused as itself on the first message, before any
            # handler runs (a configuration error, not a failure of that message).
            recorder = Recorder(Inbox(sessionmaker(autocommit)))
            recorder.add("billing.charge")
            with pytest.raises(SessionConfigurationError, match="AUTOCOMMIT"):
                recorder.inbox.process(order(1))
            assert recorder.calls == {}
            outer.rollback()
        # The application's own pending work in the busy session was left alone.
        assert busy.in_transaction()
        busy.commit()
    finally:
        busy.close()
        autocommit.dispose()
    assert claims(db) == []
    assert db.effect_counts() == {("pending", "application"): 1}


def test_a_connection_bound_session_with_savepoints_works_inside_an_outer_transaction(
    db: Database,
) -> None:
    """The test-suite pattern: everything inside one outer transaction, rolled back at the
    end; each handler transaction is a savepoint."""
    with db.engine.connect() as outer:
        outer.begin()
        sessions = sessionmaker(outer, join_transaction_mode="create_savepoint")
        recorder = Recorder(Inbox(sessions))
        recorder.add("billing.charge")
        recorder.fail["billing.charge"] = 1
        message = order(1)
        with pytest.raises(HandlerFailed):
            recorder.inbox.process(message)
        assert recorder.inbox.process(message).outcome is Outcome.PROCESSED
        assert recorder.inbox.process(message).outcome is Outcome.DUPLICATE
        rows = outer.execute(select(func.count()).select_from(effects)).scalar_one()
        assert rows == 1
        outer.rollback()
    assert claims(db) == []


def test_scoped_sessions_and_multi_bind_sessions_work(db: Database) -> None:
    scoped = scoped_session(db.sessions)
    multi = sessionmaker(binds={inbox_message: db.engine, effects: db.engine})
    for factory in (scoped, multi):
        recorder = Recorder(Inbox(factory))
        recorder.add("billing.charge")
        message = order(id(factory))
        assert recorder.inbox.process(message).outcome is Outcome.PROCESSED
        assert recorder.inbox.process(message).outcome is Outcome.DUPLICATE
    # The guards do not outlive the handler call on the thread's session.
    session = scoped()
    session.commit()
    session.close()
    scoped.remove()
    assert len(claims(db)) == 2


def test_sqlalchemy_sqlite_savepoint_recipe_is_accepted(tmp_path: Path) -> None:
    """pysqlite with isolation_level=None plus a "begin" listener that emits BEGIN (the
    recipe SQLAlchemy documents for working SAVEPOINTs) runs real transactions."""
    engine = create_engine(f"sqlite:///{tmp_path / 'recipe.db'}")

    @event.listens_for(engine, "connect")
    def no_driver_transactions(dbapi_connection: Any, record: object) -> None:
        dbapi_connection.isolation_level = None

    @event.listens_for(engine, "begin")
    def emit_begin(connection: Any) -> None:
        connection.exec_driver_sql("BEGIN")

    metadata.create_all(engine)
    effects.metadata.create_all(engine)
    recorder = Recorder(Inbox(sessionmaker(engine)))
    recorder.add("billing.charge")
    recorder.fail["billing.charge"] = 1
    message = order(1)
    try:
        with pytest.raises(HandlerFailed):
            recorder.inbox.process(message)
        with engine.connect() as connection:
            assert connection.execute(select(func.count()).select_from(effects)).scalar() == 0
        assert recorder.inbox.process(message).outcome is Outcome.PROCESSED
        assert recorder.inbox.process(message).outcome is Outcome.DUPLICATE
    finally:
        engine.dispose()
