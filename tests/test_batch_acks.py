"""The worker's batch acks: one ``basic.ack(multiple=True)`` per batch on RabbitMQ where the
delivery tags allow it (a batch handler writing the batch, a poison message copied to its
retry queue and acked alone), and the rule that decides it (``inbox.broker._acks``); one
delivery at a time, the acks of committed deliveries held back while more are at hand and
sent together, each after its delivery's commit."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import amqp
import pytest
from sqlalchemy import insert
from sqlalchemy.orm import Session
from support.databases import Database, effects
from support.rabbit import Rabbit
from support.worker import run_in_thread, run_until_idle, wait_until

from inbox import Inbox, Message
from inbox.broker import Publisher, RetryPolicy, Worker
from inbox.broker._acks import AckTracker

NAME = "orders.bulk"
QUICK = RetryPolicy((0.2, 0.4), max_tries=3)
IDLE = 1.5  # longer than the longest retry delay: idle means done


@dataclass
class AckLog:
    """Every ``basic.ack`` the worker's channel sends: (delivery tag, multiple)."""

    sent: list[tuple[int, bool]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    on_ack: Callable[[int], None] | None = None
    """Called with each ack's tag as it is sent."""


@pytest.fixture
def ack_log(monkeypatch: pytest.MonkeyPatch) -> AckLog:
    """Record py-amqp's basic_ack calls (they still go to the broker)."""
    log = AckLog()
    original = amqp.Channel.basic_ack

    def basic_ack(channel: Any, delivery_tag: int, multiple: bool = False, **kw: Any) -> Any:
        with log.lock:
            log.sent.append((delivery_tag, multiple))
            if log.on_ack is not None:
                log.on_ack(delivery_tag)
        return original(channel, delivery_tag, multiple, **kw)

    monkeypatch.setattr(amqp.Channel, "basic_ack", basic_ack)
    return log


def bulk_inbox(db: Database, batches: list[list[str]], poison: str | None = None) -> Inbox:
    inbox = Inbox(db.sessions)

    @inbox.batch_handler("order.created", name=NAME)
    def bulk(messages: list[Message], session: Session) -> None:
        refs = [str(m.body["ref"]) for m in messages]
        batches.append(refs)
        session.execute(insert(effects), [{"ref": ref, "handler": NAME} for ref in refs])
        if poison in refs:
            raise RuntimeError("poison")

    return inbox


def publish(url: str, queue: str, refs: list[str]) -> None:
    with Publisher(url, routing_key=queue) as publisher:
        for ref in refs:
            publisher.publish("order.created", {"ref": ref})


def test_a_batch_is_acked_with_one_multiple_ack(
    pg_db: Database, rabbit: Rabbit, ack_log: AckLog
) -> None:
    queue = rabbit.queue()
    batches: list[list[str]] = []
    worker = Worker(
        bulk_inbox(pg_db, batches), rabbit.url, [queue], prefetch=40, batch_size=40,
        retry=QUICK, stats_interval=None,
    )  # fmt: skip
    worker.prepare()
    refs = [f"m{i}" for i in range(120)]
    publish(rabbit.url, queue, refs)
    run_until_idle(worker, IDLE)
    assert pg_db.effect_counts() == {(ref, NAME): 1 for ref in refs}
    assert sorted(ref for batch in batches for ref in batch) == sorted(refs)
    # One ack frame per batch, each acking everything up to its highest tag.
    assert len(ack_log.sent) == len(batches)
    assert all(multiple for _, multiple in ack_log.sent)
    assert worker.stats.acked == 120
    assert worker._dispatch.acks.multiple_acks == len(batches)
    # Nothing left unacked: stopped, the worker's channel is closed, so an unacked delivery
    # would be back in the queue.
    assert rabbit.depth(queue) == 0


def test_a_poison_message_is_copied_and_acked_alone_the_rest_together(
    pg_db: Database, rabbit: Rabbit, ack_log: AckLog
) -> None:
    queue = rabbit.queue()
    batches: list[list[str]] = []
    worker = Worker(
        bulk_inbox(pg_db, batches, poison="m7"), rabbit.url, [queue], prefetch=20,
        batch_size=20, retry=QUICK, stats_interval=None,
    )  # fmt: skip
    worker.prepare()
    refs = [f"m{i}" for i in range(20)]
    publish(rabbit.url, queue, refs)
    run_until_idle(worker, IDLE)
    healthy = {(ref, NAME): 1 for ref in refs if ref != "m7"}
    assert pg_db.effect_counts() == healthy
    dead = rabbit.take_all(f"{queue}.dlq")
    assert [m.properties["type"] for m in dead] == ["order.created"]
    assert dead[0].payload == {"ref": "m7"}
    assert worker.stats.dead_lettered == 1
    assert worker.stats.acked == 19 + 3  # the healthy ones, then each try's original
    # The batches' multiple acks, and the poison's originals acked one by one after their
    # copies were confirmed.
    assert worker._dispatch.acks.multiple_acks >= 1
    assert sum(1 for _, multiple in ack_log.sent if not multiple) >= 3
    assert rabbit.depth(queue) == 0


class Stand:
    """A delivery as the tracker sees it: a channel, a tag, an ack that is logged."""

    def __init__(self, channel: object, tag: int, log: list[tuple[int, bool]]) -> None:
        self.channel, self.delivery_tag, self._log = channel, tag, log

    def ack(self, multiple: bool = False) -> None:
        self._log.append((self.delivery_tag, multiple))


def test_the_rule_acks_together_only_a_gapless_run_with_nothing_held() -> None:
    log: list[tuple[int, bool]] = []
    channel = object()
    d = {tag: Stand(channel, tag, log) for tag in range(1, 20)}
    tracker = AckTracker(multiple=True)
    tracker.ack([d[1], d[2], d[3]], [d[1], d[3]], holding=0)  # d[2] settled otherwise
    assert log == [(3, True)]
    log.clear()
    tracker.ack([d[4], d[5]], [d[4], d[5]], holding=1)  # a delivery held: one by one
    assert log == [(4, False), (5, False)]
    log.clear()
    tracker.settled([d[6]])
    tracker.ack([d[7], d[8]], [d[7], d[8]], holding=0)
    assert log == [(8, True)]
    log.clear()
    tracker.ack([d[10], d[11]], [d[10], d[11]], holding=0)  # 9 never settled: a gap
    tracker.ack([d[12]], [d[12]], holding=0)  # the gap stays on this channel
    assert log == [(10, False), (11, False), (12, False)]
    log.clear()
    fresh = object()  # a new channel (a reconnection) starts again at tag 1
    e = {tag: Stand(fresh, tag, log) for tag in (1, 2)}
    tracker.ack([e[2], e[1]], [e[1], e[2]], holding=0)
    assert log == [(2, True)]
    log.clear()
    AckTracker(multiple=False).ack([e[1], e[2]], [e[1], e[2]], holding=0)  # not RabbitMQ
    assert log == [(1, False), (2, False)]
    assert tracker.multiple_acks == 3


def single_inbox(db: Database) -> Inbox:
    inbox = Inbox(db.sessions)

    @inbox.handler("order.created", name=NAME)
    def single(message: Message, session: Session) -> None:
        session.execute(insert(effects).values(ref=str(message.body["ref"]), handler=NAME))

    return inbox


def test_one_at_a_time_committed_deliveries_are_acked_together_each_after_its_commit(
    pg_db: Database, rabbit: Rabbit, ack_log: AckLog
) -> None:
    queue = rabbit.queue()
    committed_at_ack: list[tuple[int, int]] = []  # (tag acked, rows committed by then)

    def on_ack(tag: int) -> None:
        committed_at_ack.append((tag, sum(pg_db.effect_counts().values())))

    ack_log.on_ack = on_ack
    worker = Worker(single_inbox(pg_db), rabbit.url, [queue], prefetch=40, stats_interval=None)
    worker.prepare()
    refs = [f"m{i}" for i in range(60)]
    publish(rabbit.url, queue, refs)  # all at hand before the worker starts
    run_until_idle(worker, IDLE)
    assert pg_db.effect_counts() == {(ref, NAME): 1 for ref in refs}
    assert worker.stats.acked == 60
    # At most prefetch // 4 = 10 acks held: a handful of frames for 60 deliveries, each a
    # multiple ack up to a delivery that had committed (tags count the deliveries in order).
    assert 6 <= len(ack_log.sent) < 60
    assert all(multiple for _, multiple in ack_log.sent)
    assert max(tag for tag, _ in ack_log.sent) == 60
    assert all(tag <= committed for tag, committed in committed_at_ack), committed_at_ack
    assert rabbit.depth(queue) == 0


def test_held_acks_go_out_as_soon_as_no_more_deliveries_are_at_hand(
    pg_db: Database, rabbit: Rabbit, ack_log: AckLog
) -> None:
    queue = rabbit.queue()
    worker = Worker(single_inbox(pg_db), rabbit.url, [queue], prefetch=100, stats_interval=None)
    worker.prepare()
    thread = run_in_thread(worker)
    try:
        publish(rabbit.url, queue, ["a", "b", "c"])  # far fewer than the 25 it may hold
        wait_until(lambda: len(pg_db.effect_counts()) == 3, "the three commits")
        # Acked while the worker runs and waits for more, not at its stop.
        wait_until(lambda: any(tag == 3 for tag, _ in ack_log.sent), "the ack of tag 3", 10.0)
        assert thread.is_alive()
    finally:
        worker.stop()
        thread.join(30)
    assert not thread.is_alive()


def test_held_acks_go_together_only_up_to_a_gapless_settled_run_with_nothing_held() -> None:
    log: list[tuple[int, bool]] = []
    channel = object()
    d = {tag: Stand(channel, tag, log) for tag in range(1, 12)}
    tracker = AckTracker(multiple=True)
    for tag in (1, 2, 3):  # 2 copied and acked on its own; 1 and 3 held
        tracker.settled([d[tag]])
    tracker.ack_settled([d[1], d[3]], holding=0)
    assert log == [(3, True)]
    log.clear()
    tracker.settled([d[4]])
    tracker.settled([d[5]])
    tracker.ack_settled([d[4], d[5]], holding=1)  # a delivery held for later: one by one
    assert log == [(4, False), (5, False)]
    log.clear()
    tracker.ack_settled([d[6]], holding=0)  # never recorded as settled: alone
    assert log == [(6, False)]
    log.clear()
    tracker.settled([d[6]])
    tracker.settled([d[8]])  # 7 unsettled: a gap
    tracker.ack_settled([d[6], d[8]], holding=0)
    assert log == [(6, False), (8, False)]
    log.clear()
    fresh = object()
    e = {tag: Stand(fresh, tag, log) for tag in (1, 2)}
    tracker.settled([e[1]])
    tracker.ack_settled([d[9], e[1]], holding=0)  # two channels: one by one
    assert log == [(9, False), (1, False)]
    log.clear()
    tracker.ack_settled([], holding=0)
    assert log == []
    assert tracker.multiple_acks == 1
