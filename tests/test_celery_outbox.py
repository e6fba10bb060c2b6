"""``Outbox.send_task``: a Celery task sent only when the transaction commits, as the
protocol-2 message Celery's producer sends, run by Celery's real worker (RabbitMQ,
PostgreSQL); a rolled-back send never reaches it."""

from __future__ import annotations

import datetime as dt
import json
import uuid
from pathlib import Path

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session
from support.databases import Database
from support.rabbit import AMQP_URL, rabbit_area
from support.relay import make_relay
from test_celery_worker import sender, until, worker

from inbox import InvalidMessage, Outbox
from inbox.outbox._row import headers_from_json
from inbox.schema import outbox_message


def test_send_task_writes_the_protocol_2_message_with_its_id(db: Database) -> None:
    outbox = Outbox()
    eta = dt.datetime(2030, 1, 2, 3, 4, 5, tzinfo=dt.UTC)
    with Session(db.engine) as session, session.begin():
        task_id = outbox.send_task(
            session, "app.tasks.charge", (42,), {"cents": 990}, queue="payments", eta=eta
        )
    with db.engine.connect() as connection:
        row = connection.execute(select(outbox_message)).one()
    headers = headers_from_json(row.headers)
    assert row.id == uuid.UUID(task_id)
    assert (row.routing_key, row.exchange, row.type) == ("payments", "", "app.tasks.charge")
    assert row.content_type == "application/json"
    assert headers["task"] == "app.tasks.charge"
    assert headers["id"] == headers["root_id"] == task_id
    assert headers["lang"] == "py"
    assert headers["retries"] == 0
    assert headers["eta"] == "2030-01-02T03:04:05+00:00"
    assert headers["argsrepr"] == "(42,)"
    assert json.loads(row.body) == [
        [42],
        {"cents": 990},
        {"callbacks": None, "errbacks": None, "chain": None, "chord": None},
    ]
    with Session(db.engine) as session, pytest.raises(InvalidMessage, match="JSON"):
        outbox.send_task(session, "app.tasks.charge", (object(),))
    with Session(db.engine) as session, pytest.raises(InvalidMessage, match="not both"):
        outbox.send_task(session, "t", countdown=1, eta=eta)


def test_a_committed_send_task_runs_on_a_celery_worker_and_a_rolled_back_one_never(
    pg_db: Database, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    outbox = Outbox()
    with rabbit_area() as area, sender(AMQP_URL, area.queue("celery"), pg_db, monkeypatch):
        queue = area.queue("celery")
        with area.connection() as connection, connection.channel() as channel:
            channel.queue_declare(queue=queue, durable=True, auto_delete=False)
        with Session(pg_db.engine) as session, session.begin():
            sent = outbox.send_task(session, "ct.record", ["sent"], queue=queue)
        with Session(pg_db.engine) as session:
            outbox.send_task(session, "ct.record", ["rolled-back"], queue=queue)
            session.flush()
            session.rollback()
        with Session(pg_db.engine) as session, session.begin():
            outbox.send_task(session, "ct.record", ["later"], queue=queue, countdown=1)
        relay = make_relay(pg_db, area)
        try:
            assert relay.run_until_empty(timeout=30) == 2
            # As a relay that crashed between the broker's confirm and the delete: the same
            # task, under the same id, sent a second time.
            with Session(pg_db.engine) as session, session.begin():
                outbox.send_task(session, "ct.record", ["sent"], queue=queue, task_id=sent)
            assert relay.run_until_empty(timeout=30) == 1
        finally:
            relay.close()
        assert area.depth(queue) == 3
        with worker(AMQP_URL, queue, pg_db, tmp_path):
            until(lambda: len(pg_db.effect_counts()) == 2, "the two committed tasks")
        assert pg_db.effect_counts() == {("sent", "ct.record"): 1, ("later", "ct.record"): 1}
        assert uuid.UUID(sent).version == 7


def test_an_outbox_sent_task_answers_on_the_rpc_result_backend(
    pg_db: Database, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The message carries correlation_id = task id and reply_to as AMQP properties (not as
    headers), as Celery's producer sets them: AsyncResult.get() on rpc:// gets the value."""
    outbox = Outbox()
    monkeypatch.setenv("INBOX_CELERY_BACKEND", "rpc://")
    with rabbit_area() as area, sender(AMQP_URL, area.queue("celery"), pg_db, monkeypatch) as ct:
        queue = area.queue("celery")
        with area.connection() as connection, connection.channel() as channel:
            channel.queue_declare(queue=queue, durable=True, auto_delete=False)
        app = ct.app
        # What app.send_task does first: declare the reply queue before the task can run.
        with app.producer_or_acquire() as producer:
            app.backend.on_task_call(producer, None)
        with Session(pg_db.engine) as session, session.begin():
            looked_at = outbox.send_task(
                session, "ct.record", ["seen"], queue=queue, reply_to=app.thread_oid
            )
        relay = make_relay(pg_db, area)
        try:
            assert relay.run_until_empty(timeout=30) == 1
            [message] = area.take_all(queue)
            assert message.properties["correlation_id"] == looked_at
            assert message.properties["reply_to"] == app.thread_oid
            assert not any(name.startswith("x-inbox-") for name in message.headers)
            with Session(pg_db.engine) as session, session.begin():
                task_id = outbox.send_task(
                    session, "ct.record", ["rpc"], queue=queue, reply_to=app.thread_oid
                )
            assert relay.run_until_empty(timeout=30) == 1
        finally:
            relay.close()
        with worker(AMQP_URL, queue, pg_db, tmp_path):
            value = app.AsyncResult(task_id).get(timeout=60)
        assert value.startswith("rpc:")
        with Session(pg_db.engine) as session, pytest.raises(InvalidMessage, match="reply_to"):
            outbox.send_task(session, "ct.record", ["x"], reply_to="")
