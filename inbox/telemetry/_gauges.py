"""Gauges read when Prometheus scrapes ``inbox-worker --metrics-port``: whether the worker is
ready, and, with ``--relay``, the outbox backlog. What the alert rules in ``monitoring/`` need
and no counter can tell: a state now, not a count of events."""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from inbox._version import __version__
from inbox.telemetry import _names as n

if TYPE_CHECKING:
    from opentelemetry.metrics import CallbackOptions, Observation

__all__ = ["OutboxBacklog", "observe_worker"]

logger = logging.getLogger("inbox.telemetry")

OutboxBacklog = Callable[[], tuple[int, dt.datetime | None]]
"""Reads the outbox now: (rows pending, when the oldest was created)."""


def observe_worker(ready: Callable[[], bool], backlog: OutboxBacklog | None) -> None:
    """Register the scrape-time gauges on the current meter provider: ``inbox.worker.ready``
    (1 or 0, from ``ready()``) and, when ``backlog`` is given, ``inbox.outbox.pending`` and
    ``inbox.outbox.oldest.age`` (seconds; 0 when empty). A read that fails observes nothing:
    the series goes stale, which the alert rules treat as a problem of its own."""
    from opentelemetry import metrics
    from opentelemetry.metrics import Observation

    meter = metrics.get_meter(n.SCOPE, __version__)

    def observe_ready(options: CallbackOptions) -> Iterable[Observation]:
        try:
            return [Observation(1 if ready() else 0)]
        except Exception as exc:  # a probe must never break the scrape
            logger.warning("readiness for /metrics failed: %s", type(exc).__name__)
            return [Observation(0)]

    meter.create_observable_gauge(
        n.WORKER_READY, [observe_ready], "", "1 when the worker consumes and its database is ready"
    )
    if backlog is None:
        return
    read = _Backlog(backlog)
    meter.create_observable_gauge(
        n.OUTBOX_PENDING, [read.pending], "{row}", "outbox rows not sent yet"
    )
    meter.create_observable_gauge(
        n.OUTBOX_OLDEST_AGE, [read.oldest_age], "s", "age of the oldest outbox row not sent"
    )


class _Backlog:
    """One read of the outbox per scrape, shared by its two gauges."""

    def __init__(self, read: OutboxBacklog) -> None:
        self._read = read
        self._last: tuple[int, dt.datetime | None] | None = None

    def pending(self, options: CallbackOptions) -> Iterable[Observation]:
        from opentelemetry.metrics import Observation

        self._last = self._fetch()
        return [] if self._last is None else [Observation(self._last[0])]

    def oldest_age(self, options: CallbackOptions) -> Iterable[Observation]:
        from opentelemetry.metrics import Observation

        last, self._last = self._last or self._fetch(), None
        if last is None:
            return []
        oldest = last[1]
        age = 0.0 if oldest is None else (dt.datetime.now(dt.UTC) - oldest).total_seconds()
        return [Observation(max(age, 0.0))]

    def _fetch(self) -> tuple[int, dt.datetime | None] | None:
        try:
            return self._read()
        except Exception as exc:  # the database down: no observation, the series goes stale
            logger.warning("outbox backlog for /metrics failed: %s", type(exc).__name__)
            return None
