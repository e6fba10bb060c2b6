"""The plugin's other tools as a user's tests use them (pytester): ``FakeProvider`` behind
``inbox.effect``, ``WorkerHarness`` (retries and dead letters on the in-memory broker), and
``assert_idempotent``'s options and refusals. Each sample test asserts what it is about, so
the user's run passing is the check; the ones meant to fail are named and their messages
matched."""

from __future__ import annotations

import threading
import uuid

import pytest

from inbox.testing import FakeProvider, FakeProviderError

pytest_plugins = ["pytester"]

PAYMENTS = '''
"""A user's project: payments, an SMS through inbox.effect, typed bodies."""
import dataclasses
import datetime

from sqlalchemy import Column, DateTime, Integer, MetaData, String, Table, insert

from inbox import Inbox

metadata = MetaData()
payments = Table(
    "payments", metadata,
    Column("payment_id", String(40), primary_key=True),
    Column("amount", Integer, nullable=False),
    Column("recorded_at", DateTime, nullable=False, default=datetime.datetime.now),
)
texts = Table(
    "texts", metadata,
    Column("payment_id", String(40), primary_key=True),
    Column("receipt", String(200), nullable=False),
)


@dataclasses.dataclass
class PaymentTaken:
    payment_id: str
    amount: int


def make_inbox(sessions, effect_store=None, provider=None, fail_on=()):
    inbox = Inbox(sessions, effect_store=effect_store)

    @inbox.handler("payment.taken", body=PaymentTaken, name="payments.record")
    def record(message, session):
        if message.body.payment_id in fail_on:
            raise RuntimeError("ledger unavailable")
        session.execute(
            insert(payments).values(payment_id=message.body.payment_id, amount=message.body.amount)
        )

    if provider is not None:
        @inbox.handler("payment.taken", body=PaymentTaken, name="payments.text")
        def text(message, session):
            receipt = inbox.effect("sms", provider)
            session.execute(
                insert(texts).values(payment_id=message.body.payment_id, receipt=receipt["receipt"])
            )

    return inbox
'''

USER_TESTS = """
import pytest
from sqlalchemy import func, insert, select

import payments
from inbox import HandlerFailed, Message
from inbox.aio import AsyncInbox
from inbox.testing import assert_idempotent


@pytest.fixture
def inbox_app_metadata():
    return [payments.metadata]


def paid(payment_id="p-1", amount=5):
    return Message.new("payment.taken", {"payment_id": payment_id, "amount": amount})


def test_the_fake_provider_fails_on_cue_and_the_effect_is_made_once(
    inbox_sessions, inbox_effect_store, inbox_fake_provider, inbox_engine
):
    inbox = payments.make_inbox(inbox_sessions, inbox_effect_store, inbox_fake_provider)
    message = paid()
    inbox_fake_provider.fail(1)
    with pytest.raises(HandlerFailed):
        inbox.process(message)
    inbox.process(message)
    inbox.process(message)
    [key] = inbox_fake_provider.calls
    assert inbox_fake_provider.calls_for(key) == 2  # the failed call, then one that answered
    with inbox_engine.connect() as connection:
        assert connection.execute(select(payments.texts)).all() == [("p-1", f"fake-{key}")]


def test_an_effect_handler_is_idempotent_with_its_store_put_back_between_runs(
    inbox_sessions, inbox_effect_store, inbox_fake_provider
):
    inbox = payments.make_inbox(inbox_sessions, inbox_effect_store, inbox_fake_provider)
    assert_idempotent(
        inbox, paid(), tables=["payments", "texts"], ignore_columns=["payments.recorded_at"]
    )
    # The clean run, twice in a row, and two redeliveries per handler: one call each.
    assert inbox_fake_provider.total_calls == 6
    assert len(inbox_fake_provider.calls) == 1


def test_seed_rows_stay_and_the_database_is_left_as_the_clean_run_left_it(
    inbox_sessions, inbox_engine
):
    with inbox_engine.begin() as connection:
        connection.execute(insert(payments.payments).values(payment_id="seed", amount=1))
    inbox = payments.make_inbox(inbox_sessions)
    assert_idempotent(
        inbox, paid(), tables=[payments.payments], ignore_columns=["payments.recorded_at"]
    )
    with inbox_engine.connect() as connection:
        rows = connection.execute(select(payments.payments.c.payment_id)).scalars().all()
    assert sorted(rows) == ["p-1", "seed"]


def test_timestamps_fail_the_comparison_unless_ignored(inbox_sessions):
    inbox = payments.make_inbox(inbox_sessions)
    assert_idempotent(inbox, paid(), tables=["payments"])


def test_a_handler_failing_on_a_clean_run_is_reported_as_such(inbox_sessions):
    inbox = payments.make_inbox(inbox_sessions, fail_on=("p-9",))
    assert_idempotent(inbox, paid("p-9"), tables=["payments"])


def test_bad_arguments_are_refused(inbox_sessions):
    inbox = payments.make_inbox(inbox_sessions)
    with pytest.raises(ValueError, match="no table 'nope' in the test database"):
        assert_idempotent(inbox, paid(), tables=["nope"])
    with pytest.raises(ValueError, match="table 'payments' has no column 'when'"):
        assert_idempotent(inbox, paid(), tables=["payments"], ignore_columns=["payments.when"])
    with pytest.raises(ValueError, match="is not 'table.column' for one of the compared"):
        assert_idempotent(inbox, paid(), tables=["payments"], ignore_columns=["recorded_at"])
    with pytest.raises(ValueError, match="non-empty list"):
        assert_idempotent(inbox, paid(), tables="payments")
    with pytest.raises(ValueError, match="no handler of this inbox takes messages of type 'x'"):
        assert_idempotent(inbox, Message.new("x", {}), tables=["payments"])
    with pytest.raises(TypeError, match=r"for an AsyncInbox: await assert_idempotent_async"):
        assert_idempotent(AsyncInbox.__new__(AsyncInbox), paid(), tables=["payments"])


def test_the_worker_retries_then_dead_letters(inbox_sessions, inbox_worker_harness, inbox_engine):
    inbox = payments.make_inbox(inbox_sessions, fail_on=("p-bad",))
    harness = inbox_worker_harness(inbox)
    harness.publish("payment.taken", payments.PaymentTaken("p-1", 5))
    bad = harness.publish("payment.taken", {"payment_id": "p-bad", "amount": 7})
    invalid = harness.publish("payment.taken", {"payment_id": "p-2"})

    stats = harness.run()

    assert (stats.deliveries, stats.processed, stats.retried, stats.dead_lettered) == (5, 1, 2, 2)
    failed, rejected = sorted(harness.dead_letters(), key=lambda d: d.reason)
    assert (failed.message_id, failed.reason, failed.tries) == (str(bad), "handler-failed", 3)
    assert failed.error == "payments.record: RuntimeError: ledger unavailable"
    assert failed.body == {"payment_id": "p-bad", "amount": 7}
    assert (rejected.message_id, rejected.reason) == (str(invalid), "invalid-body")
    assert rejected.tries is None  # dead-lettered at once
    assert rejected.error.endswith("amount: field required")
    assert harness.dead_letters() == []
    with inbox_engine.connect() as connection:
        assert connection.execute(select(payments.payments.c.payment_id)).scalars().all() == ["p-1"]


def test_the_worker_harness_batches_too(inbox_sessions, inbox_worker_harness):
    inbox = payments.make_inbox(inbox_sessions)
    harness = inbox_worker_harness(inbox, batch_size=10)
    for n in range(5):  # each payment sent twice, under fresh ids, with its business key
        for _ in range(2):
            harness.publish(
                "payment.taken", {"payment_id": f"p-{n}", "amount": n + 1}, idempotency_key=f"p-{n}"
            )
    stats = harness.run()
    assert (stats.acked, stats.processed, stats.duplicates, stats.dead_lettered) == (10, 5, 5, 0)
"""


@pytest.fixture
def project(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    monkeypatch.delenv("INBOX_TESTING_DATABASE_URL", raising=False)  # SQLite unless a test says
    pytester.makepyfile(payments=PAYMENTS, test_payments=USER_TESTS)
    pytester.syspathinsert()
    return pytester


def test_the_users_tools_tests_pass_and_the_two_meant_to_fail_fail_readably(
    project: pytest.Pytester,
) -> None:
    result = project.runpytest("-p", "no:cacheprovider")

    result.assert_outcomes(passed=6, failed=2)
    result.stdout.fnmatch_lines(
        [
            "FAILED test_payments.py::test_timestamps_fail_the_comparison_unless_ignored*",
            "FAILED test_payments.py::test_a_handler_failing_on_a_clean_run_is_reported_as_such*",
        ]
    )
    result.stdout.fnmatch_lines(
        [
            "E       inbox.testing.asserts.NotIdempotent: message * (type 'payment.taken') "
            "fails on a clean run, so its redeliveries cannot be judged: HandlerFailed: *"
            "payments.record: RuntimeError: ledger unavailable",
        ]
    )
    result.stdout.fnmatch_lines(
        [
            "E       delivered twice:",
            "E         table payments: 1 row(s) after the clean run, 1 after this one",
            "E           - {'payment_id': 'p-1', 'amount': 5, 'recorded_at': datetime.datetime(*)}",
            "E           + {'payment_id': 'p-1', 'amount': 5, 'recorded_at': datetime.datetime(*)}",
        ]
    )


def test_the_fake_provider_counts_per_key_and_hangs_until_released_or_timed_out() -> None:
    provider = FakeProvider("gateway")
    one, two = uuid.UUID(int=1), uuid.UUID(int=2)

    assert provider(one) == {"receipt": f"gateway-{one}", "key": str(one)}
    provider.fail(2, ConnectionError("reset"))
    with pytest.raises(ConnectionError, match="reset"):
        provider(one)
    with pytest.raises(ConnectionError):
        provider(two)
    assert provider(two)["receipt"] == f"gateway-{two}"
    assert (provider.calls_for(one), provider.calls_for(two), provider.total_calls) == (2, 2, 4)

    provider.fail()
    with pytest.raises(FakeProviderError, match="gateway: failing on cue"):
        provider(one)

    provider.hang(timeout=0.05)
    with pytest.raises(TimeoutError, match=r"gateway: no answer within 0.05 s"):
        provider(one)
    assert not provider.hanging.is_set()

    provider.hang(timeout=10)
    answered: list[object] = []
    caller = threading.Thread(target=lambda: answered.append(provider(two)))
    caller.start()
    assert provider.hanging.wait(5)
    provider.release()
    caller.join(5)
    assert answered == [{"receipt": f"gateway-{two}", "key": str(two)}]
    assert provider.calls_for(one) == 4


def test_the_fake_provider_refuses_what_an_effect_would_never_pass() -> None:
    provider = FakeProvider()
    with pytest.raises(TypeError, match="needs a hashable key, got list"):
        provider(["k"])  # type: ignore[arg-type]
    for bad in (0, -1, True, 1.5):
        with pytest.raises(ValueError, match="times must be a positive int"):
            provider.fail(bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="timeout must be positive"):
        provider.hang(timeout=0)
    assert provider.total_calls == 0
