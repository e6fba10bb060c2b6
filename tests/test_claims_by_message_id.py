"""From the message id the logs print to the claims of handlers that claim under ``key=``
(issue 32, item 7), on a real worker, RabbitMQ and PostgreSQL: the log lines and the dead
letter carry each handler's claim key, and ``inbox show ID --queue Q`` and the console's
claims page go from the id to the claims in one step, through the dead letter."""

from __future__ import annotations

import io
import logging
import uuid
from typing import Any

import pytest
from console_support import TOKEN, dead_letter, settings
from sqlalchemy.orm import Session
from starlette.testclient import TestClient
from support.databases import Database
from support.effects import record_effect
from support.rabbit import Rabbit

from inbox import HandlerFailed, Inbox, Message
from inbox.admin import admin_main
from inbox.broker import Publisher, RetryPolicy, Worker
from inbox.broker._idle import run_until_idle
from inbox.console import create_app
from inbox.delivery import headers as h
from inbox.message import KEY_NAMESPACE
from inbox.operations import _claims
from inbox.operations._dead_letters import dead_letter_queue, open_channel, publish_confirmed

RESERVE, CHARGE, AUDIT = "shop.reserve", "shop.charge", "shop.audit"


def order_key(message: Message) -> str:
    assert isinstance(message.body, dict)
    return f"order-{message.body['order']}"


def make_inbox(db: Database) -> Inbox:
    """Two handlers claiming under the order (one always fails), one under the message id."""
    inbox = Inbox(db.sessions)

    @inbox.handler("order", name=RESERVE, key=order_key)
    def reserve(message: Message, session: Session) -> None:
        record_effect(message, session, RESERVE)

    @inbox.handler("order", name=CHARGE, key=order_key)
    def charge(message: Message, session: Session) -> None:
        raise RuntimeError("the payment provider is down")

    @inbox.handler("order", name=AUDIT)
    def audit(message: Message, session: Session) -> None:
        record_effect(message, session, AUDIT)

    return inbox


def claim_key(order: str) -> uuid.UUID:
    return uuid.uuid5(KEY_NAMESPACE, f"order-{order}")


def show(db: Database, *argv: str) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    code = admin_main(["show", *argv, "--database-url", db.url], stdout=out, stderr=err)
    assert err.getvalue() == ""
    return code, out.getvalue()


def dead_letter_headers(rabbit: Rabbit, queue: str) -> dict[str, Any]:
    with open_channel(rabbit.url) as channel:
        letter = channel.basic_get(dead_letter_queue(queue), no_ack=False)
        assert letter is not None
        headers: dict[str, Any] = dict(letter.properties["application_headers"])
    return headers  # the channel closed: the letter is back in its queue


@pytest.fixture
def dead_lettered(
    pg_db: Database, rabbit: Rabbit, caplog: pytest.LogCaptureFixture
) -> tuple[str, str, str]:
    """A message whose charge failed for good: dead-lettered; reserve and audit committed.
    Its queue, its id and the worker's log (at DEBUG)."""
    queue = rabbit.queue("orders")
    worker = Worker(make_inbox(pg_db), rabbit.url, [queue], retry=RetryPolicy((), max_tries=1))
    worker.prepare()
    with Publisher(rabbit.url, routing_key=queue) as publisher:
        message_id = str(publisher.publish("order", {"order": "1042", "ref": "1042"}))
    with caplog.at_level(logging.DEBUG, logger="inbox"):
        run_until_idle(worker, 1.5)
    assert worker.stats.dead_lettered == 1
    assert rabbit.depth(dead_letter_queue(queue)) == 1
    return queue, message_id, caplog.text


def test_the_log_lines_name_the_key_each_handler_claims_under(
    dead_lettered: tuple[str, str, str],
) -> None:
    _, message_id, log = dead_lettered
    key = claim_key("1042")
    assert (
        f"handler {CHARGE} failed on message {message_id} (type 'order') under claim key {key}"
        in log
    )
    assert f"processed by {RESERVE} under claim key {key}" in log
    assert f"processed by {AUDIT}\n" in log  # under the message id: no key to name
    assert f"(claim keys: {RESERVE}={key},{CHARGE}={key})" in log


def test_the_dead_letter_carries_the_keys_that_are_not_the_message_id(
    rabbit: Rabbit, dead_lettered: tuple[str, str, str]
) -> None:
    queue, _, _ = dead_lettered
    headers = dead_letter_headers(rabbit, queue)
    key = claim_key("1042")
    assert h.parse_claim_keys(headers[h.CLAIM_KEYS]) == {CHARGE: key, RESERVE: key}


def test_show_goes_from_the_message_id_to_the_claims_through_the_dead_letter(
    pg_db: Database, rabbit: Rabbit, dead_lettered: tuple[str, str, str]
) -> None:
    queue, message_id, _ = dead_lettered
    key = claim_key("1042")

    code, out = show(pg_db, message_id)  # the database alone: only the audit's claim
    assert code == 0
    assert f"{AUDIT}: processed at" in out
    assert RESERVE not in out

    code, out = show(pg_db, message_id, "--queue", queue, "--broker", rabbit.url)
    assert code == 0
    assert f"the keys its dead letter in {dead_letter_queue(queue)} names:" in out
    assert f"{AUDIT}: processed at" in out
    assert f"{RESERVE}: processed at" in out
    assert f"(claim key {key}, the claim key of {RESERVE}, {CHARGE} (dead letter" in out
    assert rabbit.depth(dead_letter_queue(queue)) == 1  # read, left in place


def test_show_says_where_the_keys_are_when_the_id_finds_no_claim(
    pg_db: Database, rabbit: Rabbit, dead_lettered: tuple[str, str, str]
) -> None:
    code, out = show(pg_db, str(uuid.uuid4()))
    assert code == 3
    assert "under claim key K" in out
    assert "x-inbox-claim-keys" in out
    assert "inbox show ID --queue QUEUE" in out

    nowhere = rabbit.queue("never-dead-lettered")  # no dead-letter queue: not an error
    code, out = show(pg_db, str(uuid.uuid4()), "--queue", nowhere, "--broker", rabbit.url)
    assert code == 3
    assert "under claim key K" in out
    assert "--queue QUEUE" not in out


def test_the_console_claims_page_follows_the_dead_letter(
    pg_db: Database, rabbit: Rabbit, dead_lettered: tuple[str, str, str]
) -> None:
    queue, message_id, _ = dead_lettered
    client = TestClient(create_app(settings(pg_db, rabbit, (queue,))))
    page = client.get(
        "/claims", params={"q": message_id}, headers={"Authorization": f"Bearer {TOKEN}"}
    )
    assert page.status_code == 200, page.text
    assert 'id="via-dead-letter"' in page.text
    assert f"<td>{RESERVE}</td>" in page.text  # found by the key its dead letter names
    assert f"<td>{AUDIT}</td>" in page.text
    assert f'name="q" value="{claim_key("1042")}"' in page.text  # its release uses the key


def test_handler_failed_carries_every_handler_claim_key(pg_db: Database) -> None:
    inbox = make_inbox(pg_db)
    message = Message(uuid.uuid4(), "order", {"order": "7", "ref": "7"})
    with pytest.raises(HandlerFailed) as failed:
        inbox.process(message)
    assert failed.value.claim_keys == {
        RESERVE: claim_key("7").bytes,
        CHARGE: claim_key("7").bytes,
        AUDIT: message.id.bytes,
    }


def behind_two_others(rabbit: Rabbit, queue: str) -> None:
    """Put two other dead letters in front of the queue's one (moved to the tail)."""
    dlq = dead_letter_queue(queue)
    with open_channel(rabbit.url) as channel:
        letter = channel.basic_get(dlq, no_ack=False)
        assert letter is not None
        for ref in ("other-1", "other-2"):
            dead_letter(rabbit, queue, ref=ref)
        properties = {k: v for k, v in letter.properties.items() if k != "delivery_tag"}
        publish_confirmed(channel, letter.body, properties, dlq)
        channel.basic_ack(letter.delivery_tag)
    assert rabbit.depth(dlq) == 3


def test_the_dead_letter_lookup_reads_a_bounded_number_of_letters_and_says_so(
    pg_db: Database,
    rabbit: Rabbit,
    dead_lettered: tuple[str, str, str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``show --queue`` and the claims page read the first ``DEAD_LETTERS_READ`` (2 here) of
    a dead-letter queue, not all of it, and say when the letter may be further back."""
    queue, message_id, _ = dead_lettered
    behind_two_others(rabbit, queue)
    monkeypatch.setattr(_claims, "DEAD_LETTERS_READ", 2, raising=False)
    dlq = dead_letter_queue(queue)
    said = f"read only the first 2 of the 3 dead letters in {dlq}: its dead letter may be further"

    code, out = show(pg_db, message_id, "--queue", queue, "--broker", rabbit.url)
    assert code == 0  # the audit's claim, under the message id
    assert said in out
    assert RESERVE not in out  # its dead letter, third, was not read
    assert rabbit.depth(dlq) == 3

    client = TestClient(create_app(settings(pg_db, rabbit, (queue,))))
    page = client.get(
        "/claims", params={"q": message_id}, headers={"Authorization": f"Bearer {TOKEN}"}
    )
    assert page.status_code == 200, page.text
    assert said in page.text
    assert f"<td>{RESERVE}</td>" not in page.text

    monkeypatch.setattr(_claims, "DEAD_LETTERS_READ", 3)
    code, out = show(pg_db, message_id, "--queue", queue, "--broker", rabbit.url)
    assert f"{RESERVE}: processed at" in out  # within the bound: found through it
    assert "read only the first" not in out
