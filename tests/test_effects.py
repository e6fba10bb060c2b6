"""Inbox.effect on SQLite (with a store of its own), PostgreSQL and MariaDB: the call is made
once per (claim, handler, step), its record survives the handler's rollback, later attempts
get the stored result, and each mode resolves an unfinished effect as documented."""

from __future__ import annotations

import datetime as dt
import logging
import threading
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Column, Engine, MetaData, String, Table, create_engine, insert, text
from sqlalchemy.orm import Session, sessionmaker
from support.databases import Database, effects
from support.effects import order
from support.ledger import Provider, effect_store, records, store_of

from inbox import (
    KEY_NAMESPACE,
    EffectError,
    EffectMode,
    HandlerFailed,
    HandlerInterrupted,
    Inbox,
    Message,
    Outcome,
    UncertainEffect,
    UnsupportedDialect,
)
from inbox.schema import effect_table, inbox_effect, metadata


class Setup:
    """An inbox on a fresh database with its effect store, and a fake provider."""

    def __init__(self, db: Database, tmp_path: Path, **options: Any) -> None:
        self.db = db
        self.store = effect_store(db, tmp_path)
        self.inbox = Inbox(db.sessions, effect_store=self.store, **options)
        self.provider = Provider()

    def records(self) -> list[dict[str, Any]]:
        return records(store_of(self.db, self.store))

    def close(self) -> None:
        if self.store is not None:
            self.store.dispose()


@pytest.fixture
def setup(db: Database, tmp_path: Path) -> Iterator[Setup]:
    made = Setup(db, tmp_path)
    yield made
    made.close()


def deliver(inbox: Inbox, message: Message) -> HandlerFailed | Outcome:
    """Process ``message``: the handler's outcome, or the HandlerFailed it raised."""
    try:
        result = inbox.process(message)
    except HandlerFailed as failed:
        return failed
    return result.outcome


def sms_handler(setup: Setup, *, fail_after: int = 0, mode: str = "at-least-once") -> list[Any]:
    """Register ``sms.send``: the SMS through the provider, then the delivery row, then a
    failure on the first ``fail_after`` attempts. Returns the receipts each attempt saw."""
    seen: list[Any] = []
    failing = [fail_after]

    @setup.inbox.handler("sms.requested", name="sms.send")
    def send_sms(message: Message, session: Session) -> None:
        receipt = setup.inbox.effect("provider.send", setup.provider.send, mode=mode)
        seen.append(receipt)
        session.execute(insert(effects).values(ref=receipt["id"], handler="sms.send"))
        if failing[0] > 0:
            failing[0] -= 1
            raise TimeoutError("publishing the follow-up timed out")

    return seen


def expected_key(message: Message, handler: str, step: str) -> uuid.UUID:
    return uuid.uuid5(KEY_NAMESPACE, f"{message.id.bytes.hex()}:{handler}:{step}")


def test_the_timeline_sms_sent_once_delivery_row_once_stored_result_on_the_retry(
    setup: Setup,
) -> None:
    seen = sms_handler(setup, fail_after=2)
    message = order("m1", "sms.requested")
    assert isinstance(deliver(setup.inbox, message), HandlerFailed)
    assert isinstance(deliver(setup.inbox, message), HandlerFailed)
    assert deliver(setup.inbox, message) is Outcome.PROCESSED
    assert deliver(setup.inbox, message) is Outcome.DUPLICATE

    key = expected_key(message, "sms.send", "provider.send")
    assert setup.provider.calls == [key]
    assert seen == [seen[0]] * 3  # the same receipt on every attempt, as stored
    assert seen[0] == {"id": "sms-1", "key": str(key), "text": "hello"}
    assert setup.db.effect_counts() == {("sms-1", "sms.send"): 1}
    [record] = setup.records()
    assert (record["status"], record["attempts"]) == ("done", 1)
    assert record["effect_key"] == key
    assert record["claim_key"] == message.id
    assert (record["handler"], record["step"]) == ("sms.send", "provider.send")


def test_a_failure_before_the_effect_leaves_no_record_and_the_retry_calls_once(
    setup: Setup,
) -> None:
    failing = [1]

    @setup.inbox.handler("sms.requested", name="sms.send")
    def send_sms(message: Message, session: Session) -> None:
        if failing[0]:
            failing[0] -= 1
            raise RuntimeError("failed before the SMS")
        setup.inbox.effect("provider.send", setup.provider.send)

    message = order("m1", "sms.requested")
    assert isinstance(deliver(setup.inbox, message), HandlerFailed)
    assert setup.provider.calls == []
    assert setup.records() == []
    assert deliver(setup.inbox, message) is Outcome.PROCESSED
    assert len(setup.provider.calls) == 1


def test_two_handlers_with_two_steps_each_have_independent_keys_and_records(
    setup: Setup,
) -> None:
    keys: dict[tuple[str, str], uuid.UUID] = {}

    def make(name: str) -> None:
        @setup.inbox.handler("sms.requested", name=name)
        def handle(message: Message, session: Session) -> None:
            for step in ("first", "second"):
                setup.inbox.effect(step, lambda key, s=step: str(keys.setdefault((name, s), key)))

    make("a.handler")
    make("b.handler")
    message = order("m1", "sms.requested")
    setup.inbox.process(message)
    assert len(set(keys.values())) == 4
    for (handler, step), key in keys.items():
        assert key == expected_key(message, handler, step)
    stored = {(r["handler"], r["step"]): r for r in setup.records()}
    assert set(stored) == set(keys)
    assert all(r["status"] == "done" and r["attempts"] == 1 for r in stored.values())


def test_a_resend_under_a_new_id_with_the_same_business_key_finds_the_same_effect(
    setup: Setup,
) -> None:
    failing = [1]

    @setup.inbox.handler("sms.requested", name="sms.send", key=lambda m: m.body["ref"])
    def send_sms(message: Message, session: Session) -> None:
        setup.inbox.effect("provider.send", setup.provider.send)
        if failing[0]:
            failing[0] -= 1
            raise RuntimeError("failed after the SMS")

    assert isinstance(deliver(setup.inbox, order("order-7", "sms.requested")), HandlerFailed)
    assert deliver(setup.inbox, order("order-7", "sms.requested")) is Outcome.PROCESSED
    assert len(setup.provider.calls) == 1
    business_key = uuid.uuid5(KEY_NAMESPACE, "order-7").bytes
    [record] = setup.records()
    assert record["claim_key"].bytes == business_key


def test_at_least_once_calls_a_failed_effect_again_with_the_same_key(setup: Setup) -> None:
    setup.provider.failures = 1
    seen = sms_handler(setup)
    message = order("m1", "sms.requested")
    failed = deliver(setup.inbox, message)
    assert isinstance(failed, HandlerFailed)
    assert isinstance(failed.failures["sms.send"], TimeoutError)  # re-raised unchanged
    [record] = setup.records()
    assert (record["status"], record["attempts"]) == ("failed", 1)
    assert record["error"] == "TimeoutError: provider timed out (after receiving the request)"

    assert deliver(setup.inbox, message) is Outcome.PROCESSED
    key = expected_key(message, "sms.send", "provider.send")
    assert setup.provider.calls == [key, key]
    [record] = setup.records()
    assert (record["status"], record["attempts"]) == ("done", 2)
    assert len(seen) == 1


def test_the_retry_log_line_names_the_message_and_the_effect_key(
    setup: Setup, caplog: pytest.LogCaptureFixture
) -> None:
    """Regression (issue 32, item 12): the line said which effect of which handler was on
    its second attempt, not of which message, nor under which key the provider saw it."""
    setup.provider.failures = 1
    sms_handler(setup)
    message = order("m1", "sms.requested", **{"idempotency-key": "order-1"})
    assert isinstance(deliver(setup.inbox, message), HandlerFailed)
    with caplog.at_level(logging.INFO, logger="inbox.effects"):
        assert deliver(setup.inbox, message) is Outcome.PROCESSED
    [key] = set(setup.provider.calls)
    [line] = [r.getMessage() for r in caplog.records if r.name == "inbox.effects"]
    assert line == (
        f"effect 'provider.send' of 'sms.send': attempt 2 (message {message.id}, effect key {key})"
    )


def test_at_most_once_never_calls_a_failed_effect_again(setup: Setup) -> None:
    setup.provider.failures = 1
    sms_handler(setup, mode="at-most-once")
    message = order("m1", "sms.requested")
    assert isinstance(deliver(setup.inbox, message), HandlerFailed)
    for _ in range(2):
        failed = deliver(setup.inbox, message)
        assert isinstance(failed, HandlerFailed)
        uncertain = failed.failures["sms.send"]
        assert isinstance(uncertain, UncertainEffect)
        assert (uncertain.status, uncertain.attempts, uncertain.step) == (
            "failed",
            1,
            "provider.send",
        )
        assert uncertain.effect_key == expected_key(message, "sms.send", "provider.send")
    assert len(setup.provider.calls) == 1
    [record] = setup.records()
    assert (record["status"], record["attempts"]) == ("failed", 1)


def test_at_most_once_returns_a_done_effects_stored_result(setup: Setup) -> None:
    seen = sms_handler(setup, fail_after=1, mode=EffectMode.AT_MOST_ONCE)
    message = order("m1", "sms.requested")
    assert isinstance(deliver(setup.inbox, message), HandlerFailed)
    assert deliver(setup.inbox, message) is Outcome.PROCESSED
    assert len(setup.provider.calls) == 1
    assert seen[0] == seen[1]


def test_effect_outside_a_handler_or_on_another_inbox_is_an_error(setup: Setup) -> None:
    with pytest.raises(EffectError, match="only while a handler of this inbox runs"):
        setup.inbox.effect("provider.send", setup.provider.send)
    other = Inbox(setup.db.sessions, effect_store=setup.store)
    errors: list[Exception] = []

    @setup.inbox.handler("sms.requested", name="sms.send")
    def send_sms(message: Message, session: Session) -> None:
        try:
            other.effect("provider.send", setup.provider.send)
        except EffectError as exc:
            errors.append(exc)

    setup.inbox.process(order("m1", "sms.requested"))
    assert len(errors) == 1
    assert "another inbox" in str(errors[0])
    assert setup.provider.calls == []
    assert setup.records() == []


@pytest.mark.parametrize(
    ("step", "mode", "error", "match"),
    [
        ("", "at-least-once", ValueError, "empty"),
        ("  ", "at-least-once", ValueError, "empty"),
        ("s" * 10_000_000, "at-least-once", ValueError, "10000000 characters"),
        ("s" * 256, "at-least-once", ValueError, "at most 255"),
        ("step ", "at-least-once", ValueError, "whitespace"),
        ("a\x00b", "at-least-once", ValueError, "NUL"),
        ("\ud800", "at-least-once", ValueError, "surrogate"),
        (b"step", "at-least-once", TypeError, "must be a str"),
        ("provider.send", "exactly-once", ValueError, "mode must be one of"),
        ("provider.send", None, ValueError, "mode must be one of"),
    ],
    ids=[
        "empty",
        "blank",
        "10MB",
        "256",
        "trailing-space",
        "nul",
        "surrogate",
        "bytes",
        "unknown-mode",
        "none-mode",
    ],
)
def test_bad_step_or_mode_is_refused_before_anything_is_written(
    setup: Setup, step: object, mode: object, error: type[Exception], match: str
) -> None:
    @setup.inbox.handler("sms.requested", name="sms.send")
    def send_sms(message: Message, session: Session) -> None:
        setup.inbox.effect(step, setup.provider.send, mode=mode)  # type: ignore[arg-type]

    failed = deliver(setup.inbox, order("m1", "sms.requested"))
    assert isinstance(failed, HandlerFailed)
    assert isinstance(failed.failures["sms.send"], error)
    assert match in str(failed.failures["sms.send"])
    assert setup.provider.calls == []
    assert setup.records() == []


def test_a_result_that_cannot_be_stored_fails_loudly_and_is_never_called_again(
    setup: Setup,
) -> None:
    calls: list[uuid.UUID] = []

    @setup.inbox.handler("sms.requested", name="sms.send")
    def send_sms(message: Message, session: Session) -> None:
        setup.inbox.effect("provider.send", lambda key: calls.append(key) or {"at": object()})

    message = order("m1", "sms.requested")
    failed = deliver(setup.inbox, message)
    assert isinstance(failed, HandlerFailed)
    error = failed.failures["sms.send"]
    assert isinstance(error, EffectError)
    assert "cannot be stored as JSON" in str(error)
    [record] = setup.records()
    assert (record["status"], record["result"]) == ("done", None)
    failed = deliver(setup.inbox, message)
    assert isinstance(failed, HandlerFailed)
    assert isinstance(failed.failures["sms.send"], UncertainEffect)
    assert len(calls) == 1


def test_a_nan_result_is_not_json_and_is_refused(setup: Setup) -> None:
    @setup.inbox.handler("sms.requested", name="sms.send")
    def send_sms(message: Message, session: Session) -> None:
        setup.inbox.effect("provider.send", lambda key: {"cost": float("nan")})

    failed = deliver(setup.inbox, order("m1", "sms.requested"))
    assert isinstance(failed, HandlerFailed)
    assert isinstance(failed.failures["sms.send"], EffectError)


class Stop(BaseException):
    """A BaseException that is not an Exception (a gevent timeout, say)."""


def test_a_base_exception_from_call_is_recorded_and_propagates(setup: Setup) -> None:
    def interrupted(key: uuid.UUID) -> None:
        setup.provider.send(key)
        raise Stop("stopped")

    @setup.inbox.handler("sms.requested", name="sms.send")
    def send_sms(message: Message, session: Session) -> None:
        setup.inbox.effect("provider.send", interrupted)

    failed = deliver(setup.inbox, order("m1", "sms.requested"))
    assert isinstance(failed, HandlerFailed)
    interrupt = failed.failures["sms.send"]
    assert isinstance(interrupt, HandlerInterrupted)
    assert isinstance(interrupt.interrupt, Stop)
    [record] = setup.records()
    assert (record["status"], record["error"]) == ("failed", "Stop: stopped")


def test_keyboard_interrupt_from_call_is_recorded_and_raised_as_itself(setup: Setup) -> None:
    def interrupted(key: uuid.UUID) -> None:
        raise KeyboardInterrupt

    @setup.inbox.handler("sms.requested", name="sms.send")
    def send_sms(message: Message, session: Session) -> None:
        setup.inbox.effect("provider.send", interrupted, mode="at-most-once")

    message = order("m1", "sms.requested")
    with pytest.raises(KeyboardInterrupt):
        setup.inbox.process(message)
    [record] = setup.records()
    assert (record["status"], record["error"]) == ("failed", "KeyboardInterrupt")


def test_re_entering_the_same_step_inside_its_call_is_refused(setup: Setup) -> None:
    inner: list[BaseException] = []

    def outer_call(key: uuid.UUID) -> str:
        try:
            setup.inbox.effect("provider.send", setup.provider.send)
        except EffectError as exc:
            inner.append(exc)
        setup.inbox.effect("provider.other", setup.provider.send)  # another step is fine
        return "outer"

    @setup.inbox.handler("sms.requested", name="sms.send")
    def send_sms(message: Message, session: Session) -> None:
        assert setup.inbox.effect("provider.send", outer_call) == "outer"
        # After its call the same step again returns the stored result, calls nothing.
        assert setup.inbox.effect("provider.send", outer_call) == "outer"

    assert setup.inbox.process(order("m1", "sms.requested")).outcome is Outcome.PROCESSED
    assert len(inner) == 1
    assert "entered again" in str(inner[0])
    assert len(setup.provider.calls) == 1  # provider.other only
    assert [(r["step"], r["status"]) for r in setup.records()] == [
        ("provider.other", "done"),
        ("provider.send", "done"),
    ]


def test_a_coroutine_function_call_is_refused_by_the_blocking_inbox(setup: Setup) -> None:
    async def call(key: uuid.UUID) -> None:
        return None

    @setup.inbox.handler("sms.requested", name="sms.send")
    def send_sms(message: Message, session: Session) -> None:
        setup.inbox.effect("provider.send", call)

    failed = deliver(setup.inbox, order("m1", "sms.requested"))
    assert isinstance(failed, HandlerFailed)
    assert "coroutine function" in str(failed.failures["sms.send"])
    assert setup.records() == []


def test_batches_return_stored_results_when_bisection_re_runs_a_handler(setup: Setup) -> None:
    seen: dict[str, list[Any]] = {}

    @setup.inbox.handler("sms.requested", name="sms.send")
    def send_sms(message: Message, session: Session) -> None:
        ref = message.body["ref"]
        receipt = setup.inbox.effect("provider.send", setup.provider.send)
        seen.setdefault(ref, []).append(receipt)
        session.execute(insert(effects).values(ref=ref, handler="sms.send"))
        if ref == "bad":
            raise RuntimeError("this message fails")

    messages = [order(ref, "sms.requested") for ref in ("a", "b", "bad", "c")]
    results = setup.inbox.process_batch(messages)
    assert [isinstance(r, HandlerFailed) for r in results] == [False, False, True, False]
    assert len(setup.provider.calls) == 4  # every message's SMS once, re-runs included
    assert all(len(set(map(str, receipts))) == 1 for receipts in seen.values())
    assert len(seen["a"]) > 1  # bisection did re-run it
    assert setup.db.effect_counts() == {
        ("a", "sms.send"): 1,
        ("b", "sms.send"): 1,
        ("c", "sms.send"): 1,
    }


def test_sqlite_without_an_effect_store_of_its_own_says_what_to_do(tmp_path: Path) -> None:
    engine = create_engine(f"sqlite:///{tmp_path / 'inbox.db'}")
    metadata.create_all(engine)
    sessions = sessionmaker(engine)
    inbox = Inbox(sessions)

    @inbox.handler("sms.requested", name="sms.send")
    def send_sms(message: Message, session: Session) -> None:
        inbox.effect("provider.send", lambda key: None)

    with pytest.raises(UnsupportedDialect, match="effect_store="):
        inbox.process(order("m1", "sms.requested"))
    same_file = Inbox(sessions, effect_store=create_engine(engine.url))

    @same_file.handler("sms.requested", name="sms.send")
    def send_again(message: Message, session: Session) -> None:
        same_file.effect("provider.send", lambda key: None)

    with pytest.raises(UnsupportedDialect, match="store of its own"):
        same_file.process(order("m2", "sms.requested"))


def test_effect_store_must_be_a_blocking_engine(db: Database) -> None:
    with pytest.raises(TypeError, match="effect_store must be a sqlalchemy Engine"):
        Inbox(db.sessions, effect_store="sqlite:///x.db")  # type: ignore[arg-type]


def test_an_effect_table_with_another_name(db: Database, tmp_path: Path) -> None:
    store = effect_store(db, tmp_path)
    target: Engine = db.engine if store is None else store
    table = effect_table(MetaData(), "sms_effects")
    table.create(target)
    inbox = Inbox(db.sessions, effect_store=store, effect_table="sms_effects")
    provider = Provider()

    @inbox.handler("sms.requested", name="sms.send")
    def send_sms(message: Message, session: Session) -> None:
        inbox.effect("provider.send", provider.send)

    inbox.process(order("m1", "sms.requested"))
    with target.connect() as connection:
        assert connection.execute(table.select()).one().status == "done"
    assert records(target) == []


def test_a_result_the_database_refuses_is_never_called_again(server_db: Database) -> None:
    """A result too large for the column (here a narrow one): the call was made, so the
    record becomes done without a result, and no later attempt calls again."""
    full = effect_table(MetaData(), "narrow_effects")
    narrow = Table(
        "narrow_effects",
        MetaData(),
        *(
            Column(
                c.name,
                String(10) if c.name == "result" else c.type,
                primary_key=c.primary_key,
                nullable=c.nullable,
            )
            for c in full.columns
        ),
    )
    narrow.create(server_db.engine)
    inbox = Inbox(server_db.sessions, effect_table=narrow)
    provider = Provider()

    @inbox.handler("sms.requested", name="sms.send")
    def send_sms(message: Message, session: Session) -> None:
        inbox.effect("provider.send", provider.send)

    message = order("m1", "sms.requested")
    failed = deliver(inbox, message)
    assert isinstance(failed, HandlerFailed)
    assert "refused to store its result" in str(failed.failures["sms.send"])
    again = deliver(inbox, message)
    assert isinstance(again, HandlerFailed)
    assert isinstance(again.failures["sms.send"], UncertainEffect)
    assert len(provider.calls) == 1
    with server_db.engine.connect() as connection:
        row = connection.execute(narrow.select()).one()
    assert (row.status, row.result) == ("done", None)


def v2_key(claim_key: bytes, tenant: str, handler: str, step: str) -> uuid.UUID:
    """The documented version-2 effect key (docs/effects.md), computed independently."""
    fields = (claim_key.hex(), tenant, handler, step)
    return uuid.uuid5(KEY_NAMESPACE, "v2" + "".join(f":{len(f.encode())}:{f}" for f in fields))


def colliding_handlers(setup: Setup) -> dict[str, Any]:
    """Handlers ``notify`` (step ``sms:customer``) and ``notify:sms`` (step ``customer``):
    one effect each, the result each got kept by handler name."""
    got: dict[str, Any] = {}

    def make(handler: str, step: str) -> None:
        @setup.inbox.handler("sms.requested", name=handler)
        def send(message: Message, session: Session) -> None:
            got[handler] = setup.inbox.effect(step, setup.provider.send)

    make("notify", "sms:customer")
    make("notify:sms", "customer")
    return got


def test_handler_and_step_names_with_colons_never_make_one_effect_of_two(setup: Setup) -> None:
    """Regression: the key was uuid5(f"{claim}:{handler}:{step}"), so handler 'notify' with
    step 'sms:customer' was the same effect as handler 'notify:sms' with step 'customer':
    the second was never called and got the first one's stored result."""
    got = colliding_handlers(setup)
    message = order("m1", "sms.requested")
    assert set(setup.inbox.process(message).outcomes.values()) == {Outcome.PROCESSED}

    claim = message.id.bytes
    assert sorted(setup.provider.calls) == sorted(
        [v2_key(claim, "", "notify", "sms:customer"), v2_key(claim, "", "notify:sms", "customer")]
    )
    assert got["notify"] != got["notify:sms"]
    stored = {(r["handler"], r["step"]): r["status"] for r in setup.records()}
    assert stored == {("notify", "sms:customer"): "done", ("notify:sms", "customer"): "done"}


def test_a_record_written_under_a_version_1_key_stays_valid_for_its_own_effect_only(
    setup: Setup,
) -> None:
    """Effects whose handler or step holds a ':' have a new key. A record an earlier version
    wrote for one is still found by that effect (the record's handler and step say whose it
    is), never by the other effect that shared its version-1 key."""
    got = colliding_handlers(setup)
    message = order("m1", "sms.requested")
    v1 = uuid.uuid5(KEY_NAMESPACE, f"{message.id.bytes.hex()}:notify:sms:customer")
    now = dt.datetime.now(dt.UTC)
    with store_of(setup.db, setup.store).begin() as connection:
        connection.execute(
            insert(inbox_effect).values(
                effect_key=v1,
                claim_key=message.id,
                handler="notify",
                step="sms:customer",
                status="done",
                attempts=1,
                result='{"id": "sent-before-the-upgrade"}',
                started_at=now,
                updated_at=now,
            )
        )

    setup.inbox.process(message)

    assert got["notify"] == {"id": "sent-before-the-upgrade"}  # no call: it was made
    assert setup.provider.calls == [v2_key(message.id.bytes, "", "notify:sms", "customer")]
    assert got["notify:sms"]["key"] == str(setup.provider.calls[0])
    keys = {(r["handler"], r["step"]): r["effect_key"] for r in setup.records()}
    assert keys == {
        ("notify", "sms:customer"): v1,
        ("notify:sms", "customer"): setup.provider.calls[0],
    }


def small_store(db: Database, tmp_path: Path) -> tuple[Engine, Engine]:
    """An effect store with one pooled connection, waiting at most 0.2 s for it; and an
    engine of its own to read its records with."""
    url = f"sqlite:///{tmp_path / 'effects.db'}" if db.backend == "sqlite" else db.url
    store = create_engine(url, pool_size=1, max_overflow=0, pool_timeout=0.2)
    inbox_effect.create(store, checkfirst=True)
    return store, create_engine(url)


@pytest.mark.parametrize("mode", ["at-least-once", "at-most-once"])
def test_a_pool_timeout_while_recording_done_keeps_the_result_and_never_calls_again(
    db: Database, tmp_path: Path, mode: str
) -> None:
    """Regression: a pool TimeoutError while the ledger recorded 'done' was taken for the
    database refusing the result: the record became done without it, and every later
    attempt raised UncertainEffect saying it 'could not be stored as JSON'. A transient
    error leaves the effect retryable, and the result of the call that was made is kept."""
    store, reader = small_store(db, tmp_path)
    inbox = Inbox(db.sessions, effect_store=store)
    provider = Provider()
    seen: list[Any] = []
    held: list[Any] = []

    def call(key: uuid.UUID) -> dict[str, Any]:
        receipt = provider.send(key)
        if len(provider.calls) == 1:
            held.append(store.connect())  # the store's only connection: 'done' must wait
        return receipt

    @inbox.handler("sms.requested", name="sms.send")
    def send_sms(message: Message, session: Session) -> None:
        seen.append(inbox.effect("provider.send", call, mode=mode))
        session.execute(insert(effects).values(ref=seen[-1]["id"], handler="sms.send"))

    message = order("m1", "sms.requested")
    try:
        failed = deliver(inbox, message)
        assert isinstance(failed, HandlerFailed)
        error = failed.failures["sms.send"]
        assert not isinstance(error, EffectError | UncertainEffect), error
        [record] = records(reader)
        assert record["status"] == "started"  # not 'done' without its result
        held.pop().close()

        assert deliver(inbox, message) is Outcome.PROCESSED
        assert provider.calls == [expected_key(message, "sms.send", "provider.send")]
        assert seen == [{"id": "sms-1", "key": str(provider.calls[0]), "text": "hello"}]
        [record] = records(reader)
        assert record["status"] == "done"
        assert record["result"] is not None
        assert db.effect_counts() == {("sms-1", "sms.send"): 1}
    finally:
        for connection in held:
            connection.close()
        store.dispose()
        reader.dispose()


def max_allowed_packet(engine: Engine) -> int:
    with engine.connect() as connection:
        return int(connection.execute(text("SELECT @@max_allowed_packet")).scalar_one())


def test_a_result_over_mariadbs_max_allowed_packet_is_done_without_it_and_never_called_again(
    mariadb_db: Database,
) -> None:
    """Regression: MariaDB drops the connection on a statement over max_allowed_packet; the
    inbox took that for a transient error, the record stayed 'started', and the call was
    made again on every retry (8 calls over 2 deliveries)."""
    inbox = Inbox(mariadb_db.sessions)
    provider = Provider()
    blob = "x" * max_allowed_packet(mariadb_db.engine)

    @inbox.handler("report.requested", name="report.make")
    def make_report(message: Message, session: Session) -> None:
        inbox.effect("renderer.render", lambda key: {**provider.send(key), "pdf": blob})

    message = order("r1", "report.requested")
    first = deliver(inbox, message)
    assert isinstance(first, HandlerFailed)
    error = first.failures["report.make"]
    assert isinstance(error, EffectError)
    assert "max_allowed_packet" in str(error)
    again = deliver(inbox, message)
    assert isinstance(again, HandlerFailed)
    assert isinstance(again.failures["report.make"], UncertainEffect)
    assert len(provider.calls) == 1
    [record] = records(mariadb_db.engine)
    assert (record["status"], record["result"]) == ("done", None)


def test_as_many_threads_making_effects_as_the_pool_holds_never_wedge_it(
    server_db: Database,
) -> None:
    """Each handler holds its claim's connection while its effect is recorded: the records
    must not wait for a connection of the same pool, or as many handlers as the pool holds
    wait for each other until the pool's timeout."""
    engine = create_engine(server_db.url, pool_size=2, max_overflow=0, pool_timeout=10)
    inbox = Inbox(sessionmaker(engine))
    provider = Provider()
    together = threading.Barrier(2, timeout=30)

    @inbox.handler("sms.requested", name="sms.send")
    def send_sms(message: Message, session: Session) -> None:
        together.wait()  # two claims held: every connection of the pool is taken
        receipt = inbox.effect("provider.send", provider.send)
        session.execute(insert(effects).values(ref=receipt["id"], handler="sms.send"))

    messages = [order(f"m{n}", "sms.requested") for n in range(4)]
    try:
        with ThreadPoolExecutor(4) as pool:
            outcomes = list(pool.map(lambda m: deliver(inbox, m), messages))
    finally:
        engine.dispose()
    assert outcomes == [Outcome.PROCESSED] * 4
    assert len(set(provider.calls)) == 4
    assert sum(server_db.effect_counts().values()) == 4
