"""``assert_idempotent`` and ``FakeProvider`` where a new user found them lacking (issue 25):
a handler that calls an outside API directly is caught, an outbox table compares fairly,
and FakeProvider stands in for a direct call."""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy import insert
from sqlalchemy.orm import Session
from support.databases import Database, effects
from support.telemetry import sdk

from inbox import Inbox, Message, Outbox
from inbox.testing import FakeProvider, NotIdempotent, assert_idempotent


def order(ref: str = "42") -> Message:
    return Message.new("order.created", {"ref": ref})


def test_a_handler_calling_an_outside_api_directly_is_caught(db: Database) -> None:
    sms = FakeProvider("sms")
    inbox = Inbox(db.sessions)

    @inbox.handler("order.created", name="orders.notify")
    def notify(message: Message, session: Session) -> None:
        # Straight to the API, not through inbox.effect: made again by every redelivery.
        sms(uuid.uuid5(uuid.NAMESPACE_URL, f"order-{message.body['ref']}"))
        session.execute(insert(effects).values(ref=message.body["ref"], handler="notify"))

    with pytest.raises(NotIdempotent) as failed:
        assert_idempotent(inbox, order(), tables=["effects"], ignore_columns=["effects.id"])

    report = str(failed.value)
    assert "FakeProvider 'sms': called 2 time(s), 1 in the clean run" in report
    assert "make it through inbox.effect(step, call)" in report
    assert "table effects" not in report  # the rows are the same: only the calls give it away


def test_the_same_call_through_inbox_effect_passes(server_db: Database) -> None:
    sms = FakeProvider("sms")
    inbox = Inbox(server_db.sessions)

    @inbox.handler("order.created", name="orders.notify")
    def notify(message: Message, session: Session) -> None:
        inbox.effect("sms.send", sms)
        session.execute(insert(effects).values(ref=message.body["ref"], handler="notify"))

    assert_idempotent(inbox, order(), tables=["effects"], ignore_columns=["effects.id"])
    assert len(sms.calls) == 1  # one key, whatever the redeliveries


def test_an_outbox_table_compares_without_what_each_publish_sets_anew(db: Database) -> None:
    sdk()  # tracing on: each publish stores the current span's traceparent in the headers
    inbox, outbox = Inbox(db.sessions), Outbox()

    @inbox.handler("order.created", name="orders.forward")
    def forward(message: Message, session: Session) -> None:
        outbox.publish(session, "order.accepted", {"ref": message.body["ref"]}, routing_key="o")

    assert_idempotent(inbox, order(), tables=["outbox_message"])

    @inbox.handler("order.created", name="orders.forward.sloppy")
    def forward_sloppy(message: Message, session: Session) -> None:
        forward_sloppy.runs += 1  # type: ignore[attr-defined]
        body = {"ref": message.body["ref"], "run": forward_sloppy.runs}  # type: ignore[attr-defined]
        outbox.publish(session, "order.accepted", body, routing_key="o")

    forward_sloppy.runs = 0  # type: ignore[attr-defined]
    with pytest.raises(NotIdempotent) as failed:
        assert_idempotent(inbox, order("43"), tables=["outbox_message"])
    report = str(failed.value)
    assert """'body': b'{"ref":"43","run":1}'""" in report  # a real difference is still one
    assert report.endswith(
        "ignored columns: outbox_message.id, outbox_message.created_at, outbox_message.available_at"
    )


def test_fake_provider_takes_any_hashable_key_or_none() -> None:
    provider = FakeProvider("api")
    assert provider("order-7") == {"receipt": "api-order-7", "key": "order-7"}
    assert provider(7)["receipt"] == "api-7"
    assert provider()["key"] == "None"
    key = uuid.UUID(int=3)
    provider(key)
    assert (provider.calls_for("order-7"), provider.calls_for(None), provider.calls_for(key)) == (
        1,
        1,
        1,
    )
    assert provider.total_calls == 4
