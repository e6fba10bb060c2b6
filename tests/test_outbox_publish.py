"""Outbox.publish on every backend: the row exists if and only if the publishing transaction
commits, with every property as given; inside an inbox handler it commits with the claim;
sessions in autocommit are refused; publishing sends no statement of its own."""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from decimal import Decimal
from typing import Any

import pytest
from sqlalchemy import Engine, MetaData, create_engine, event, insert, select, text
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, scoped_session
from support.databases import Database, current_schema, effects, own_notifications
from support.effects import Recorder, order, record_effect

from inbox import (
    HandlerFailed,
    Inbox,
    Message,
    Outbox,
    Outcome,
    SessionConfigurationError,
    uuid7,
)
from inbox.outbox import OutboxRow
from inbox.outbox._row import row_from_mapping
from inbox.schema import outbox_message, outbox_table


def stored(engine: Engine, table: Any = outbox_message) -> list[dict[str, Any]]:
    """Every row of the outbox table, oldest id first."""
    with engine.connect() as connection:
        return [dict(r._mapping) for r in connection.execute(select(table).order_by(table.c.id))]


@contextmanager
def statements(engine: Engine) -> Iterator[list[str]]:
    """The SQL statements ``engine`` sends while the block runs."""
    sent: list[str] = []

    def record(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        sent.append(statement)

    event.listen(engine, "before_cursor_execute", record)
    try:
        yield sent
    finally:
        event.remove(engine, "before_cursor_execute", record)


def test_a_committed_publish_is_one_row_with_every_property(db: Database) -> None:
    outbox = Outbox()
    headers = {"trace": "t-1", "raw": b"\x00\xff", "amount": Decimal("9.90"), "n": [1, None]}
    before = dt.datetime.now(dt.UTC)
    with Session(db.engine) as session, session.begin():
        message_id = outbox.publish(
            session,
            "order.created",
            {"order_id": 42, "note": "grüße"},
            routing_key="orders",
            exchange="shop",
            idempotency_key="order-created-42",
            headers=headers,
        )

    [row] = stored(db.engine)
    assert message_id.version == 7
    assert row_from_mapping(row) == OutboxRow(
        id=message_id,
        type="order.created",
        exchange="shop",
        routing_key="orders",
        content_type="application/json",
        content_encoding="utf-8",
        headers=headers | {"idempotency-key": "order-created-42"},
        body='{"order_id":42,"note":"grüße"}'.encode(),
    )
    assert row["attempts"] == 0
    assert row["last_error"] is None
    assert row["available_at"] == row["created_at"]
    assert before - dt.timedelta(seconds=1) <= row["created_at"] <= dt.datetime.now(dt.UTC)


def test_bytes_text_and_a_given_id_are_stored_as_given(db: Database) -> None:
    outbox = Outbox()
    given = uuid.uuid4()
    with Session(db.engine) as session, session.begin():
        raw_id = outbox.publish(session, "blob", b"\x00\x01", routing_key="q")
        xml_id = outbox.publish(
            session, "doc", "<a/>", routing_key="q", content_type="application/xml"
        )
        given_id = outbox.publish(session, "again", {}, routing_key="q", message_id=str(given))

    rows = {r.id: r for r in map(row_from_mapping, stored(db.engine))}
    assert given_id == given
    assert (rows[raw_id].content_type, rows[raw_id].content_encoding) == (
        "application/octet-stream",
        "binary",
    )
    assert rows[raw_id].body == b"\x00\x01"
    assert (rows[xml_id].content_type, rows[xml_id].body) == ("application/xml", b"<a/>")
    assert rows[given].body == b"{}"


def publish_then_fail(session: Session, outbox: Outbox) -> None:
    with session.begin():
        session.execute(insert(effects).values(ref="order-1", handler="web"))
        outbox.publish(session, "order.created", {"order_id": 1}, routing_key="orders")
        session.flush()  # the INSERT reached the database, inside the transaction
        raise RuntimeError("request failed")


def test_a_rolled_back_transaction_leaves_no_row(db: Database) -> None:
    outbox = Outbox()
    with Session(db.engine) as session, pytest.raises(RuntimeError, match="request failed"):
        publish_then_fail(session, outbox)
    with Session(db.engine) as session:
        outbox.publish(session, "order.created", {"order_id": 2}, routing_key="orders")
        session.rollback()
    with Session(db.engine) as session:
        outbox.publish(session, "order.created", {"order_id": 3}, routing_key="orders")
        # closed without a commit

    assert stored(db.engine) == []
    assert db.effect_counts() == {}


def test_publish_sends_nothing_itself_and_many_rows_go_in_one_statement(db: Database) -> None:
    outbox = Outbox()
    with Session(db.engine) as session, session.begin():
        session.execute(insert(effects).values(ref="warm", handler="web"))  # connection taken
        with statements(db.engine) as at_publish:
            for n in range(5):
                outbox.publish(session, "tick", {"n": n}, routing_key="q")
        assert at_publish == []
        with statements(db.engine) as at_flush:
            session.flush()
    inserts = [s for s in at_flush if "outbox_message" in s]
    assert len(inserts) == 1, at_flush
    assert [row_from_mapping(r).body for r in stored(db.engine)] == [
        b'{"n":%d}' % n for n in range(5)
    ]


def undone_savepoint(session: Session, outbox: Outbox) -> None:
    with session.begin_nested():
        outbox.publish(session, "dropped.too", {}, routing_key="q")
        raise RuntimeError("undo the savepoint")


def test_a_row_published_in_a_rolled_back_savepoint_vanishes_with_it(db: Database) -> None:
    outbox = Outbox()
    with Session(db.engine) as session, session.begin():
        kept = outbox.publish(session, "kept", {}, routing_key="q")
        savepoint = session.begin_nested()
        outbox.publish(session, "dropped", {}, routing_key="q")
        session.flush()
        savepoint.rollback()
        with session.begin_nested():
            survivor = outbox.publish(session, "kept.too", {}, routing_key="q")
        with pytest.raises(RuntimeError, match="undo"):
            undone_savepoint(session, outbox)

    assert [r["id"] for r in stored(db.engine)] == [kept, survivor]


def test_a_message_id_already_in_the_outbox_fails_the_flush_and_the_transaction(
    db: Database,
) -> None:
    outbox = Outbox()
    message_id = uuid7()
    with Session(db.engine) as session, session.begin():
        outbox.publish(session, "first", {}, routing_key="q", message_id=message_id)
    with Session(db.engine) as session:
        session.execute(insert(effects).values(ref="second", handler="web"))
        outbox.publish(session, "second", {}, routing_key="q", message_id=message_id)
        with pytest.raises(IntegrityError):
            session.commit()

    [row] = stored(db.engine)
    assert row["type"] == "first"
    assert db.effect_counts() == {}


def test_publish_message_keeps_the_id_type_body_and_headers(db: Database) -> None:
    outbox = Outbox()
    message = Message.new("order.created", {"order_id": 7}, {"idempotency-key": "o-7", "x": 1})
    with Session(db.engine) as session, session.begin():
        assert outbox.publish_message(session, message, routing_key="orders") == message.id
    [row] = map(row_from_mapping, stored(db.engine))
    assert (row.id, row.type, row.body) == (message.id, "order.created", b'{"order_id":7}')
    assert row.headers == {"idempotency-key": "o-7", "x": 1}


def test_inside_a_handler_the_row_commits_with_the_claim_and_only_then(db: Database) -> None:
    inbox = Inbox(db.sessions)
    outbox = Outbox()
    failures = {"ref": 1}

    @inbox.handler("order.created", name="orders.confirm")
    def confirm(message: Message, session: Session) -> None:
        record_effect(message, session, "orders.confirm")
        outbox.publish(
            session, "order.confirmed", {"ref": message.body["ref"]}, routing_key="confirmed"
        )
        if failures["ref"] > 0:
            failures["ref"] -= 1
            raise RuntimeError("the handler failed after publishing")

    message = order(7)
    with pytest.raises(HandlerFailed):
        inbox.process(message)
    assert stored(db.engine) == []  # a failing handler leaves neither claim nor row
    assert db.count(inbox.table) == 0

    assert inbox.process(message).outcome is Outcome.PROCESSED
    assert inbox.process(message).outcome is Outcome.DUPLICATE  # adds no second row

    [row] = map(row_from_mapping, stored(db.engine))
    assert (row.type, row.body) == ("order.confirmed", b'{"ref":7}')
    assert db.count(inbox.table) == 1
    assert db.effect_counts() == {("7", "orders.confirm"): 1}


def test_in_a_batch_each_message_publishes_once_and_a_failed_one_not_at_all(
    db: Database,
) -> None:
    recorder = Recorder(Inbox(db.sessions))
    outbox = Outbox()

    @recorder.inbox.handler("order.created", name="orders.announce")
    def announce(message: Message, session: Session) -> None:
        if message.body["ref"] == "poison":
            raise ValueError("poison")
        outbox.publish(session, "announced", {"ref": message.body["ref"]}, routing_key="q")

    messages = [order(1), order("poison"), order(2)]
    results = recorder.inbox.process_batch(messages)
    assert isinstance(results[1], HandlerFailed)
    recorder.inbox.process_batch(messages)  # redelivered: the two others are duplicates

    bodies = sorted(row_from_mapping(r).body for r in stored(db.engine))
    assert bodies == [b'{"ref":1}', b'{"ref":2}']


def engine_in_autocommit(url: str) -> Session:
    return Session(create_engine(url, isolation_level="AUTOCOMMIT"))


def execution_options_in_autocommit(url: str) -> Session:
    return Session(create_engine(url).execution_options(isolation_level="AUTOCOMMIT"))


def connection_in_autocommit(url: str) -> Session:
    session = Session(create_engine(url))
    session.connection(execution_options={"isolation_level": "AUTOCOMMIT"})
    return session


@pytest.mark.parametrize(
    "make_session",
    [engine_in_autocommit, execution_options_in_autocommit, connection_in_autocommit],
)
def test_a_session_in_autocommit_is_refused_before_anything_is_written(
    db: Database, make_session: Any
) -> None:
    outbox = Outbox()
    session: Session = make_session(db.url)
    engine = session.get_bind()
    try:
        with pytest.raises(SessionConfigurationError, match="AUTOCOMMIT"):
            outbox.publish(session, "t", {}, routing_key="q")
        assert not session.new
        session.commit()
    finally:
        session.close()
        assert isinstance(engine, Engine)
        engine.dispose()
    assert stored(db.engine) == []


def test_a_scoped_session_and_a_session_of_several_binds_work(db: Database) -> None:
    outbox = Outbox()
    scoped = scoped_session(db.sessions)
    with scoped.begin():
        outbox.publish(scoped, "scoped", {}, routing_key="q")
    scoped.remove()
    with Session(binds={effects: db.engine, outbox.table: db.engine}) as session:
        session.execute(insert(effects).values(ref="bound", handler="web"))
        outbox.publish(session, "bound", {}, routing_key="q")
        session.commit()
    assert [r["type"] for r in stored(db.engine)] == ["scoped", "bound"]

    with (
        Session(binds={effects: db.engine}) as session,
        pytest.raises(SessionConfigurationError, match="no bind for the outbox table"),
    ):
        outbox.publish(session, "unbound", {}, routing_key="q")


def test_a_session_that_may_not_autobegin_must_be_in_a_transaction(db: Database) -> None:
    outbox = Outbox()
    with Session(db.engine, autobegin=False) as session:
        with pytest.raises(SessionConfigurationError, match="never begins a transaction"):
            outbox.publish(session, "t", {}, routing_key="q")
        with session.begin():
            outbox.publish(session, "t", {}, routing_key="q")
    assert len(stored(db.engine)) == 1


def test_an_outbox_table_of_another_name(db: Database) -> None:
    table = outbox_table(MetaData(), "shop_outbox")
    table.create(db.engine)
    by_table, by_name = Outbox(table), Outbox("shop_outbox")
    with Session(db.engine) as session, session.begin():
        by_table.publish(session, "a", {}, routing_key="q")
        by_name.publish(session, "b", {}, routing_key="q")
    assert [r["type"] for r in stored(db.engine, table)] == ["a", "b"]
    assert stored(db.engine) == []
    assert Outbox("shop_outbox").table is by_name.table  # one table, one mapped class
    with pytest.raises(ValueError, match="not an outbox table"):
        Outbox(effects)
    with pytest.raises(ValueError, match="plain identifier"):
        Outbox("shop outbox")


def test_the_schema_translate_map_applies_to_the_row(pg_db: Database) -> None:
    other = f"{pg_db.url.rsplit('search_path%3D', 1)[-1]}_x"
    translated = create_engine(pg_db.url).execution_options(schema_translate_map={None: other})
    try:
        with pg_db.engine.begin() as connection:
            connection.execute(text(f"CREATE SCHEMA {other}"))
        outbox_table(MetaData(), schema=other).create(pg_db.engine)
        with Session(translated) as session, session.begin():
            Outbox().publish(session, "translated", {}, routing_key="q")
        assert [r["type"] for r in stored(translated)] == ["translated"]
        assert stored(pg_db.engine) == []
    finally:
        translated.dispose()
        with pg_db.engine.begin() as connection:
            connection.execute(text(f"DROP SCHEMA IF EXISTS {other} CASCADE"))


def test_postgresql_is_notified_when_the_publishing_transaction_commits(pg_db: Database) -> None:
    import psycopg

    listener_url = pg_db.engine.url.set(drivername="postgresql").render_as_string(
        hide_password=False
    )
    with psycopg.connect(listener_url, autocommit=True) as listener:
        listener.execute("LISTEN inbox_outbox")
        with Session(pg_db.engine) as session, session.begin():
            Outbox().publish(session, "t", {}, routing_key="q")
            session.flush()
        [payload] = own_notifications(listener, current_schema(pg_db.engine), timeout=10)
    assert payload == f"{current_schema(pg_db.engine)}.outbox_message"


def test_the_same_idempotency_key_twice_is_two_rows_and_one_effect_downstream(
    db: Database,
) -> None:
    outbox = Outbox()
    for _ in range(2):  # e.g. a request retried by the client
        with Session(db.engine) as session, session.begin():
            outbox.publish(
                session, "order.created", {"ref": 9}, routing_key="q", idempotency_key="order-9"
            )
    rows = [row_from_mapping(r) for r in stored(db.engine)]
    assert len({row.id for row in rows}) == 2
    assert {row.headers["idempotency-key"] for row in rows} == {"order-9"}

    downstream = Recorder(Inbox(db.sessions))
    downstream.add("orders.apply", "order.created")
    results = [
        downstream.inbox.process(Message(row.id, row.type, {"ref": 9}, row.headers)) for row in rows
    ]
    assert [r.outcome for r in results] == [Outcome.PROCESSED, Outcome.DUPLICATE]
    assert db.effect_counts() == {("9", "orders.apply"): 1}


def test_a_handler_publishing_an_id_already_in_the_outbox_fails_and_commits_nothing(
    db: Database,
) -> None:
    inbox = Inbox(db.sessions)
    outbox = Outbox()
    taken = uuid7()
    with Session(db.engine) as session, session.begin():
        outbox.publish(session, "earlier", {}, routing_key="q", message_id=taken)

    @inbox.handler("order.created", name="orders.announce")
    def announce(message: Message, session: Session) -> None:
        record_effect(message, session, "orders.announce")
        outbox.publish(session, "announced", {}, routing_key="q", message_id=taken)

    with pytest.raises(HandlerFailed) as failed:
        inbox.process(order(3))
    assert isinstance(failed.value.failures["orders.announce"], IntegrityError)
    assert [r["type"] for r in stored(db.engine)] == ["earlier"]
    assert db.count(inbox.table) == 0
    assert db.effect_counts() == {}


def test_one_outbox_shared_by_threads_writes_every_row_once(server_db: Database) -> None:
    outbox = Outbox()
    threads, each = 6, 40

    def publish_many(worker: int) -> list[uuid.UUID]:
        ids = []
        for n in range(each):
            with Session(server_db.engine) as session, session.begin():
                ids.append(outbox.publish(session, "t", {"w": worker, "n": n}, routing_key="q"))
        return ids

    with ThreadPoolExecutor(threads) as pool:
        published = [i for ids in pool.map(publish_many, range(threads)) for i in ids]

    rows = [row_from_mapping(r) for r in stored(server_db.engine)]
    assert sorted(r.id for r in rows) == sorted(published)
    assert len(set(published)) == threads * each


def test_each_tenant_schema_gets_its_own_notify_function(pg_db: Database) -> None:
    """create_all under a schema_translate_map puts the trigger's function in the tenant's
    schema: dropping one tenant's schema leaves the others' triggers in place."""
    import psycopg

    base = pg_db.url.rsplit("search_path%3D", 1)[-1]
    tenants = [f"{base}_a", f"{base}_b"]
    try:
        for tenant in tenants:
            with pg_db.engine.begin() as connection:
                connection.execute(text(f"CREATE SCHEMA {tenant}"))
            translated = pg_db.engine.execution_options(schema_translate_map={None: tenant})
            outbox_table(MetaData()).create(translated)
        with pg_db.engine.connect() as connection:
            owners = connection.execute(
                text(
                    "SELECT c.relnamespace::regnamespace::text, p.pronamespace::regnamespace::text"
                    " FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid"
                    " JOIN pg_proc p ON p.oid = t.tgfoid WHERE t.tgname = 'inbox_outbox_notify'"
                    " AND c.relnamespace::regnamespace::text = ANY(:tenants)"
                ),
                {"tenants": tenants},
            ).all()
        assert sorted(owners) == [(t, t) for t in tenants]
        with pg_db.engine.begin() as connection:
            connection.execute(text(f"DROP SCHEMA {tenants[0]} CASCADE"))
        listener_url = pg_db.engine.url.set(drivername="postgresql").render_as_string(
            hide_password=False
        )
        survivor = pg_db.engine.execution_options(schema_translate_map={None: tenants[1]})
        with psycopg.connect(listener_url, autocommit=True) as listener:
            listener.execute("LISTEN inbox_outbox")
            with Session(survivor) as session, session.begin():
                Outbox().publish(session, "t", {}, routing_key="q")
            [payload] = own_notifications(listener, tenants[1], timeout=10)
        assert payload == f"{tenants[1]}.outbox_message"
    finally:
        with pg_db.engine.begin() as connection:
            for tenant in tenants:
                connection.execute(text(f"DROP SCHEMA IF EXISTS {tenant} CASCADE"))
