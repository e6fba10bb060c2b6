"""Hostile input at the worker: broker deliveries of every shape (ids, bodies, content types
and encodings, headers, idempotency keys, compression, types) on kombu's in-memory transport
and SQLite, and the bugs found there on RabbitMQ. Each delivery is acked once, with its effect
committed exactly once per claim key, or dead-lettered with its documented reason and nothing
of it lost; nothing crashes the worker. test_broker*.py holds the common cases; this file
covers what they leave out (strategies in support/strategies.py, the oracle in
support/hostile.py).

Tests whose comment starts "Regression:" reproduce library bugs the hostile-input suite found
(at 5467c00); each comment says what used to happen.
"""

from __future__ import annotations

import math
import threading
import uuid
import zlib
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pika
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import event as note_event
from kombu.connection import Connection
from kombu.message import Message as KombuMessage
from sqlalchemy import Engine, create_engine, insert, select
from sqlalchemy.orm import Session, sessionmaker
from support.databases import effects, effects_metadata
from support.hostile import (
    DEEP_INVALID,
    DEEP_VALID,
    DOCUMENTED_REASONS,
    FAIL,
    HANDLER_FAILED,
    HUGE_GARBAGE,
    HUGE_JSON,
    INVALID_ID,
    INVALID_MESSAGE,
    LONG_INT,
    MISSING,
    NOT_COMPRESSED,
    SAMPLE,
    SEQ,
    UNDECODABLE,
    UNHANDLED,
    Delivery,
    claim_key,
)
from support.rabbit import Rabbit
from support.strategies import delivery_batches
from support.worker import TIMEOUT, delete_queues, run_until_idle, wait_until

from inbox import Inbox, Message
from inbox.broker import RetryPolicy, Worker
from inbox.delivery import headers as h
from inbox.message import IDEMPOTENCY_KEY_HEADER
from inbox.schema import metadata as inbox_metadata

MEMORY = "memory://"
HANDLER = "ops.apply"
POLICY = RetryPolicy((0.01,), max_tries=2)


def memory_inbox(path: Path) -> tuple[Engine, Inbox]:
    engine = create_engine(f"sqlite:///{path}")
    inbox_metadata.create_all(engine)
    effects_metadata.create_all(engine)
    inbox = Inbox(sessionmaker(engine))

    @inbox.handler("op", name=HANDLER)
    def apply(message: Message, session: Session) -> None:
        # The effect names the delivery (SEQ) and the id the handler was given.
        session.execute(
            insert(effects).values(ref=message.id.hex, handler=str(message.headers[SEQ]))
        )
        if message.headers.get(FAIL):
            raise RuntimeError("failing on purpose")

    return engine, inbox


def publish_all(queue: str, deliveries: Sequence[Delivery]) -> None:
    with Connection(MEMORY) as connection:
        producer = connection.Producer()
        channel = connection.default_channel
        for delivery in deliveries:
            headers = {**delivery.headers, SEQ: delivery.seq}
            if delivery.fail:
                headers[FAIL] = True
            properties = {
                name: value
                for name, value in (("message_id", delivery.message_id), ("type", delivery.type))
                if value is not None
            }
            if delivery.content_type is None:  # kombu's Producer would serialize the body
                raw = channel.prepare_message(delivery.body, None, None, None, headers, properties)
                channel.basic_publish(raw, exchange="", routing_key=queue)
            else:
                producer.publish(
                    delivery.body,
                    routing_key=queue,
                    content_type=delivery.content_type,
                    content_encoding=delivery.content_encoding,
                    headers=headers,
                    **properties,
                )


def take_all(queue: str) -> list[KombuMessage]:
    """Every message in ``queue``, each acked."""
    taken: list[KombuMessage] = []
    with Connection(MEMORY) as connection:
        simple = connection.SimpleQueue(queue)
        try:
            while True:
                try:
                    message = simple.get_nowait()
                except simple.Empty:
                    return taken
                message.ack()
                taken.append(message)
        finally:
            simple.close()
            connection.default_channel.exchange_delete(queue)  # SimpleQueue declared one


def depth(queue: str) -> int:
    with Connection(MEMORY) as connection:
        declared = connection.default_channel.queue_declare(queue=queue, passive=True)
        return int(declared.message_count)


@dataclass
class Run:
    """What became of a batch of deliveries: the worker's stats, the dead letters by SEQ,
    the committed effects as (message id hex, SEQ)."""

    worker: Worker
    queue: str
    dead: dict[int, KombuMessage]
    effects: list[tuple[str, int]]
    left_in_queue: int


def run_until_settled(worker: Worker, deliveries: int) -> None:
    """Run ``worker`` until each of ``deliveries`` got its last ack (committed, duplicate or
    dead-lettered; a retry's ack is not its last), then stop it: it must return normally.

    A condition, not an idle time: on a loaded machine a retry held for its delay can
    outlast any idle cutoff, and the worker would stop with it still in the queue."""
    failed: list[BaseException] = []

    def run() -> None:
        try:
            worker.run()
        except BaseException as exc:
            failed.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    stats = worker.stats
    try:
        wait_until(
            lambda: stats.acked - stats.retried >= deliveries or not thread.is_alive(),
            f"{deliveries} deliveries to be settled",
            TIMEOUT,
        )
    finally:
        worker.stop()
        thread.join(TIMEOUT)
    assert not thread.is_alive(), "the worker did not stop"
    if failed:
        raise failed[0]


def run_batch(deliveries: Sequence[Delivery], directory: Path) -> Run:
    """Publish ``deliveries`` (numbered in order), run a worker until every one of them is
    settled, and collect what became of them."""
    for seq, delivery in enumerate(deliveries):
        delivery.seq = seq
    engine, inbox = memory_inbox(directory / "inbox.db")
    queue = f"hostile-{uuid.uuid4().hex[:12]}"
    worker = Worker(inbox, MEMORY, [queue], retry=POLICY, stats_interval=None)
    try:
        publish_all(queue, deliveries)
        run_until_settled(worker, len(deliveries))
        dead: dict[int, KombuMessage] = {}
        for message in take_all(f"{queue}.dlq"):
            seq = message.headers[SEQ]
            assert seq not in dead, f"delivery {seq} was dead-lettered twice"
            dead[seq] = message
        with engine.connect() as connection:
            rows = connection.execute(select(effects.c.ref, effects.c.handler)).all()
        return Run(worker, queue, dead, [(ref, int(seq)) for ref, seq in rows], depth(queue))
    finally:
        delete_queues(worker)
        engine.dispose()


def assert_dead_letter(delivery: Delivery, dead: KombuMessage, queue: str) -> None:
    """Dead-lettered with the expected reason and a readable error, and nothing of the
    message lost: body, properties and every header the producer set."""
    headers = dead.headers
    assert headers[h.REASON] == delivery.expected, headers[h.ERROR]
    assert headers[h.REASON] in DOCUMENTED_REASONS
    assert headers[h.SOURCE_QUEUE] == queue
    error = headers[h.ERROR]
    assert isinstance(error, str)
    assert 0 < len(error) <= 1000
    assert delivery.fragment in error
    assert bytes(dead.body) == delivery.body
    assert dead.content_type == delivery.content_type
    if delivery.message_id is not None:
        assert dead.properties["message_id"] == delivery.message_id
    if delivery.type is not None:
        assert dead.properties["type"] == delivery.type
    for name, value in delivery.headers.items():
        if name != "compression" and not name.startswith("x-inbox-"):
            assert repr(headers[name]) == repr(value), name
    if delivery.expected == HANDLER_FAILED:
        assert headers[h.TRIES] == POLICY.max_tries
        assert headers[h.FAILED_HANDLERS] == HANDLER
    elif h.TRIES not in delivery.headers:
        assert h.TRIES not in headers  # rejected at once, never tried


def assert_every_delivery_accounted_for(deliveries: Sequence[Delivery], run: Run) -> None:
    """Each delivery acked or dead-lettered (never both, never neither), as expected; and
    each claim key among the acked ones committed its effect exactly once."""
    stats = run.worker.stats
    assert run.left_in_queue == 0
    # Every ack counts: each delivery's last one (after its commit or its dead letter), and
    # one per retry (its copy is a new delivery).
    assert stats.acked - stats.retried == len(deliveries)
    assert len(run.dead) == stats.dead_lettered
    acked = [d for d in deliveries if d.seq not in run.dead]
    assert stats.acked - stats.retried - stats.dead_lettered == len(acked)
    for delivery in deliveries:
        dead = run.dead.get(delivery.seq)
        if delivery.expected is None:
            assert dead is None, (
                f"delivery {delivery.seq} was dead-lettered: "
                f"{dead.headers[h.REASON]}: {dead.headers[h.ERROR]}"
            )
        else:
            assert dead is not None, f"delivery {delivery.seq} was acked, not {delivery.expected}"
            assert_dead_letter(delivery, dead, run.queue)
    groups: dict[bytes | None, set[int]] = defaultdict(set)
    for delivery in acked:
        assert delivery.key is not None
        groups[delivery.key].add(delivery.seq)
    by_seq = {d.seq: d for d in deliveries}
    committed = Counter(by_seq[seq].key for _, seq in run.effects)
    assert committed == dict.fromkeys(groups, 1)
    for ref, seq in run.effects:
        assert seq in groups[by_seq[seq].key]
        assert ref == uuid.UUID(str(by_seq[seq].message_id)).hex  # the handler got its id
    assert stats.processed == len(groups)
    assert stats.duplicates == len(acked) - len(groups)


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(batch=delivery_batches())
def test_any_delivery_is_acked_once_or_dead_lettered_with_its_reason(
    tmp_path_factory: pytest.TempPathFactory, batch: list[Delivery]
) -> None:
    for delivery in batch:
        note_event(f"delivery: {delivery.expected or 'acked'}")
    run = run_batch(batch, tmp_path_factory.mktemp("hostile"))
    assert_every_delivery_accounted_for(batch, run)


def uid(name: str) -> str:
    return str(uuid.uuid5(SAMPLE, name))


ODD_HEADERS: dict[str, Any] = {
    "big-int": 2**70,
    "negative": -1,
    "float": 1.5,
    "nan": math.nan,
    "-inf": -math.inf,
    "true": True,
    "none": None,
    "bytes": b"\x00\xff",
    "nested": {"a": [1, {"b": None}], "c": {"d": [b"e", 2.5]}},
    "list": [1, "two", 3.0, None, [True]],
    "long": "L" * 100_000,
    "unicode": "grüße ✓",
    "empty": "",
}


def named_cases() -> dict[str, Delivery]:
    """Named hostile deliveries, each with what must become of it."""

    def ok(body: bytes = b'{"ref": 1}', **kwargs: Any) -> Delivery:
        delivery = Delivery(body, **kwargs)
        delivery.key = claim_key(delivery.message_id, delivery.headers)
        return delivery

    def dead(reason: str, fragment: str, body: bytes = b'{"ref": 1}', **kwargs: Any) -> Delivery:
        return Delivery(body, expected=reason, fragment=fragment, **kwargs)

    text, raw = "text/plain", "application/octet-stream"
    return {
        "valid-json": ok(message_id=uid("valid")),
        "valid-upper-case-id": ok(message_id=uid("upper").upper()),
        "valid-32-hex-id": ok(message_id=uuid.UUID(uid("hex")).hex),
        "redelivery-spelled-in-upper-case": ok(message_id=uid("valid").upper()),
        "no-message-id": dead(MISSING, "no message_id"),
        "empty-message-id": dead(MISSING, "no message_id", message_id=""),
        "blank-message-id": dead(INVALID_ID, "canonical", message_id=" "),
        "braced-message-id": dead(INVALID_ID, "canonical", message_id="{" + uid("b") + "}"),
        "urn-message-id": dead(INVALID_ID, "canonical", message_id="urn:uuid:" + uid("u")),
        "int-message-id": dead(INVALID_ID, "got int", message_id=42),
        "bytes-15-message-id": dead(INVALID_ID, "got 15", message_id=b"x" * 15),
        "huge-message-id": dead(INVALID_ID, "1000002 characters", message_id="x" * 1_000_000),
        "invalid-utf8-json": dead(
            UNDECODABLE, "not valid utf-8", b'{"ref": "\xff"}', message_id=uid("8j")
        ),
        "invalid-utf8-text": dead(
            UNDECODABLE, "not valid utf-8", b"caf\xe9", content_type=text, message_id=uid("8t")
        ),
        "utf8-encoded-surrogate": dead(
            UNDECODABLE, "not valid utf-8", b'"\xed\xa0\x80"', message_id=uid("su")
        ),
        "truncated-json": dead(UNDECODABLE, "not valid JSON", b'{"ref": ', message_id=uid("t")),
        "empty-json-body": dead(UNDECODABLE, "not valid JSON", b"", message_id=uid("e")),
        "no-content-type-garbage": dead(
            UNDECODABLE, "JSON assumed", b"\x00raw", content_type=None, message_id=uid("n")
        ),
        "no-content-type-json": ok(b'{"ref": 2}', content_type=None, message_id=uid("nj")),
        "json-nested-100000-deep": dead(
            UNDECODABLE, "nested too deeply", DEEP_INVALID, message_id=uid("deep")
        ),
        "json-nested-200-deep": ok(DEEP_VALID, message_id=uid("deep-ok")),
        "json-5000-digit-int": dead(UNDECODABLE, "digits", LONG_INT, message_id=uid("int")),
        "huge-valid-json-3MB": ok(HUGE_JSON, message_id=uid("huge")),
        "huge-garbage-json-3MB": dead(
            UNDECODABLE, "not valid utf-8", HUGE_GARBAGE, message_id=uid("garbage")
        ),
        "huge-raw-3MB": ok(HUGE_GARBAGE, content_type=raw, message_id=uid("raw")),
        "unknown-charset": dead(
            UNDECODABLE,
            "no-such-codec",
            b"x",
            content_type="text/plain; charset=no-such-codec",
            message_id=uid("cs"),
        ),
        "binary-to-binary-codec-as-charset": dead(
            UNDECODABLE,
            "rot13",
            b"x",
            content_type="text/plain; charset=rot13",
            message_id=uid("rot"),
        ),
        "unknown-content-encoding": dead(
            UNDECODABLE, "no-such-codec", content_encoding="no-such-codec", message_id=uid("ce")
        ),
        "pickle-stays-bytes": ok(
            b"\x80\x04K\x01.", content_type="application/x-python-serialize", message_id=uid("p")
        ),
        "garbage-compression": dead(
            UNDECODABLE,
            "cannot decompress",
            NOT_COMPRESSED,
            headers={"compression": "zlib"},
            message_id=uid("z"),
        ),
        "unhashable-compression": dead(
            UNDECODABLE,
            "cannot decompress",
            NOT_COMPRESSED,
            headers={"compression": {"a": 1}},
            message_id=uid("zu"),
        ),
        "zlib-compressed-json": ok(
            zlib.compress(b'{"ref": 3}'), headers={"compression": "zlib"}, message_id=uid("zok")
        ),
        **{
            f"idempotency-key-{label}": dead(
                INVALID_MESSAGE,
                IDEMPOTENCY_KEY_HEADER,
                headers={IDEMPOTENCY_KEY_HEADER: value},
                message_id=uid(f"idem-{label}"),
            )
            for label, value in {
                "int": 7,
                "empty": "",
                "nan": math.nan,
                "bool": True,
                "bytes": b"order-7",
                "list": ["order-7"],
                "dict": {"key": "order-7"},
            }.items()
        },
        "idempotency-key-1MB": ok(
            headers={IDEMPOTENCY_KEY_HEADER: "k" * 1_000_000}, message_id=uid("idem-huge")
        ),
        "idempotency-key-resent-1": ok(
            headers={IDEMPOTENCY_KEY_HEADER: "order-42"}, message_id=uid("resent-1")
        ),
        "idempotency-key-resent-2": ok(
            headers={IDEMPOTENCY_KEY_HEADER: "order-42"}, message_id=uid("resent-2")
        ),
        "type-int": dead(INVALID_MESSAGE, "type must be a str", type=5, message_id=uid("ti")),
        "type-bytes": dead(INVALID_MESSAGE, "type must be a str", type=b"op", message_id=uid("tb")),
        "type-missing": dead(UNHANDLED, "None", type=None, message_id=uid("tn")),
        "type-empty": dead(UNHANDLED, "no handler", type="", message_id=uid("te")),
        "type-other-case": dead(UNHANDLED, "'OP'", type="OP", message_id=uid("tc")),
        "type-100k": dead(UNHANDLED, "no handler", type="t" * 100_000, message_id=uid("th")),
        "odd-header-values": ok(headers=ODD_HEADERS, message_id=uid("odd")),
        "odd-header-values-failing": dead(
            HANDLER_FAILED,
            "failing on purpose",
            headers=ODD_HEADERS,
            fail=True,
            message_id=uid("odd-fail"),
        ),
        "forged-inbox-headers": dead(
            HANDLER_FAILED,
            "failing on purpose",
            headers={
                h.REASON: "forged",
                h.TRIES: "many",
                h.ERROR: 5,
                h.SOURCE_QUEUE: "elsewhere",
            },
            fail=True,
            message_id=uid("forged"),
        ),
    }


NAMED = list(named_cases())


@pytest.fixture(scope="module")
def named_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Delivery], Run]:
    cases = named_cases()
    return cases, run_batch(list(cases.values()), tmp_path_factory.mktemp("named"))


def test_named_hostile_deliveries_all_end_acked_once_or_dead_lettered(
    named_run: tuple[dict[str, Delivery], Run],
) -> None:
    cases, run = named_run
    assert_every_delivery_accounted_for(list(cases.values()), run)


@pytest.mark.parametrize("name", NAMED)
def test_named_hostile_delivery(name: str, named_run: tuple[dict[str, Delivery], Run]) -> None:
    cases, run = named_run
    delivery = cases[name]
    dead = run.dead.get(delivery.seq)
    if delivery.expected is None:
        assert dead is None, dead.headers[h.ERROR]
        committed = {cases_key(cases, seq) for _, seq in run.effects}
        assert delivery.key in committed
    else:
        assert dead is not None
        assert_dead_letter(delivery, dead, run.queue)


def cases_key(cases: dict[str, Delivery], seq: int) -> bytes | None:
    return next(d.key for d in cases.values() if d.seq == seq)


# --- Bugs at the worker --------------------------------------------------------------------

CRASHING_CHARSETS = {
    "charset-undefined": ("text/plain; charset=undefined", "binary", b"anything"),
    "charset-punycode": ("application/json; charset=punycode", "binary", b'"x"'),
    "charset-idna": ("text/plain; charset=idna", "binary", b"xn--zz"),
    "content-encoding-undefined": ("application/json", "undefined", b"{}"),
}


# Regression: decode_body caught (LookupError, UnicodeDecodeError) only, but the 'undefined',
# 'punycode' and 'idna' codecs raise a plain UnicodeError. It escaped Worker.run: on RabbitMQ
# the unacked delivery came back and crashed the next worker too; on memory:// it was lost.
@pytest.mark.parametrize(
    ("content_type", "content_encoding", "body"),
    CRASHING_CHARSETS.values(),
    ids=CRASHING_CHARSETS.keys(),
)
def test_a_charset_whose_codec_raises_unicode_error_is_dead_lettered_not_a_crash(
    tmp_path: Path, content_type: str, content_encoding: str, body: bytes
) -> None:
    bad = Delivery(
        body,
        content_type,
        content_encoding,
        message_id=uid(content_type + content_encoding),
        expected=UNDECODABLE,
    )
    good = Delivery(b'{"ref": 1}', message_id=uid("after-the-bad-one"))
    good.key = claim_key(good.message_id, good.headers)
    run = run_batch([bad, good], tmp_path)
    assert_every_delivery_accounted_for([bad, good], run)


# Regression: a lone surrogate in the idempotency-key header passed Message(), then uuid5()
# raised UnicodeEncodeError in Inbox.process: the worker retried it as a handler failure and
# dead-lettered it as handler-failed after max tries. py-amqp decodes header strings with
# surrogatepass, so RabbitMQ delivers such headers too.
def test_an_idempotency_key_with_a_lone_surrogate_is_dead_lettered_at_once(
    tmp_path: Path,
) -> None:
    bad = Delivery(
        b"{}",
        headers={IDEMPOTENCY_KEY_HEADER: "order-\ud800"},
        message_id=uid("surrogate-key"),
        expected=INVALID_MESSAGE,
    )
    run = run_batch([bad], tmp_path)
    assert_every_delivery_accounted_for([bad], run)


# Regression: a producer-set x-inbox-tries of 2**63 - 1 plus a failing handler made the worker
# write x-inbox-tries = 2**63, which py-amqp cannot encode: struct.error escaped Worker.run and
# the unacked delivery crashed every worker that received it. (memory:// encodes no headers.)
def test_a_forged_huge_try_count_does_not_crash_the_worker_on_rabbitmq(
    rabbit: Rabbit, tmp_path: Path
) -> None:
    engine, inbox = memory_inbox(tmp_path / "inbox.db")
    queue = rabbit.queue()
    worker = Worker(inbox, rabbit.url, [queue], retry=RetryPolicy((0.2,), max_tries=2))
    worker.prepare()
    try:
        with Connection(rabbit.url) as connection:
            connection.Producer().publish(
                b"{}",
                routing_key=queue,
                content_type="application/json",
                content_encoding="utf-8",
                message_id=uid("forged-tries"),
                type="op",
                headers={h.TRIES: 2**63 - 1, SEQ: 0, FAIL: True},
            )
        run_until_idle(worker, 1.5)
    finally:
        engine.dispose()
    assert worker.stats.dead_lettered == 1
    assert rabbit.depth(queue) == 0


# Regression: py-amqp decodes a body whose content_encoding names a text codec and the worker
# encoded it back, which is not lossless (UTF-16 gained a BOM, unicode_escape lost its
# escapes): handlers and retry and dead-letter copies got other bytes than were sent.
def test_a_raw_body_reaches_the_handler_and_the_dead_letter_byte_for_byte_on_rabbitmq(
    rabbit: Rabbit, tmp_path: Path
) -> None:
    engine = create_engine(f"sqlite:///{tmp_path / 'inbox.db'}")
    inbox_metadata.create_all(engine)
    inbox = Inbox(sessionmaker(engine))
    seen: list[object] = []

    @inbox.handler("op", name=HANDLER)
    def keep(message: Message, session: Session) -> None:
        seen.append(message.body)
        raise RuntimeError("dead-letter it")

    queue = rabbit.queue()
    worker = Worker(inbox, rabbit.url, [queue], retry=RetryPolicy((0.2,), max_tries=1))
    worker.prepare()
    sent = {"utf-16": b"ab", "unicode_escape": b"\\x41"}
    try:
        with Connection(rabbit.url) as connection:
            for encoding, body in sent.items():
                connection.Producer().publish(
                    body,
                    routing_key=queue,
                    content_type="application/octet-stream",
                    content_encoding=encoding,
                    message_id=uid(encoding),
                    type="op",
                )
        run_until_idle(worker, 1.5)
    finally:
        engine.dispose()
    assert seen == list(sent.values())
    # Read the dead letters with pika, which hands bodies over undecoded.
    parameters = pika.URLParameters(rabbit.url.rstrip("/") + "/%2F")
    with pika.BlockingConnection(parameters) as connection:
        channel = connection.channel()
        dead: dict[str, bytes] = {}
        while True:
            method, properties, body = channel.basic_get(f"{queue}.dlq", auto_ack=True)
            if method is None:
                break
            dead[properties.content_encoding] = body
    assert dead == sent
