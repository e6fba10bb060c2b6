"""Typed bodies: ``@inbox.handler(..., body=T)`` with T a dataclass or a pydantic model.

The handler gets a ``Message[T]``; a body that does not validate is ``InvalidBody`` raised
before any claim (nothing committed, no handler run), dead-lettered at once by the worker
with ``x-inbox-reason: invalid-body`` and a reason that names fields, never values.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import decimal
import enum
import json
import textwrap
import uuid
from collections import Counter
from pathlib import Path
from typing import Any, Literal

import pydantic
import pytest
from kombu import Connection
from mypy import api as mypy_api
from sqlalchemy import create_engine, func, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker, create_async_engine
from sqlalchemy.orm import Session
from support.databases import Database
from support.effects import record_effect
from support.rabbit import Rabbit
from support.worker import run_until_idle

from inbox import Inbox, InvalidBody, InvalidMessage, Message, Outbox, Outcome, RegistrationError
from inbox.aio import AsyncInbox
from inbox.broker import DeadLetterReason, Publisher, RetryPolicy, Worker
from inbox.core._bodies import plain_body
from inbox.delivery import headers as h
from inbox.delivery._policy import DeadLetter, decide
from inbox.schema import inbox_message, outbox_message
from inbox.schema import metadata as inbox_metadata

SECRET = "4111-1111-1111-1111"  # a value that must never reach an error or a header


class Currency(enum.Enum):
    EUR = "EUR"
    USD = "USD"


@dataclasses.dataclass(frozen=True)
class Line:
    sku: str
    quantity: int


@dataclasses.dataclass(frozen=True)
class OrderCreated:
    order_id: uuid.UUID
    total: decimal.Decimal
    currency: Currency
    lines: list[Line]
    placed_at: dt.datetime
    note: str | None = None
    channel: Literal["web", "shop"] = "web"
    tags: tuple[str, ...] = ()


class PaymentTaken(pydantic.BaseModel):
    payment_id: uuid.UUID
    amount: int = pydantic.Field(gt=0)
    card: str


@pydantic.dataclasses.dataclass
class Refund:
    refund_id: str
    amount: int


def order_body(**changes: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "order_id": str(uuid.UUID(int=7)),
        "total": "19.90",
        "currency": "EUR",
        "lines": [{"sku": "A-1", "quantity": 2}],
        "placed_at": "2026-11-26T10:00:00+00:00",
        "unknown_to_this_consumer": True,
    }
    return body | changes


def claims(db: Database) -> int:
    return db.count(inbox_message)


def test_a_dataclass_handler_gets_the_validated_body_and_commits(db: Database) -> None:
    inbox = Inbox(db.sessions)
    seen: list[Message[OrderCreated]] = []

    @inbox.handler("order.created", body=OrderCreated, name="orders.typed")
    def typed(message: Message[OrderCreated], session: Session) -> None:
        seen.append(message)
        record_effect(message.with_body({"ref": message.body.lines[0].sku}), session, "typed")

    message = Message.new("order.created", order_body(note=None), {"tenant": "acme"})
    result = inbox.process(message)

    assert result.outcomes == {"orders.typed": Outcome.PROCESSED}
    [got] = seen
    assert (got.id, got.type, dict(got.headers)) == (
        message.id,
        "order.created",
        {"tenant": "acme"},
    )
    assert got.body == OrderCreated(
        order_id=uuid.UUID(int=7),
        total=decimal.Decimal("19.90"),
        currency=Currency.EUR,
        lines=[Line("A-1", 2)],
        placed_at=dt.datetime(2026, 11, 26, 10, tzinfo=dt.UTC),
    )
    assert db.effect_counts() == {("A-1", "typed"): 1}
    assert inbox.process(message).outcomes == {"orders.typed": Outcome.DUPLICATE}


def test_an_invalid_body_is_invalid_body_before_any_claim_and_no_handler_runs(
    db: Database,
) -> None:
    inbox = Inbox(db.sessions)
    ran: list[str] = []

    @inbox.handler("order.created", name="orders.untyped")
    def untyped(message: Message, session: Session) -> None:
        ran.append("untyped")

    @inbox.handler("order.created", body=OrderCreated, name="orders.typed")
    def typed(message: Message[OrderCreated], session: Session) -> None:
        ran.append("typed")

    bad = order_body(total=SECRET + "x", currency="GBP", lines=[{"sku": SECRET}])
    del bad["order_id"]
    message = Message.new("order.created", bad)

    with pytest.raises(InvalidBody) as raised:
        inbox.process(message)

    error = raised.value
    assert isinstance(error, InvalidMessage)
    assert (error.handler, error.message_id, error.body_type) == (
        "orders.typed",
        message.id,
        "OrderCreated",
    )
    assert error.reason == (
        "order_id: field required; total: expected Decimal as a string, got str; "
        "currency: not a value of Currency (and 1 more)"
    )
    assert SECRET not in str(error)
    assert ran == []  # the untyped handler, registered first, did not run either
    assert claims(db) == 0


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        ([1, 2], "body: expected an object, got an array"),
        (None, "body: expected an object, got null"),
        (b"raw", "body: expected an object, got bytes"),
        (order_body(lines="A-1"), "lines: expected an array, got str"),
        (order_body(lines=[{"sku": "A", "quantity": True}]), "lines[0].quantity: expected an"),
        (order_body(channel="phone"), "channel: not one of the 2 allowed values"),
        (order_body(note=5), "note: expected str | None, got int"),
        (order_body(placed_at="yesterday"), "placed_at: expected datetime as a string, got str"),
    ],
)
def test_each_kind_of_invalid_dataclass_body_is_named(body: object, reason: str) -> None:
    engine = create_engine("sqlite://")
    inbox_metadata.create_all(engine)
    inbox = Inbox(lambda: Session(engine))
    inbox.handler("order.created", body=OrderCreated, name="typed")(lambda m, s: None)

    with pytest.raises(InvalidBody) as raised:
        inbox.process(Message.new("order.created", body))

    assert raised.value.reason.startswith(reason)


def test_the_key_function_of_a_typed_handler_sees_the_typed_body(db: Database) -> None:
    inbox = Inbox(db.sessions)
    runs: list[uuid.UUID] = []

    @inbox.handler(
        "order.created", body=OrderCreated, key=lambda m: m.body.order_id, name="orders.keyed"
    )
    def typed(message: Message[OrderCreated], session: Session) -> None:
        runs.append(message.body.order_id)

    # Two sends of one order under fresh ids: one business operation, one run.
    first = inbox.process(Message.new("order.created", order_body()))
    again = inbox.process(Message.new("order.created", order_body()))

    assert list(first.outcomes.values()) == [Outcome.PROCESSED]
    assert list(again.outcomes.values()) == [Outcome.DUPLICATE]
    assert runs == [uuid.UUID(int=7)]


def test_a_pydantic_model_body_is_validated_by_pydantic_without_values_in_the_reason(
    db: Database,
) -> None:
    inbox = Inbox(db.sessions)
    seen: list[PaymentTaken] = []

    @inbox.handler("payment.taken", body=PaymentTaken, name="payments")
    def on_payment(message: Message[PaymentTaken], session: Session) -> None:
        seen.append(message.body)

    good = {"payment_id": str(uuid.UUID(int=1)), "amount": 5, "card": SECRET}
    inbox.process(Message.new("payment.taken", good))
    assert seen == [PaymentTaken(payment_id=uuid.UUID(int=1), amount=5, card=SECRET)]

    with pytest.raises(InvalidBody) as raised:
        inbox.process(Message.new("payment.taken", {"payment_id": SECRET, "amount": -3}))
    reason = raised.value.reason
    assert reason.startswith("payment_id: Input should be a valid UUID")
    assert "amount: Input should be greater than 0" in reason
    assert "card: Field required" in reason
    assert SECRET not in str(raised.value)
    assert raised.value.__cause__ is None  # pydantic's error (with the input) is not chained
    assert claims(db) == 1


def test_a_pydantic_dataclass_body_is_validated_by_pydantic() -> None:
    engine = create_engine("sqlite://")
    inbox_metadata.create_all(engine)
    inbox = Inbox(lambda: Session(engine))
    seen: list[Refund] = []
    inbox.handler("refund", body=Refund, name="refunds")(lambda m, s: seen.append(m.body))

    inbox.process(Message.new("refund", {"refund_id": "r1", "amount": "12"}))  # lax mode
    with pytest.raises(InvalidBody, match=r"amount: Input should be a valid integer"):
        inbox.process(Message.new("refund", {"refund_id": "r2", "amount": "twelve"}))

    assert seen == [Refund(refund_id="r1", amount=12)]


@dataclasses.dataclass
class Unsupported:
    ids: set[int]


@dataclasses.dataclass
class Tree:
    name: str
    children: list[Tree] = dataclasses.field(default_factory=list)


def test_bad_body_types_are_refused_at_registration() -> None:
    inbox = Inbox(lambda: Session(create_engine("sqlite://")))
    for body, message in [
        (dict, "body= must be a dataclass or a pydantic model class, got dict"),
        (
            OrderCreated(uuid.UUID(int=1), decimal.Decimal(1), Currency.EUR, [], dt.datetime.now()),
            "body= must be a dataclass or a pydantic model class, got OrderCreated(",
        ),
        (Unsupported, "body type field Unsupported.ids is annotated set[int]"),
    ]:
        with pytest.raises(RegistrationError) as raised:
            inbox.handler("t", body=body, name=f"h{id(body)}")(lambda m, s: None)  # type: ignore[call-overload]
        assert str(raised.value).startswith(message)
    assert inbox.handlers == ()


def test_recursive_dataclasses_validate_at_every_depth() -> None:
    engine = create_engine("sqlite://")
    inbox_metadata.create_all(engine)
    inbox = Inbox(lambda: Session(engine))
    seen: list[Tree] = []
    inbox.handler("tree", body=Tree, name="trees")(lambda m, s: seen.append(m.body))

    inbox.process(Message.new("tree", {"name": "a", "children": [{"name": "b"}]}))
    with pytest.raises(InvalidBody, match=r"children\[0\]\.children\[0\]\.name: field required"):
        inbox.process(
            Message.new("tree", {"name": "a", "children": [{"name": "b", "children": [{}]}]})
        )

    assert seen == [Tree("a", [Tree("b")])]

    deep: dict[str, Any] = {"name": "leaf"}
    for _ in range(5000):  # deeper than the stack: refused as a body, not a crash
        deep = {"name": "n", "children": [deep]}
    with pytest.raises(InvalidBody, match=r"body: nested too deeply to check"):
        inbox.process(Message.new("tree", deep))


def test_a_batch_rejects_only_the_message_whose_body_does_not_validate(db: Database) -> None:
    inbox = Inbox(db.sessions)
    skus: list[str] = []

    @inbox.handler("order.created", body=OrderCreated, name="orders.typed")
    def typed(message: Message[OrderCreated], session: Session) -> None:
        skus.append(message.body.lines[0].sku)

    messages = [
        Message.new("order.created", order_body(lines=[{"sku": "A", "quantity": 1}])),
        Message.new("order.created", order_body(lines=[{"sku": "B"}])),
        Message.new("order.created", order_body(lines=[{"sku": "C", "quantity": 1}])),
    ]
    results = inbox.process_batch(messages)

    assert isinstance(results[1], InvalidBody)
    assert results[1].reason == "lines[0].quantity: field required"
    assert [r.outcomes for r in (results[0], results[2])] == [  # type: ignore[union-attr]
        {"orders.typed": Outcome.PROCESSED}
    ] * 2
    assert skus == ["A", "C"]
    assert claims(db) == 2


def test_the_async_inbox_gets_typed_bodies_too(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'typed.db'}"
    inbox_metadata.create_all(create_engine(url))
    engine = create_async_engine(url.replace("sqlite:", "sqlite+aiosqlite:"))
    inbox = AsyncInbox(async_sessionmaker(engine))
    seen: list[PaymentTaken] = []

    @inbox.handler("payment.taken", body=PaymentTaken, name="payments")
    async def on_payment(message: Message[PaymentTaken], session: AsyncSession) -> None:
        seen.append(message.body)

    async def main() -> int:
        await inbox.process(
            Message.new(
                "payment.taken", {"payment_id": str(uuid.UUID(int=2)), "amount": 1, "card": "c"}
            )
        )
        with pytest.raises(InvalidBody):
            await inbox.process(Message.new("payment.taken", {"amount": 1}))
        async with engine.connect() as connection:
            count = await connection.scalar(select(func.count()).select_from(inbox_message))
        await engine.dispose()
        return int(count or 0)

    assert asyncio.run(main()) == 1
    assert [p.payment_id for p in seen] == [uuid.UUID(int=2)]


def test_plain_body_turns_typed_bodies_into_json_values() -> None:
    order = OrderCreated(
        order_id=uuid.UUID(int=7),
        total=decimal.Decimal("19.90"),
        currency=Currency.USD,
        lines=[Line("A-1", 2)],
        placed_at=dt.datetime(2026, 11, 26, 10, tzinfo=dt.UTC),
        tags=("gift",),
    )
    plain = plain_body(order)
    assert plain == {
        "order_id": "00000000-0000-0000-0000-000000000007",
        "total": "19.90",
        "currency": "USD",
        "lines": [{"sku": "A-1", "quantity": 2}],
        "placed_at": "2026-11-26T10:00:00+00:00",
        "note": None,
        "channel": "web",
        "tags": ["gift"],
    }
    json.dumps(plain)  # JSON values only
    payment = PaymentTaken(payment_id=uuid.UUID(int=1), amount=3, card="c")
    assert plain_body(payment) == {"payment_id": str(uuid.UUID(int=1)), "amount": 3, "card": "c"}
    assert plain_body({"as": "is"}) == {"as": "is"}
    assert plain_body(OrderCreated) is OrderCreated  # a class is not a body to convert


def test_the_policy_dead_letters_an_invalid_body_at_once() -> None:
    error = InvalidBody("orders.typed", uuid.UUID(int=3), "OrderCreated", "total: field required")
    decision = decide(error, 0, RetryPolicy())
    assert decision == DeadLetter(DeadLetterReason.INVALID_BODY, str(error))
    assert DeadLetterReason.INVALID_BODY == "invalid-body"


def test_the_worker_dead_letters_an_invalid_body_at_once_with_its_reason(
    pg_db: Database, rabbit: Rabbit
) -> None:
    queue = rabbit.queue()
    inbox = Inbox(pg_db.sessions)
    runs: list[str] = []

    @inbox.handler("order.created", body=OrderCreated, name="orders.typed")
    def typed(message: Message[OrderCreated], session: Session) -> None:
        runs.append(message.body.lines[0].sku)

    worker = Worker(inbox, rabbit.url, [queue], retry=RetryPolicy((0.2,), max_tries=3))
    worker.prepare()
    with Publisher(rabbit.url, routing_key=queue) as publisher:
        publisher.publish("order.created", order_body())
        bad_id = publisher.publish("order.created", order_body(total=SECRET, lines=[{}]))
    run_until_idle(worker, 1.0)

    assert runs == ["A-1"]
    assert worker.stats.dead_letter_reasons == Counter({"invalid-body": 1})
    assert worker.stats.failed_tries == 0  # dead-lettered at once, never retried
    assert claims(pg_db) == 1
    [dead] = rabbit.take_all(f"{queue}.dlq")
    assert dead.properties["message_id"] == str(bad_id)
    assert dead.headers[h.REASON] == "invalid-body"
    assert h.TRIES not in dead.headers
    error = dead.headers[h.ERROR]
    assert error == (
        f"message {bad_id}: body is not a valid OrderCreated for handler 'orders.typed': "
        "total: expected Decimal as a string, got str; lines[0].sku: field required; "
        "lines[0].quantity: field required"
    )
    assert SECRET not in error


def test_the_in_memory_worker_dead_letters_an_invalid_body_too(db: Database) -> None:
    queue = f"typed-{uuid.uuid4().hex[:8]}"
    inbox = Inbox(db.sessions)
    inbox.handler("order.created", body=OrderCreated, name="typed")(lambda m, s: None)
    worker = Worker(inbox, "memory://", [queue])
    worker.prepare()
    with Publisher("memory://", routing_key=queue) as publisher:
        publisher.publish("order.created", {"total": "1"})
    run_until_idle(worker, 0.5)

    assert worker.stats.dead_letter_reasons == Counter({"invalid-body": 1})
    with Connection("memory://") as connection:
        dead = connection.SimpleQueue(f"{queue}.dlq").get(timeout=1)
        assert dead.headers[h.REASON] == "invalid-body"


def test_mypy_sees_the_body_type(tmp_path: Path) -> None:
    sample = tmp_path / "typed_sample.py"
    sample.write_text(
        textwrap.dedent(
            """
            from dataclasses import dataclass
            from sqlalchemy.orm import Session, sessionmaker
            from inbox import Inbox, Message

            @dataclass
            class OrderCreated:
                order_id: str

            inbox = Inbox(sessionmaker())

            @inbox.handler("order.created", body=OrderCreated, key=lambda m: m.body.order_id)
            def on_order(message: Message[OrderCreated], session: Session) -> None:
                reveal_type(message.body)

            @inbox.handler("order.created", body=OrderCreated, name="wrong")
            def wrong(message: Message[int], session: Session) -> None: ...

            @inbox.handler("other")
            def untyped(message: Message, session: Session) -> None: ...
            """
        )
    )
    out, _, status = mypy_api.run(["--strict", "--no-error-summary", str(sample)])

    lines = [line.split(":", 2)[2].strip() for line in out.splitlines()]
    assert status == 1
    assert lines[0] == 'note: Revealed type is "typed_sample.OrderCreated"'
    assert lines[1].startswith('error: Argument 1 has incompatible type "Callable[[Message[int]')
    assert len(lines) == 2  # bare Message is Message[Any]: no missing-type-parameter error


def test_the_publisher_sends_a_typed_body_that_a_typed_handler_takes_back(db: Database) -> None:
    queue = f"typed-{uuid.uuid4().hex[:8]}"
    inbox = Inbox(db.sessions)
    seen: list[OrderCreated] = []
    inbox.handler("order.created", body=OrderCreated, name="typed")(
        lambda m, s: seen.append(m.body)
    )
    sent = OrderCreated(
        order_id=uuid.UUID(int=9),
        total=decimal.Decimal("0.10"),
        currency=Currency.USD,
        lines=[Line("Z", 1)],
        placed_at=dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC),
        tags=("a", "b"),
    )
    worker = Worker(inbox, "memory://", [queue])
    worker.prepare()
    with Publisher("memory://", routing_key=queue) as publisher:
        publisher.publish("order.created", sent)
    run_until_idle(worker, 0.5)

    assert seen == [sent]


def test_the_outbox_stores_a_typed_body_as_its_json_values(db: Database) -> None:
    payment = PaymentTaken(payment_id=uuid.UUID(int=4), amount=3, card="c")
    with db.sessions() as session, session.begin():
        Outbox().publish(session, "payment.taken", payment, routing_key="payments")
    with db.engine.connect() as connection:
        [(body, content_type)] = connection.execute(
            select(outbox_message.c.body, outbox_message.c.content_type)
        ).all()
    assert content_type == "application/json"
    assert json.loads(body) == {"payment_id": str(uuid.UUID(int=4)), "amount": 3, "card": "c"}
