"""The outbox relay against the real databases and RabbitMQ: what it sends (checked with
pika, a client that is not the relay's), what it keeps when the broker refuses a row, and
what an operator sees of the kept rows."""

from __future__ import annotations

import dataclasses
import datetime as dt
import io
import json
import time
import uuid
from decimal import Decimal

import pytest
from kombu import Connection
from sqlalchemy import select, update
from sqlalchemy.orm import Session
from support.databases import Database
from support.rabbit import Rabbit
from support.relay import (
    JSON,
    add_rows,
    declare_queue,
    make_relay,
    op_row,
    outbox_ids,
    receive_all,
)

from inbox import InvalidMessage, Outbox
from inbox.broker import Relay, outbox_status
from inbox.outbox._row import OutboxRow
from inbox.outbox.relay._publish import BatchPublisher
from inbox.outbox.relay.cli import relay_main
from inbox.schema import outbox_message

PERSISTENT = 2


def test_committed_rows_go_out_once_each_in_id_order_with_every_property_intact(
    db: Database, rabbit: Rabbit
) -> None:
    queue = declare_queue(rabbit, "out")
    when = dt.datetime(2024, 5, 6, 7, 8, 9, 123456, tzinfo=dt.UTC)
    headers = {
        "idempotency-key": "order-created-42",
        "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        "n": 7,
        "ratio": 2.0,  # pika reads an AMQP double as an integer: a whole one compares equal
        "flag": True,
        "nothing": None,
        "nested": {"a": [1, "two", False]},
        "price": Decimal("9.90"),
        "at": when,
    }
    rows = [op_row(queue, f"r{i}", headers=headers) for i in range(150)]
    raw = OutboxRow(
        id=uuid.uuid4(),  # not a UUIDv7: sorts wherever its bytes put it
        type="blob.stored",
        exchange="",
        routing_key=queue,
        content_type="application/octet-stream",
        content_encoding=None,
        headers={},
        body=bytes(range(256)) * 3,
    )
    add_rows(db.engine, [*rows, raw])

    with make_relay(db, rabbit, batch_size=40) as relay:
        assert relay.drain() == 151
        assert relay.stats.published == 151
        assert relay.stats.resent == relay.stats.unconfirmed == relay.stats.refused == 0

    received = receive_all(rabbit, queue)
    assert [m.message_id for m in received] == sorted(r.id for r in [*rows, raw])
    by_id = {m.message_id: m for m in received}
    for row in rows:
        got = by_id[row.id]
        assert got.properties.type == "op"
        assert got.properties.content_type == JSON
        assert got.properties.content_encoding == "utf-8"
        assert got.properties.delivery_mode == PERSISTENT
        assert json.loads(got.body) == json.loads(row.body)
        sent = dict(got.properties.headers or {})
        assert sent == {**headers, "at": when.replace(microsecond=0)}  # AMQP: whole seconds
    blob = by_id[raw.id]
    assert blob.body == raw.body
    assert blob.properties.type == "blob.stored"
    assert blob.properties.content_type == "application/octet-stream"
    assert blob.properties.content_encoding is None
    assert outbox_ids(db.engine) == []


def test_outbox_publish_committed_goes_out_once_with_its_id_rolled_back_never(
    db: Database, rabbit: Rabbit
) -> None:
    queue = declare_queue(rabbit, "orders")
    outbox = Outbox()
    with Session(db.engine) as session, session.begin():
        kept = outbox.publish(
            session,
            "order.created",
            {"order_id": 42},
            routing_key=queue,
            idempotency_key="order-created-42",
            headers={"tenant": "acme"},
        )
    with Session(db.engine) as session, session.begin():
        outbox.publish(session, "order.created", {"order_id": 43}, routing_key=queue)
        session.flush()  # the row is written, then rolled back with the transaction
        session.rollback()
    with Session(db.engine) as session, session.begin():
        raw = outbox.publish(
            session, "blob", b"\x00\xff", routing_key=queue, content_type="image/png"
        )

    with make_relay(db, rabbit) as relay:
        assert relay.drain() == 2
    first, second = receive_all(rabbit, queue)
    assert (first.message_id, second.message_id) == (kept, raw)
    assert first.properties.type == "order.created"
    assert first.properties.content_type == JSON
    assert first.properties.delivery_mode == PERSISTENT
    assert json.loads(first.body) == {"order_id": 42}
    assert first.properties.headers == {"idempotency-key": "order-created-42", "tenant": "acme"}
    assert second.body == b"\x00\xff"
    assert second.properties.content_type == "image/png"
    assert outbox_ids(db.engine) == []


def test_an_unroutable_row_stays_with_its_error_and_goes_out_once_its_queue_exists(
    db: Database, rabbit: Rabbit
) -> None:
    flowing = declare_queue(rabbit, "flowing")
    missing = rabbit.queue("not-yet")
    before = [op_row(flowing, f"a{i}") for i in range(5)]
    stuck = op_row(missing, "stuck")
    after = [op_row(flowing, f"b{i}") for i in range(5)]
    add_rows(db.engine, [*before, stuck, *after])

    with make_relay(db, rabbit, max_retry_delay=0.5) as relay:
        assert relay.drain() == 10
        assert relay.stats.refused == 1
        assert [m.message_id for m in receive_all(rabbit, flowing)] == [
            r.id for r in [*before, *after]
        ]
        status = outbox_status(db.engine, outbox_message)
        assert (status.pending, status.refused) == (1, 1)
        assert status.oldest_refused_id == stuck.id
        assert status.attempts == 1
        assert status.last_error is not None
        assert "NO_ROUTE" in status.last_error
        assert "\n" not in status.last_error
        assert status.next_attempt_at is not None
        assert status.next_attempt_at > dt.datetime.now(dt.UTC) - dt.timedelta(seconds=1)

        declare_queue(rabbit, "not-yet")
        assert relay.run_until_empty(timeout=20) == 1
    [copy] = receive_all(rabbit, missing)
    assert copy.message_id == stuck.id
    assert outbox_ids(db.engine) == []


def test_a_missing_exchange_keeps_its_rows_until_it_is_declared(
    pg_db: Database, rabbit: Rabbit
) -> None:
    queue = declare_queue(rabbit, "bound")
    exchange = rabbit.queue("exchange")
    to_exchange = [op_row("key", f"x{i}", exchange=exchange) for i in range(3)]
    direct = [op_row(queue, f"d{i}") for i in range(3)]
    add_rows(pg_db.engine, [to_exchange[0], direct[0], to_exchange[1], *direct[1:], to_exchange[2]])

    with make_relay(pg_db, rabbit, max_retry_delay=0.5) as relay:
        assert relay.drain() == 3
        assert relay.stats.refused == 3
        status = outbox_status(pg_db.engine, outbox_message)
        assert status.refused == 3
        assert status.last_error is not None

        assert "does not exist" in status.last_error

        with rabbit.connection() as connection, connection.channel() as channel:
            channel.exchange_declare(exchange, "direct", durable=True, auto_delete=False)
            channel.queue_bind(queue, exchange, "key")
        try:
            assert relay.run_until_empty(timeout=20) == 3
        finally:
            with rabbit.connection() as connection, connection.channel() as channel:
                channel.exchange_delete(exchange)
    got = [m.message_id for m in receive_all(rabbit, queue)]
    assert sorted(got) == sorted(r.id for r in [*to_exchange, *direct])
    assert len(got) == 6


def test_a_full_queue_rejecting_publishes_nacks_rows_that_stay_and_go_out_once_drained(
    pg_db: Database, rabbit: Rabbit
) -> None:
    queue = declare_queue(rabbit, "full", {"x-max-length": 2, "x-overflow": "reject-publish"})
    rows = [op_row(queue, f"f{i}") for i in range(5)]
    add_rows(pg_db.engine, rows)

    with make_relay(pg_db, rabbit, max_retry_delay=0.3) as relay:
        assert relay.drain() == 2
        assert relay.stats.refused == 3
        status = outbox_status(pg_db.engine, outbox_message)
        assert status.refused == 3
        assert status.last_error is not None
        assert "nack" in status.last_error
        received = receive_all(rabbit, queue)
        deadline = time.monotonic() + 20
        while outbox_ids(pg_db.engine) and time.monotonic() < deadline:
            time.sleep(0.4)  # the refused rows' next attempt is at most 0.3 s away
            relay.drain()
            received += receive_all(rabbit, queue)
        assert sorted(m.message_id for m in received) == sorted(r.id for r in rows)
    assert outbox_ids(pg_db.engine) == []


def test_an_exchange_deleted_under_a_batch_closes_the_channel_and_only_its_rows_stay(
    pg_db: Database, rabbit: Rabbit
) -> None:
    queue = declare_queue(rabbit, "q")
    exchange = rabbit.queue("gone")
    with rabbit.connection() as connection, connection.channel() as channel:
        channel.exchange_declare(exchange, "fanout", durable=True, auto_delete=False)
        channel.queue_bind(queue, exchange, "")
    first = op_row("", "first", exchange=exchange)
    add_rows(pg_db.engine, [first])
    with make_relay(pg_db, rabbit, max_retry_delay=60) as relay:
        assert relay.drain() == 1  # the relay now knows the exchange exists
        with rabbit.connection() as connection, connection.channel() as channel:
            channel.exchange_delete(exchange)
        rows = [op_row(queue, f"q{i}") for i in range(10)]
        doomed = op_row("", "doomed", exchange=exchange)
        add_rows(pg_db.engine, [*rows[:5], doomed, *rows[5:]])

        assert relay.drain() == 10
        assert relay.stats.refused == 1
    assert outbox_ids(pg_db.engine) == [doomed.id]
    status = outbox_status(pg_db.engine, outbox_message)
    assert status.last_error is not None
    assert "NOT_FOUND" in status.last_error
    got = [m.message_id for m in receive_all(rabbit, queue)]
    assert first.id in got
    # Rows unanswered when the channel closed went again one by one: at most that many twice.
    assert set(got) == {first.id, *(r.id for r in rows)}
    assert len(got) - 11 <= relay.stats.unconfirmed


def test_headers_too_large_for_a_frame_and_unreadable_rows_stay_while_the_rest_flow(
    db: Database, rabbit: Rabbit
) -> None:
    queue = declare_queue(rabbit, "q")
    good = [op_row(queue, f"g{i}") for i in range(4)]
    huge = op_row(queue, "huge")
    broken = op_row(queue, "broken")
    add_rows(db.engine, good[:2])
    big = {f"h{i}": "x" * 60_000 for i in range(3)}  # 180 kB: over the 128 kB frame
    add_rows(db.engine, [huge], raw={"headers": json.dumps(big)})
    add_rows(db.engine, [broken], raw={"headers": "{not json"})
    add_rows(db.engine, good[2:])

    with make_relay(db, rabbit) as relay:
        assert relay.drain() == 4
        assert relay.stats.refused == 2
    assert [m.message_id for m in receive_all(rabbit, queue)] == [r.id for r in good]
    assert outbox_ids(db.engine) == sorted([huge.id, broken.id])
    with db.engine.connect() as connection:
        query = select(outbox_message.c.id, outbox_message.c.last_error)
        errors = dict(connection.execute(query).all())
    assert "frame" in errors[huge.id]
    assert "cannot be read" in errors[broken.id]
    assert "x" * 100 not in errors[huge.id]  # no row data in the error


def test_rows_not_due_yet_wait(db: Database, rabbit: Rabbit) -> None:
    queue = declare_queue(rabbit, "q")
    later = op_row(queue, "later")
    now = op_row(queue, "now")
    add_rows(db.engine, [later, now])
    with db.engine.begin() as connection:
        connection.execute(
            update(outbox_message)
            .where(outbox_message.c.id == later.id)
            .values(available_at=dt.datetime.now(dt.UTC) + dt.timedelta(hours=1))
        )
    with make_relay(db, rabbit) as relay:
        assert relay.drain() == 1
    assert [m.message_id for m in receive_all(rabbit, queue)] == [now.id]
    assert outbox_ids(db.engine) == [later.id]


def test_status_from_the_command_line(db: Database, rabbit: Rabbit) -> None:
    stuck = op_row(rabbit.queue("nowhere"), "stuck")
    add_rows(db.engine, [stuck])
    with make_relay(db, rabbit) as relay:
        relay.drain()
    out, err = io.StringIO(), io.StringIO()
    assert relay_main(["--database-url", db.url, "--status"], stdout=out, stderr=err) == 0
    line = out.getvalue()
    assert line.count("\n") == 1
    assert "pending=1 " in line
    assert "refused=1 " in line
    assert str(stuck.id) in line
    assert "NO_ROUTE" in line
    assert err.getvalue() == ""


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--batch-size", "0"], "--batch-size"),
        (["--poll-interval", "nan"], "--poll-interval"),
        (["--table", ".x"], "outbox table"),
        ([], "no broker"),
    ],
)
def test_bad_usage_is_one_line_and_exit_2(
    argv: list[str], message: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("INBOX_BROKER_URL", raising=False)
    err = io.StringIO()
    code = relay_main(["--database-url", "sqlite://", *argv], stdout=io.StringIO(), stderr=err)
    assert code == 2
    assert message in err.getvalue().splitlines()[-1]


def test_a_missing_table_or_unreachable_database_fails_at_start_with_exit_1(
    rabbit: Rabbit,
) -> None:
    err = io.StringIO()
    code = relay_main(
        ["--database-url", "sqlite://", "--broker", rabbit.url, "--connect-retries", "0"],
        stderr=err,
    )
    assert code == 1
    assert "outbox_message does not exist" in err.getvalue()


def test_constructor_checks_its_arguments(rabbit: Rabbit) -> None:
    with pytest.raises(ValueError, match="batch_size"):
        Relay("sqlite://", rabbit.url, batch_size=0)
    with pytest.raises(TypeError, match="batch_size"):
        Relay("sqlite://", rabbit.url, batch_size=True)
    with pytest.raises(ValueError, match="poll_interval"):
        Relay("sqlite://", rabbit.url, poll_interval=float("inf"))
    with pytest.raises(TypeError, match="broker"):
        Relay("sqlite://", object())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="publisher confirms"):
        Relay("sqlite://", Connection("memory://"))
    with pytest.raises(ValueError, match="outbox schema"):
        Relay("sqlite://", rabbit.url, table="a-b.c")


@pytest.mark.parametrize(
    ("raw", "fragment"),
    [
        ({"type": "ж" * 200}, "type is 400 UTF-8 bytes"),
        ({"headers": json.dumps({"n": 2**70})}, "signed 64-bit"),
        ({"routing_key": "ж" * 200}, "routing_key is 400 UTF-8 bytes"),
        ({"content_type": "ж" * 200}, "content_type is 400 UTF-8 bytes"),
    ],
    ids=["long-type", "huge-header-int", "long-routing-key", "long-content-type"],
)
def test_a_row_written_by_hand_that_amqp_cannot_carry_is_refused_and_every_restart_gets_past_it(
    db: Database, rabbit: Rabbit, raw: dict[str, object], fragment: str
) -> None:
    """Regression: such a row raised struct.error out of Relay.run(), was never marked
    refused, and every restart died on it with every row behind it unsent."""
    queue = declare_queue(rabbit, "q")
    bad = op_row(queue, "bad")
    before, after = op_row(queue, "before"), op_row(queue, "after")
    add_rows(db.engine, [before])
    add_rows(db.engine, [bad], raw=raw)
    add_rows(db.engine, [after])

    for restart in range(2):
        with make_relay(db, rabbit) as relay:
            assert relay.drain() == (2 if restart == 0 else 0)
            assert relay.stats.refused == 1
        with db.engine.begin() as connection:  # due again at once, for the restart
            connection.execute(update(outbox_message).values(available_at=dt.datetime.now(dt.UTC)))

    assert [m.message_id for m in receive_all(rabbit, queue)] == [before.id, after.id]
    assert outbox_ids(db.engine) == [bad.id]
    with db.engine.connect() as connection:
        attempts, error = connection.execute(
            select(outbox_message.c.attempts, outbox_message.c.last_error)
        ).one()
    assert attempts == 2
    assert fragment in error


@pytest.mark.parametrize(
    "arguments",
    [
        {"type": "ж" * 200},
        {"headers": {"n": 2**70}},
        {"routing_key": "ж" * 200},
        {"content_type": "ж" * 200, "body": b"x"},
        {"headers": {"ж" * 200: 1}},
    ],
    ids=["long-type", "huge-header-int", "long-routing-key", "long-content-type", "long-name"],
)
def test_outbox_publish_refuses_what_amqp_cannot_carry_before_anything_is_written(
    db: Database, arguments: dict[str, object]
) -> None:
    call: dict[str, object] = {"type": "op", "body": {"ref": 1}, "routing_key": "q"} | arguments
    with Session(db.engine) as session, session.begin(), pytest.raises(InvalidMessage):
        Outbox().publish(session, **call)  # type: ignore[arg-type]
    assert outbox_ids(db.engine) == []


def test_the_publisher_refuses_a_row_amqp_cannot_encode_and_sends_the_rest_of_its_batch(
    rabbit: Rabbit,
) -> None:
    """The relay checks each row before it publishes; should one slip through, py-amqp's
    encoding error refuses that row only (it is raised before anything of it is written)."""
    queue = declare_queue(rabbit, "q")
    good = [op_row(queue, "g1"), op_row(queue, "g2")]
    bad = dataclasses.replace(op_row(queue, "bad"), headers={"n": 2**70})
    publisher = BatchPublisher(Connection(rabbit.url), confirm_timeout=30.0)
    try:
        publisher.connect(lambda: None, max_retries=1)
        sent = publisher.publish([good[0], bad, good[1]])
    finally:
        publisher.close()
    assert sent.confirmed == [r.id for r in good]
    assert list(sent.refused) == [bad.id]
    assert "AMQP cannot carry" in sent.refused[bad.id]
    assert sent.unconfirmed == []
    assert sent.lost is None
    assert [m.message_id for m in receive_all(rabbit, queue)] == [r.id for r in good]
