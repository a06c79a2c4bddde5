"""OpenTelemetry traces and metrics, derived from what an invocation committed.

Optional: ``pip install 'loop-actors[otel]'``, then configure an SDK tracer or meter
provider in the application. See ``docs/reference/telemetry.md``.

The driver's hook, :func:`loop_actors.telemetry.live.report_drive`, is not re-exported
here: it imports trio, and ``loop-actors submit`` imports this package without it.

Every name below is imported when first used (PEP 562): ``loop-actors submit`` asks
for the current span only, and builds no span.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from aggregates.lazy_names import lazy_names

if TYPE_CHECKING:
    from loop_actors.telemetry.otel import CONTENT_ENV as CONTENT_ENV
    from loop_actors.telemetry.otel import OTEL_ENV as OTEL_ENV
    from loop_actors.telemetry.otel import current_trace_parent as current_trace_parent
    from loop_actors.telemetry.otel import telemetry_on as telemetry_on
    from loop_actors.telemetry.spans import Drive as Drive
    from loop_actors.telemetry.spans import DriveEnd as DriveEnd
    from loop_actors.telemetry.spans import MetricPoint as MetricPoint
    from loop_actors.telemetry.spans import Report as Report
    from loop_actors.telemetry.spans import SpanRecord as SpanRecord
    from loop_actors.telemetry.spans import drives_of as drives_of
    from loop_actors.telemetry.spans import report as report

_EXPORTS: dict[str, str] = {
    "CONTENT_ENV": "loop_actors.telemetry.otel",
    "OTEL_ENV": "loop_actors.telemetry.otel",
    "current_trace_parent": "loop_actors.telemetry.otel",
    "telemetry_on": "loop_actors.telemetry.otel",
    "Drive": "loop_actors.telemetry.spans",
    "DriveEnd": "loop_actors.telemetry.spans",
    "MetricPoint": "loop_actors.telemetry.spans",
    "Report": "loop_actors.telemetry.spans",
    "SpanRecord": "loop_actors.telemetry.spans",
    "drives_of": "loop_actors.telemetry.spans",
    "report": "loop_actors.telemetry.spans",
}
"""Each public name and the module it is defined in (under the same name)."""

__all__ = [
    "CONTENT_ENV",
    "OTEL_ENV",
    "Drive",
    "DriveEnd",
    "MetricPoint",
    "Report",
    "SpanRecord",
    "current_trace_parent",
    "drives_of",
    "report",
    "telemetry_on",
]

__getattr__, __dir__ = lazy_names(globals(), _EXPORTS)
