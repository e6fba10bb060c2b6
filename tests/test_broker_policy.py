"""The worker's decision for every outcome of ``Inbox.process``, without a broker.

:func:`inbox.delivery._policy.decide` is pure: what the inbox made of the message, the tries
recorded on the delivery and the retry policy give ack, retry (with its delay), dead letter
(with its reason) or halt (a configuration error: requeue and stop).
"""

from __future__ import annotations

import asyncio
import uuid

import pytest

from inbox import (
    HandlerFailed,
    InvalidKey,
    Outcome,
    ProcessResult,
    SessionConfigurationError,
    TransactionControlError,
    UnhandledMessage,
    UnsupportedDialect,
)
from inbox.broker import DeadLetterReason, RetryPolicy
from inbox.delivery._policy import Ack, DeadLetter, Halt, Retry, decide

POLICY = RetryPolicy((1.0, 5.0), max_tries=3)
ID = uuid.UUID("01890a5d-ac96-774b-bcce-b302099a8057")


def result(**outcomes: Outcome) -> ProcessResult:
    return ProcessResult(ID, outcomes)


def failed(**failures: Exception) -> HandlerFailed:
    return HandlerFailed(ID, failures, result(other=Outcome.PROCESSED))


def test_a_result_is_acked_whatever_its_outcomes() -> None:
    assert decide(result(a=Outcome.PROCESSED, b=Outcome.DUPLICATE), 0, POLICY) == Ack()
    assert decide(result(), 2, POLICY) == Ack()


def test_a_failed_handler_is_retried_with_the_delay_of_its_try_then_dead_lettered() -> None:
    failure = failed(billing=RuntimeError("card declined"))
    first = decide(failure, 0, POLICY)
    assert first == Retry(1, 1000, "billing: RuntimeError: card declined", ("billing",))
    second = decide(failure, 1, POLICY)
    assert isinstance(second, Retry)
    assert (second.tries, second.delay_ms) == (2, 5000)
    last = decide(failure, 2, POLICY)
    assert last == DeadLetter(
        DeadLetterReason.HANDLER_FAILED, "billing: RuntimeError: card declined", 3, ("billing",)
    )


def test_with_one_try_a_failure_is_dead_lettered_at_once() -> None:
    decision = decide(failed(a=ValueError("x")), 0, RetryPolicy((), max_tries=1))
    assert isinstance(decision, DeadLetter)
    assert (decision.reason, decision.tries) == (DeadLetterReason.HANDLER_FAILED, 1)


@pytest.mark.parametrize(
    "error",
    [RuntimeError("outside any handler"), asyncio.CancelledError(), GeneratorExit()],
    ids=["exception", "cancelled", "generator-exit"],
)
def test_any_other_error_out_of_process_is_a_failed_try_never_a_dead_worker(
    error: BaseException,
) -> None:
    decision = decide(error, 0, POLICY)
    assert isinstance(decision, Retry)
    assert decision.tries == 1
    assert type(error).__name__ in decision.error
    assert isinstance(decide(error, 2, POLICY), DeadLetter)


@pytest.mark.parametrize("error", [KeyboardInterrupt(), SystemExit(1)])
def test_interrupts_are_not_decided_on(error: BaseException) -> None:
    with pytest.raises(TypeError, match="stops the worker"):
        decide(error, 0, POLICY)


def test_misrouted_messages_and_failing_keys_are_dead_lettered_at_once() -> None:
    unhandled = decide(UnhandledMessage(ID, "nobody.takes.this"), 0, POLICY)
    assert isinstance(unhandled, DeadLetter)
    assert (unhandled.reason, unhandled.tries) == (DeadLetterReason.UNHANDLED_TYPE, None)
    key = decide(InvalidKey("billing", ID, "key() raised KeyError"), 0, POLICY)
    assert isinstance(key, DeadLetter)
    assert key.reason is DeadLetterReason.INVALID_KEY


def test_a_handler_that_ended_the_inbox_transaction_is_dead_lettered_at_once() -> None:
    # Retrying could find the claim committed without the handler's other writes: a silent
    # duplicate. It goes to the dead letters on the first try, whatever tries remain.
    failure = failed(
        ledger=TransactionControlError("the transaction ended under the inbox"),
        mail=RuntimeError("smtp down"),
    )
    decision = decide(failure, 0, POLICY)
    assert isinstance(decision, DeadLetter)
    assert decision.reason is DeadLetterReason.TRANSACTION_ENDED
    assert decision.tries == 1
    assert decision.failed_handlers == ("ledger", "mail")
    assert "ledger: TransactionControlError" in decision.detail


@pytest.mark.parametrize(
    "error",
    [
        SessionConfigurationError("autocommit sessions cannot be owned"),
        UnsupportedDialect("oracle"),
    ],
)
def test_configuration_errors_halt_the_worker_raised_or_inside_handler_failed(
    error: Exception,
) -> None:
    assert decide(error, 0, POLICY) == Halt(error)
    assert decide(failed(a=error), 3, POLICY) == Halt(error)
    assert decide(failed(a=RuntimeError("x"), b=error), 0, POLICY) == Halt(error)


def test_dead_letter_reasons_are_the_documented_header_values() -> None:
    assert {r.value for r in DeadLetterReason} == {
        "missing-message-id",
        "invalid-message-id",
        "unreadable-properties",
        "undecodable-body",
        "body-too-large",
        "invalid-message",
        "unhandled-type",
        "invalid-key",
        "invalid-body",
        "handler-failed",
        "transaction-ended",
        "uncertain-effect",
        "copy-too-large",
    }
