"""The seams between features: one test per pair of features that meet on a message, each
run against the real servers and asserting the end state (rows, calls, broker messages),
never the calls made between them.

Each pair here once broke where the two met although each held on its own (issue 24): the
test names the pair first.
"""

from __future__ import annotations

import datetime as dt
import io
import uuid
from collections.abc import Iterator

import amqp
import pytest
from sqlalchemy import Interval, literal, update
from sqlalchemy.orm import Session
from support.databases import Database
from support.effects import record_effect
from support.rabbit import Rabbit
from support.worker import run_in_thread, wait_until

from inbox import Inbox, Message
from inbox.admin import admin_main
from inbox.broker import Publisher, RetryPolicy, Worker
from inbox.schema import inbox_message

TIMEOUT = 60.0


@pytest.fixture
def running() -> Iterator[list[Worker]]:
    """Workers a test starts in threads, stopped after it."""
    started: list[Worker] = []
    yield started
    for worker in started:
        worker.stop()


def start(running: list[Worker], worker: Worker) -> Worker:
    running.append(worker)
    run_in_thread(worker)
    return worker


# --- replay x retention ------------------------------------------------------------------


def shift_dead_letters(rabbit: Rabbit, dlq: str, by: dt.timedelta) -> None:
    """Every dead letter of ``dlq`` as it would be ``by`` later: its time headers moved back
    (taken and published again, confirmed)."""
    with rabbit.connection() as connection:
        connection.connect()
        channel = connection.connection.channel()
        channel.confirm_select()
        for _ in range(rabbit.depth(dlq)):  # each once: the shifted copies go to the end
            message = channel.basic_get(dlq, no_ack=False)
            headers = dict(message.properties.get("application_headers") or {})
            for name, value in headers.items():
                if name.startswith("x-inbox-") and name.endswith(("-at", "failure")):
                    moved = dt.datetime.fromisoformat(value) - by
                    headers[name] = moved.isoformat(timespec="milliseconds")
            properties = {**message.properties, "application_headers": headers}
            channel.basic_publish_confirm(
                amqp.Message(message.body, **properties), exchange="", routing_key=dlq
            )
            channel.basic_ack(message.delivery_tag)


def inbox_command(*argv: str) -> str:
    out, err = io.StringIO(), io.StringIO()
    code = admin_main(list(argv), stdout=out, stderr=err)
    assert code == 0, err.getvalue()
    return out.getvalue()


def test_replay_x_retention_a_replayed_dead_letter_keeps_the_age_cleanup_must_respect(
    pg_db: Database, rabbit: Rabbit, running: list[Worker]
) -> None:
    """Regression: a replay removed the failure headers, so a foreign (UUIDv4) message that
    failed again was dated by its new first failure; cleanup then deleted the claims of its
    first delivery, and the next replay charged the order a second time."""
    queue, dlq = rabbit.queue("orders"), rabbit.queue("orders.dlq")
    mail_down = [True]
    inbox = Inbox(pg_db.sessions)

    @inbox.handler("order.placed", name="billing.charge")
    def charge(message: Message, session: Session) -> None:
        record_effect(message, session, "billing.charge")

    @inbox.handler("order.placed", name="mail.confirm")
    def confirm(message: Message, session: Session) -> None:
        if mail_down[0]:
            raise RuntimeError("mail server down")
        record_effect(message, session, "mail.confirm")

    worker = start(
        running, Worker(inbox, rabbit.url, [queue], retry=RetryPolicy(max_tries=1), prefetch=1)
    )
    wait_until(lambda: worker.consuming, "the worker to consume", TIMEOUT)
    with Publisher(rabbit.url, routing_key=queue) as publisher:
        publisher.publish("order.placed", {"ref": "order-1"}, message_id=uuid.uuid4())
    wait_until(lambda: rabbit.depth(dlq) == 1, "the first dead letter", TIMEOUT)

    # Ten days go by: the charge's claim and the dead letter's times are ten days old.
    ten_days = dt.timedelta(days=10)
    with pg_db.engine.begin() as connection:
        connection.execute(
            update(inbox_message).values(
                processed_at=inbox_message.c.processed_at - literal(ten_days, Interval())
            )
        )
    shift_dead_letters(rabbit, dlq, ten_days)

    for replays in (1, 2):  # replayed, and dead-lettered again: the mail server is still down
        inbox_command("dlq", "replay", "--queue", queue, "--broker", rabbit.url)
        wait_until(
            lambda n=replays: worker.stats.dead_lettered == 1 + n, "the dead letter", TIMEOUT
        )
        wait_until(lambda: rabbit.depth(dlq) == 1, "the dead letter in place", TIMEOUT)

    inbox_command(
        "cleanup", "--days", "3", "--database-url", pg_db.url, "--broker", rabbit.url,
        "--queue", queue, "--quiet",
    )  # fmt: skip

    mail_down[0] = False
    inbox_command("dlq", "replay", "--queue", queue, "--broker", rabbit.url)
    wait_until(lambda: ("order-1", "mail.confirm") in pg_db.effect_counts(), "the mail", TIMEOUT)
    wait_until(lambda: worker.stats.acked >= 4, "the replayed copy acked", TIMEOUT)
    assert pg_db.effect_counts() == {
        ("order-1", "billing.charge"): 1,
        ("order-1", "mail.confirm"): 1,
    }
    assert rabbit.depth(dlq) == 0
    assert rabbit.depth(queue) == 0
