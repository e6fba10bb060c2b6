"""The worker and publisher against the real RabbitMQ and PostgreSQL, in one process.

Each test publishes through the real broker, runs the worker until it has been idle for a
moment, then reads the database and the queues: effects committed exactly once, the queue
drained, dead letters where they belong with the reason in their headers.
"""

from __future__ import annotations

import json
import logging
import re
import subprocess
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from typing import Any

import pika
import pytest
from kombu import Connection
from sqlalchemy import text
from sqlalchemy.orm import Session
from support.databases import Database
from support.effects import record_effect
from support.rabbit import Rabbit
from support.worker import run_until_idle

from inbox import Inbox, Message, PublishError
from inbox.broker import DeadLetterReason, Publisher, QueueType, RetryPolicy, Worker
from inbox.delivery import headers as h

QUICK = RetryPolicy((0.2, 0.4), max_tries=3)
IDLE = 1.5  # longer than the longest retry delay the tests use, so idle means done


def make_inbox(db: Database, on_call: Callable[[Message], None] | None = None) -> Inbox:
    inbox = Inbox(db.sessions)

    @inbox.handler("op", name="ops.apply")
    def apply(message: Message, session: Session) -> None:
        record_effect(message, session, "ops.apply")
        if on_call is not None:
            on_call(message)

    return inbox


def run_worker(worker: Worker, idle: float = IDLE) -> Worker:
    run_until_idle(worker, idle)
    return worker


def refs_once(db: Database, refs: range | list[str]) -> bool:
    counts = db.effect_counts()
    return all(counts.get((str(ref), "ops.apply")) == 1 for ref in refs) and len(counts) == len(
        refs
    )


@pytest.mark.parametrize("queue_type", list(QueueType))
def test_every_duplicate_is_skipped_and_the_queue_drains(
    pg_db: Database, rabbit: Rabbit, queue_type: QueueType
) -> None:
    queue = rabbit.queue()
    worker = Worker(
        make_inbox(pg_db), rabbit.url, [queue], prefetch=100, queue_type=queue_type, retry=QUICK
    )
    worker.prepare()
    published = 0
    with Publisher(rabbit.url, routing_key=queue) as publisher:
        for ref in range(1000):
            message_id = publisher.publish("op", {"ref": ref})
            copies = 2 if ref % 10 else 3
            for _ in range(copies - 1):
                publisher.publish("op", {"ref": ref}, message_id=message_id)
            published += copies

    run_worker(worker)

    assert refs_once(pg_db, range(1000))
    assert worker.stats.processed == 1000
    assert worker.stats.duplicates == published - 1000
    assert worker.stats.acked == published
    assert rabbit.depth(queue) == 0
    assert rabbit.depth(f"{queue}.dlq") == 0


def test_idempotency_key_deduplicates_resends_with_fresh_ids(
    pg_db: Database, rabbit: Rabbit
) -> None:
    queue = rabbit.queue()
    worker = Worker(make_inbox(pg_db), rabbit.url, [queue], retry=QUICK)
    worker.prepare()
    with Publisher(rabbit.url, routing_key=queue) as publisher:
        ids = {
            publisher.publish("op", {"ref": "order-7"}, idempotency_key="order-7") for _ in range(3)
        }
    assert len(ids) == 3

    run_worker(worker)

    assert pg_db.effect_counts() == {("order-7", "ops.apply"): 1}
    assert worker.stats.duplicates == 2


@pytest.mark.parametrize("queue_type", list(QueueType))
def test_a_handler_that_fails_twice_then_succeeds_commits_once_and_shows_its_tries(
    pg_db: Database, rabbit: Rabbit, queue_type: QueueType, caplog: pytest.LogCaptureFixture
) -> None:
    queue = rabbit.queue()
    seen_tries: list[object] = []

    def fail_twice(message: Message) -> None:
        seen_tries.append(message.headers.get(h.TRIES))
        if len(seen_tries) <= 2:
            raise RuntimeError(f"flaky downstream, call {len(seen_tries)}")

    policy = RetryPolicy((0.2, 0.4), max_tries=3)
    worker = Worker(
        make_inbox(pg_db, fail_twice), rabbit.url, [queue], retry=policy, queue_type=queue_type
    )
    worker.prepare()
    with Publisher(rabbit.url, routing_key=queue) as publisher:
        publisher.publish("op", {"ref": "r1"})

    with caplog.at_level(logging.WARNING, logger="inbox.worker"):
        run_worker(worker)

    assert pg_db.effect_counts() == {("r1", "ops.apply"): 1}
    assert seen_tries == [None, 1, 2]
    assert worker.stats.failed_tries == 2
    assert worker.stats.retried == 2
    assert worker.stats.dead_lettered == 0
    assert "try 1/3 failed" in caplog.text
    assert "try 2/3 failed" in caplog.text
    assert "RuntimeError: flaky downstream, call 2" in caplog.text
    assert rabbit.depth(queue) == 0
    assert rabbit.depth(f"{queue}.dlq") == 0


@pytest.mark.parametrize("queue_type", list(QueueType))
def test_a_handler_that_always_fails_is_dead_lettered_after_max_tries_with_the_reason(
    pg_db: Database, rabbit: Rabbit, queue_type: QueueType
) -> None:
    queue = rabbit.queue()
    calls: list[str] = []

    def always_fail(message: Message) -> None:
        calls.append(str(message.id))
        raise ValueError("card declined")

    worker = Worker(
        make_inbox(pg_db, always_fail), rabbit.url, [queue], retry=QUICK, queue_type=queue_type
    )
    worker.prepare()
    with Publisher(rabbit.url, routing_key=queue) as publisher:
        message_id = publisher.publish(
            "op", {"ref": "r1", "amount": "9.90"}, headers={"tenant": "acme"}
        )

    run_worker(worker)

    assert len(calls) == QUICK.max_tries == 3
    assert pg_db.effect_counts() == {}
    assert rabbit.depth(queue) == 0
    [dead] = rabbit.take_all(f"{queue}.dlq")
    assert dead.properties["message_id"] == str(message_id)
    assert dead.properties["type"] == "op"
    assert dead.content_type == "application/json"
    assert json.loads(as_bytes(dead.body)) == {"ref": "r1", "amount": "9.90"}
    assert dead.headers["tenant"] == "acme"
    assert dead.headers[h.REASON] == DeadLetterReason.HANDLER_FAILED
    assert dead.headers[h.TRIES] == 3
    assert dead.headers[h.ERROR] == "ops.apply: ValueError: card declined"
    assert dead.headers[h.FAILED_HANDLERS] == "ops.apply"
    assert dead.headers[h.SOURCE_QUEUE] == queue
    assert dead.headers[h.FIRST_FAILURE] < dead.headers[h.LAST_FAILURE]
    assert dead.delivery_info["routing_key"] == f"{queue}.dlq"
    assert worker.stats.dead_letter_reasons == Counter({"handler-failed": 1})


def test_backoff_does_not_hold_up_other_messages(pg_db: Database, rabbit: Rabbit) -> None:
    queue = rabbit.queue()
    order: list[str] = []

    def fail_first_try(message: Message) -> None:
        ref = message.body["ref"]
        order.append(ref)
        if ref == "slow" and order.count("slow") == 1:
            raise RuntimeError("try later")

    policy = RetryPolicy((1.0,), max_tries=2)
    worker = Worker(
        make_inbox(pg_db, fail_first_try), rabbit.url, [queue], prefetch=1, retry=policy
    )
    worker.prepare()
    with Publisher(rabbit.url, routing_key=queue) as publisher:
        publisher.publish("op", {"ref": "slow"})
        for ref in range(20):
            publisher.publish("op", {"ref": str(ref)})

    run_worker(worker, idle=2.0)

    # The retry waited on the broker while the worker went on with the other 20.
    assert order[0] == "slow"
    assert order[-1] == "slow"
    assert order[1:-1] == [str(ref) for ref in range(20)]
    assert refs_once(pg_db, ["slow", *[str(ref) for ref in range(20)]])


def as_bytes(body: bytes | str) -> bytes:
    """py-amqp hands bodies with a text content_encoding over as str."""
    return body.encode() if isinstance(body, str) else body


def publish_raw(rabbit: Rabbit, queue: str, body: bytes, **properties: Any) -> None:
    with Connection(rabbit.url) as connection:
        producer = connection.Producer()
        producer.publish(body, routing_key=queue, **properties)


def test_invalid_deliveries_are_dead_lettered_with_their_reason_and_the_worker_goes_on(
    pg_db: Database, rabbit: Rabbit
) -> None:
    queue = rabbit.queue()
    worker = Worker(make_inbox(pg_db), rabbit.url, [queue], retry=QUICK)
    worker.prepare()
    json_type = {"content_type": "application/json", "content_encoding": "utf-8"}
    good = json.dumps({"ref": "ok"}).encode()
    cases = {
        "missing-message-id": (good, {**json_type, "type": "op"}),
        "invalid-message-id": (good, {**json_type, "type": "op", "message_id": "not-a-uuid"}),
        "undecodable-body": (
            b'{"ref": ',
            {**json_type, "type": "op", "message_id": str(uuid.uuid4())},
        ),
        "unhandled-type": (
            good,
            {**json_type, "type": "nobody.handles", "message_id": str(uuid.uuid4())},
        ),
        "invalid-message": (
            good,
            {
                **json_type,
                "type": "op",
                "message_id": str(uuid.uuid4()),
                "headers": {"idempotency-key": 42},
            },
        ),
    }
    for body, properties in cases.values():
        publish_raw(rabbit, queue, body, **properties)
    with Publisher(rabbit.url, routing_key=queue) as publisher:
        publisher.publish("op", {"ref": "ok"})

    run_worker(worker)

    assert pg_db.effect_counts() == {("ok", "ops.apply"): 1}
    dead = rabbit.take_all(f"{queue}.dlq")
    reasons = {m.headers[h.REASON]: m for m in dead}
    assert sorted(reasons) == sorted(cases)
    for reason, (body, _) in cases.items():
        assert as_bytes(reasons[reason].body) == body
        assert reasons[reason].headers[h.ERROR]
        assert h.TRIES not in reasons[reason].headers
    assert "not-a-uuid" in reasons["invalid-message-id"].headers[h.ERROR]
    assert "not valid JSON" in reasons["undecodable-body"].headers[h.ERROR]
    assert rabbit.depth(queue) == 0
    assert worker.stats.acked == 1 + len(cases)  # the dead letters' deliveries are acked too


def test_unknown_content_types_reach_the_handler_as_bytes_and_are_never_unpickled(
    pg_db: Database, rabbit: Rabbit
) -> None:
    queue = rabbit.queue()
    bodies: list[object] = []
    inbox = Inbox(pg_db.sessions)

    @inbox.handler("blob", name="blobs.keep")
    def keep(message: Message, session: Session) -> None:
        bodies.append(message.body)

    worker = Worker(inbox, rabbit.url, [queue], retry=QUICK)
    worker.prepare()
    payload = b"\x80\x04K\x01."  # pickle of 1: must stay bytes
    publish_raw(
        rabbit,
        queue,
        payload,
        content_type="application/x-python-serialize",
        content_encoding="binary",
        type="blob",
        message_id=str(uuid.uuid4()),
    )
    publish_raw(
        rabbit,
        queue,
        "grüße".encode("latin-1"),
        content_type="text/plain; charset=latin-1",
        content_encoding="binary",
        type="blob",
        message_id=str(uuid.uuid4()),
    )

    run_worker(worker)

    assert bodies == [payload, "grüße"]


def test_messages_from_another_amqp_client_are_consumed(pg_db: Database, rabbit: Rabbit) -> None:
    queue = rabbit.queue()
    worker = Worker(make_inbox(pg_db), rabbit.url, [queue], retry=QUICK)
    worker.prepare()
    ids = [str(uuid.uuid4()) for _ in range(5)]
    # pika spells the default vhost "%2F" where kombu spells it "/".
    connection = pika.BlockingConnection(pika.URLParameters(rabbit.url.rstrip("/") + "/%2F"))
    try:
        channel = connection.channel()
        for ref, message_id in enumerate(ids):
            for _ in range(2):  # each sent twice: the second is a duplicate
                channel.basic_publish(
                    exchange="",
                    routing_key=queue,
                    body=json.dumps({"ref": ref}).encode(),
                    properties=pika.BasicProperties(
                        message_id=message_id, type="op", content_type="application/json"
                    ),
                )
    finally:
        connection.close()

    run_worker(worker)

    assert refs_once(pg_db, range(5))
    assert worker.stats.duplicates == 5
    assert rabbit.depth(f"{queue}.dlq") == 0


def test_publishing_to_a_queue_that_does_not_exist_is_an_error_not_a_silent_loss(
    rabbit: Rabbit,
) -> None:
    with (
        Publisher(rabbit.url, routing_key=rabbit.queue("missing")) as publisher,
        pytest.raises(PublishError, match="not routed to any queue"),
    ):
        publisher.publish("op", {"ref": 1})


def test_publisher_reports_a_missing_exchange_and_a_nack_as_publish_errors(
    rabbit: Rabbit,
) -> None:
    queue = rabbit.queue()
    Worker(Inbox(lambda: None), rabbit.url, [queue], retry=QUICK).prepare()  # type: ignore[arg-type,return-value]
    policy = f"{rabbit.prefix}-full"
    with Publisher(rabbit.url, routing_key=queue) as publisher:
        with pytest.raises(PublishError, match="NOT_FOUND"):
            publisher.publish("op", {}, exchange=f"{rabbit.prefix}-no-such-exchange")
        publisher.publish("op", {"ref": "fits"})  # the publisher recovers from the error
        set_policy(
            policy, f"^{re.escape(queue)}$", '{"max-length": 1, "overflow": "reject-publish"}'
        )
        try:
            with pytest.raises(PublishError, match="nacked"):
                publisher.publish("op", {"ref": "does not fit"})
        finally:
            clear_policy(policy)
    assert rabbit.depth(queue) == 1


def test_publishing_to_an_unreachable_broker_is_a_publish_error() -> None:
    with (
        Publisher("amqp://guest:guest@127.0.0.1:1//", routing_key="q") as publisher,
        pytest.raises(PublishError, match=r"could not publish message .*Connection refused"),
    ):
        publisher.publish("op", {"ref": 1})


def set_policy(name: str, pattern: str, definition: str) -> None:
    subprocess.run(
        ["rabbitmqctl", "set_policy", name, pattern, definition, "--apply-to", "queues"],
        check=True,
        capture_output=True,
        timeout=60,
    )


def clear_policy(name: str) -> None:
    subprocess.run(
        ["rabbitmqctl", "clear_policy", name], check=True, capture_output=True, timeout=60
    )


def test_publisher_refuses_what_it_cannot_send(rabbit: Rabbit) -> None:
    with Publisher(rabbit.url, routing_key=rabbit.queue()) as publisher:
        with pytest.raises(TypeError, match="not JSON-serializable"):
            publisher.publish("op", {"when": object()})
        with pytest.raises(ValueError, match="non-empty str"):
            publisher.publish("op", {}, idempotency_key="")
        with pytest.raises(ValueError, match="contradicts"):
            publisher.publish("op", {}, idempotency_key="a", headers={"idempotency-key": "b"})
        with pytest.raises(ValueError, match="UUID"):
            publisher.publish("op", {}, message_id="not-a-uuid")


def test_the_worker_only_checks_queues_when_it_must_not_declare_them(rabbit: Rabbit) -> None:
    inbox = Inbox(lambda: None)  # type: ignore[arg-type,return-value]  # never called
    queue = rabbit.queue()
    checking = Worker(inbox, rabbit.url, [queue], declare=False, retry=QUICK)
    with pytest.raises(Exception, match="NOT_FOUND"):
        checking.prepare()
    Worker(inbox, rabbit.url, [queue], retry=QUICK).prepare()  # declares
    checking.prepare()  # now every queue exists


def test_a_queue_declared_with_another_type_is_refused_at_start(rabbit: Rabbit) -> None:
    inbox = Inbox(lambda: None)  # type: ignore[arg-type,return-value]  # never called
    queue = rabbit.queue()
    Worker(inbox, rabbit.url, [queue], retry=QUICK, queue_type="classic").prepare()
    with pytest.raises(Exception, match="PRECONDITION_FAILED"):
        Worker(inbox, rabbit.url, [queue], retry=QUICK, queue_type="quorum").prepare()
    # Without retry queues to trip over: the consumed queue's own type is refused too.
    with pytest.raises(Exception, match=r"PRECONDITION_FAILED.*x-queue-type"):
        Worker(inbox, rabbit.url, [queue], retry=RetryPolicy((), 1), queue_type="quorum").prepare()


def test_stop_from_another_thread_finishes_the_in_flight_message(
    pg_db: Database, rabbit: Rabbit
) -> None:
    queue = rabbit.queue()
    started = threading.Event()
    release = threading.Event()

    def block(message: Message) -> None:
        started.set()
        release.wait(10)

    worker = Worker(make_inbox(pg_db, block), rabbit.url, [queue], prefetch=5, retry=QUICK)
    worker.prepare()
    with Publisher(rabbit.url, routing_key=queue) as publisher:
        for ref in range(5):
            publisher.publish("op", {"ref": ref})
    runner = threading.Thread(target=worker.run)
    runner.start()
    assert started.wait(10)
    worker.stop()
    release.set()
    runner.join(10)

    assert not runner.is_alive()
    assert worker.stats.acked == 1
    assert pg_db.effect_counts() == {("0", "ops.apply"): 1}
    assert rabbit.depth(queue) == 4  # the prefetched rest went back to the queue untouched


def test_the_in_memory_transport_retries_and_dead_letters_too(pg_db: Database) -> None:
    queue = f"mem-{uuid.uuid4().hex[:8]}"
    calls: Counter[str] = Counter()

    def flaky(message: Message) -> None:
        ref = message.body["ref"]
        calls[ref] += 1
        if ref == "never" or (ref == "once" and calls[ref] == 1):
            raise RuntimeError(f"{ref} failed")

    worker = Worker(make_inbox(pg_db, flaky), "memory://", [queue], retry=QUICK)
    worker.prepare()
    with Publisher("memory://", routing_key=queue) as publisher:
        for ref in ("ok", "once", "never"):
            publisher.publish("op", {"ref": ref})

    run_worker(worker, idle=0.5)

    assert not worker.native_delays
    assert calls == Counter({"ok": 1, "once": 2, "never": 3})
    assert pg_db.effect_counts() == {("ok", "ops.apply"): 1, ("once", "ops.apply"): 1}
    assert worker.stats.dead_letter_reasons == Counter({"handler-failed": 1})
    with Connection("memory://") as connection:
        dead = connection.SimpleQueue(f"{queue}.dlq").get(timeout=1)
        assert dead.headers[h.TRIES] == 3
        assert dead.headers[h.REASON] == "handler-failed"


def test_a_lost_database_connection_is_retried_in_place_not_through_the_broker(
    pg_db: Database, rabbit: Rabbit
) -> None:
    queue = rabbit.queue()
    calls: list[str] = []
    inbox = Inbox(pg_db.sessions)

    @inbox.handler("op", name="ops.apply")
    def apply(message: Message, session: Session) -> None:
        calls.append(message.body["ref"])
        if len(calls) == 1:  # the server ends this very connection, mid-transaction
            session.execute(text("SELECT pg_terminate_backend(pg_backend_pid())"))
        record_effect(message, session, "ops.apply")

    worker = Worker(inbox, rabbit.url, [queue], retry=QUICK)
    worker.prepare()
    with Publisher(rabbit.url, routing_key=queue) as publisher:
        publisher.publish("op", {"ref": "r1"})

    run_worker(worker)

    assert calls == ["r1", "r1"]
    assert pg_db.effect_counts() == {("r1", "ops.apply"): 1}
    assert worker.stats.failed_tries == 0
    assert worker.stats.retried == 0
    assert worker.stats.acked == 1


def run_in_thread(worker: Worker) -> threading.Thread:
    runner = threading.Thread(target=worker.run, daemon=True)
    runner.start()
    return runner


def wait_until(condition: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


def test_kombu_compressed_messages_are_processed_and_their_copies_stay_readable(
    pg_db: Database, rabbit: Rabbit
) -> None:
    queue = rabbit.queue()
    bodies: list[object] = []

    def fail_on_poison(message: Message) -> None:
        bodies.append(message.body)
        if message.body["ref"] == "poison":
            raise ValueError("poison")

    worker = Worker(
        make_inbox(pg_db, fail_on_poison),
        rabbit.url,
        [queue],
        retry=RetryPolicy((0.2,), max_tries=2),
    )
    worker.prepare()
    with Connection(rabbit.url) as connection:
        producer = connection.Producer()
        for ref in ("zipped", "poison"):
            producer.publish(
                {"ref": ref},
                routing_key=queue,
                serializer="json",
                compression="zlib",
                message_id=str(uuid.uuid4()),
                type="op",
            )
        producer.publish(
            b"not zlib at all",
            routing_key=queue,
            content_type="application/json",
            content_encoding="binary",
            headers={"compression": "application/x-gzip"},
            message_id=str(uuid.uuid4()),
            type="op",
        )

    run_worker(worker)

    assert pg_db.effect_counts() == {("zipped", "ops.apply"): 1}
    assert bodies.count({"ref": "poison"}) == 2  # the retry copy decoded as well
    dead = {m.headers[h.REASON]: m for m in rabbit.take_all(f"{queue}.dlq")}
    assert sorted(dead) == ["handler-failed", "undecodable-body"]
    # The copies go out as they came, compressed (a decompressed copy could exceed the
    # broker's maximum message size); kombu decompresses them again on receipt.
    assert dead["handler-failed"].headers["compression"] == "application/x-gzip"
    assert json.loads(as_bytes(dead["handler-failed"].body)) == {"ref": "poison"}
    assert "cannot decompress" in dead["undecodable-body"].headers[h.ERROR]


def test_a_dead_letter_queue_deleted_under_the_worker_loses_nothing(
    pg_db: Database, rabbit: Rabbit, caplog: pytest.LogCaptureFixture
) -> None:
    queue = rabbit.queue()
    worker = Worker(make_inbox(pg_db), rabbit.url, [queue], retry=QUICK, stats_interval=None)
    worker.prepare()
    caplog.set_level(logging.INFO, logger="inbox.worker")
    runner = run_in_thread(worker)
    try:
        wait_until(lambda: "consuming" in caplog.text)
        with rabbit.connection() as connection, connection.channel() as channel:
            channel.queue_delete(f"{queue}.dlq")
        with Publisher(rabbit.url, routing_key=queue) as publisher:
            publisher.publish("nobody.handles", {"ref": "lost?"})
            publisher.publish("op", {"ref": "fine"})
        wait_until(lambda: "the broker refused its copy" in caplog.text)
        wait_until(lambda: pg_db.effect_counts() == {("fine", "ops.apply"): 1})
        assert rabbit.depth(f"{queue}.dlq") == 0
        Worker(make_inbox(pg_db), rabbit.url, [queue], retry=QUICK).prepare()  # operator fix
        wait_until(lambda: rabbit.depth(f"{queue}.dlq") == 1)
    finally:
        worker.stop()
        runner.join(20)
    assert not runner.is_alive()
    [dead] = rabbit.take_all(f"{queue}.dlq")
    assert dead.headers[h.REASON] == "unhandled-type"
    assert rabbit.depth(queue) == 0


def test_a_nacked_dead_letter_is_kept_and_the_worker_goes_on(
    pg_db: Database, rabbit: Rabbit, caplog: pytest.LogCaptureFixture
) -> None:
    queue = rabbit.queue()
    policy = f"{rabbit.prefix}-full-dlq"
    set_policy(
        policy, f"^{re.escape(queue)}\\.dlq$", '{"max-length": 0, "overflow": "reject-publish"}'
    )
    worker = Worker(make_inbox(pg_db), rabbit.url, [queue], retry=QUICK, stats_interval=None)
    caplog.set_level(logging.INFO, logger="inbox.worker")
    try:
        worker.prepare()
        runner = run_in_thread(worker)
        with Publisher(rabbit.url, routing_key=queue) as publisher:
            publisher.publish("nobody.handles", {"ref": "x"})
            for ref in range(3):
                publisher.publish("op", {"ref": ref})
        wait_until(lambda: "nacked" in caplog.text)
        wait_until(lambda: len(pg_db.effect_counts()) == 3)
        assert runner.is_alive()
    finally:
        clear_policy(policy)
    wait_until(lambda: rabbit.depth(f"{queue}.dlq") == 1)
    worker.stop()
    runner.join(20)
    assert not runner.is_alive()
    assert rabbit.depth(queue) == 0


def test_stop_ends_the_reconnect_loop_when_the_broker_is_down(pg_db: Database) -> None:
    worker = Worker(make_inbox(pg_db), "amqp://guest:guest@127.0.0.1:1//", ["q"])
    runner = run_in_thread(worker)
    time.sleep(1.0)
    assert runner.is_alive()  # still trying to connect
    worker.stop()
    runner.join(10)
    assert not runner.is_alive()


def test_stopping_the_in_memory_worker_hands_back_the_retries_it_holds(pg_db: Database) -> None:
    queue = f"mem-{uuid.uuid4().hex[:8]}"
    failing = [True]

    def fail_while_told(message: Message) -> None:
        if failing[0]:
            raise RuntimeError("not yet")

    slow = RetryPolicy((60.0,), max_tries=3)
    worker = Worker(make_inbox(pg_db, fail_while_told), "memory://", [queue], retry=slow)
    worker.prepare()
    with Publisher("memory://", routing_key=queue) as publisher:
        publisher.publish("op", {"ref": "held"})
    runner = run_in_thread(worker)
    wait_until(lambda: worker.stats.retried == 1)
    worker.stop()
    runner.join(10)
    assert not runner.is_alive()

    failing[0] = False
    again = Worker(make_inbox(pg_db, fail_while_told), "memory://", [queue], retry=slow)
    run_worker(again, idle=0.5)
    assert again.stats.acked == 1
    assert pg_db.effect_counts() == {("held", "ops.apply"): 1}
