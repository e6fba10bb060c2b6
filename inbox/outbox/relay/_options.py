"""The relay's options, checked once at construction: the engine, the broker connection,
whole numbers and durations."""

from __future__ import annotations

import math

from kombu.connection import Connection
from sqlalchemy import Engine, create_engine

from inbox.errors import ConfigurationError

__all__ = ["broker_connection", "check_seconds", "check_whole", "engine_of"]


def engine_of(engine: Engine | str) -> Engine:
    """``engine`` itself, or a new engine (pre-pinging its pooled connections) for a URL."""
    if isinstance(engine, Engine):
        return engine
    if isinstance(engine, str):
        if not engine.strip():
            raise ConfigurationError("the database URL is empty")
        return create_engine(engine, pool_pre_ping=True)
    raise ConfigurationError(
        f"engine must be a sqlalchemy Engine or a URL, got {type(engine).__name__}"
    )


def broker_connection(broker: Connection | str) -> Connection:
    """A clone of ``broker`` without kombu's own confirm handling (the relay awaits each
    batch's confirms itself)."""
    if isinstance(broker, str):
        if not broker.strip():
            raise ConfigurationError("the broker URL is empty")
        broker = Connection(broker)
    elif not isinstance(broker, Connection):
        raise ConfigurationError(
            f"broker must be a URL or a kombu Connection, got {type(broker).__name__}"
        )
    options = dict(broker.transport_options or {})
    options.pop("confirm_publish", None)
    clone: Connection = broker.clone(transport_options=options)
    if clone.transport.driver_type != "amqp":
        raise ConfigurationError(
            f"the relay needs an AMQP broker with publisher confirms, got {clone.transport_cls!r}"
        )
    return clone


def check_whole(name: str, value: object, low: int, high: int) -> None:
    """TypeError unless ``value`` is an int (not a bool), ValueError unless in range."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigurationError(f"{name} must be an int, got {type(value).__name__}")
    if not low <= value <= high:
        raise ConfigurationError(f"{name} must be between {low} and {high}, got {value}")


def check_seconds(name: str, value: object) -> None:
    """TypeError unless ``value`` is a number, ValueError unless finite and positive."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigurationError(f"{name} must be a number of seconds, got {type(value).__name__}")
    if not math.isfinite(value) or value <= 0:
        raise ConfigurationError(f"{name} must be a positive number of seconds, got {value}")
