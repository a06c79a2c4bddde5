"""Traces and metrics of a run that pauses for an approval and resumes, in the OpenTelemetry SDK.

Run it from this folder: ``python otel_traces.py``. The application configures the SDK
(here with in-memory exporters, to print what they received; with
``OTEL_EXPORTER_OTLP_ENDPOINT`` set, it sends spans to that collector instead). loop-actors
needs no flag: it reports to the providers the application installed.
"""

from __future__ import annotations

import os
from typing import Any

import trio
from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    SimpleSpanProcessor,
    SpanExporter,
)
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from loop_actors import Agent, Runtime, ScriptedModel, Usage, tool

# --- the application's OpenTelemetry setup (once, at start-up)
resource = Resource.create({"service.name": "refund-desk"})
tracer_provider = TracerProvider(resource=resource)
memory = InMemorySpanExporter()
if os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    exporter: SpanExporter = OTLPSpanExporter()  # reads OTEL_EXPORTER_OTLP_ENDPOINT
    tracer_provider.add_span_processor(BatchSpanProcessor(exporter))
else:
    tracer_provider.add_span_processor(SimpleSpanProcessor(memory))
trace.set_tracer_provider(tracer_provider)
reader = InMemoryMetricReader()
metrics.set_meter_provider(MeterProvider(resource=resource, metric_readers=[reader]))
# --- end of the setup


@tool(effect="write", requires_approval=lambda arguments: arguments["amount"] > 100)
def refund(order_id: str, amount: int) -> str:
    """Refund an amount of euros on an order; above 100 a person must approve it."""
    return f"refunded {amount} on {order_id}"


SCRIPT: list[dict[str, Any]] = [
    {
        "kind": "tool_calls",
        "calls": [{"id": "r1", "name": "refund", "arguments": {"order_id": "A-1", "amount": 250}}],
    },
    {"kind": "final", "answer": "refunded A-1"},
]
USAGE = Usage(input_tokens=900, output_tokens=40, provider="openai", model="gpt-4.1-mini")
agent = Agent("refunds", ScriptedModel(SCRIPT, usage=USAGE), tools=[refund])


async def main() -> None:
    tracer = trace.get_tracer("refund-desk")
    async with Runtime("memory://") as runtime:
        with tracer.start_as_current_span("POST /refunds"):  # the application's own span
            paused = await runtime.run(agent, "Refund order A-1.", invocation_id="refund-1")
        assert paused.digest is not None
        await runtime.approve("refund-1", digest=paused.digest, by="alice")
        await runtime.resume("refund-1", agent)  # later, perhaps in another process

    spans = sorted(memory.get_finished_spans(), key=lambda span: span.start_time or 0)
    names = {span.context.span_id: span.name for span in spans}
    print("one trace:", len({span.context.trace_id for span in spans}) == 1)
    for span in spans:
        parent = names.get(span.parent.span_id) if span.parent else None
        attributes = span.attributes or {}
        drive = attributes.get("loop_actors.drive.end", "")
        print(f"  {span.name:<22} parent={parent!s:<20} {drive}".rstrip())
    data = reader.get_metrics_data()
    assert data is not None
    for metric in data.resource_metrics[0].scope_metrics[0].metrics:
        if metric.name == "loop_actors.invocation.runs":
            for point in metric.data.data_points:
                reason = (point.attributes or {})["loop_actors.terminal_reason"]
                print("runs:", reason, point.value)  # type: ignore[union-attr]


if __name__ == "__main__":
    trio.run(main)
