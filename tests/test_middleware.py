"""The middleware chain and the delivery hooks of the blocking Inbox, on every backend: the
order of the layers, middleware inside the handler's transaction (a raise rolls the claim
back, the guards hold, a duplicate never reaches it, inbox.effect works), hooks before any
claim, and the two shipped middlewares."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import insert
from sqlalchemy.orm import Session
from support.databases import Database, effects
from support.ledger import Provider, effect_store, records, store_of

from inbox import (
    HandlerFailed,
    Inbox,
    Message,
    Outcome,
    ProcessResult,
    RegistrationError,
    SessionConfigurationError,
    TransactionControlError,
)
from inbox.middleware import LogContextFilter, Timing, current_handler, log_context

Next = Callable[[Message], object]


def write(session: Session, ref: str, handler: str) -> None:
    session.execute(insert(effects).values(ref=ref, handler=handler))


def tracing(events: list[str], name: str) -> Callable[[Message, Session, Next], object]:
    def middleware(message: Message, session: Session, call_next: Next) -> object:
        events.append(f"{name} in {current_handler()}")
        returned = call_next(message)
        events.append(f"{name} out")
        return returned

    return middleware


def test_layers_run_in_order_hooks_before_the_claim_and_after_the_result(db: Database) -> None:
    events: list[str] = []

    def hook(message: Message, call_next: Callable[[Message], ProcessResult]) -> ProcessResult:
        events.append(f"hook in, claims={db.count(inbox.table)}")
        result = call_next(message)
        events.append(f"hook out {result.outcome.value}, claims={db.count(inbox.table)}")
        return result

    inbox = Inbox(
        db.sessions,
        middleware=[tracing(events, "first"), tracing(events, "second")],
        around_delivery=[hook],
    )

    @inbox.handler("order.created", name="orders")
    def handle(message: Message, session: Session) -> None:
        events.append("handler")
        write(session, "o-1", "orders")

    message = Message.new("order.created", {})
    assert inbox.process(message).outcome is Outcome.PROCESSED
    assert events == [
        "hook in, claims=0",
        "first in orders",
        "second in orders",
        "handler",
        "second out",
        "first out",
        "hook out processed, claims=1",
    ]
    events.clear()
    # A duplicate goes through the hook (before any claim) but never reaches the middleware.
    assert inbox.process(message).outcome is Outcome.DUPLICATE
    assert events == ["hook in, claims=1", "hook out duplicate, claims=1"]
    assert db.effect_counts() == {("o-1", "orders"): 1}


def test_a_middleware_that_raises_rolls_back_the_claim_and_the_writes(db: Database) -> None:
    fail = [True]

    def audit(message: Message, session: Session, call_next: Next) -> object:
        write(session, "audit", "audit")
        returned = call_next(message)
        if fail[0]:
            raise RuntimeError("audit refused")
        return returned

    inbox = Inbox(db.sessions, middleware=[audit])

    @inbox.handler(name="orders")
    def handle(message: Message, session: Session) -> None:
        write(session, "o-1", "orders")

    message = Message.new("order.created", {})
    with pytest.raises(HandlerFailed) as failed:
        inbox.process(message)
    assert isinstance(failed.value.failures["orders"], RuntimeError)
    assert db.count(inbox.table) == 0
    assert db.effect_counts() == {}
    fail[0] = False
    assert inbox.process(message).outcome is Outcome.PROCESSED  # the claim was released
    assert db.effect_counts() == {("audit", "audit"): 1, ("o-1", "orders"): 1}


def test_a_middleware_may_stop_the_chain_before_the_handler(db: Database) -> None:
    ran: list[str] = []

    def refuse(message: Message, session: Session, call_next: Next) -> object:
        raise PermissionError("tenant suspended")

    inbox = Inbox(db.sessions, middleware=[refuse])

    @inbox.handler(name="orders")
    def handle(message: Message, session: Session) -> None:
        ran.append("handler")

    with pytest.raises(HandlerFailed):
        inbox.process(Message.new("order.created", {}))
    assert ran == []
    assert db.count(inbox.table) == 0


@pytest.mark.parametrize("method", ["commit", "rollback", "close"])
def test_the_guards_hold_inside_middleware(db: Database, method: str) -> None:
    def sneaky(message: Message, session: Session, call_next: Next) -> object:
        returned = call_next(message)
        getattr(session, method)()
        return returned

    inbox = Inbox(db.sessions, middleware=[sneaky])

    @inbox.handler(name="orders")
    def handle(message: Message, session: Session) -> None:
        write(session, "o-1", "orders")

    with pytest.raises(HandlerFailed) as failed:
        inbox.process(Message.new("order.created", {}))
    assert isinstance(failed.value.failures["orders"], TransactionControlError)
    assert db.effect_counts() == {}
    assert db.count(inbox.table) == 0


def test_effects_work_in_a_wrapped_handler_and_in_middleware(db: Database, tmp_path: Path) -> None:
    provider = Provider(failures=0)
    store = effect_store(db, tmp_path)
    fail_after = [True]

    def notify(message: Message, session: Session, call_next: Next) -> object:
        returned = call_next(message)
        inbox.effect("notify", lambda key: provider.send(key, "notified"))
        return returned

    inbox = Inbox(db.sessions, middleware=[notify], effect_store=store)

    @inbox.handler(name="payments")
    def pay(message: Message, session: Session) -> None:
        inbox.effect("charge", lambda key: provider.send(key, "charged"))
        write(session, "p-1", "payments")
        if fail_after[0]:
            fail_after[0] = False
            raise RuntimeError("the database write failed after the charge")

    message = Message.new("payment.requested", {})
    with pytest.raises(HandlerFailed):
        inbox.process(message)
    assert inbox.process(message).outcome is Outcome.PROCESSED
    assert inbox.process(message).outcome is Outcome.DUPLICATE
    # The charge ran once across both attempts; the notification once, on the second.
    assert sorted(provider.per_key().values()) == [1, 1]
    steps = [(r["step"], r["status"]) for r in records(store_of(db, store))]
    assert steps == [("charge", "done"), ("notify", "done")]
    assert db.effect_counts() == {("p-1", "payments"): 1}


def test_the_shipped_log_context_and_timing(db: Database, caplog: pytest.LogCaptureFixture) -> None:
    timings: list[tuple[str, float, str | None]] = []

    def report(handler: str, message: Message, seconds: float, error: BaseException | None) -> None:
        timings.append((handler, seconds, None if error is None else type(error).__name__))

    inbox = Inbox(db.sessions, middleware=[Timing(report)], around_delivery=[log_context])
    log = logging.getLogger("tests.orders")

    @inbox.handler("order.created", name="orders")
    def handle(message: Message, session: Session) -> None:
        log.info("handling")
        if message.body.get("fail"):
            raise ValueError("bad order")

    stamp = LogContextFilter()
    caplog.handler.addFilter(stamp)
    try:
        with caplog.at_level(logging.INFO):
            message = Message.new("order.created", {})
            inbox.process(message)
            inbox.process(message)  # a duplicate: logged by the inbox outside any handler
            with pytest.raises(HandlerFailed):
                inbox.process(Message.new("order.created", {"fail": True}))
    finally:
        caplog.handler.removeFilter(stamp)
    logged: Any = [r for r in caplog.records if r.name == "tests.orders"]
    assert next((r.inbox_message_id, r.inbox_message_type, r.inbox_handler) for r in logged) == (
        str(message.id),
        "order.created",
        "orders",
    )
    duplicate: Any = next(r for r in caplog.records if "duplicate skipped" in r.getMessage())
    assert (duplicate.inbox_message_id, duplicate.inbox_handler) == (str(message.id), None)
    assert [(handler, error) for handler, _, error in timings] == [
        ("orders", None),
        ("orders", "ValueError"),
    ]
    assert all(seconds >= 0 for _, seconds, _ in timings)
    outside: Any = logging.LogRecord("x", logging.INFO, __file__, 1, "outside", None, None)
    stamp.filter(outside)
    assert (outside.inbox_message_id, outside.inbox_handler) == (None, None)


def test_timing_logs_by_default(db: Database, caplog: pytest.LogCaptureFixture) -> None:
    inbox = Inbox(db.sessions, middleware=[Timing()])
    inbox.handler(name="orders")(lambda message, session: None)
    message = Message.new("order.created", {})
    with caplog.at_level(logging.INFO, logger="inbox.timing"):
        inbox.process(message)
    line = next(r.getMessage() for r in caplog.records if r.name == "inbox.timing")
    assert line.startswith("handler orders ran in ")
    assert line.endswith(f"on message {message.id}")


def test_batches_with_hooks_run_one_process_after_another(db: Database) -> None:
    seen: list[str] = []

    def hook(message: Message, call_next: Callable[[Message], ProcessResult]) -> ProcessResult:
        seen.append(str(message.body["n"]))
        return call_next(message)

    inbox = Inbox(db.sessions, around_delivery=[hook])

    @inbox.handler(name="orders")
    def handle(message: Message, session: Session) -> None:
        if message.body["n"] == 2:
            raise RuntimeError("two fails")
        write(session, str(message.body["n"]), "orders")

    batch = [Message.new("order.created", {"n": n}) for n in (1, 2, 3)]
    results = inbox.process_batch(batch)
    assert seen == ["1", "2", "3"]
    assert isinstance(results[0], ProcessResult)
    assert isinstance(results[2], ProcessResult)
    assert isinstance(results[1], HandlerFailed)
    assert db.effect_counts() == {("1", "orders"): 1, ("3", "orders"): 1}


def test_bad_layers_are_refused_clearly(db: Database) -> None:
    async def async_middleware(message: Message, session: Session, call_next: Next) -> None:
        return None

    with pytest.raises(RegistrationError, match="coroutine function"):
        Inbox(db.sessions, middleware=[async_middleware])
    with pytest.raises(TypeError, match="middleware items must be callable"):
        Inbox(db.sessions, middleware=["logging"])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="around_delivery must be a list"):
        Inbox(db.sessions, around_delivery=log_context)  # type: ignore[arg-type]

    def forgetful(message: Message, call_next: Callable[[Message], ProcessResult]) -> Any:
        call_next(message)

    inbox = Inbox(db.sessions, around_delivery=[forgetful])
    inbox.handler(name="orders")(lambda message, session: None)
    with pytest.raises(TypeError, match="returned NoneType"):
        inbox.process(Message.new("order.created", {}))


def test_middleware_wraps_each_handler_run_of_a_batch(db: Database) -> None:
    events: list[str] = []
    inbox = Inbox(db.sessions, middleware=[tracing(events, "mw")])

    @inbox.handler(name="orders")
    def handle(message: Message, session: Session) -> None:
        write(session, str(message.body["n"]), "orders")

    batch = [Message.new("order.created", {"n": n}) for n in (1, 2)]
    assert all(isinstance(r, ProcessResult) for r in inbox.process_batch(batch))
    assert inbox.process_batch(batch)[0].outcome is Outcome.DUPLICATE  # type: ignore[union-attr]
    assert events == ["mw in orders", "mw out"] * 2
    assert db.effect_counts() == {("1", "orders"): 1, ("2", "orders"): 1}


def test_assert_idempotent_runs_through_the_middleware(db: Database) -> None:
    from inbox.testing import NotIdempotent, assert_idempotent

    counter = [0]

    def audit(message: Message, session: Session, call_next: Next) -> object:
        returned = call_next(message)
        counter[0] += 1  # outside the transaction: the helper must see through it
        write(session, f"audit-{counter[0]}", "audit")
        return returned

    inbox = Inbox(db.sessions, middleware=[audit])
    inbox.handler(name="orders")(lambda message, session: write(session, "o-1", "orders"))
    with pytest.raises(NotIdempotent):
        assert_idempotent(inbox, Message.new("order.created", {}), tables=[effects])


def test_a_busy_session_from_sessions_for_is_refused_before_any_claim(db: Database) -> None:
    busy = db.sessions()
    busy.begin()
    inbox = Inbox(sessions_for=lambda message: busy)
    inbox.handler(name="orders")(lambda message, session: None)
    try:
        with pytest.raises(SessionConfigurationError, match="already in a transaction"):
            inbox.process(Message.new("order.created", {}))
    finally:
        busy.close()
    assert db.count(inbox.table) == 0
