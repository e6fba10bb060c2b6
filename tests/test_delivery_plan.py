"""The decision carried out, without a broker: every decision and every copy outcome through
the I/O-free plan (:mod:`inbox.delivery._plan`), and the blocking and asyncio shells of
:mod:`inbox.delivery.transport` over a transport that records what it was asked."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Mapping
from typing import Any

import pytest

from inbox.delivery import headers as h
from inbox.delivery._inbound import Inbound
from inbox.delivery._plan import (
    Ack,
    Copy,
    CopyResult,
    GiveBack,
    Hold,
    Plan,
    Reply,
    Stop,
    giving_back,
    plan,
)
from inbox.delivery._policy import DeadLetter, DeadLetterReason, Decision, Halt, Retry
from inbox.delivery._settling import MAX_REFUSAL_WAIT, Settling
from inbox.delivery._stats import WorkerStats
from inbox.delivery.topology import RetryPolicy
from inbox.delivery.transport import (
    carry_out,
    carry_out_async,
    deliver,
    deliver_async,
)
from inbox.errors import ConfigurationError, CopyRefused, SessionConfigurationError
from inbox.message import Message
from inbox.result import Outcome, ProcessResult

MESSAGE_ID = uuid.UUID("0190a6d2-8f5e-7c3a-9b1d-2e4f6a8b0c1d")


class Routes:
    """Where copies go: a RabbitMQ-like broker delays retries in queues of their own."""

    queue = "orders"
    dead_letters = "orders.dlq"

    def __init__(self, hold: float = 0.0, own_queue: bool = False) -> None:
        self.hold = hold
        self.own_queue = own_queue

    def retry_route(self, delay_ms: int) -> tuple[str, float]:
        if self.hold or self.own_queue:
            return self.queue, self.hold
        return f"orders.retry.{delay_ms}ms", 0.0


def settling() -> Settling:
    policy = RetryPolicy(delays=(1.0, 5.0), max_tries=3)
    return Settling(WorkerStats(), policy, logging.getLogger("test.delivery"))


def inbound(headers: Mapping[str, Any] | None = None) -> Inbound:
    return Inbound(
        str(MESSAGE_ID),
        "order.placed",
        dict(headers or {"x-own": "1"}),
        b'{"n": 1}',
        "application/json",
        None,
    )


def message() -> Message:
    return Message(id=MESSAGE_ID, type="order.placed", body={"n": 1})


def run(steps: Plan, *replies: Reply) -> list[object]:
    """The actions ``steps`` yields when sent ``replies`` in turn (the first action is
    asked for with None)."""
    actions: list[object] = [steps.send(None)]
    for reply in replies:
        try:
            actions.append(steps.send(reply))
        except StopIteration:
            actions.append("done")
            break
    return actions


def retry() -> Retry:
    return Retry(tries=1, delay_ms=1000, error="ValueError: no", failed_handlers=("h",))


def dead() -> DeadLetter:
    return DeadLetter(DeadLetterReason.HANDLER_FAILED, "ValueError: no", 3, ("h",))


# --- the plan, decision by decision ---------------------------------------------------------


def test_an_ack_decision_is_one_ack_counted_when_the_broker_took_it() -> None:
    s = settling()
    assert run(plan(Ack(), s, Routes(), inbound(), message=message()), True) == [Ack(), "done"]
    assert s.stats.acked == 1
    s = settling()
    assert run(plan(Ack(), s, Routes(), inbound(), message=message()), False) == [Ack(), "done"]
    assert s.stats.acked == 0  # the channel was gone: the broker gives it back


def test_a_halt_gives_the_delivery_back_then_stops_and_is_remembered(
    caplog: pytest.LogCaptureFixture,
) -> None:
    s = settling()
    error = ConfigurationError("no such table")
    with caplog.at_level(logging.CRITICAL, "test.delivery"):
        actions = run(plan(Halt(error), s, Routes(), inbound(), message=message()), True, None)
    assert actions == [GiveBack(), Stop(error), "done"]
    assert s.stats.requeued == 1
    assert s.halted_by is error
    assert "configuration error, stopping" in caplog.text


def test_a_retry_goes_to_its_delay_queue_with_the_failure_headers_then_acks() -> None:
    s = settling()
    steps = plan(retry(), s, Routes(), inbound(), message=message())
    copy = steps.send(None)
    assert isinstance(copy, Copy)
    assert copy.target == "orders.retry.1000ms"
    assert copy.headers["x-own"] == "1"  # the delivery's own headers go with it
    assert copy.headers[h.TRIES] == 1
    assert copy.headers[h.FAILED_HANDLERS] == "h"
    assert not copy.trimmed
    assert s.stats.retried == 1
    assert s.stats.failed_tries == 1


def test_a_retry_is_acked_only_after_its_copy_was_confirmed() -> None:
    s = settling()
    steps = plan(retry(), s, Routes(), inbound(), message=message())
    assert isinstance(steps.send(None), Copy)
    assert steps.send(CopyResult.COPIED) == Ack()
    with pytest.raises(StopIteration):
        steps.send(True)
    assert s.stats.acked == 1


def test_a_retry_the_edge_delays_is_held_then_copied_to_the_consumed_queue() -> None:
    s = settling()
    steps = plan(retry(), s, Routes(hold=1.0), inbound(), message=message())
    assert steps.send(None) == Hold(1.0)
    copy = steps.send(None)
    assert isinstance(copy, Copy)
    assert (copy.target, copy.delay_ms) == ("orders", 0)
    assert steps.send(CopyResult.COPIED) == Ack()


def test_a_retry_the_broker_delays_on_the_consumed_queue_carries_its_delay() -> None:
    steps = plan(retry(), settling(), Routes(own_queue=True), inbound(), message=message())
    copy = steps.send(None)
    assert isinstance(copy, Copy)
    assert (copy.target, copy.delay_ms) == ("orders", 1000)


def test_a_dead_letter_goes_to_the_dlq_with_its_reason_then_acks() -> None:
    s = settling()
    steps = plan(dead(), s, Routes(), inbound(), message=message())
    copy = steps.send(None)
    assert isinstance(copy, Copy)
    assert copy.target == "orders.dlq"
    assert copy.headers[h.REASON] == "handler-failed"
    assert copy.headers[h.SOURCE_QUEUE] == "orders"
    assert copy.headers[h.TRIES] == 3
    assert steps.send(CopyResult.COPIED) == Ack()
    assert s.stats.dead_lettered == 1
    assert s.stats.dead_letter_reasons == {"handler-failed": 1}


def test_a_delivery_that_cannot_be_a_message_is_dead_lettered_without_one() -> None:
    s = settling()
    unreadable = DeadLetter(DeadLetterReason.MISSING_ID, "delivery has no message_id property")
    copy = plan(unreadable, s, Routes(), inbound()).send(None)
    assert isinstance(copy, Copy)
    assert copy.headers[h.REASON] == "missing-message-id"
    assert h.TRIES not in copy.headers
    assert s.stats.failed_tries == 0


# --- the plan, copy outcome by copy outcome -------------------------------------------------


def test_a_refused_copy_is_held_doubling_to_the_limit_then_tried_again_until_accepted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    s = settling()
    steps = plan(dead(), s, Routes(), inbound(), message=message())
    first = steps.send(None)
    holds = []
    for _ in range(7):
        hold = steps.send(CopyRefused("unroutable"))
        assert isinstance(hold, Hold)
        holds.append(hold.seconds)
        assert steps.send(None) == first  # the same copy, not processed again
    assert holds == [1.0, 2.0, 4.0, 8.0, 16.0, MAX_REFUSAL_WAIT, MAX_REFUSAL_WAIT]
    assert steps.send(CopyResult.COPIED) == Ack()
    assert s.stats.dead_lettered == 1  # counted once, however many attempts
    assert "refused its copy for orders.dlq (unroutable)" in caplog.text


def test_a_copy_too_large_goes_trimmed_to_the_dlq_as_copy_too_large() -> None:
    s = settling()
    big = {"x-own": "1", "x-huge": "y" * 100}
    steps = plan(retry(), s, Routes(), inbound(big), message=message())
    assert isinstance(steps.send(None), Copy)
    trimmed = steps.send(CopyResult.TOO_LARGE)
    assert isinstance(trimmed, Copy)
    assert trimmed.target == "orders.dlq"
    assert trimmed.trimmed
    assert trimmed.headers[h.REASON] == "copy-too-large"
    assert "x-huge" not in trimmed.headers
    assert "x-own" not in trimmed.headers
    assert "x-huge" in trimmed.headers[h.ERROR]
    assert steps.send(CopyResult.COPIED) == Ack()
    assert s.stats.dead_letter_reasons == {"copy-too-large": 1}
    assert s.stats.dead_lettered == 1


def test_a_dead_letter_too_large_is_counted_once() -> None:
    s = settling()
    steps = plan(dead(), s, Routes(), inbound(), message=message())
    steps.send(None)
    steps.send(CopyResult.TOO_LARGE)
    assert s.stats.dead_lettered == 1
    assert s.stats.dead_letter_reasons == {"handler-failed": 1, "copy-too-large": 1}


def test_a_refused_copy_whose_channel_is_gone_ends_unacked(
    caplog: pytest.LogCaptureFixture,
) -> None:
    s = settling()
    actions = run(plan(dead(), s, Routes(), inbound(), message=message()), CopyResult.GONE)
    assert actions[1] == "done"
    assert s.stats.acked == 0
    assert "its channel is gone" in caplog.text


def test_a_stopping_edge_tries_a_held_copy_once_more_and_gives_it_back_when_refused() -> None:
    s = settling()
    steps = plan(retry(), s, Routes(hold=5.0), inbound(), message=message())
    assert steps.send(None) == Hold(5.0)
    assert isinstance(steps.send(CopyResult.STOPPING), Copy)
    assert steps.send(CopyRefused("nacked")) == GiveBack()
    with pytest.raises(StopIteration):
        steps.send(True)
    assert s.stats.requeued == 1
    assert s.stats.acked == 0


def test_a_stopping_edge_acks_a_refused_copy_that_goes_through_on_the_last_try() -> None:
    s = settling()
    steps = plan(dead(), s, Routes(), inbound(), message=message())
    steps.send(None)
    assert isinstance(steps.send(CopyRefused("nacked")), Hold)
    assert isinstance(steps.send(CopyResult.STOPPING), Copy)
    assert steps.send(CopyResult.COPIED) == Ack()


def test_a_copy_answered_with_anything_else_is_a_programming_error() -> None:
    steps = plan(dead(), settling(), Routes(), inbound(), message=message())
    steps.send(None)
    with pytest.raises(TypeError, match="CopyResult or CopyRefused"):
        steps.send(True)


def test_giving_back_counts_a_give_back_the_broker_took() -> None:
    s = settling()
    assert run(giving_back(s), True) == [GiveBack(), "done"]
    assert s.stats.requeued == 1


class Seen:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def acking(self) -> None:
        self.calls.append("ack")

    def halting(self, halt: Halt) -> None:
        self.calls.append("halt")

    def retrying(self, retry: Retry) -> None:
        self.calls.append(f"retry {retry.tries}")

    def dead_lettering(self, dead: DeadLetter) -> None:
        self.calls.append(f"dead {dead.reason}")


@pytest.mark.parametrize(
    ("decision", "seen"),
    [
        (Ack(), "ack"),
        (Halt(ConfigurationError("x")), "halt"),
        (retry(), "retry 1"),
        (dead(), "dead handler-failed"),
    ],
)
def test_the_observer_hears_each_decision_once(decision: Decision, seen: str) -> None:
    observer = Seen()
    plan(decision, settling(), Routes(), inbound(), message=message(), observer=observer).send(None)
    assert observer.calls == [seen]


# --- the shells over a recording transport ---------------------------------------------------


class Recorder(Routes):
    """A transport that records each call; ``refusals`` copies are refused first."""

    def __init__(
        self, *, refusals: int = 0, fits: bool = True, settleable: bool = True, hold: float = 0
    ) -> None:
        super().__init__(hold)
        self.calls: list[tuple[Any, ...]] = []
        self.refusals = refusals
        self._fits = fits
        self._settleable = settleable

    def read(self, delivery: Inbound) -> Inbound:
        return delivery

    def fits(self, delivery: Inbound, headers: Mapping[str, Any]) -> bool:
        self.calls.append(("fits",))
        return self._fits

    def settleable(self, delivery: Inbound) -> bool:
        return self._settleable

    def stop(self, error: BaseException) -> None:
        self.calls.append(("stop", type(error).__name__))

    def _ack(self, delivery: Inbound) -> bool:
        self.calls.append(("ack",))
        return True

    def _give_back(self, delivery: Inbound) -> bool:
        self.calls.append(("give back",))
        return True

    def _copy(self, target: str, headers: Mapping[str, Any], delay_ms: int) -> None:
        self.calls.append(("copy", target, headers.get(h.REASON), delay_ms))
        if self.refusals:
            self.refusals -= 1
            raise CopyRefused("nacked")


class Blocking(Recorder):
    def ack(self, delivery: Inbound) -> bool:
        return self._ack(delivery)

    def give_back(self, delivery: Inbound) -> bool:
        return self._give_back(delivery)

    def copy(
        self, delivery: Inbound, target: str, headers: Mapping[str, Any], *, delay_ms: int
    ) -> None:
        self._copy(target, headers, delay_ms)


class Async(Recorder):
    async def ack(self, delivery: Inbound) -> bool:
        return self._ack(delivery)

    async def give_back(self, delivery: Inbound) -> bool:
        return self._give_back(delivery)

    async def copy(
        self, delivery: Inbound, target: str, headers: Mapping[str, Any], *, delay_ms: int
    ) -> None:
        self._copy(target, headers, delay_ms)


def test_carry_out_stops_at_each_hold_and_resumes_where_it_was() -> None:
    transport = Blocking(refusals=1)
    s = settling()
    delivery = inbound()
    steps = plan(dead(), s, transport, delivery, message=message())
    assert carry_out(transport, delivery, steps) == Hold(1.0)
    assert transport.calls == [("fits",), ("copy", "orders.dlq", "handler-failed", 0)]
    assert carry_out(transport, delivery, steps) is None
    assert transport.calls[2:] == [("fits",), ("copy", "orders.dlq", "handler-failed", 0), ("ack",)]
    assert s.stats.acked == 1


def test_carry_out_asks_whether_a_copy_fits_but_never_for_the_trimmed_one() -> None:
    transport = Blocking(fits=False)
    delivery = inbound()
    assert carry_out(transport, delivery, plan(retry(), settling(), transport, delivery)) is None
    assert transport.calls == [("fits",), ("copy", "orders.dlq", "copy-too-large", 0), ("ack",)]


def test_carry_out_ends_a_refused_copy_whose_channel_is_gone() -> None:
    transport = Blocking(refusals=1, settleable=False)
    delivery = inbound()
    assert carry_out(transport, delivery, plan(dead(), settling(), transport, delivery)) is None
    assert ("ack",) not in transport.calls


def test_carry_out_on_a_stop_gives_back_a_held_delivery_whose_copy_is_refused() -> None:
    transport = Blocking(refusals=2)
    s = settling()
    delivery = inbound()
    steps = plan(dead(), s, transport, delivery)
    assert carry_out(transport, delivery, steps) == Hold(1.0)
    assert carry_out(transport, delivery, steps, CopyResult.STOPPING) is None
    assert transport.calls[-1] == ("give back",)
    assert s.stats.requeued == 1


def test_carry_out_of_a_halt_gives_back_then_stops_the_transport() -> None:
    transport = Blocking()
    delivery = inbound()
    halt = Halt(ConfigurationError("x"))
    assert carry_out(transport, delivery, plan(halt, settling(), transport, delivery)) is None
    assert transport.calls == [("give back",), ("stop", "ConfigurationError")]


def processed(message: Message) -> ProcessResult:
    return ProcessResult(message.id, {"h": Outcome.PROCESSED})


def failing(message: Message) -> ProcessResult:
    raise ValueError("no")


def test_deliver_acks_a_processed_delivery() -> None:
    transport, s = Blocking(), settling()
    deliver(transport, inbound(), s, processed, default_content_type=None)
    assert transport.calls == [("ack",)]
    assert (s.stats.deliveries, s.stats.processed, s.stats.acked) == (1, 1, 1)


def test_deliver_retries_a_failed_try_through_a_hold() -> None:
    transport, s = Blocking(hold=0.001), settling()
    deliver(transport, inbound(), s, failing, default_content_type=None)
    assert transport.calls == [("fits",), ("copy", "orders", None, 0), ("ack",)]
    assert s.stats.retried == 1


def test_deliver_dead_letters_what_cannot_be_a_message_without_processing_it() -> None:
    transport, s = Blocking(), settling()
    bad = inbound()._replace(raw_id="not-a-uuid")
    deliver(transport, bad, s, failing, default_content_type=None)
    assert transport.calls == [("fits",), ("copy", "orders.dlq", "invalid-message-id", 0), ("ack",)]


def test_deliver_after_a_halt_gives_every_delivery_back_unread() -> None:
    transport, s = Blocking(), settling()

    def misconfigured(message: Message) -> ProcessResult:
        raise SessionConfigurationError("not a Session factory")

    deliver(transport, inbound(), s, misconfigured, default_content_type=None)
    deliver(transport, inbound(), s, processed, default_content_type=None)
    stop = ("stop", "SessionConfigurationError")
    assert transport.calls == [("give back",), stop, ("give back",)]
    assert (s.stats.deliveries, s.stats.requeued) == (1, 2)


def test_deliver_async_carries_out_the_same_plan() -> None:
    async def processed_async(message: Message) -> ProcessResult:
        return processed(message)

    async def failing_async(message: Message) -> ProcessResult:
        raise ValueError("no")

    transport, s = Async(hold=0.001), settling()
    asyncio.run(deliver_async(transport, inbound(), s, processed_async, default_content_type=None))
    assert transport.calls == [("ack",)]
    transport.calls.clear()
    asyncio.run(deliver_async(transport, inbound(), s, failing_async, default_content_type=None))
    assert transport.calls == [("fits",), ("copy", "orders", None, 0), ("ack",)]
    assert (s.stats.deliveries, s.stats.acked, s.stats.retried) == (2, 2, 1)


def test_carry_out_async_sleeps_through_a_refusal_and_tries_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)

    monkeypatch.setattr("inbox.delivery.transport.asyncio.sleep", sleep)
    transport, s = Async(refusals=2), settling()
    delivery = inbound()
    asyncio.run(carry_out_async(transport, delivery, plan(dead(), s, transport, delivery)))
    assert slept == [1.0, 2.0]
    assert [c[0] for c in transport.calls] == ["fits", "copy"] * 3 + ["ack"]
    assert s.stats.acked == 1


def test_carry_out_async_of_a_halt_gives_back_then_stops() -> None:
    transport = Async()
    delivery = inbound()
    steps = plan(Halt(ConfigurationError("x")), settling(), transport, delivery)
    asyncio.run(carry_out_async(transport, delivery, steps))
    assert transport.calls == [("give back",), ("stop", "ConfigurationError")]
