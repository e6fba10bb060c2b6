"""The Prometheus exposition of the inbox's metrics, for ``inbox-worker --metrics-port``:
an OpenTelemetry SDK ``MeterProvider`` with a ``PrometheusMetricReader``, whose metrics
``prometheus_client`` renders from its default registry."""

from __future__ import annotations

import logging
from collections.abc import Callable

from inbox.errors import InboxError
from inbox.telemetry._api import refresh

__all__ = ["Exposition", "MissingExtra", "prometheus_exposition"]

logger = logging.getLogger("inbox.telemetry")

Exposition = Callable[[], tuple[bytes, str]]
"""Renders the metrics now: (body, content type)."""


class MissingExtra(InboxError, ImportError):
    """A feature needs the ``otel`` extra, which is not installed."""


def prometheus_exposition() -> Exposition:
    """Install a ``MeterProvider`` that Prometheus can scrape and return the renderer.

    When the application configured a ``MeterProvider`` already, that one stays (there can
    be only one): the endpoint then serves what ``prometheus_client``'s default registry
    holds, which includes the inbox's metrics if that provider has a
    ``PrometheusMetricReader``. Raises :class:`MissingExtra` without the ``otel`` extra.
    """
    try:
        import prometheus_client
        from opentelemetry import metrics
        from opentelemetry.exporter.prometheus import PrometheusMetricReader
        from opentelemetry.sdk.metrics import MeterProvider
    except ImportError as exc:
        raise MissingExtra(
            f"--metrics-port needs the otel extra (missing {exc.name}): "
            "pip install 'sqlalchemy-inbox[otel]'"
        ) from None
    reader = PrometheusMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    metrics.set_meter_provider(provider)
    refresh()
    if metrics.get_meter_provider() is not provider:
        provider.shutdown()
        logger.warning(
            "the application configured an OpenTelemetry MeterProvider already: /metrics "
            "serves prometheus_client's default registry; add a PrometheusMetricReader to "
            "that provider for the inbox's metrics to be in it"
        )

    def render() -> tuple[bytes, str]:
        return prometheus_client.generate_latest(), prometheus_client.CONTENT_TYPE_LATEST

    return render
