"""The broker edge's pure parts: body codec, retry policy, queue topology, headers."""

from __future__ import annotations

import ast
import bz2
import json
import logging
import lzma
import struct
import subprocess
import sys
import time
import tracemalloc
import uuid
import zlib
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from amqp.basic_message import Message as AMQPMessage
from kombu.message import Message as KombuMessage

import inbox
from inbox import Message
from inbox._amqp.frames import tolerant_frame_handler
from inbox.broker import QueueTopology, QueueType, RetryPolicy
from inbox.broker._declare import kombu_queue
from inbox.broker._forwarder import Forwarder
from inbox.broker._transport import AckBatch, KombuTransport
from inbox.delivery import headers as h
from inbox.delivery._inbound import (
    DEFERRED_COMPRESSION,
    MAX_BODY_BYTES,
    RAW_PROPERTIES,
    UNREADABLE,
    decompress,
    inbound_of,
    read_delivery,
)
from inbox.delivery._plan import plan
from inbox.delivery._policy import DeadLetter, DeadLetterReason, Decision, Retry
from inbox.delivery._settling import Settling
from inbox.delivery._stats import WorkerStats
from inbox.delivery.codec import UndecodableBody, decode_body
from inbox.outbox._arguments import encode_body

JSON = "application/json"
ID = uuid.UUID("01890a5d-ac96-774b-bcce-b302099a8057")


def decode(data: bytes, content_type: str | None, default: str | None = JSON) -> object:
    return decode_body(data, content_type, None, default)


@pytest.mark.parametrize(
    ("data", "content_type", "expected"),
    [
        (b'{"a": [1, 2]}', JSON, {"a": [1, 2]}),
        (b'{"a": 1}', "application/json; charset=utf-8", {"a": 1}),
        (b'{"a": 1}', "application/cloudevents+json", {"a": 1}),
        ('"grüße"'.encode(), JSON, "grüße"),
        ("grüße".encode("latin-1"), "text/plain; charset=latin-1", "grüße"),
        (b"\x80\x04K\x01.", "application/x-python-serialize", b"\x80\x04K\x01."),
        (b"a: 1", "application/x-yaml", b"a: 1"),
        (b"\x00\x01", "application/octet-stream", b"\x00\x01"),
    ],
)
def test_bodies_decode_by_content_type_and_only_json_and_text_are_parsed(
    data: bytes, content_type: str, expected: object
) -> None:
    assert decode(data, content_type) == expected


def test_a_delivery_without_content_type_is_read_as_the_default() -> None:
    assert decode(b'{"a": 1}', None) == {"a": 1}
    assert decode(b'{"a": 1}', None, default=None) == b'{"a": 1}'
    with pytest.raises(UndecodableBody, match="no content type; JSON assumed"):
        decode(b"\x00raw", None)


@pytest.mark.parametrize(
    ("data", "content_type", "reason"),
    [
        (b"", JSON, "not valid JSON"),
        (b'{"a": ', JSON, "not valid JSON"),
        (b"NaN-ish {", JSON, "not valid JSON"),
        (b"\xff\xfe{}", JSON, "not valid utf-8"),
        (b"\xc3\x28", "text/plain", "not valid utf-8"),
        (b"{}", "text/plain; charset=no-such-codec", "not valid no-such-codec"),
        (b"[" * 100_000 + b"]" * 100_000, JSON, "nested too deeply"),
    ],
)
def test_undecodable_bodies_say_why(data: bytes, content_type: str, reason: str) -> None:
    with pytest.raises(UndecodableBody, match=reason):
        decode(data, content_type)


def test_encode_body_round_trips_and_refuses_what_json_cannot_say() -> None:
    encoded = encode_body({"total": "9.90", "items": [1, 2]})
    assert encoded.content_type == JSON
    assert json.loads(encoded.data) == {"total": "9.90", "items": [1, 2]}
    assert encode_body(b"\x00").content_type == "application/octet-stream"
    assert encode_body("<a/>", "application/xml").data == b"<a/>"
    with pytest.raises(TypeError, match="not JSON-serializable"):
        encode_body({"x": {1, 2}})
    with pytest.raises(TypeError, match="not JSON-serializable"):
        encode_body(float("nan"))
    with pytest.raises(TypeError, match="must be bytes or str"):
        encode_body({"a": 1}, "application/xml")
    with pytest.raises(ValueError, match="content_type"):
        encode_body(b"x", " ")


def test_retry_policy_counts_every_try_and_repeats_the_last_delay() -> None:
    policy = RetryPolicy((1, 5, 30), max_tries=6)
    assert [policy.exhausted(t) for t in range(1, 7)] == [False] * 5 + [True]
    assert [policy.delay_ms(t) for t in range(1, 6)] == [1000, 5000, 30000, 30000, 30000]
    assert policy.used_delays_ms() == (1000, 5000, 30000)
    assert RetryPolicy((1, 5, 30), max_tries=2).used_delays_ms() == (1000,)
    assert RetryPolicy((), max_tries=1).used_delays_ms() == ()


@pytest.mark.parametrize(
    ("delays", "max_tries", "error"),
    [
        ((1.0,), 0, "at least 1"),
        ((), 3, "at least one retry delay"),
        ((0.0,), 2, "at least 0.001"),
        ((float("inf"),), 2, "finite"),
        ((-1.0,), 2, "at least 0.001"),
        (("1",), 2, "numbers of seconds"),
        ((1.0,), True, "must be an int"),
    ],
)
def test_retry_policy_refuses_nonsense(
    delays: tuple[float, ...], max_tries: int, error: str
) -> None:
    with pytest.raises((ValueError, TypeError), match=error):
        RetryPolicy(delays, max_tries)


def test_topology_names_and_arguments() -> None:
    topology = QueueTopology("orders", QueueType.QUORUM, RetryPolicy((1, 5), max_tries=4))
    queues = {q.name: dict(q.arguments) for q in topology.queues()}
    assert list(queues) == ["orders", "orders.retry.1000ms", "orders.retry.5000ms", "orders.dlq"]
    # What RabbitMQ drops from the consumed quorum queue (past a delivery limit) is
    # dead-lettered to orders.dlq, not lost.
    assert queues["orders"] == {
        "x-queue-type": "quorum",
        "x-dead-letter-exchange": "",
        "x-dead-letter-routing-key": "orders.dlq",
    }
    assert queues["orders.retry.5000ms"] == {
        "x-queue-type": "quorum",
        "x-message-ttl": 5000,
        "x-dead-letter-exchange": "",
        "x-dead-letter-routing-key": "orders",
        "x-dead-letter-strategy": "at-least-once",
        "x-overflow": "reject-publish",
    }
    kombu = [kombu_queue(q) for q in topology.queues()]
    assert all(q.durable and not q.auto_delete for q in kombu)
    classic = QueueTopology("orders")
    assert {q.name: kombu_queue(q).queue_arguments for q in classic.queues()}["orders"] is None


@pytest.mark.parametrize("name", ["", " orders", "amq.orders", "x" * 250])
def test_topology_refuses_unusable_queue_names(name: str) -> None:
    with pytest.raises(ValueError, match="queue name"):
        QueueTopology(name)


def test_failure_headers_keep_the_first_failure_and_tolerate_garbled_counts() -> None:
    first = h.failure_headers({}, 1, "ValueError: x", ["a", "b"])
    assert first[h.TRIES] == 1
    assert first[h.FAILED_HANDLERS] == "a,b"
    second = h.failure_headers(first, 2, "E" * 5000, ["a"])
    assert second[h.FIRST_FAILURE] == first[h.FIRST_FAILURE]
    assert len(second[h.ERROR]) == 1000
    for garbled in ("3", -1, True, None, 2.5):
        assert h.tries_so_far({h.TRIES: garbled}) == 0
    assert h.tries_so_far({h.TRIES: 3}) == 3


def test_import_inbox_loads_no_kombu_and_publish_error_still_imports_from_the_core() -> None:
    code = (
        "import sys, inbox, inbox.errors\n"
        "assert 'kombu' not in sys.modules, 'import inbox loaded kombu'\n"
        "from inbox import PublishError\n"
        "from inbox.errors import PublishError as Same\n"
        "from inbox.broker import PublishError as Edge\n"
        "assert PublishError is Same is Edge and issubclass(Edge, inbox.InboxError)\n"
        "print('ok')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False, timeout=60
    )
    assert done.stdout.strip() == "ok", done.stderr


# The places that must speak both: the relay (outbox rows in, confirmed publishes out), the
# dead-letter tooling (a queue's messages against the inbox's claims) and the test harness that
# runs a real Worker on mem:// for users' tests.
BRIDGES = (
    "celery/",  # Celery tasks (kombu underneath) run in the inbox's handler transaction
    "outbox/relay/",
    "operations/_dead_letters.py",
    "operations/_dead_letter_age.py",
    "operations/_replay.py",
    "operations/_queues.py",  # a queue's depth and consumers beside the workers' counts
    "operations/_story.py",  # a message's dead letters beside its claims and outbox rows
    "testing/harness.py",
)
# The broker edge: the kombu worker and the py-amqp frame and confirm plumbing under it.
BROKER_EDGE = ("broker", "_amqp")


def test_the_core_imports_no_kombu_and_the_broker_edge_no_sqlalchemy() -> None:
    package = Path(inbox.__file__).parent
    for path in sorted(package.rglob("*.py")):
        relative = path.relative_to(package)
        if relative.as_posix().startswith(BRIDGES):
            continue
        in_broker = relative.parts[0] in BROKER_EDGE
        forbidden = "sqlalchemy" if in_broker else "kombu"
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = (
                [alias.name for alias in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            for name in names:
                assert name.split(".")[0] not in (forbidden, "amqp" if not in_broker else ""), (
                    f"{path.relative_to(package)} imports {name}"
                )


# --- The forwarder's confirm bookkeeping (issue 15, bug 7), with a scripted channel ---------


class ScriptedChannel:
    """Stands in for a py-amqp channel in confirm mode: records publishes; the connection
    plays the broker's answers to each publish from a script."""

    def __init__(self) -> None:
        self.events: dict[str, set[Any]] = defaultdict(set)
        self.published: list[str] = []

    def confirm_select(self) -> None:
        pass

    def prepare_message(self, body: bytes, *args: Any) -> Any:
        return SimpleNamespace(body=body, _serialize_properties=lambda: b"")

    def basic_publish(self, message: Any, exchange: str, routing_key: str, **_: Any) -> None:
        self.published.append(routing_key)

    def fire(self, event: str, *args: Any) -> None:
        for callback in list(self.events[event]):
            callback(*args)


class ScriptedConnection:
    def __init__(self, channel: ScriptedChannel, script: list[list[tuple[Any, ...]]]) -> None:
        self.channel = channel
        self.script = script  # for each publish: the frames the broker sends back
        self.connection = SimpleNamespace(frame_max=131072)
        self.during_wait: Callable[[], None] | None = None

    def drain_events(self, timeout: float | None = None) -> None:
        if self.during_wait is not None:
            hook, self.during_wait = self.during_wait, None
            hook()
        if not self.script or not self.script[0]:
            raise TimeoutError
        event = self.script[0].pop(0)
        if not self.script[0]:
            self.script.pop(0)
        self.channel.fire(*event)


class FakeDelivery:
    def __init__(self, name: str) -> None:
        self.name = name
        self.acked = 0
        self.body = b"{}"
        self.content_type = "application/json"
        self.content_encoding = "utf-8"
        self.properties = {"message_id": name}
        self.headers: dict[str, Any] = {}

    def ack(self) -> None:
        self.acked += 1

    def requeue(self) -> None:
        raise AssertionError("not expected")


def forwarder(script: list[list[tuple[Any, ...]]]) -> tuple[Forwarder, ScriptedConnection]:
    channel = ScriptedChannel()
    connection = ScriptedConnection(channel, script)
    sent = Forwarder(confirms=True, confirm_timeout=0.5)
    sent.attach(connection, channel)
    return sent, connection


def forward(sent: Forwarder, delivery: FakeDelivery, target: str) -> None:
    """``delivery`` copied to ``target`` (``q.dlq``, or a retry queue of ``q``) and then
    acked, as the worker carries out a dead letter or a retry; a refused copy is held."""
    settling = Settling(WorkerStats(), RetryPolicy(), logging.getLogger("test"))
    topology = QueueTopology("q", QueueType.CLASSIC, RetryPolicy())
    transport = KombuTransport(topology, sent, AckBatch(), native_delays=True, on_halt=lambda: None)
    decision: Decision = DeadLetter(DeadLetterReason.HANDLER_FAILED, "no", 5)
    if target != topology.dead_letter_queue:
        delay_ms = int(target.removeprefix("q.retry.").removesuffix("ms"))
        decision = Retry(1, delay_ms, "no")
    inbound = inbound_of(delivery)  # type: ignore[arg-type]
    sent.run(transport, delivery, plan(decision, settling, transport, inbound))  # type: ignore[arg-type]


def test_a_confirm_for_another_publish_is_never_credited_to_the_one_waiting() -> None:
    # The broker acks some other tag (a stale publish), then nacks ours: ours is refused,
    # kept unacked and held; acking the original would lose the message.
    sent, _ = forwarder([[("basic_ack", 7, False), ("basic_nack", 1, False)]])
    delivery = FakeDelivery("m1")
    forward(sent, delivery, "q.retry.1000ms")
    assert delivery.acked == 0
    assert sent.holding == 1


def test_each_copy_is_acked_only_on_its_own_confirm_multiple_acks_included() -> None:
    sent, _ = forwarder([[("basic_ack", 1, False)], [("basic_ack", 2, True)]])
    first, second = FakeDelivery("m1"), FakeDelivery("m2")
    forward(sent, first, "q.dlq")
    forward(sent, second, "q.dlq")
    assert (first.acked, second.acked, sent.holding) == (1, 1, 0)


def test_a_returned_copy_is_refused_even_though_the_broker_acks_it() -> None:
    no_queue = Exception("NO_ROUTE")
    sent, _ = forwarder([[("basic_return", no_queue, "", "q.dlq", None), ("basic_ack", 1, False)]])
    delivery = FakeDelivery("m1")
    forward(sent, delivery, "q.dlq")
    assert (delivery.acked, sent.holding) == (0, 1)


def test_a_copy_published_while_another_waits_for_its_confirm_is_refused_loudly() -> None:
    sent, connection = forwarder([[("basic_ack", 1, False)]])
    inner = FakeDelivery("m2")

    def reentrant() -> None:
        forward(sent, inner, "q.dlq")

    connection.during_wait = reentrant
    with pytest.raises(RuntimeError, match="while another waited for its confirm"):
        forward(sent, FakeDelivery("m1"), "q.dlq")
    assert inner.acked == 0


def test_a_confirm_that_never_comes_ends_the_wait_instead_of_wedging_the_worker() -> None:
    sent, _ = forwarder([])
    delivery = FakeDelivery("m1")
    started = time.monotonic()
    with pytest.raises(TimeoutError, match="no publisher confirm"):
        forward(sent, delivery, "q.dlq")
    assert time.monotonic() - started < 5
    assert delivery.acked == 0


# --- Bounded decompression (issue 15, bug 9) ------------------------------------------------


def test_decompression_stops_at_the_bound_without_inflating_a_bomb() -> None:
    compressor = zlib.compressobj(9)
    bomb = b"".join(
        [*(compressor.compress(bytes(1 << 20)) for _ in range(256)), compressor.flush()]
    )
    tracemalloc.start()
    try:
        with pytest.raises(ValueError, match="more than 4194304 bytes"):
            decompress(bomb, "application/x-gzip", limit=4 << 20)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20  # a 256 MiB bomb, never more than a few MiB held


@pytest.mark.parametrize(
    ("name", "compress"),
    [("application/x-gzip", zlib.compress), ("bzip2", bz2.compress), ("xz", lzma.compress)],
)
def test_bodies_compressed_the_kombu_ways_decompress(
    name: str, compress: Callable[[bytes], bytes]
) -> None:
    body = b'{"ref": 1}' * 1000
    assert decompress(compress(body), name) == body
    with pytest.raises(ValueError, match=r"truncated|cannot decompress"):
        decompress(compress(body)[:20], name)
    with pytest.raises(ValueError, match="unsupported compression"):
        decompress(body, "application/x-brotli")


# --- Reading deliveries: frames (issue 15, bug 3) and the Message or dead letter -----------


def header_frame(properties: bytes, body_size: int) -> bytes:
    return struct.pack(">HHQ", 60, 0, body_size) + properties


def read_frames(properties: bytes, body: bytes) -> Any:
    """Feed one Basic.Deliver through the tolerant frame reader; the message it hands on."""
    received: list[Any] = []
    on_frame = tolerant_frame_handler(
        SimpleNamespace(bytes_recv=0), lambda *args: received.append(args[3])
    )
    on_frame((1, 1, struct.pack(">HH", 60, 60)))
    on_frame((2, 1, header_frame(properties, len(body))))
    on_frame((3, 1, body))
    [message] = received
    return message


def serialized(**properties: Any) -> bytes:
    return bytes(AMQPMessage(b"", **properties)._serialize_properties())


def test_properties_that_do_not_decode_still_reach_the_consumer_with_their_raw_bytes() -> None:
    raw = serialized(message_id="ABCD", type="op").replace(b"ABCD", b"\xff\xfe\xfd\xfc")
    message = read_frames(raw, b'{"ref": 1}')
    assert set(message.properties) == {UNREADABLE, RAW_PROPERTIES}
    assert "UnicodeDecodeError" in message.properties[UNREADABLE]
    assert message.properties[RAW_PROPERTIES] == raw
    assert message.body == b'{"ref": 1}'


def test_a_compression_header_is_left_for_the_worker_so_kombu_never_inflates_the_body() -> None:
    body = zlib.compress(b'{"ref": 1}')
    raw = serialized(message_id="m", application_headers={"compression": "zlib", "a": "b"})
    message = read_frames(raw, body)
    assert message.properties["application_headers"] == {"a": "b"}
    assert message.properties[DEFERRED_COMPRESSION] == "zlib"
    assert message.body == body


def delivery(body: bytes, **properties: Any) -> KombuMessage:
    headers = properties.pop("headers", {})
    return KombuMessage(
        body=body,
        content_type=properties.pop("content_type", "application/json"),
        content_encoding="utf-8",
        properties=properties,
        headers=headers,
    )


@pytest.mark.parametrize(
    ("built", "reason"),
    [
        (lambda: delivery(b"{}", **{UNREADABLE: "UnicodeDecodeError: x"}), "unreadable-properties"),
        (lambda: delivery(b"{}"), "missing-message-id"),
        (lambda: delivery(b"{}", message_id="nope"), "invalid-message-id"),
        (lambda: delivery(b"{", message_id=str(ID)), "undecodable-body"),
        (
            lambda: delivery(b"zz", message_id=str(ID), **{DEFERRED_COMPRESSION: "zlib"}),
            "undecodable-body",
        ),
        (
            lambda: delivery(
                zlib.compress(bytes(MAX_BODY_BYTES + 1)),
                message_id=str(ID),
                **{DEFERRED_COMPRESSION: "application/x-gzip"},
            ),
            "body-too-large",
        ),
    ],
    ids=["unreadable", "no-id", "bad-id", "bad-json", "bad-zlib", "bomb"],
)
def test_a_delivery_that_is_no_message_gets_its_dead_letter_reason(
    built: Callable[[], KombuMessage], reason: str
) -> None:
    read = read_delivery(built(), None, "application/json")
    assert isinstance(read, DeadLetter)
    assert read.reason == reason


def test_a_deferred_compression_is_undone_and_the_header_shown_as_sent() -> None:
    body = zlib.compress(b'{"ref": 1}')
    read = read_delivery(
        delivery(body, message_id=str(ID), type="op", **{DEFERRED_COMPRESSION: "zlib"}),
        None,
        "application/json",
    )
    assert isinstance(read, Message)
    assert (read.id, read.type, read.body) == (ID, "op", {"ref": 1})
    assert read.headers["compression"] == "zlib"


# Regression: inbox.middleware imported sqlalchemy.ext.asyncio at module level, which needs
# greenlet; a plain `pip install .` has none, and `python -m inbox.demo` died on import.
def test_the_blocking_inbox_and_its_tools_load_no_asyncio_layer() -> None:
    code = (
        "import sys\n"
        "import inbox, inbox.middleware, inbox.outbox, inbox.demo, inbox.demo_sms\n"
        "import inbox.broker.cli, inbox.outbox.relay.cli, inbox.retention.cli, inbox.admin.cli\n"
        "loaded = [m for m in ('sqlalchemy.ext.asyncio', 'greenlet') if m in sys.modules]\n"
        "assert not loaded, loaded\n"
        "print('ok')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False, timeout=60
    )
    assert done.stdout.strip() == "ok", done.stderr


def test_the_delivery_policy_imports_no_database_and_no_broker_library() -> None:
    """delivery/ is the I/O-free policy every edge shares: no SQLAlchemy, no broker client."""
    package = Path(inbox.__file__).parent / "delivery"
    forbidden = {"sqlalchemy", "kombu", "amqp", "faststream", "aio_pika", "aiormq", "pamqp"}
    for path in sorted(package.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            else:
                continue
            for name in names:
                assert name.split(".")[0] not in forbidden, f"delivery/{path.name} imports {name}"
