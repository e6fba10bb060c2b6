"""Issue 15's broker-side bugs, each against the real RabbitMQ and PostgreSQL.

* 3: a delivery whose AMQP properties do not decode (invalid UTF-8, a timestamp past 9999)
  killed every worker: now it is dead-lettered with its raw property bytes, the queue flows;
* 4: a BaseException (``asyncio.CancelledError``) out of ``process`` killed the worker: now
  it is a failed try like any other;
* 7: a refused copy re-sent while deliveries kept arriving wedged the worker: now copies are
  sent one at a time, each confirm matched to its own publish;
* 8: a quorum queue with a delivery limit dropped the messages a stopping worker requeued:
  now the consumed queue dead-letters to ``.dlq`` and a stopping worker requeues nothing;
* 9: a copy too large for a frame (headers near ``frame_max``) or for the broker (a
  decompressed bomb) livelocked the worker: now it reaches ``.dlq`` as it came, trimmed.
"""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import logging
import re
import subprocess
import threading
import time
import uuid
import zlib
from collections.abc import Callable, Iterator

import pika
import pytest
from kombu import Connection
from sqlalchemy import text
from sqlalchemy.orm import Session
from support.databases import Database
from support.effects import record_effect
from support.rabbit import Rabbit
from support.worker import run_in_thread, run_until_idle, wait_until

from inbox import Inbox, Message, ProcessResult
from inbox.broker import Publisher, QueueType, RetryPolicy, Worker
from inbox.delivery import headers as h

QUICK = RetryPolicy((0.2, 0.4), max_tries=3)
IDLE = 1.5
JSON = "application/json"
FRAME_MAX = 131072  # RabbitMQ's default, and py-amqp's and pika's


def make_inbox(db: Database, on_call: Callable[[Message], None] | None = None) -> Inbox:
    inbox = Inbox(db.sessions)

    @inbox.handler("op", name="ops.apply")
    def apply(message: Message, session: Session) -> None:
        record_effect(message, session, "ops.apply")
        if on_call is not None:
            on_call(message)

    return inbox


def pika_parameters(rabbit: Rabbit) -> pika.ConnectionParameters:
    with Connection(rabbit.url) as parsed:
        return pika.ConnectionParameters(
            parsed.hostname,
            parsed.port or 5672,
            parsed.virtual_host or "/",
            pika.PlainCredentials(parsed.userid, parsed.password),
        )


def publish_pika(rabbit: Rabbit, queue: str, body: bytes, properties: pika.BasicProperties) -> None:
    """Publish with another client, which sends whatever bytes it is given."""
    with pika.BlockingConnection(pika_parameters(rabbit)) as connection:
        channel = connection.channel()
        channel.confirm_delivery()
        channel.basic_publish("", queue, body, properties, mandatory=True)


def take_raw(rabbit: Rabbit, queue: str) -> list[tuple[pika.BasicProperties, bytes]]:
    """Every message in ``queue`` as it is on the broker (no decompression by kombu)."""
    taken = []
    with pika.BlockingConnection(pika_parameters(rabbit)) as connection:
        channel = connection.channel()
        while True:
            method, properties, body = channel.basic_get(queue, auto_ack=True)
            if method is None:
                return taken
            taken.append((properties, body))


def publish_good(rabbit: Rabbit, queue: str, ref: str) -> None:
    with Publisher(rabbit.url, routing_key=queue) as publisher:
        publisher.publish("op", {"ref": ref})


# --- 3: properties that do not decode -------------------------------------------------------


class PastYear9999(dt.datetime):
    """A datetime that pika encodes as an AMQP timestamp in the year 10001 (RabbitMQ takes
    it; Python cannot represent it)."""

    def utctimetuple(self) -> time.struct_time:
        return time.struct_time((9999, 12, 400, 0, 0, 0, 0, 1, 0))  # timegm() adds the days


def test_a_delivery_whose_properties_do_not_decode_is_dead_lettered_raw_and_the_queue_flows(
    pg_db: Database, rabbit: Rabbit
) -> None:
    queue = rabbit.queue()
    worker = Worker(make_inbox(pg_db), rabbit.url, [queue], retry=QUICK, stats_interval=None)
    worker.prepare()
    bad_id = b"\xff\xfe-not-utf-8"
    publish_pika(
        rabbit,
        queue,
        b'{"ref": "bad-id"}',
        pika.BasicProperties(message_id=bad_id, type="op", content_type=JSON),  # type: ignore[arg-type]
    )
    publish_pika(
        rabbit,
        queue,
        b'{"ref": "far-future"}',
        pika.BasicProperties(
            message_id=str(uuid.uuid4()),
            type="op",
            content_type=JSON,
            headers={"sent-at": PastYear9999(2020, 1, 1)},
        ),
    )
    publish_good(rabbit, queue, "good")

    run_until_idle(worker, IDLE)  # returns: the worker did not die on either

    assert pg_db.effect_counts() == {("good", "ops.apply"): 1}
    assert rabbit.depth(queue) == 0
    dead = {bytes(m.body): m for m in rabbit.take_all(f"{queue}.dlq")}
    assert sorted(dead) == [b'{"ref": "bad-id"}', b'{"ref": "far-future"}']
    for message in dead.values():
        assert message.headers[h.REASON] == "unreadable-properties"
        assert "do not decode" in message.headers[h.ERROR]
    raw = base64.b64decode(dead[b'{"ref": "bad-id"}'].headers["x-inbox-raw-properties"])
    assert bad_id in raw  # the property bytes as they came, for whoever repairs it
    assert worker.stats.dead_letter_reasons == {"unreadable-properties": 2}


# --- 4: a BaseException out of process ------------------------------------------------------


class CancellingInbox(Inbox):
    """An inbox whose ``process`` lets ``asyncio.CancelledError`` escape for one ref, as
    code around the handlers (a wrapper, an instrumentation) may."""

    def process(self, message: Message) -> ProcessResult:
        if isinstance(message.body, dict) and message.body.get("ref") == "cancelled":
            raise asyncio.CancelledError("cancelled outside any handler")
        return super().process(message)


def test_a_base_exception_out_of_process_or_a_handler_is_a_failed_try_not_a_dead_worker(
    pg_db: Database, rabbit: Rabbit
) -> None:
    queue = rabbit.queue()
    inbox = CancellingInbox(pg_db.sessions)

    @inbox.handler("op", name="ops.apply")
    def apply(message: Message, session: Session) -> None:
        record_effect(message, session, "ops.apply")
        if message.body["ref"] == "cancelled-in-handler":
            raise asyncio.CancelledError("cancelled inside the handler")

    worker = Worker(inbox, rabbit.url, [queue], retry=QUICK, stats_interval=None)
    worker.prepare()
    for ref in ("cancelled", "cancelled-in-handler", "good"):
        publish_good(rabbit, queue, ref)

    run_until_idle(worker, IDLE)  # returns normally

    assert pg_db.effect_counts() == {("good", "ops.apply"): 1}
    dead = {m.decode()["ref"]: m for m in rabbit.take_all(f"{queue}.dlq")}
    assert sorted(dead) == ["cancelled", "cancelled-in-handler"]
    for message in dead.values():
        assert message.headers[h.REASON] == "handler-failed"
        assert message.headers[h.TRIES] == QUICK.max_tries
    assert "CancelledError" in dead["cancelled"].headers[h.ERROR]
    assert worker.stats.failed_tries == 2 * QUICK.max_tries


# --- 7: refused copies re-sent while deliveries keep arriving --------------------------------


def test_refused_copies_resent_while_failing_deliveries_arrive_never_wedge_the_worker(
    pg_db: Database, rabbit: Rabbit
) -> None:
    queue = rabbit.queue()
    failing = [True]

    def fail_while_told(message: Message) -> None:
        if failing[0]:
            raise RuntimeError("down for now")

    worker = Worker(
        make_inbox(pg_db, fail_while_told),
        rabbit.url,
        [queue],
        prefetch=50,
        retry=RetryPolicy((0.2,), max_tries=50),
        stats_interval=None,
    )
    worker.prepare()
    retry_queue = worker.topologies[0].retry_queue(200)
    with Connection(rabbit.url) as connection, connection.channel() as channel:
        channel.queue_delete(retry_queue)  # every retry copy is now returned unroutable
    refs = [f"r{i}" for i in range(60)]
    runner = run_in_thread(worker)
    try:
        with Publisher(rabbit.url, routing_key=queue) as publisher:
            for ref in refs:  # failing deliveries keep arriving while refused copies wait
                publisher.publish("op", {"ref": ref})
                time.sleep(0.05)
        wait_until(lambda: worker.stats.failed_tries >= len(refs), "every ref to fail once")
        worker.prepare()  # the retry queue is back: the held copies can go now
        failing[0] = False
        wait_until(
            lambda: len(pg_db.effect_counts()) == len(refs), "every ref processed", timeout=90
        )
    finally:
        worker.stop()
        runner.join(30)
    assert not runner.is_alive(), "the worker did not honour stop()"
    counts = pg_db.effect_counts()
    assert counts == {(ref, "ops.apply"): 1 for ref in refs}
    assert rabbit.depth(queue) == 0
    assert rabbit.depth(f"{queue}.dlq") == 0


def test_copies_nacked_while_failing_deliveries_arrive_never_wedge_the_worker(
    pg_db: Database, rabbit: Rabbit, queue_policy: Callable[[str, str], None]
) -> None:
    # The reported wedge: a refused copy re-sent between deliveries waited for its confirm
    # while a failing delivery published its own copy on the same channel; one confirm for
    # both left a wait that never ended, and the worker never honoured its stop.
    queue = rabbit.queue()
    failing = [True]

    def fail_while_told(message: Message) -> None:
        if failing[0]:
            raise RuntimeError("down for now")

    inbox = make_inbox(pg_db, fail_while_told)
    retry = RetryPolicy((0.05,), max_tries=1000)
    worker = Worker(
        inbox,
        rabbit.url,
        [queue],
        prefetch=100,
        queue_type=QueueType.QUORUM,
        retry=retry,
        stats_interval=None,
    )
    worker.prepare()
    # A full retry queue (reject-publish overflow): RabbitMQ nacks every retry copy.
    queue_policy(worker.topologies[0].retry_queue(50), '{"max-length": 0}')
    stop_publishing = threading.Event()
    sent: list[str] = []

    def keep_publishing() -> None:
        with Publisher(rabbit.url, routing_key=queue) as publisher:
            while not stop_publishing.is_set():
                ref = f"r{len(sent)}"
                publisher.publish("op", {"ref": ref})
                sent.append(ref)
                time.sleep(0.002)

    publishing = threading.Thread(target=keep_publishing, daemon=True)
    runner = run_in_thread(worker)
    publishing.start()
    time.sleep(8)
    stop_publishing.set()
    publishing.join(10)
    worker.stop()
    runner.join(30)
    assert not runner.is_alive(), f"the worker is wedged: {worker.stats.summary()}"
    assert worker.stats.failed_tries > 0

    failing[0] = False
    queue_policy(worker.topologies[0].retry_queue(50), '{"max-length": 100000}')
    again = Worker(inbox, rabbit.url, [queue], queue_type=QueueType.QUORUM, retry=retry)
    run_until_idle(again, IDLE)
    assert pg_db.effect_counts() == {(ref, "ops.apply"): 1 for ref in sent}


# --- 8: quorum queues with a delivery limit -------------------------------------------------


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


@pytest.fixture
def queue_policy() -> Iterator[Callable[[str, str], None]]:
    """Apply a policy definition to one queue (the last one given for a queue wins)."""
    names: list[str] = []

    def apply(queue: str, definition: str) -> None:
        name = f"{queue}-policy"
        set_policy(name, f"^{re.escape(queue)}$", definition)
        names.append(name)

    yield apply
    for name in dict.fromkeys(names):
        clear_policy(name)


@pytest.fixture
def delivery_limit(rabbit: Rabbit) -> Iterator[Callable[[str, int], None]]:
    """Give a queue a delivery limit by policy (as RabbitMQ 4 does by default)."""
    names: list[str] = []

    def limit(queue: str, deliveries: int) -> None:
        name = f"{queue}-limit"
        set_policy(name, f"^{re.escape(queue)}$", f'{{"delivery-limit": {deliveries}}}')
        names.append(name)

    yield limit
    for name in names:
        clear_policy(name)


def test_clean_restarts_on_a_quorum_queue_with_a_delivery_limit_lose_nothing(
    pg_db: Database, rabbit: Rabbit, delivery_limit: Callable[[str, int], None]
) -> None:
    queue = rabbit.queue()
    refs = [f"q{i}" for i in range(10)]
    current: list[Worker] = []

    def stop_at_the_first_message(message: Message) -> None:
        if current:
            current.pop().stop()  # a clean stop with nine more deliveries in hand

    inbox = make_inbox(pg_db, stop_at_the_first_message)
    Worker(inbox, rabbit.url, [queue], queue_type=QueueType.QUORUM).prepare()
    delivery_limit(queue, 1)
    with Publisher(rabbit.url, routing_key=queue) as publisher:
        for ref in refs:
            publisher.publish("op", {"ref": ref})

    requeued = 0
    for _ in range(4):
        worker = Worker(
            inbox, rabbit.url, [queue], queue_type=QueueType.QUORUM, prefetch=10, retry=QUICK
        )
        current.append(worker)
        run_until_idle(worker, IDLE)  # stopped by the first message it takes, if any
        requeued += worker.stats.requeued_on_stop  # the old name: the test runs on both
    current.clear()
    last = Worker(inbox, rabbit.url, [queue], queue_type=QueueType.QUORUM, retry=QUICK)
    run_until_idle(last, IDLE)

    # Each requeue would count against the limit of 1: nothing was dropped, none happened.
    assert pg_db.effect_counts() == {(ref, "ops.apply"): 1 for ref in refs}
    assert requeued == 0
    assert rabbit.depth(f"{queue}.dlq") == 0


def test_what_a_quorum_queue_drops_past_its_delivery_limit_lands_in_the_dlq(
    rabbit: Rabbit, delivery_limit: Callable[[str, int], None]
) -> None:
    queue = rabbit.queue()
    inbox = Inbox(Session)  # never used: the worker only declares its topology
    Worker(inbox, rabbit.url, [queue], queue_type=QueueType.QUORUM).prepare()
    delivery_limit(queue, 1)
    publish_good(rabbit, queue, "dropped")
    with pika.BlockingConnection(pika_parameters(rabbit)) as connection:
        channel = connection.channel()
        deadline = time.monotonic() + 30
        while rabbit.depth(f"{queue}.dlq") == 0:
            assert time.monotonic() < deadline, "RabbitMQ never dead-lettered the message"
            method, _, _ = channel.basic_get(queue, auto_ack=False)
            if method is not None:  # a consumer that keeps giving it back
                channel.basic_reject(method.delivery_tag, requeue=True)
            time.sleep(0.05)
    [(properties, body)] = take_raw(rabbit, f"{queue}.dlq")
    assert b"dropped" in body
    assert properties.headers["x-first-death-reason"] == "delivery_limit"


def test_a_quorum_queue_declared_by_an_older_version_is_kept_with_a_warning(
    pg_db: Database, rabbit: Rabbit, caplog: pytest.LogCaptureFixture
) -> None:
    queue = rabbit.queue()
    with Connection(rabbit.url) as connection, connection.channel() as channel:
        channel.queue_declare(
            queue, durable=True, auto_delete=False, arguments={"x-queue-type": "quorum"}
        )
    caplog.set_level(logging.WARNING, logger="inbox.worker")
    worker = Worker(make_inbox(pg_db), rabbit.url, [queue], queue_type="quorum", retry=QUICK)

    worker.prepare()  # RabbitMQ refuses the new arguments on the existing queue: not fatal
    publish_good(rabbit, queue, "still-consumed")
    run_until_idle(worker, IDLE)

    assert pg_db.effect_counts() == {("still-consumed", "ops.apply"): 1}
    # Once per connection (the check at prepare(), then the worker's own connection).
    warning = next(r.getMessage() for r in caplog.records if "exists with other" in r.getMessage())
    assert "PRECONDITION_FAILED" in warning
    assert "rabbitmqctl set_policy" in warning
    assert f'"dead-letter-routing-key":"{queue}.dlq"' in warning


# --- 9: copies that cannot be sent as they are ----------------------------------------------


def test_a_copy_whose_headers_outgrow_the_frame_is_dead_lettered_trimmed_not_livelocked(
    pg_db: Database, rabbit: Rabbit
) -> None:
    queue = rabbit.queue()

    def fail_loudly(message: Message) -> None:
        if message.body["ref"] == "big-headers":
            raise ValueError("declined: " + "why " * 200)

    worker = Worker(
        make_inbox(pg_db, fail_loudly), rabbit.url, [queue], retry=QUICK, stats_interval=None
    )
    worker.prepare()
    filler = "x" * (FRAME_MAX - 8 - 12 - 600)  # the delivery itself fits in one frame
    publish_pika(
        rabbit,
        queue,
        b'{"ref": "big-headers"}',
        pika.BasicProperties(
            message_id=str(uuid.uuid4()),
            type="op",
            content_type=JSON,
            headers={"filler": filler, "trace": "t-1"},
        ),
    )
    publish_good(rabbit, queue, "behind-it")
    runner = run_in_thread(worker, IDLE)
    try:
        wait_until(lambda: rabbit.depth(f"{queue}.dlq") == 1, "the dead letter", timeout=60)
        runner.join(30)
    finally:
        worker.stop()
        runner.join(30)

    assert pg_db.effect_counts() == {("behind-it", "ops.apply"): 1}
    [dead] = rabbit.take_all(f"{queue}.dlq")
    assert dead.headers[h.REASON] == "copy-too-large"
    assert "filler" not in dead.headers  # trimmed: the delivery's own headers dropped...
    assert "filler, trace" in dead.headers[h.ERROR]  # ...and named
    assert dead.headers[h.TRIES] == 1  # the bookkeeping stays: it failed once
    assert bytes(dead.body) == b'{"ref": "big-headers"}'
    assert worker.stats.dead_letter_reasons["copy-too-large"] == 1


def zip_bomb(size: int) -> bytes:
    """``size`` zero bytes, zlib-compressed (about a thousandth of the size)."""
    compressor = zlib.compressobj(9)
    chunk = bytes(1024 * 1024)
    parts = [compressor.compress(chunk) for _ in range(size // len(chunk))]
    return b"".join([*parts, compressor.flush()])


def test_a_compressed_bomb_is_dead_lettered_as_it_came_not_decompressed_in_full(
    pg_db: Database, rabbit: Rabbit
) -> None:
    queue = rabbit.queue()
    worker = Worker(make_inbox(pg_db), rabbit.url, [queue], retry=QUICK, stats_interval=None)
    worker.prepare()
    bomb = zip_bomb(200 * 1024 * 1024)  # past RabbitMQ's 128 MiB maximum message size
    publish_pika(
        rabbit,
        queue,
        bomb,
        pika.BasicProperties(
            message_id=str(uuid.uuid4()),
            type="op",
            content_type=JSON,
            headers={"compression": "application/x-gzip"},
        ),
    )
    publish_good(rabbit, queue, "behind-it")
    runner = run_in_thread(worker, IDLE)
    try:
        wait_until(lambda: rabbit.depth(f"{queue}.dlq") == 1, "the dead letter", timeout=60)
        runner.join(30)
    finally:
        worker.stop()
        runner.join(30)

    assert pg_db.effect_counts() == {("behind-it", "ops.apply"): 1}
    [(properties, body)] = take_raw(rabbit, f"{queue}.dlq")
    assert properties.headers[h.REASON] == "body-too-large"
    assert properties.headers["compression"] == "application/x-gzip"
    assert body == bomb  # the original encoding, a few hundred KiB


# --- A handler that ends the inbox's transaction (issue 10) ---------------------------------


def test_a_handler_that_commits_under_the_inbox_is_dead_lettered_at_once_as_transaction_ended(
    pg_db: Database, rabbit: Rabbit
) -> None:
    queue = rabbit.queue()

    def commit_then_fail(message: Message) -> None:
        if message.body["ref"] == "early-commit":
            session = current_session[0]
            session.execute(text("COMMIT"))  # the claim is now committed on its own
            raise RuntimeError("failed after the commit")

    current_session: list[Session] = []
    inbox = Inbox(pg_db.sessions)

    @inbox.handler("op", name="ops.apply")
    def apply(message: Message, session: Session) -> None:
        current_session[:] = [session]
        record_effect(message, session, "ops.apply")
        commit_then_fail(message)

    worker = Worker(inbox, rabbit.url, [queue], retry=QUICK, stats_interval=None)
    worker.prepare()
    publish_good(rabbit, queue, "early-commit")
    publish_good(rabbit, queue, "good")

    run_until_idle(worker, IDLE)

    # A retry would find the claim committed and skip the handler as a duplicate: the
    # message goes to the dead letters on its first try, for a person to reconcile.
    [dead] = rabbit.take_all(f"{queue}.dlq")
    assert dead.headers[h.REASON] == "transaction-ended"
    assert dead.headers[h.TRIES] == 1
    assert worker.stats.retried == 0
    assert ("good", "ops.apply") in pg_db.effect_counts()
