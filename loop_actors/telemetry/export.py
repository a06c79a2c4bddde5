"""Send derived spans to an OTLP/HTTP endpoint, or write them as OTLP/JSON (``trace export``)."""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from loop_actors._errors import UsageError
from loop_actors.telemetry.otel import readable_spans
from loop_actors.telemetry.spans import SpanRecord

TRACES_PATH = "/v1/traces"
"""Where an OTLP/HTTP receiver takes traces when a URL names only the host."""
SERVICE_NAME = "loop-actors"
"""The ``service.name`` of re-exported spans, unless ``OTEL_SERVICE_NAME`` says otherwise."""


class TraceExportError(UsageError):
    """Raised when an OTLP endpoint cannot be reached or does not take the spans."""


def traces_url(url: str) -> str:
    """The OTLP/HTTP traces URL: ``url`` itself, or ``url`` + ``/v1/traces`` for a bare host.

    Raises:
        UsageError: not an ``http`` or ``https`` URL with a host.
    """
    parts = urlsplit(url)
    if parts.scheme not in {"http", "https"} or not parts.hostname:
        raise UsageError(f"--otlp needs an http:// or https:// URL with a host, not {url!r}")
    path = parts.path if parts.path not in {"", "/"} else TRACES_PATH
    return urlunsplit((parts.scheme, parts.netloc, path, parts.query, ""))


def shown_url(url: str) -> str:
    """A URL as printed: without user name or password."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    netloc = f"{host}:{parts.port}" if parts.port else host
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def export_to_otlp(records: Sequence[SpanRecord], url: str, *, timeout_s: float = 10.0) -> str:
    """Send ``records`` as OTLP/HTTP protobuf to ``url``; return the URL they went to.

    Raises:
        UsageError: a malformed URL, or the OTLP exporter is not installed.
        TraceExportError: the endpoint could not be reached or refused them.
    """
    endpoint = traces_url(url)
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace.export import SpanExportResult
    except ImportError as error:
        raise UsageError(
            "sending traces needs the OpenTelemetry SDK and OTLP exporter: "
            "pip install 'loop-actors[otel]'"
        ) from error
    resource = Resource.create({"service.name": SERVICE_NAME})
    exporter = OTLPSpanExporter(endpoint=endpoint, timeout=timeout_s)
    try:
        result = exporter.export(readable_spans(records, resource))
    finally:
        exporter.shutdown()  # type: ignore[no-untyped-call]
    if result is not SpanExportResult.SUCCESS:
        raise TraceExportError(
            f"the OTLP endpoint {shown_url(endpoint)} did not take the spans "
            "(unreachable, or it refused them: see its log)"
        )
    return endpoint


_ID_FIELDS = ("traceId", "spanId", "parentSpanId")
"""The byte fields of OTLP/JSON that are hex strings (protobuf's own JSON would base64 them)."""


def _hex_ids(value: Any) -> Any:
    if isinstance(value, dict):
        return {
            key: base64.b64decode(item).hex() if key in _ID_FIELDS else _hex_ids(item)
            for key, item in value.items()
        }
    if isinstance(value, list):
        return [_hex_ids(item) for item in value]
    return value


def otlp_json(records: Sequence[SpanRecord]) -> str:
    """``records`` as one OTLP/JSON ``ExportTraceServiceRequest`` (one line, no newline).

    The encoding of the OTLP specification: field names in lowerCamelCase, enums as
    integers, trace and span ids as lower-case hex, 64-bit integers as decimal strings;
    what an OTLP/HTTP receiver takes with ``Content-Type: application/json``, and the
    collector's ``otlpjsonfile`` receiver reads line by line.

    Raises:
        UsageError: the OpenTelemetry SDK and its OTLP encoder are not installed.
    """
    try:
        from google.protobuf.json_format import MessageToDict  # type: ignore[import-untyped]
        from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
        from opentelemetry.sdk.resources import Resource
    except ImportError as error:
        raise UsageError(
            "writing OTLP/JSON needs the OpenTelemetry SDK and OTLP exporter: "
            "pip install 'loop-actors[otel]'"
        ) from error
    resource = Resource.create({"service.name": SERVICE_NAME})
    request = encode_spans(readable_spans(records, resource))
    document = MessageToDict(request, use_integers_for_enums=True)
    return json.dumps(_hex_ids(document), separators=(",", ":"), sort_keys=True)
