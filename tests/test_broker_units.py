"""The broker edge's pure parts: body codec, retry policy, queue topology, headers."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

import inbox
from inbox.broker import QueueTopology, QueueType, RetryPolicy
from inbox.broker import headers as h
from inbox.broker.codec import UndecodableBody, decode_body, encode_body

JSON = "application/json"


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
    queues = {q.name: q.queue_arguments for q in topology.queues()}
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
    assert all(q.durable and not q.auto_delete for q in topology.queues())
    classic = QueueTopology("orders")
    assert {q.name: q.queue_arguments for q in classic.queues()}["orders"] is None


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
        "from inbox.broker.errors import PublishError as Edge\n"
        "assert PublishError is Same is Edge and issubclass(Edge, inbox.InboxError)\n"
        "print('ok')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False, timeout=60
    )
    assert done.stdout.strip() == "ok", done.stderr


def test_the_core_imports_no_kombu_and_the_broker_edge_no_sqlalchemy() -> None:
    package = Path(inbox.__file__).parent
    for path in sorted(package.rglob("*.py")):
        in_broker = "broker" in path.relative_to(package).parts
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
