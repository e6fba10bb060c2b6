"""Poison messages Celery's consumer refuses before any task runs (undecodable body, unknown
task name, content type not accepted, no task message at all) and an inbox task sent bad
arguments: each becomes one dead letter on ``<queue>.dlq`` with the inbox's reason headers,
never lost, never looping. A real prefork worker on RabbitMQ, PostgreSQL."""

from __future__ import annotations

import logging
import pickle
import uuid
from pathlib import Path

import pytest
from celery import Celery
from kombu import Message
from support.databases import Database
from support.rabbit import AMQP_URL, rabbit_area
from test_celery_worker import sender, until, worker

from inbox.broker import DeadLetterReason
from inbox.celery._poison import dead_lettering

UNDECODABLE = DeadLetterReason.UNDECODABLE_BODY


def test_messages_celery_refuses_are_dead_letters_once_with_their_reason(
    pg_db: Database, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with rabbit_area() as area, sender(AMQP_URL, area.queue("celery"), pg_db, monkeypatch) as app:
        queue = area.queue("celery")
        celery = app.app
        unknown = celery.send_task("ct.nope", args=(1,))
        bad_arguments = celery.send_task("ct.record", args=("a", "b", "c"))
        ids = {name: str(uuid.uuid4()) for name in ("undecodable", "pickled")}
        with area.connection() as connection:
            producer = connection.Producer()
            for name, body, content_type in (
                ("undecodable", b'{"not json', "application/json"),
                ("pickled", pickle.dumps((("x",), {}, {})), "application/x-python-serialize"),
            ):
                sent = celery.amqp.as_task_v2(ids[name], "ct.record", args=("x",))
                producer.publish(
                    body,
                    routing_key=queue,
                    headers=sent.headers,
                    content_type=content_type,
                    content_encoding="binary",
                    correlation_id=ids[name],
                )
            producer.publish(
                b'{"hello": 1}',
                routing_key=queue,
                content_type="application/json",
                content_encoding="utf-8",
            )
        with worker(AMQP_URL, queue, pg_db, tmp_path):
            # The end: five letters and every message of the queue acked, none ready or
            # delivered; the worker reads only the queue, so no letter can come after this.
            until(
                lambda: area.depth(f"{queue}.dlq") >= 5 and area.unsettled(queue) == 0,
                "five dead letters and the queue settled",
            )
            assert area.depth(f"{queue}.dlq") == 5
        assert pg_db.effect_counts() == {}
        letters = {
            (m.headers or {}).get("id") or "no task header": m
            for m in area.take_all(f"{queue}.dlq")
        }
        reasons = {key: m.headers["x-inbox-reason"] for key, m in letters.items()}
        assert reasons == {
            unknown.id: "unhandled-type",
            bad_arguments.id: "invalid-body",
            ids["undecodable"]: "undecodable-body",
            ids["pickled"]: "invalid-message",
            "no task header": "invalid-message",
        }
        for letter in letters.values():
            assert letter.headers["x-inbox-queue"] == queue
            assert letter.headers["x-inbox-dead-lettered-at"]
        assert letters[ids["undecodable"]].body == b'{"not json'
        assert letters[unknown.id].headers["x-inbox-error"] == (
            "NotRegistered: no task 'ct.nope' in this worker"
        )
        assert letters["no task header"].headers["x-inbox-error"].startswith("not a Celery task")
        assert "too many positional" in letters[bad_arguments.id].headers["x-inbox-error"]
        assert letters[ids["pickled"]].headers["x-inbox-error"].startswith("ContentDisallowed")


def test_a_poison_message_whose_copy_the_broker_refuses_stays_unacked_and_is_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    app = Celery("refused_copy", broker="amqp://guest:guest@127.0.0.1:1//", set_as_current=False)
    refused: list[tuple[object, ...]] = []
    handler = dead_lettering(app, lambda *a: refused.append(a), 0, UNDECODABLE)
    message = Message(
        body=b'{"not json',
        content_type="application/json",
        headers={"task": "ct.record"},
        delivery_info={"routing_key": "q"},
    )
    with caplog.at_level(logging.ERROR, logger="inbox.celery"):
        assert handler(message, ValueError("bad JSON")) is None
    assert refused == [], "Celery's handler (which would drop it) was not called"
    assert not message.acknowledged
    [record] = caplog.records
    assert "(undecodable-body) was not dead-lettered" in record.getMessage()
    assert "copy to 'q.dlq' not taken" in record.getMessage()
    app.close()
