"""The effect ledger's state machine on each database, driven directly: the decisions a later
attempt makes, the attempt guard on late writes, a start re-run after its commit landed;
and the worker's decision for an UncertainEffect."""

from __future__ import annotations

import datetime as dt
import os
import uuid

import pytest
from support.databases import Database

from inbox import HandlerFailed, ProcessResult, UncertainEffect
from inbox.broker import RetryPolicy
from inbox.core.effects._identity import EffectMode, EffectRef, effect_key
from inbox.core.effects._ledger import Call, Ledger, Stored
from inbox.delivery._policy import DeadLetter, DeadLetterReason, decide
from inbox.schema import inbox_effect

LEAST, MOST = EffectMode.AT_LEAST_ONCE, EffectMode.AT_MOST_ONCE


def ref() -> EffectRef:
    claim = os.urandom(16)
    return EffectRef(effect_key(claim, "sms.send", "send"), claim, "sms.send", "send")


def at(seconds: int) -> dt.datetime:
    return dt.datetime(2026, 1, 1, tzinfo=dt.UTC) + dt.timedelta(seconds=seconds, microseconds=7)


def test_a_later_attempt_decides_by_the_record_and_the_mode(db: Database) -> None:
    ledger = Ledger(inbox_effect)
    effect = ref()
    with db.engine.connect() as connection:
        assert ledger.start(connection, effect, LEAST, at(0)) == Call(1)
        with pytest.raises(UncertainEffect) as uncertain:
            ledger.start(connection, effect, MOST, at(1))
        assert (uncertain.value.status, uncertain.value.attempts) == ("started", 1)
        assert ledger.start(connection, effect, LEAST, at(2)) == Call(2)
        assert ledger.fail(connection, effect, 2, "TimeoutError: slow", at(3))
        with pytest.raises(UncertainEffect, match="'failed'"):
            ledger.start(connection, effect, MOST, at(4))
        assert ledger.start(connection, effect, LEAST, at(5)) == Call(3)
        assert ledger.finish(connection, effect, 3, '{"id": 1}', at(6))
        for mode in EffectMode:
            assert ledger.start(connection, effect, mode, at(7)) == Stored('{"id": 1}')


def test_a_late_write_of_a_superseded_attempt_changes_nothing(db: Database) -> None:
    ledger = Ledger(inbox_effect)
    effect = ref()
    with db.engine.connect() as connection:
        assert ledger.start(connection, effect, LEAST, at(0)) == Call(1)
        assert ledger.start(connection, effect, LEAST, at(1)) == Call(2)  # took over
        assert ledger.finish(connection, effect, 2, '"new"', at(2))
        assert not ledger.finish(connection, effect, 1, '"old"', at(3))
        assert not ledger.fail(connection, effect, 1, "late failure", at(4))
        assert ledger.start(connection, effect, LEAST, at(5)) == Stored('"new"')


def test_a_start_re_run_after_its_commit_landed_goes_on_as_that_attempt(db: Database) -> None:
    """A start whose COMMIT landed but whose acknowledgement was lost is re-run (transient
    error) with the same stamp: it must not take its own record for an earlier attempt's,
    which at-most-once would refuse for ever without a call ever made."""
    ledger = Ledger(inbox_effect)
    effect = ref()
    with db.engine.connect() as connection:
        assert ledger.start(connection, effect, MOST, at(0)) == Call(1)
        assert ledger.start(connection, effect, MOST, at(0)) == Call(1)
        with pytest.raises(UncertainEffect):
            ledger.start(connection, effect, MOST, at(1))


def test_the_worker_dead_letters_an_uncertain_effect_at_once() -> None:
    message_id = uuid.uuid4()
    uncertain = UncertainEffect(
        uuid.uuid4(), "sms.send", "send", status="started", attempts=1, why="at-most-once"
    )
    failed = HandlerFailed(message_id, {"sms.send": uncertain}, ProcessResult(message_id, {}))
    decision = decide(failed, 0, RetryPolicy())
    assert isinstance(decision, DeadLetter)
    assert decision.reason is DeadLetterReason.UNCERTAIN_EFFECT
    assert decision.failed_handlers == ("sms.send",)
    assert decision.tries == 1
