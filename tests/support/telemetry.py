"""The OpenTelemetry SDK with in-memory exporters, installed as the global providers for a test.

The API lets an application set its providers once per process; a test sets them for
its own duration and puts the API back as it found it (no provider: the proxies), so
that tracing is on in these tests only.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from opentelemetry import metrics, trace
from opentelemetry.metrics import _internal as metrics_internal
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader, NumberDataPoint
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.util._once import Once


@dataclass
class Captured:
    """What the application's SDK received."""

    spans_exporter: InMemorySpanExporter
    metric_reader: InMemoryMetricReader

    def spans(self) -> list[ReadableSpan]:
        """Every finished span, in the order they were exported."""
        return list(self.spans_exporter.get_finished_spans())

    def metrics(self) -> dict[str, list[tuple[dict[str, Any], float, int]]]:
        """Each metric's points: (attributes, sum or value, count: 1 for a counter)."""
        data = self.metric_reader.get_metrics_data()
        found: dict[str, list[tuple[dict[str, Any], float, int]]] = {}
        if data is None:
            return found
        for resource in data.resource_metrics:
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    for point in metric.data.data_points:
                        attributes = dict(point.attributes or {})
                        if isinstance(point, NumberDataPoint):
                            entry = (attributes, float(point.value), 1)
                        else:
                            entry = (attributes, float(point.sum), int(point.count))
                        found.setdefault(metric.name, []).append(entry)
        return found

    def serialized(self) -> str:
        """Everything exported, as text: every span (JSON) and every metric point."""
        spans = "\n".join(span.to_json() for span in self.spans())
        data = self.metric_reader.get_metrics_data()
        return spans + "\n" + (data.to_json() if data is not None else "")


def _reset_globals() -> None:
    trace._TRACER_PROVIDER = None
    trace._TRACER_PROVIDER_SET_ONCE = Once()
    metrics_internal._METER_PROVIDER = None
    metrics_internal._METER_PROVIDER_SET_ONCE = Once()


@contextmanager
def in_memory_telemetry(*, metrics_only: bool = False) -> Iterator[Captured]:
    """Install SDK providers with in-memory exporters as the global ones, for a ``with``."""
    exporter = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    reader = InMemoryMetricReader()
    meter_provider = MeterProvider(metric_readers=[reader])
    _reset_globals()
    if not metrics_only:
        trace.set_tracer_provider(tracer_provider)
    metrics.set_meter_provider(meter_provider)
    try:
        yield Captured(exporter, reader)
    finally:
        _reset_globals()
        tracer_provider.shutdown()
        meter_provider.shutdown()


def span_tree(spans: list[ReadableSpan]) -> list[tuple[str, str | None]]:
    """(name, parent's name) of each span, sorted: the shape of the trace."""
    names = {span.context.span_id: span.name for span in spans if span.context is not None}
    return sorted(
        (span.name, names.get(span.parent.span_id) if span.parent is not None else None)
        for span in spans
    )


def times(span: ReadableSpan) -> tuple[int, int]:
    """A finished span's start and end, in nanoseconds."""
    assert span.start_time is not None
    assert span.end_time is not None
    return span.start_time, span.end_time


def attributes_of(span: ReadableSpan) -> dict[str, Any]:
    """A span's attributes, as a dict."""
    return dict(span.attributes or {})
