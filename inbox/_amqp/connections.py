"""Broker connections: for consuming, with publisher confirms, and URLs safe to print."""

from __future__ import annotations

from typing import Any, Final

from kombu.connection import Connection

from inbox._amqp.frames import tolerant_frame_handler
from inbox.errors import ConfigurationError

BROKER_URL_ENV: Final = "INBOX_BROKER_URL"
"""The environment variable the commands read a broker URL from, without ``--broker``."""


def broker_connection(url: str) -> Connection:
    """Parse the broker URL without ever echoing it: a password with an unescaped ``#`` or
    ``/`` would otherwise show up in the parser's error."""
    scheme = url.partition("://")[0] if "://" in url else "?"
    try:
        connection = Connection(url)
        connection.transport_cls  # noqa: B018 - resolves the transport: unknown ones fail here
        connection.as_uri()
    except Exception as exc:
        raise ConfigurationError(
            f"--broker: not a usable kombu URL (scheme {scheme!r}, {type(exc).__name__}); check "
            "the transport name, its client library, and percent-encode special characters "
            "in the user name and password"
        ) from None
    return connection


def consuming_connection(broker: str | Connection) -> Connection:
    """A clone of ``broker`` whose AMQP frames are read by the tolerant frame reader."""
    if isinstance(broker, str):
        if not broker.strip():
            raise ConfigurationError("the broker URL is empty")
        broker = Connection(broker)
    elif not isinstance(broker, Connection):
        raise ConfigurationError(
            f"broker must be a URL or a kombu Connection, got {type(broker).__name__}"
        )
    options: dict[str, Any] = dict(broker.transport_options or {})
    options.pop("confirm_publish", None)  # the forwarder tracks each copy's confirm itself
    if broker.transport.driver_name == "py-amqp":  # its frame_handler option
        options["frame_handler"] = tolerant_frame_handler
    connection: Connection = broker.clone(transport_options=options)
    return connection


def confirming_connection(broker: str | Connection) -> Connection:
    """A new kombu ``Connection`` to ``broker`` (a URL or a connection to clone) on which
    every publish waits for the broker's confirm (``confirm_publish``; transports without
    confirms ignore it)."""
    if isinstance(broker, str):
        if not broker.strip():
            raise ConfigurationError("the broker URL is empty")
        base = Connection(broker)
    elif isinstance(broker, Connection):
        base = broker
    else:
        raise ConfigurationError(
            f"broker must be a URL or a kombu Connection, got {type(broker).__name__}"
        )
    options: dict[str, Any] = dict(base.transport_options or {})
    options["confirm_publish"] = True
    connection: Connection = base.clone(transport_options=options)
    return connection


def safe_uri(connection: Connection) -> str:
    """The connection's URL with any password masked."""
    return str(connection.as_uri(include_password=False))
