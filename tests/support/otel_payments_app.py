"""The payments agent in an application that configured OpenTelemetry: spans to a JSONL file.

``loop-actors run otel_payments_app:agent`` imports this module, which installs an SDK
tracer provider whose exporter appends each finished span, as JSON, to ``$SPANS_FILE``:
what every process of a crash test exported can be read back after it died.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from opentelemetry import trace
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
