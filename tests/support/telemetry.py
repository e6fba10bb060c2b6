"""A real OpenTelemetry SDK for the telemetry tests: an in-memory metric reader and span
exporter, installed as the global providers once per test process (OpenTelemetry allows one
of each). Tests tell their records apart by unique handler and queue names."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import HistogramDataPoint, InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from inbox.telemetry import refresh

__all__ = ["Sdk", "sdk"]


@dataclass(frozen=True)
class Sdk:
    """The installed SDK's in-memory reader and exporter, with queries over them."""

    reader: InMemoryMetricReader
    exporter: InMemorySpanExporter

    def points(self, name: str) -> list[tuple[dict[str, Any], float]]:
        """Every data point of metric ``name``: (attributes, value), a histogram's value
        being its count."""
        found: list[tuple[dict[str, Any], float]] = []
        data = self.reader.get_metrics_data()
        for resource in data.resource_metrics if data else ():
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    if metric.name != name:
                        continue
                    for point in metric.data.data_points:
                        value = (
                            point.count if isinstance(point, HistogramDataPoint) else point.value
                        )
                        found.append((dict(point.attributes or {}), float(value)))
        return found

    def total(self, name: str, **attributes: str) -> float:
        """The sum of ``name``'s points whose attributes include ``attributes`` (dots in
        keys written as ``__``: ``inbox__handler="h"``)."""
        wanted = {key.replace("__", "."): value for key, value in attributes.items()}
        return sum(
            value
            for got, value in self.points(name)
            if all(got.get(k) == v for k, v in wanted.items())
        )

    def histogram(self, name: str, **attributes: str) -> list[HistogramDataPoint]:
        """The histogram points of ``name`` whose attributes include ``attributes``."""
        wanted = {key.replace("__", "."): value for key, value in attributes.items()}
        found: list[HistogramDataPoint] = []
        data = self.reader.get_metrics_data()
        for resource in data.resource_metrics if data else ():
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    for point in metric.data.data_points if metric.name == name else ():
                        got: Mapping[str, Any] = point.attributes or {}
                        if isinstance(point, HistogramDataPoint) and all(
                            got.get(k) == v for k, v in wanted.items()
                        ):
                            found.append(point)
        return found

    def spans(self, name: str | None = None, **attributes: Any) -> list[ReadableSpan]:
        """Finished spans named ``name`` (any, if None) whose attributes include these."""
        wanted = {key.replace("__", "."): value for key, value in attributes.items()}
        return [
            span
            for span in self.exporter.get_finished_spans()
            if (name is None or span.name == name)
            and all((span.attributes or {}).get(k) == v for k, v in wanted.items())
        ]


@functools.cache
def sdk() -> Sdk:
    """Install the SDK (once per process) and return it."""
    reader = InMemoryMetricReader()
    meter_provider = MeterProvider(metric_readers=[reader])
    metrics.set_meter_provider(meter_provider)
    exporter = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(tracer_provider)
    installed = (metrics.get_meter_provider(), trace.get_tracer_provider())
    assert installed == (meter_provider, tracer_provider), "other providers were installed first"
    refresh()  # the inbox looks for a provider at most once a second by itself
    return Sdk(reader, exporter)
