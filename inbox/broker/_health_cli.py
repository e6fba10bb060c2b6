"""The ``inbox-worker`` options of the metrics and health endpoint, and building it."""

from __future__ import annotations

import argparse
import functools
from typing import TYPE_CHECKING

from inbox._cli import whole_number
from inbox.broker._health import DEFAULT_STALE_AFTER, HealthServer, Probed
from inbox.core import Inbox
from inbox.core._readiness import database_not_ready
from inbox.errors import ConfigurationError
from inbox.telemetry._gauges import observe_worker
from inbox.telemetry._prometheus import prometheus_exposition

if TYPE_CHECKING:
    import datetime as dt

    from inbox.outbox.relay._relay import Relay

__all__ = ["add_health_arguments", "health_server"]


def add_health_arguments(parser: argparse.ArgumentParser) -> None:
    """``--metrics-port``, ``--metrics-host``, ``--healthz-timeout``."""
    parser.add_argument(
        "--metrics-port",
        type=whole_number(0, 65535),
        default=0,
        help="serve /metrics (Prometheus), /healthz and /readyz on this port (default 0: off; "
        "needs the otel extra)",
    )
    parser.add_argument(
        "--metrics-host",
        default="127.0.0.1",
        help="address the endpoint binds (default 127.0.0.1; 0.0.0.0 for every interface)",
    )
    parser.add_argument(
        "--healthz-timeout",
        type=whole_number(1),
        default=int(DEFAULT_STALE_AFTER),
        help="/healthz fails when the consume loop has not turned for this many seconds "
        f"(default {DEFAULT_STALE_AFTER:g}; above your slowest handler)",
    )


def health_server(
    args: argparse.Namespace, worker: Probed, inbox: Inbox, outbox: Relay | None = None
) -> HealthServer | None:
    """The endpoint the options ask for (bound, not yet serving), or None when off; with
    ``outbox`` (``--relay``), ``/metrics`` also shows that relay's backlog.

    Raises :class:`~inbox.telemetry._prometheus.MissingExtra` (an ``ImportError``) without
    the ``otel`` extra and ``ValueError`` when the address cannot be bound.
    """
    if not args.metrics_port:
        return None
    exposition = prometheus_exposition()
    database = functools.partial(database_not_ready, inbox)
    observe_worker(
        lambda: worker.consuming and database() is None,
        None if outbox is None else functools.partial(_backlog, outbox),
    )
    try:
        return HealthServer(
            worker,
            args.metrics_host,
            args.metrics_port,
            database=database,
            metrics=exposition,
            stale_after=float(args.healthz_timeout),
        )
    except OSError as exc:
        raise ConfigurationError(
            f"--metrics-port {args.metrics_port} on {args.metrics_host}: "
            f"{exc.strerror or type(exc).__name__}"
        ) from None


def _backlog(relay: Relay) -> tuple[int, dt.datetime | None]:
    """The relay's outbox now: rows pending and the oldest one's creation time."""
    from inbox.outbox.relay._relay import outbox_status

    status = outbox_status(relay.engine, relay.table)
    return status.pending, status.oldest_created_at
