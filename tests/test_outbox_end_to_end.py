"""From Outbox.publish to a foreign AMQP client (pika) through the relay and RabbitMQ: a
rolled-back publish never reaches the broker, a committed one arrives once with the returned
id and every property; a handler's follow-up message has its effect once downstream."""

from __future__ import annotations

import datetime as dt
import json
from decimal import Decimal

from sqlalchemy.orm import Session
from support.databases import Database
from support.effects import Recorder, order, record_effect
from support.rabbit import Rabbit
from support.relay import declare_queue, make_relay, outbox_ids, receive_all

from inbox import Inbox, Message, Outbox


def test_only_the_committed_publish_reaches_the_broker_with_every_property(
    db: Database, rabbit: Rabbit
) -> None:
    queue = declare_queue(rabbit, "orders")
    outbox = Outbox()
    headers = {
        "trace": "t-1",
        "count": 5,
        "amount": Decimal("9.90"),
        "flag": True,
        "nested": {"a": [1, "b", None]},
        "at": dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC),
    }
    with Session(db.engine) as session:
        outbox.publish(session, "order.created", {"order_id": 0}, routing_key=queue)
        session.rollback()
    with Session(db.engine) as session, session.begin():
        message_id = outbox.publish(
            session,
            "order.created",
            {"order_id": 1, "note": "grüße"},
            routing_key=queue,
            idempotency_key="order-created-1",
            headers=headers,
        )

    with make_relay(db, rabbit) as relay:
        assert relay.drain() == 1

    [received] = receive_all(rabbit, queue)
    properties = received.properties
    assert received.message_id == message_id
    assert properties.type == "order.created"
    assert (properties.content_type, properties.content_encoding) == (
        "application/json",
        "utf-8",
    )
    assert properties.delivery_mode == 2
    assert json.loads(received.body) == {"order_id": 1, "note": "grüße"}
    sent = {k: v for k, v in properties.headers.items() if k in headers or k == "idempotency-key"}
    assert sent == headers | {"idempotency-key": "order-created-1"}
    assert outbox_ids(db.engine) == []


def test_a_handler_follow_up_goes_out_once_and_has_its_effect_once_downstream(
    db: Database, rabbit: Rabbit
) -> None:
    queue = declare_queue(rabbit, "confirmations")
    outbox = Outbox()
    upstream = Inbox(db.sessions)

    @upstream.handler("order.created", name="orders.confirm")
    def confirm(message: Message, session: Session) -> None:
        record_effect(message, session, "orders.confirm")
        outbox.publish(
            session,
            "order.confirmed",
            {"ref": message.body["ref"]},
            routing_key=queue,
            idempotency_key=f"order-confirmed-{message.body['ref']}",
        )

    created = order(7)
    upstream.process(created)
    upstream.process(created)  # a redelivery: a duplicate, no second row
    with make_relay(db, rabbit) as relay:
        assert relay.drain() == 1

    downstream = Recorder(Inbox(db.sessions, table="downstream_claims"))
    downstream.inbox.table.create(db.engine)
    downstream.add("notifications.sms", "order.confirmed")
    [received] = receive_all(rabbit, queue)
    delivered = Message(
        received.message_id,
        received.properties.type,
        json.loads(received.body),
        received.properties.headers,
    )
    downstream.inbox.process(delivered)
    downstream.inbox.process(delivered)  # the broker delivered it twice: no second effect

    assert db.effect_counts() == {("7", "orders.confirm"): 1, ("7", "notifications.sms"): 1}
    assert downstream.calls["notifications.sms"] == 1
