"""Canaries for the private internals of dependencies the library relies on.

docs/architecture.md ("Private internals of dependencies") lists each one: what the library
uses, why, and the test that fails on the release that changes it. These are those tests
(except the ones that live beside the feature they guard, named in the table). Each imports
the real dependency and checks the exact attribute, signature or behaviour the library
depends on; nothing here needs a broker or a database (the file takes a few seconds, most
of them importing FastStream).

py-amqp is driven on a scripted transport (frames in, bytes out): the network is the only
thing stood in for, every py-amqp object is the real one.
"""

from __future__ import annotations

import asyncio
import inspect
import struct
import subprocess
import sys
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import SimpleNamespace
from typing import Any

import amqp
import pytest
from amqp import spec
from amqp.basic_message import Message as AMQPMessage
from amqp.method_framing import frame_handler, frame_writer
from amqp.serialization import dumps
from kombu.connection import Connection as KombuConnection
from kombu.messaging import Queue
from kombu.mixins import ConsumerMixin

from inbox._amqp.confirms import _FRAME_OVERHEAD, ConfirmTracker, corked, fits_in_frame
from inbox._amqp.connections import consuming_connection
from inbox._amqp.frames import tolerant_frame_handler

# --- a real py-amqp connection on a scripted transport ------------------------------------


class ScriptedTransport:
    """What py-amqp's connection asks of its transport: frames to read, bytes written."""

    def __init__(self) -> None:
        self.frames: deque[tuple[int, int, bytes]] = deque()
        self.written: list[bytes] = []

    def write(self, data: Any) -> None:
        self.written.append(bytes(data))

    @contextmanager
    def having_timeout(self, timeout: float | None) -> Iterator[None]:
        yield

    def read_frame(self) -> tuple[int, int, bytes]:
        if not self.frames:
            raise TimeoutError  # what a socket read times out with
        return self.frames.popleft()

    def close(self) -> None:
        pass


def scripted_connection(
    reader: Callable[..., Any] = frame_handler,
) -> tuple[amqp.Connection, ScriptedTransport]:
    """A real ``amqp.Connection``, wired as ``connect()`` wires it, on a scripted transport."""
    connection = amqp.Connection()
    transport = ScriptedTransport()
    connection.transport = transport
    connection.on_inbound_frame = reader(connection, connection.on_inbound_method)
    connection.frame_writer = frame_writer(connection, transport)
    return connection, transport


def method(sig: tuple[int, int], argsig: str = "", args: tuple[Any, ...] = ()) -> bytes:
    return struct.pack(">HH", *sig) + (dumps(argsig, args) if argsig else b"")


def content_frames(
    channel: int, sig: tuple[int, int], argsig: str, args: tuple[Any, ...], message: AMQPMessage
) -> list[tuple[int, int, bytes]]:
    """A content method as the broker sends it: method, content header, body frames."""
    body = message.body if isinstance(message.body, bytes) else message.body.encode()
    header = struct.pack(">HHQ", 60, 0, len(body)) + message._serialize_properties()
    return [(1, channel, method(sig, argsig, args)), (2, channel, header), (3, channel, body)]


def frames_of(written: bytes) -> list[tuple[int, int, bytes]]:
    """Split bytes py-amqp wrote into frames (type, channel, payload)."""
    frames, offset = [], 0
    while offset < len(written):
        frame_type, channel, size = struct.unpack_from(">BHI", written, offset)
        payload = written[offset + 7 : offset + 7 + size]
        assert written[offset + 7 + size] == 0xCE  # the frame-end octet
        frames.append((frame_type, channel, payload))
        offset += 8 + size
    return frames


# --- py-amqp: Message._serialize_properties (fits_in_frame) -------------------------------


def test_serialize_properties_returns_the_bytes_py_amqp_writes_in_the_content_header() -> None:
    # fits_in_frame: len(_serialize_properties()) + _FRAME_OVERHEAD is the header frame's size.
    connection, transport = scripted_connection()
    message = AMQPMessage(b"{}", message_id="m", application_headers={"x-inbox-reason": "r" * 99})
    properties = message._serialize_properties()
    assert isinstance(properties, bytes)
    connection.frame_writer(1, 1, spec.Basic.Publish, dumps("Bssbb", (0, "", "q", 0, 0)), message)
    _, (header_type, _, header), _ = frames_of(b"".join(transport.written))
    assert header_type == 2
    assert header[12:] == properties  # class id, weight, body size, then exactly these bytes
    assert len(header) + 8 == len(properties) + _FRAME_OVERHEAD  # the whole header frame


def test_fits_in_frame_reads_frame_max_from_the_py_amqp_connection() -> None:
    connection = amqp.Connection(frame_max=4096)
    assert connection.frame_max == 4096  # what fits_in_frame reads as connection.connection
    small = AMQPMessage(b"", application_headers={"a": "b"})
    large = AMQPMessage(b"", application_headers={"a": "b" * 5000})
    kombu = SimpleNamespace(connection=connection)
    assert fits_in_frame(kombu, small)
    assert not fits_in_frame(kombu, large)


# --- py-amqp: Connection.frame_writer, swapped by corked() --------------------------------


def test_frame_writer_takes_connection_and_transport_and_is_a_settable_connection_attribute() -> (
    None
):
    assert list(inspect.signature(frame_writer).parameters)[:2] == ["connection", "transport"]
    attribute = vars(amqp.Connection)["frame_writer"]
    assert isinstance(attribute, property)
    assert attribute.fset is not None  # corked() assigns it


def test_corked_gathers_real_publishes_into_one_transport_write_and_restores_the_writer() -> None:
    # py-amqp's channels must write through connection.frame_writer at call time (not a
    # writer cached per channel), else corked() would silently stop corking.
    connection, transport = scripted_connection()
    channel = amqp.Channel(connection, 1)
    original = connection.frame_writer
    with corked(SimpleNamespace(connection=connection)):
        for n in range(3):
            channel.basic_publish(AMQPMessage(b"{}", message_id=str(n)), "", "q")
        assert transport.written == []
    assert connection.frame_writer is original
    [written] = transport.written
    kinds = [frame_type for frame_type, _, _ in frames_of(written)]
    assert kinds == [1, 2, 3] * 3


# --- py-amqp: the frame_handler option and its reader (tolerant_frame_handler) ------------


class _Handshake(Exception):
    """Raised where the real connect() would start reading the broker's handshake."""


class _StubTransport(ScriptedTransport):
    def connect(self) -> None:
        pass

    def read_frame(self) -> tuple[int, int, bytes]:
        raise _Handshake


def test_connect_builds_the_frame_handler_option_with_the_connection_and_its_callback() -> None:
    built: dict[str, Any] = {}

    def reader(connection: Any, callback: Any) -> Any:
        built["reader"] = (connection, callback)
        return frame_handler(connection, callback)

    def writer(connection: Any, transport: Any) -> Any:
        built["writer"] = (connection, transport)
        return frame_writer(connection, transport)

    class Probe(amqp.Connection):  # type: ignore[misc]
        def Transport(self, *args: Any, **kwargs: Any) -> _StubTransport:
            return _StubTransport()

    connection = Probe(frame_handler=reader, frame_writer=writer)
    assert connection.frame_handler_cls is reader
    with pytest.raises(_Handshake):
        connection.connect()
    assert built["reader"] == (connection, connection.on_inbound_method)
    assert built["writer"][0] is connection
    assert isinstance(built["writer"][1], _StubTransport)


def test_kombu_hands_the_frame_handler_transport_option_to_py_amqp() -> None:
    broker = consuming_connection("pyamqp://guest:guest@127.0.0.1:1//")
    transport = broker.transport
    assert transport.driver_name == "py-amqp"  # what consuming_connection checks

    class Unconnected(transport.Connection):  # type: ignore[misc,name-defined]
        def connect(self, callback: Any = None) -> None:
            pass

    transport.Connection = Unconnected
    connection = transport.establish_connection()
    assert connection.frame_handler_cls is tolerant_frame_handler


def test_tolerant_frame_handler_reads_what_py_amqp_reads_for_well_formed_frames() -> None:
    # tolerant_frame_handler is py-amqp's frame_handler with two changes: for frames that
    # decode it must hand the callback exactly what py-amqp's own reader hands it.
    message = AMQPMessage(
        b'{"ref": 1}', message_id="m", type="t", application_headers={"a": 1}, delivery_mode=2
    )
    frames = [
        (1, 1, method(spec.Basic.QosOk)),
        *content_frames(1, spec.Basic.Deliver, "sLbss", ("ctag", 7, False, "", "q"), message),
        (8, 0, b""),
        *content_frames(2, spec.Basic.GetOk, "Lbssl", (3, True, "", "q", 0), message),
    ]
    seen: dict[str, list[tuple[Any, ...]]] = {"py-amqp": [], "tolerant": []}
    for name, reader in (("py-amqp", frame_handler), ("tolerant", tolerant_frame_handler)):
        connection = SimpleNamespace(bytes_recv=0)
        on_frame = reader(
            connection,
            lambda ch, sig, buf, msg, into=seen[name]: into.append(
                (ch, sig, bytes(buf), None if msg is None else (msg.properties, msg.body))
            ),
        )
        returns = [on_frame(frame) for frame in frames]
        seen[name].append((tuple(returns), connection.bytes_recv))
    assert seen["tolerant"] == seen["py-amqp"]
    assert len(seen["py-amqp"]) == 4


# --- py-amqp: Channel.events (ConfirmTracker) and Channel.auto_decode ---------------------


def test_channel_events_deliver_acks_nacks_and_returns_as_the_confirm_tracker_expects() -> None:
    connection, transport = scripted_connection(tolerant_frame_handler)
    channel = amqp.Channel(connection, 1)
    transport.frames.append((1, 1, method(spec.Confirm.SelectOk)))
    tracker = ConfirmTracker()
    tracker.attach(channel)  # confirm_select() and the three event callbacks
    for n in (1, 2, 3):
        channel.basic_publish(AMQPMessage(b"{}", message_id=f"m{n}"), "", "q", mandatory=True)
        tracker.sent(f"m{n}")
    transport.frames.extend(
        [
            *content_frames(
                1,
                spec.Basic.Return,
                "Bsss",
                (312, "NO_ROUTE", "", "q"),
                AMQPMessage(b"{}", message_id="m3"),
            ),
            (1, 1, method(spec.Basic.Ack, "Lb", (1, False))),
            (1, 1, method(spec.Basic.Nack, "Lbb", (2, False, False))),
            (1, 1, method(spec.Basic.Ack, "Lb", (3, False))),
        ]
    )
    tracker.wait(connection, timeout=1.0)
    assert tracker.confirmed == {"m1"}
    assert set(tracker.refused) == {"m2", "m3"}
    assert "returned unroutable" in tracker.refused["m3"]


@pytest.mark.parametrize("auto_decode", [True, False])
def test_channel_auto_decode_is_what_decides_whether_a_body_stays_bytes(auto_decode: bool) -> None:
    # The worker and the dead-letter tooling set channel.auto_decode = False to keep bodies
    # as the bytes that came (the worker only where the attribute exists: hasattr()).
    assert "auto_decode" in inspect.signature(amqp.Channel.__init__).parameters
    connection, transport = scripted_connection()
    channel = amqp.Channel(connection, 1)
    channel.auto_decode = auto_decode
    message = AMQPMessage(b"caf\xc3\xa9", message_id="m", content_encoding="utf-8")
    transport.frames.extend(
        content_frames(1, spec.Basic.GetOk, "Lbssl", (1, False, "", "q", 0), message)
    )
    got = channel.basic_get("q")
    assert got.body == ("café" if auto_decode else b"caf\xc3\xa9")
    assert got.delivery_tag == 1


def test_kombu_pyamqp_channels_are_py_amqp_channels() -> None:
    from kombu.transport import pyamqp

    assert issubclass(pyamqp.Channel, amqp.Channel)
    assert pyamqp.Connection.Channel is pyamqp.Channel


def test_kombu_prepare_message_takes_its_arguments_in_the_order_inbox_passes_them() -> None:
    # The relay and the forwarder call it positionally: body, priority, content type,
    # content encoding, headers, properties; and read the result as a py-amqp Message.
    from kombu.transport import pyamqp

    names = list(inspect.signature(pyamqp.Channel.prepare_message).parameters)
    assert names[:7] == [
        "self",
        "body",
        "priority",
        "content_type",
        "content_encoding",
        "headers",
        "properties",
    ]
    connection, _ = scripted_connection()
    channel = pyamqp.Channel(connection, 1)
    prepared = channel.prepare_message(
        b"{}", 3, "application/json", "utf-8", {"a": "b"}, {"message_id": "m"}
    )
    assert isinstance(prepared, AMQPMessage)
    assert prepared.properties == {
        "priority": 3,
        "content_type": "application/json",
        "content_encoding": "utf-8",
        "application_headers": {"a": "b"},
        "message_id": "m",
    }


# --- kombu: ConsumerMixin hooks the Worker overrides --------------------------------------


def test_consumer_mixin_enters_the_overridable_establish_connection_and_calls_the_hooks() -> None:
    calls: list[str] = []
    received: list[Any] = []

    class Probe(ConsumerMixin):  # the hooks inbox.broker.Worker overrides, in kombu's order
        def __init__(self) -> None:
            self.connection = KombuConnection("memory://")

        @contextmanager
        def establish_connection(self) -> Iterator[KombuConnection]:
            with self.create_connection() as connection:
                # As the Worker calls it: errback and max retries by position, a callback.
                connection.ensure_connection(
                    self.on_connection_error,
                    self.connect_max_retries,
                    callback=lambda: None,
                )
                calls.append("establish_connection")
                yield connection

        def get_consumers(self, consumer_class: Any, channel: Any) -> list[Any]:
            calls.append("get_consumers")
            return [consumer_class(queues=[queue], on_message=received.append)]

        def on_consume_ready(
            self, connection: Any, channel: Any, consumers: Any, **kw: Any
        ) -> None:
            calls.append("on_consume_ready")

        @contextmanager
        def extra_context(self, connection: Any, channel: Any) -> Iterator[None]:
            calls.append("extra_context")
            yield

        def on_iteration(self) -> None:
            calls.append("on_iteration")

        def on_consume_end(self, connection: Any, channel: Any) -> None:
            calls.append("on_consume_end")

    queue = Queue("inbox-canary-consumer-mixin")
    probe = Probe()
    with probe.connection.clone() as connection:
        connection.SimpleQueue(queue.name).put({"n": 1})
    for _ in probe.consume(limit=1, safety_interval=0.05):
        pass
    assert calls == [
        "establish_connection",
        "get_consumers",
        "extra_context",
        "on_consume_ready",
        "on_iteration",
        "on_consume_end",
    ]
    assert len(received) == 1
    assert "safety_interval" in inspect.signature(ConsumerMixin.consume).parameters
    assert ConsumerMixin.connect_max_retries is None  # what Worker.establish_connection passes


# --- SQLAlchemy: create_engine(isolation_level=) as the dialect keeps it --------------------


@pytest.mark.parametrize("url", ["sqlite://", "postgresql+psycopg://u@127.0.0.1:1/x"])
def test_create_engine_isolation_level_is_kept_on_the_dialect_where_the_outbox_reads_it(
    url: str,
) -> None:
    # SQLAlchemy has no public way to read create_engine(isolation_level=...) before a
    # connection exists (Dialect.default_isolation_level is the server's, after connecting),
    # so the outbox's check at publish time reads the private attribute (outbox/_session.py).
    from sqlalchemy import create_engine

    from inbox.outbox._session import _engine_autocommits

    autocommit = create_engine(url, isolation_level="AUTOCOMMIT")
    plain = create_engine(url)
    assert autocommit.dialect._on_connect_isolation_level == "AUTOCOMMIT"
    assert plain.dialect._on_connect_isolation_level is None
    assert _engine_autocommits(autocommit)
    assert not _engine_autocommits(plain)


# --- SQLAlchemy: _has_events, the flag a connection event listener sets -------------------


def test_has_events_is_set_by_every_connection_event_listener_the_claim_must_see() -> None:
    # The psycopg backend's one-round-trip claim asks the engine's dispatch for statement
    # listeners only when SQLAlchemy's own _has_events flag says there is a listener at all
    # (inbox/_backends/postgresql/_psycopg.py, _statement_listeners). Were the flag renamed
    # or no longer set, a tracing listener would miss the claim: this fails first.
    # Each check runs in a process of its own: a listener on the Engine class sets the
    # class's flag for the rest of a process (event.remove does not clear it), and other
    # tests in this process (test_demo's spy, effect_app) listen on the Engine class.
    one_engine = """
from sqlalchemy import create_engine, event
from inbox._backends.postgresql._psycopg import _statement_listeners

def listener(*args):
    return None

quiet, traced = create_engine("sqlite://"), create_engine("sqlite://")
event.listen(traced, "before_cursor_execute", listener)
optioned = quiet.execution_options(inbox_share_round_trips=True)
with quiet.connect() as connection:
    assert not connection._has_events
    assert not connection.engine._has_events
    assert not _statement_listeners(connection)
with traced.connect() as connection:
    assert connection.engine._has_events
    assert _statement_listeners(connection)
event.listen(optioned, "after_cursor_execute", listener)
with optioned.connect() as connection:
    assert connection.engine._has_events
    assert _statement_listeners(connection)
"""
    # A listener on the Engine class (every engine) sets the class's flag.
    every_engine = """
from sqlalchemy import create_engine, event
from sqlalchemy.engine import Engine
from inbox._backends.postgresql._psycopg import _statement_listeners
engine = create_engine("sqlite://")
event.listen(Engine, "before_cursor_execute", lambda *args: None)
with engine.connect() as connection:
    assert _statement_listeners(connection)
"""
    for script in (one_engine, every_engine):
        done = subprocess.run(
            [sys.executable, "-c", script], capture_output=True, text=True, check=False
        )
        assert done.returncode == 0, done.stderr


# --- OpenTelemetry: the meter API's proxy, told by class name -----------------------------


def test_the_meter_api_proxy_class_is_still_named_what_inbox_compares() -> None:
    from opentelemetry.metrics import _internal

    from inbox.telemetry._api import _METER_PROXY

    proxy = getattr(_internal, _METER_PROXY)
    assert isinstance(proxy, type)
    assert issubclass(proxy, _internal.MeterProvider)


# --- FastStream, aio-pika, aiormq, pamqp (the RabbitMQ edge) ------------------------------


def test_faststream_names_the_rabbit_edge_imports_exist() -> None:
    from faststream.exceptions import StopConsume, SubscriberNotFound
    from faststream.message import StreamMessage
    from faststream.middlewares import AckPolicy
    from faststream.rabbit import Channel, RabbitBroker, RabbitQueue
    from faststream.rabbit import QueueType as FastStreamQueueType
    from faststream.rabbit.subscriber import RabbitSubscriber
    from faststream.redis import RedisBroker, StreamSub

    assert AckPolicy.MANUAL
    assert FastStreamQueueType.QUORUM
    assert issubclass(StopConsume, Exception)
    assert issubclass(SubscriberNotFound, Exception)
    assert (
        hasattr(StreamMessage, "raw_message")
        or "raw_message" in inspect.signature(StreamMessage.__init__).parameters
    )
    assert {"prefetch_count"} <= set(inspect.signature(Channel).parameters)
    assert issubclass(RabbitSubscriber, object)
    assert StreamSub("s", group="g", consumer="c").group == "g"
    assert RabbitQueue("q").name == "q"
    subscriber = set(inspect.signature(RabbitBroker.subscriber).parameters)
    assert {"channel", "ack_policy", "decoder", "no_reply", "title"} <= subscriber
    redis_subscriber = set(inspect.signature(RedisBroker.subscriber).parameters)
    assert {
        "stream",
        "ack_policy",
        "decoder",
        "no_reply",
        "max_workers",
        "title",
    } <= redis_subscriber
    publish = set(inspect.signature(RabbitBroker.publish).parameters)
    assert {"queue", "persist", "headers", "mandatory", "timeout", "message_id"} <= publish


def test_test_rabbit_broker_hands_subscribers_a_patched_message() -> None:
    # subscribe_rabbit settles the deliveries whose raw_message is exactly this class on
    # TestRabbitTransport (no frames, no TTL queues, copies run the target's subscriber):
    # InboxEdge looks the class up in its stand-in transports.
    from aio_pika import IncomingMessage
    from faststream.rabbit import RabbitBroker
    from faststream.rabbit.testing import PatchedMessage, TestRabbitBroker

    assert issubclass(PatchedMessage, IncomingMessage)
    broker = RabbitBroker()
    raw: list[Any] = []

    async def as_is(msg: Any) -> Any:  # the edge's decoder: the StreamMessage itself
        return msg

    @broker.subscriber("inbox-canary", decoder=as_is, no_reply=True)
    async def handle(msg: Any) -> None:
        raw.append(msg.raw_message)

    async def main() -> None:
        async with TestRabbitBroker(broker) as test_broker:
            await test_broker.publish(b"{}", queue="inbox-canary")

    asyncio.run(main())
    assert len(raw) == 1
    assert type(raw[0]) is PatchedMessage


def test_pamqp_content_header_marshal_is_the_header_frame_payload() -> None:
    # _RabbitTransport.fits: len(ContentHeader(...).marshal()) + 8 is the header frame.
    import aio_pika
    from pamqp import frame
    from pamqp.header import ContentHeader

    copy = aio_pika.Message(b"{}", headers={"x-inbox-reason": "r" * 99}, message_id="m")
    header = ContentHeader(0, 2, copy.properties)
    payload = header.marshal()
    assert payload[12:] == copy.properties.marshal()
    assert len(frame.marshal(header, 1)) == len(payload) + 8


def test_an_aio_pika_delivery_reaches_frame_max_through_its_aiormq_channel() -> None:
    # _RabbitTransport.fits reads raw.channel.connection.connection_tune.frame_max.
    import aio_pika
    import aiormq
    from aiormq.abc import DeliveredMessage
    from pamqp import commands
    from pamqp.header import ContentHeader

    assert "connection_tune" in aiormq.Connection.__annotations__
    tune = commands.Connection.Tune(frame_max=4096)

    async def main() -> int:
        # A real aiormq connection, never connected: what the broker's Tune and capabilities
        # would have set is set by hand.
        connector = aiormq.Connection("amqp://guest:guest@127.0.0.1:1/")
        connector.server_properties = {"capabilities": {"publisher_confirms": True}}
        connector.connection_tune = tune
        channel = aiormq.Channel(connector, 1)
        delivered = DeliveredMessage(
            channel=channel,
            header=ContentHeader(0, 2, commands.Basic.Properties(message_id="m")),
            body=b"{}",
            delivery=commands.Basic.Deliver("ctag", 1, False, "", "q"),
        )
        raw = aio_pika.IncomingMessage(delivered)
        return int(raw.channel.connection.connection_tune.frame_max)

    assert asyncio.run(main()) == 4096
    assert aiormq.spec.Basic.Ack is commands.Basic.Ack  # what a confirmed publish returns


def test_celery_as_task_v2_makes_the_protocol_2_layout_the_outbox_writes() -> None:
    """inbox/celery/_transport.py rebuilds a dead letter with ``app.amqp.as_task_v2``;
    inbox/outbox/_celery_task.py writes the same layout without Celery."""
    import uuid as uuid_module

    from celery import Celery

    from inbox.outbox._celery_task import task_message
    from inbox.outbox._row import PROPERTY_HEADERS

    app = Celery("canary", set_as_current=False)
    task_id = uuid_module.uuid4()
    sent = app.amqp.as_task_v2(str(task_id), "t.name", args=(1,), kwargs={"a": 2})
    ours = task_message(
        task_id,
        "t.name",
        (1,),
        {"a": 2},
        eta=None,
        expires=None,
        time_limit=None,
        soft_time_limit=None,
    )
    args, kwargs, embed = sent.body
    assert (list(args), kwargs) == ([1], {"a": 2})
    assert set(embed) == {"callbacks", "errbacks", "chain", "chord"}
    assert sent.properties["correlation_id"] == str(task_id)
    theirs = {k: v for k, v in sent.headers.items() if v is not None}
    for name in ("lang", "task", "id", "root_id", "retries", "argsrepr", "kwargsrepr"):
        assert ours.headers[name] == theirs[name], name
    # The row's x-inbox-correlation-id / x-inbox-reply-to go out as AMQP properties.
    for header, prop in PROPERTY_HEADERS.items():
        if header in ours.headers:
            assert ours.headers[header] == sent.properties[prop], header
    assert set(ours.headers) - set(PROPERTY_HEADERS) <= set(sent.headers)
    app.close()


def test_celery_beat_calls_a_lazy_kwarg_at_send_and_crontab_exposes_its_fields() -> None:
    """inbox/celery/_beat.py puts the slot in a ``BeatLazyFunc`` kwarg (beat calls it when it
    sends) and reads a crontab's expanded fields and time zone to find its latest slot."""
    from celery import Celery
    from celery.beat import BeatLazyFunc, Scheduler
    from celery.schedules import crontab

    app = Celery("canary", set_as_current=False, broker="memory://")
    app.conf.update(task_always_eager=True, timezone="Europe/Paris")
    sent: list[dict[str, object]] = []

    @app.task(name="canary.tick", shared=False)
    def tick(**kwargs: object) -> None:
        sent.append(kwargs)

    app.conf.beat_schedule = {
        "tick": {"task": "canary.tick", "schedule": 60, "kwargs": {"slot": BeatLazyFunc(str, 7)}}
    }
    scheduler = Scheduler(app=app)
    scheduler.apply_async(scheduler.schedule["tick"])
    assert sent == [{"slot": "7"}]
    cron = crontab(hour=3, minute=0, day_of_week="mon", app=app)
    assert (cron.hour, cron.minute, cron.day_of_week) == ({3}, {0}, {1})
    assert cron.day_of_month == set(range(1, 32))
    assert cron.month_of_year == set(range(1, 13))
    assert str(cron.tz) == "Europe/Paris"
    app.close()


def test_celery_consumer_refusal_handlers_keep_their_arguments() -> None:
    """inbox/celery/_poison.py wraps these handlers on the consumer (from a bootstep's
    ``__init__``) and finds the message among their arguments by position."""
    import inspect

    from celery.worker.consumer import Consumer

    expected = {
        "on_decode_error": ["message", "exc"],
        "on_unknown_message": ["body", "message"],
        "on_unknown_task": ["body", "message", "exc"],
        "on_invalid_task": ["body", "message", "exc"],
    }
    for name, parameters in expected.items():
        assert list(inspect.signature(getattr(Consumer, name)).parameters)[1:] == parameters
    handler = inspect.getsource(Consumer.create_task_handler)
    for name in ("on_unknown_message", "on_unknown_task", "on_invalid_task"):
        assert f"{name} = self.{name}" in handler
    assert "self.on_decode_error(message, exc)" in handler


def test_pymysql_connection_has_the_command_hook_the_watch_overrides() -> None:
    """inbox/_backends/mysql/_pymysql.py swaps a PyMySQL connection's class for a subclass
    overriding ``_execute_command(command, sql)``: the method must exist with that signature,
    be what commit(), rollback() and query() send through, and the class must have no
    ``__slots__`` of its own (``__class__`` assignment needs the same layout). The behaviour
    against a server: tests/test_mysql_watch.py."""
    import inspect

    from pymysql.connections import Connection

    from inbox._backends.mysql._pymysql import _Watched

    parameters = list(inspect.signature(Connection._execute_command).parameters)
    assert parameters == ["self", "command", "sql"]
    for method in (Connection.commit, Connection.rollback, Connection.query, Connection.ping):
        assert "self._execute_command(" in inspect.getsource(method)
    assert "__slots__" not in vars(Connection)
    assert _Watched.__mro__[1] is Connection
    assert "__slots__" not in vars(_Watched)
    assert "self._result = None" in inspect.getsource(Connection._read_query_result)


def test_pymysql_escape_and_query_are_what_the_claim_on_the_driver_uses() -> None:
    """inbox/_backends/mysql/_claim.py renders the claim with ``Connection.escape`` (the
    function ``Cursor.execute`` escapes each parameter with; its docstring calls it internal)
    and sends it with ``Connection.query`` (undocumented), which returns the affected rows;
    ``_pymysql.py``'s ``_Ending`` / ``_Ended`` override ``commit()`` and ``rollback()``.
    Were the cursor to escape another way, the claim would no longer be the statement the
    cursor sends: this fails first. The behaviour against a server: tests/test_mysql_claim.py."""
    import inspect

    from pymysql.connections import Connection
    from pymysql.cursors import Cursor

    from inbox._backends.mysql._pymysql import _Ended, _Ending

    assert list(inspect.signature(Connection.escape).parameters) == ["self", "obj", "mapping"]
    assert "escape = self._get_db().escape" in inspect.getsource(Cursor._mogrify)
    assert list(inspect.signature(Connection.query).parameters) == ["self", "sql", "unbuffered"]
    query = inspect.getsource(Connection.query)
    assert "self._affected_rows = self._read_query_result(" in query
    assert "return self._affected_rows" in query
    for method in (Connection.commit, Connection.rollback):
        assert list(inspect.signature(method).parameters) == ["self"]
    for swapped in (_Ending, _Ended):
        assert swapped.__mro__[1] is Connection
        assert "__slots__" not in vars(swapped)


def test_sqlalchemy_handles_a_failed_statement_it_did_not_send() -> None:
    """inbox/_backends/mysql/_claim.py hands an error of the claim it sent on PyMySQL's
    connection to ``Connection._handle_dbapi_exception(e, statement, parameters, cursor,
    context)``, with no cursor and no context, so that it is wrapped, ``handle_error``
    listeners run and a lost connection is invalidated as through ``execute()``."""
    import inspect

    from sqlalchemy import Connection

    parameters = list(inspect.signature(Connection._handle_dbapi_exception).parameters)
    assert parameters[:6] == ["self", "e", "statement", "parameters", "cursor", "context"]
    source = inspect.getsource(Connection._handle_dbapi_exception)
    assert "and context is None" in source  # a DBAPI error with a statement is wrapped
    assert "dispatch.handle_error" in source
    assert "self.invalidate(e)" in source
