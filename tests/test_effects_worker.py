"""Effects through the worker's batch mode (kombu's in-memory broker, a real database): a
batch that rolls back and is bisected re-runs its handlers, which get their effects' stored
results; an at-most-once effect left failed is dead-lettered at once from a batch too."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kombu import Connection
from sqlalchemy.orm import Session
from support.databases import Database
from support.effects import record_effect
from support.ledger import Provider, effect_store

from inbox import Inbox, Message
from inbox.broker import Publisher, RetryPolicy, Worker
from inbox.broker._idle import delete_queues, run_until_idle
from inbox.delivery import headers as h

QUICK = RetryPolicy((0.05,), max_tries=3)


@pytest.fixture
def queue() -> str:
    return f"mem-effects-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def inbox(db: Database, tmp_path: Path) -> Iterator[Inbox]:
    store = effect_store(db, tmp_path)
    yield Inbox(db.sessions, effect_store=store)
    if store is not None:
        store.dispose()


def take_memory(queue: str) -> list[Any]:
    taken = []
    with Connection("memory://") as connection:
        simple = connection.SimpleQueue(queue)
        while True:
            try:
                message = simple.get(timeout=0.2)
            except simple.Empty:
                return taken
            message.ack()
            taken.append(message)


def run_batch(inbox: Inbox, queue: str, refs: list[str]) -> Worker:
    worker = Worker(inbox, "memory://", [queue], prefetch=10, batch_size=10, retry=QUICK)
    worker.prepare()
    try:
        with Publisher("memory://", routing_key=queue) as publisher:
            for ref in refs:
                publisher.publish("op", {"ref": ref})
        run_until_idle(worker, 0.5)
    finally:
        delete_queues(worker)
    return worker


def test_a_bisected_batch_gets_stored_results_and_calls_each_effect_once(
    db: Database, inbox: Inbox, queue: str
) -> None:
    provider = Provider()
    receipts: dict[str, set[str]] = {}
    failing = {"b3"}

    @inbox.handler("op", name="sms.send")
    def send(message: Message, session: Session) -> None:
        ref = message.body["ref"]
        receipt = inbox.effect("provider.send", provider.send)
        receipts.setdefault(ref, set()).add(receipt["id"])
        record_effect(message, session, "sms.send")
        if ref in failing:
            failing.discard(ref)
            raise RuntimeError("failed after sending, once")

    refs = [f"b{i}" for i in range(8)]
    worker = run_batch(inbox, queue, refs)
    assert len(provider.calls) == len(set(provider.calls)) == 8
    assert all(len(ids) == 1 for ids in receipts.values())  # the stored receipt every time
    assert db.effect_counts() == {(ref, "sms.send"): 1 for ref in refs}
    assert (worker.stats.processed, worker.stats.dead_lettered) == (8, 0)


def test_an_uncertain_effect_in_a_batch_is_dead_lettered_at_once(
    db: Database, inbox: Inbox, queue: str
) -> None:
    provider = Provider(failures=1)

    @inbox.handler("op", name="sms.send")
    def send(message: Message, session: Session) -> None:
        if message.body["ref"] == "u1":
            inbox.effect("provider.send", provider.send, mode="at-most-once")
        record_effect(message, session, "sms.send")

    worker = run_batch(inbox, queue, ["u0", "u1", "u2"])
    [dead] = take_memory(f"{queue}.dlq")
    assert dead.headers[h.REASON] == "uncertain-effect"
    # The bisection re-ran u1 alone in the same delivery and found its effect failed.
    assert dead.headers[h.TRIES] == 1
    assert len(provider.calls) == 1
    assert db.effect_counts() == {("u0", "sms.send"): 1, ("u2", "sms.send"): 1}
    assert worker.stats.dead_lettered == 1
