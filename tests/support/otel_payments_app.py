"""The payments agent in an application that configured OpenTelemetry: spans to a JSONL file.

``loop-actors run otel_payments_app:agent`` imports this module, which installs an SDK
tracer provider whose exporter appends each finished span, as JSON, to ``$SPANS_FILE``:
what every process of a crash test exported can be read back after it died. Its meter
provider appends what the process recorded, once, when it exits, to ``$METRICS_FILE``
(a process killed with SIGKILL writes nothing).
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import ConsoleMetricExporter, PeriodicExportingMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
from payments_app import agent  # type: ignore[import-not-found]

__all__ = ["agent"]


class JsonLinesExporter(SpanExporter):
    """Appends each span to a file, one JSON object a line, as it is exported."""

    def __init__(self, path: str) -> None:
        self.path = path

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        with open(self.path, "a", encoding="utf-8") as out:
            for span in spans:
                out.write(span.to_json(indent=None) + "\n")
        return SpanExportResult.SUCCESS


provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(JsonLinesExporter(os.environ["SPANS_FILE"])))
trace.set_tracer_provider(provider)

_metrics_out = open(os.environ["METRICS_FILE"], "a", encoding="utf-8")  # noqa: SIM115 - open for the process's life
_reader = PeriodicExportingMetricReader(
    ConsoleMetricExporter(
        out=_metrics_out, formatter=lambda data: data.to_json(indent=None) + "\n"
    ),
    export_interval_millis=3_600_000,  # once, at exit (the SDK shuts the provider down then)
)
metrics.set_meter_provider(MeterProvider(metric_readers=[_reader]))
