"""OpenTelemetry traces and metrics, derived from what an invocation committed.

Optional: ``pip install 'loop-actors[otel]'``, then configure an SDK tracer or meter
provider in the application. See ``docs/reference/telemetry.md``.

The driver's hook, :func:`loop_actors.telemetry.live.report_drive`, is not re-exported
here: it imports trio, and ``loop-actors submit`` imports this package without it.
"""

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
