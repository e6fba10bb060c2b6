"""Reading AMQP frames so that no single delivery can kill the consumer (py-amqp only).

py-amqp decodes a delivery's properties while it reads the content-header frame: a property
that is not valid UTF-8, or a timestamp past the year 9999, raises from inside
``drain_events``, the connection is torn down, and the same delivery comes back first on
every reconnect. kombu also decompresses a body (``compression`` header) in full before any
callback runs, so a small compressed bomb could exhaust memory.

:func:`tolerant_frame_handler` is py-amqp's own frame reader (its ``frame_handler``
connection option) with two changes, both visible to the worker through the delivery's
properties only:

* properties that do not decode become ``{UNREADABLE: reason, RAW_PROPERTIES: bytes}``;
  the delivery still reaches the consumer, which dead-letters it with the raw bytes kept;
* a ``compression`` header is moved out of the headers into ``DEFERRED_COMPRESSION``, so
  kombu hands over the body as it came and the worker decompresses it with a bound.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from struct import unpack_from
from typing import Any, Final

from amqp import spec
from amqp.basic_message import Message as AMQPMessage
from amqp.exceptions import UnexpectedFrame

from inbox.delivery._inbound import DEFERRED_COMPRESSION, RAW_PROPERTIES, UNREADABLE

__all__ = ["tolerant_frame_handler"]

_CONTENT_METHODS: Final = frozenset({spec.Basic.Return, spec.Basic.Deliver, spec.Basic.GetOk})
_HEADER_PREFIX: Final = 12  # class id, weight, body size: read before the properties


def tolerant_frame_handler(connection: Any, callback: Callable[..., Any]) -> Callable[..., bool]:
    """A py-amqp ``frame_handler``: py-amqp's reader, tolerant of undecodable properties."""
    expected_types: defaultdict[int, int] = defaultdict(lambda: 1)
    partial_messages: dict[int, AMQPMessage] = {}

    def on_frame(frame: tuple[int, int, Any]) -> bool:
        frame_type, channel, buf = frame
        connection.bytes_recv += 1
        if frame_type not in (expected_types[channel], 8):
            raise UnexpectedFrame(
                f"Received frame {frame_type} while expecting type: {expected_types[channel]}"
            )
        if frame_type == 1:
            method_sig = unpack_from(">HH", buf, 0)
            if method_sig in _CONTENT_METHODS:
                partial_messages[channel] = AMQPMessage(frame_method=method_sig, frame_args=buf)
                expected_types[channel] = 2
                return False
            callback(channel, method_sig, buf, None)
        elif frame_type == 2:
            msg = partial_messages[channel]
            _read_header(msg, buf)
            if not msg.ready:
                expected_types[channel] = 3
                return False
            expected_types[channel] = 1
            partial_messages.pop(channel, None)
            callback(channel, msg.frame_method, msg.frame_args, msg)
        elif frame_type == 3:
            msg = partial_messages[channel]
            msg.inbound_body(buf)
            if not msg.ready:
                return False
            expected_types[channel] = 1
            partial_messages.pop(channel, None)
            callback(channel, msg.frame_method, msg.frame_args, msg)
        elif frame_type == 8:
            return False
        return True

    return on_frame


def _read_header(msg: AMQPMessage, buf: Any) -> None:
    try:
        msg.inbound_header(buf)
    except Exception as exc:  # any decoding error of the properties: keep the raw bytes
        _, msg.body_size = unpack_from(">HxxQ", buf, 0)
        msg.properties = {
            UNREADABLE: f"{type(exc).__name__}: {exc}",
            RAW_PROPERTIES: bytes(buf[_HEADER_PREFIX:]),
        }
        if not msg.body_size:
            msg.ready = True
        return
    headers = msg.properties.get("application_headers")
    if isinstance(headers, dict) and "compression" in headers:
        msg.properties["application_headers"] = {
            k: v for k, v in headers.items() if k != "compression"
        }
        msg.properties[DEFERRED_COMPRESSION] = headers["compression"]
