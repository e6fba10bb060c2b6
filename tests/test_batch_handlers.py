"""Batch handlers (``@inbox.batch_handler``) on SQLite, PostgreSQL and MariaDB: one call per
batch transaction with the messages whose claims the batch won, each message still claimed
on its own, duplicates never passed on, a failing batch bisected down to the poison message,
``process()`` with a one-element list, typed bodies checked per message, and concurrent
batches on PostgreSQL that apply every message exactly once."""

from __future__ import annotations

import random
import threading
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import pytest
from sqlalchemy import event, insert, select
from sqlalchemy.orm import Session
from support.databases import Database, effects
from support.effects import order

from inbox import (
    EffectError,
    HandlerFailed,
    Inbox,
    InvalidBody,
    Message,
    Outcome,
    ProcessResult,
    RegistrationError,
)
from inbox.message import key_bytes
from inbox.schema import inbox_message

P = Outcome.PROCESSED
D = Outcome.DUPLICATE
NAME = "orders.bulk"


def ref_of(message: Message) -> str:
    assert isinstance(message.body, dict)
    return str(message.body["ref"])


class Bulk:
    """A batch handler that writes one effect row per message with ONE executemany, logs
    the refs of every call, and raises after writing when ``poison`` is among them."""

    def __init__(
        self,
        inbox: Inbox,
        *,
        poison: str | None = None,
        name: str = NAME,
        key: Callable[[Message], str] | None = None,
    ) -> None:
        self.calls: list[list[str]] = []
        self.poison = poison
        inbox.batch_handler("order.created", name=name, key=key)(self)

    def __call__(self, messages: list[Message], session: Session) -> None:
        refs = [ref_of(m) for m in messages]
        self.calls.append(refs)
        session.execute(insert(effects), [{"ref": ref, "handler": NAME} for ref in refs])
        if self.poison in refs:
            raise RuntimeError(f"poison {self.poison}")


def outcomes(results: Sequence[object]) -> list[object]:
    return [r.outcomes[NAME] if isinstance(r, ProcessResult) else type(r) for r in results]


def claims(db: Database) -> set[tuple[bytes, str]]:
    """(16-byte claim key, handler) of every committed claim."""
    with db.engine.connect() as connection:
        rows = connection.execute(select(inbox_message.c.message_id, inbox_message.c.handler))
        return {(key.bytes, handler) for key, handler in rows}


def test_the_handler_gets_the_messages_its_batch_won_once_in_one_call(db: Database) -> None:
    inbox = Inbox(db.sessions)
    bulk = Bulk(inbox)
    earlier = order("r0")
    assert inbox.process(earlier).outcomes == {NAME: P}
    batch = [order(f"r{i}") for i in range(1, 6)]
    # The same id twice in the batch, and one processed before: neither reaches the handler.
    results = inbox.process_batch([batch[0], earlier, *batch, batch[3]])
    assert outcomes(results) == [P, D, D, P, P, P, P, D]
    assert bulk.calls == [["r0"], ["r1", "r2", "r3", "r4", "r5"]]
    assert db.effect_counts() == {(f"r{i}", NAME): 1 for i in range(6)}
    # Each message has its own claim row under the handler's name.
    assert claims(db) == {(m.id.bytes, NAME) for m in [earlier, *batch]}
    # Delivered again, all duplicates: no call at all.
    assert outcomes(inbox.process_batch(batch)) == [D] * 5
    assert len(bulk.calls) == 2


def test_process_calls_it_with_a_one_element_list(db: Database) -> None:
    inbox = Inbox(db.sessions)
    seen: list[list[Message]] = []

    @inbox.batch_handler("order.created", name=NAME)
    def bulk(messages: list[Message], session: Session) -> None:
        seen.append(messages)
        session.execute(insert(effects), [{"ref": ref_of(m), "handler": NAME} for m in messages])

    message = order("solo")
    assert inbox.process(message).outcomes == {NAME: P}
    assert inbox.process(message).outcomes == {NAME: D}
    assert seen == [[message]]
    assert db.effect_counts() == {("solo", NAME): 1}


def test_a_failing_batch_is_bisected_down_to_the_poison_message(db: Database) -> None:
    inbox = Inbox(db.sessions)
    bulk = Bulk(inbox, poison="r5")
    batch = [order(f"r{i}") for i in range(8)]
    results = inbox.process_batch(batch)
    assert outcomes(results) == [P, P, P, P, P, HandlerFailed, P, P]
    failed = results[5]
    assert isinstance(failed, HandlerFailed)
    assert set(failed.failures) == {NAME}
    assert str(failed.failures[NAME]) == "poison r5"
    # Whole batch, halves, quarters, then the poison alone (through process()).
    assert bulk.calls[0] == [f"r{i}" for i in range(8)]
    assert ["r5"] in bulk.calls
    assert ["r4"] in bulk.calls or ["r4", "r5"] in bulk.calls
    # The rolled-back runs left nothing behind: each healthy message once, the poison never.
    healthy = {(f"r{i}", NAME): 1 for i in range(8) if i != 5}
    assert db.effect_counts() == healthy
    assert (batch[5].id.bytes, NAME) not in claims(db)
    # Redelivered with the poison fixed, only the poison runs.
    bulk.poison = None
    assert outcomes(inbox.process_batch(batch)) == [D] * 5 + [P] + [D] * 2
    assert bulk.calls[-1] == ["r5"]


def test_per_message_handlers_run_first_then_each_batch_handler_once(db: Database) -> None:
    inbox = Inbox(db.sessions)
    order_of_calls: list[str] = []

    @inbox.batch_handler("order.created", name="bulk.first")
    def first(messages: list[Message], session: Session) -> None:
        order_of_calls.append("bulk.first:" + ",".join(ref_of(m) for m in messages))

    @inbox.handler("order.created", name="single")
    def single(message: Message, session: Session) -> None:
        order_of_calls.append("single:" + ref_of(message))

    @inbox.batch_handler(name="bulk.all")
    def every(messages: list[Message], session: Session) -> None:
        order_of_calls.append("bulk.all:" + ",".join(ref_of(m) for m in messages))

    batch = [order("a"), order("b", "order.shipped"), order("c")]
    results = inbox.process_batch(batch)
    assert [r.outcomes if isinstance(r, ProcessResult) else r for r in results] == [
        {"bulk.first": P, "single": P, "bulk.all": P},
        {"bulk.all": P},
        {"bulk.first": P, "single": P, "bulk.all": P},
    ]
    assert order_of_calls == ["single:a", "single:c", "bulk.first:a,c", "bulk.all:a,b,c"]


def test_key_and_name_are_those_of_per_message_handlers(db: Database) -> None:
    inbox = Inbox(db.sessions)
    bulk = Bulk(inbox, name="billing.bulk", key=lambda m: f"invoice-{m.body['order']}")
    batch = [
        Message.new("order.created", {"ref": "x1", "order": 1}),
        Message.new("order.created", {"ref": "x2", "order": 2}),
        Message.new("order.created", {"ref": "x3", "order": 1}),  # the same business key
    ]
    results = inbox.process_batch(batch)
    assert [r.outcomes for r in results if isinstance(r, ProcessResult)] == [
        {"billing.bulk": P},
        {"billing.bulk": P},
        {"billing.bulk": D},
    ]
    assert bulk.calls == [["x1", "x2"]]
    assert claims(db) == {
        (key_bytes("invoice-1"), "billing.bulk"),
        (key_bytes("invoice-2"), "billing.bulk"),
    }


@dataclass(frozen=True)
class Placed:
    ref: str
    amount: int


def test_typed_bodies_are_validated_per_message_and_passed_typed(db: Database) -> None:
    inbox = Inbox(db.sessions)
    got: list[list[Placed]] = []

    @inbox.batch_handler("order.created", name=NAME, body=Placed)
    def bulk(messages: list[Message[Placed]], session: Session) -> None:
        got.append([m.body for m in messages])
        rows = [{"ref": m.body.ref, "handler": NAME} for m in messages]
        session.execute(insert(effects), rows)

    good = [Message.new("order.created", {"ref": f"t{i}", "amount": i}) for i in range(3)]
    bad = Message.new("order.created", {"ref": "t-bad", "amount": "lots"})
    results = inbox.process_batch([good[0], bad, good[1], good[2]])
    assert isinstance(results[1], InvalidBody)
    assert [r.outcomes for r in results if isinstance(r, ProcessResult)] == [{NAME: P}] * 3
    assert got == [[Placed("t0", 0), Placed("t1", 1), Placed("t2", 2)]]
    assert inbox.process(Message.new("order.created", {"ref": "t9", "amount": 9})).outcomes == {
        NAME: P
    }
    assert got[-1] == [Placed("t9", 9)]
    with pytest.raises(InvalidBody):
        inbox.process(bad)
    assert db.effect_counts() == {(f"t{i}", NAME): 1 for i in (0, 1, 2, 9)}


def test_the_batch_handlers_rows_go_in_one_statement(db: Database) -> None:
    inbox = Inbox(db.sessions)
    Bulk(inbox)
    statements: list[tuple[str, bool]] = []

    def record(
        _conn: Any, _cursor: Any, statement: str, _params: Any, _ctx: Any, many: bool
    ) -> None:
        if "effects" in statement:
            statements.append((statement, many))

    event.listen(db.engine, "before_cursor_execute", record)
    try:
        results = inbox.process_batch([order(f"m{i}") for i in range(20)])
    finally:
        event.remove(db.engine, "before_cursor_execute", record)
    assert outcomes(results) == [P] * 20
    # SQLAlchemy sends the list as one executemany, or one multi-row INSERT (insertmanyvalues).
    assert len(statements) == 1, statements
    assert db.effect_counts() == {(f"m{i}", NAME): 1 for i in range(20)}


def test_refusals_async_functions_middleware_and_effects(db: Database) -> None:
    inbox = Inbox(db.sessions)

    async def coroutine(messages: list[Message], session: Session) -> None: ...

    with pytest.raises(RegistrationError, match="coroutine function"):
        inbox.batch_handler("order.created", name="a")(coroutine)

    def layer(message: Message, session: Session, call_next: Callable[[Message], object]) -> object:
        return call_next(message)

    with pytest.raises(RegistrationError, match="middleware= wraps one message"):
        Inbox(db.sessions, middleware=[layer]).batch_handler("order.created", name="b")(
            lambda messages, session: None
        )
    with pytest.raises(RegistrationError, match="has no stable name"):
        inbox.batch_handler("order.created")(lambda messages, session: None)

    @inbox.batch_handler("order.created", name="c")
    def with_effect(messages: list[Message], session: Session) -> None:
        inbox.effect("sms", lambda key: None)

    for run in (inbox.process, lambda m: inbox.process_batch([m, order("y")])[0]):
        message = order("x")
        try:
            outcome = run(message)
        except HandlerFailed as exc:
            outcome = exc
        assert isinstance(outcome, HandlerFailed)
        assert isinstance(outcome.failures["c"], EffectError)
        assert "batch handler has no single claim key" in str(outcome.failures["c"])


def test_concurrent_batches_apply_every_message_exactly_once(pg_db: Database) -> None:
    inbox = Inbox(pg_db.sessions)
    calls: list[int] = []
    lock = threading.Lock()

    @inbox.batch_handler("order.created", name=NAME)
    def bulk(messages: list[Message], session: Session) -> None:
        with lock:
            calls.append(len(messages))
        session.execute(insert(effects), [{"ref": ref_of(m), "handler": NAME} for m in messages])

    messages = [order(f"c{i}") for i in range(200)]
    # Four workers, each with every message in its own shuffled batches of 25: every message
    # is delivered four times, concurrently, and its claim decides which batch applies it.
    plans = []
    for seed in range(4):
        shuffled = messages[:]
        random.Random(seed).shuffle(shuffled)
        plans.append([shuffled[i : i + 25] for i in range(0, len(shuffled), 25)])
    barrier = threading.Barrier(4)

    def work(batches: list[list[Message]]) -> list[object]:
        barrier.wait()
        return [r for batch in batches for r in outcomes(inbox.process_batch(batch))]

    with ThreadPoolExecutor(4) as pool:
        seen = [o for done in pool.map(work, plans) for o in done]
    assert seen.count(P) == 200
    assert seen.count(D) == 600
    assert sum(calls) == 200
    assert pg_db.effect_counts() == {(f"c{i}", NAME): 1 for i in range(200)}
    assert len(claims(pg_db)) == 200


def test_many_handlers_many_types_in_one_batch_on_every_backend(db: Database) -> None:
    inbox = Inbox(db.sessions)
    Bulk(inbox)
    other: list[list[str]] = []

    @inbox.batch_handler(
        "order.shipped", name="ship.bulk", key=lambda m: uuid.uuid5(uuid.NAMESPACE_URL, ref_of(m))
    )
    def ship(messages: list[Message], session: Session) -> None:
        other.append([ref_of(m) for m in messages])
        session.execute(
            insert(effects), [{"ref": ref_of(m), "handler": "ship.bulk"} for m in messages]
        )

    batch = [order("o1"), order("s1", "order.shipped"), order("o2"), order("s1", "order.shipped")]
    results = inbox.process_batch(batch)
    assert [r.outcomes for r in results if isinstance(r, ProcessResult)] == [
        {NAME: P},
        {"ship.bulk": P},
        {NAME: P},
        {"ship.bulk": D},
    ]
    assert other == [["s1"]]
    assert db.effect_counts() == {("o1", NAME): 1, ("o2", NAME): 1, ("s1", "ship.bulk"): 1}
