"""The OpenTelemetry side: is tracing on, and hand derived spans and points to the SDK.

Nothing here imports OpenTelemetry unless the application already did: tracing is on
when the application installed an SDK ``TracerProvider`` or ``MeterProvider`` as the
global one (as for every library instrumented with the API), and
``LOOP_ACTORS_OTEL=off`` turns it off. The check (:func:`telemetry_on`) looks at
``sys.modules`` and the global providers: the driver makes it once per drive.

The spans are built, not started: their ids and times come from the committed history
(:mod:`loop_actors.telemetry.spans`), so they are handed as finished ``ReadableSpan``
objects to the provider's span processors, as ``Span.end()`` does.
"""

from __future__ import annotations

import os
import sys
import weakref
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol

from aggregates.invocation import TraceParent
from aggregates.lease import HolderKind
from loop_actors._version import __version__
from loop_actors.telemetry import semconv as sc

if TYPE_CHECKING:  # ``submit`` asks for the current span and builds no span (issue 32)
    from loop_actors._statistics import TransactionWritten
    from loop_actors.telemetry.spans import MetricPoint, SpanRecord

OTEL_ENV = "LOOP_ACTORS_OTEL"
"""``off`` turns tracing and metrics off whatever the application configured."""
CONTENT_ENV = "LOOP_ACTORS_OTEL_CONTENT"
"""``on`` adds goal, decisions, tool arguments and outputs (as stored, redacted) to spans."""

_instruments: weakref.WeakKeyDictionary[Any, dict[str, Any]] = weakref.WeakKeyDictionary()


def _off() -> bool:
    return os.environ.get(OTEL_ENV, "").strip().lower() in {"off", "0", "false", "no"}


def content_on() -> bool:
    """True when the application asked for content in spans (``LOOP_ACTORS_OTEL_CONTENT=on``)."""
    return os.environ.get(CONTENT_ENV, "").strip().lower() in {"on", "1", "true", "yes"}


def latest_experimental_on() -> bool:
    """True when ``OTEL_SEMCONV_STABILITY_OPT_IN`` lists ``gen_ai_latest_experimental``."""
    listed = os.environ.get(sc.STABILITY_OPT_IN_ENV, "")
    return sc.GEN_AI_LATEST_EXPERIMENTAL in {part.strip() for part in listed.split(",")}


def sdk_tracer_provider() -> Any | None:
    """The global tracer provider when it is the SDK's (not the API's proxy or no-op)."""
    sdk = sys.modules.get("opentelemetry.sdk.trace")
    api = sys.modules.get("opentelemetry.trace")
    if sdk is None or api is None:
        return None
    provider = api.get_tracer_provider()
    return provider if isinstance(provider, sdk.TracerProvider) else None


def sdk_meter_provider() -> Any | None:
    """The global meter provider when it is the SDK's."""
    sdk = sys.modules.get("opentelemetry.sdk.metrics")
    api = sys.modules.get("opentelemetry.metrics")
    if sdk is None or api is None:
        return None
    provider = api.get_meter_provider()
    return provider if isinstance(provider, sdk.MeterProvider) else None


def telemetry_on() -> bool:
    """True when the application configured an SDK provider and did not turn us off."""
    if _off():
        return False
    return sdk_tracer_provider() is not None or sdk_meter_provider() is not None


def current_trace_parent() -> TraceParent | None:
    """The application's current span, to record in a new invocation (None when off)."""
    if _off() or sdk_tracer_provider() is None:
        return None
    from opentelemetry import trace

    context = trace.get_current_span().get_span_context()
    if not context.is_valid:
        return None
    return TraceParent(trace_id=f"{context.trace_id:032x}", span_id=f"{context.span_id:016x}")


def caller_context() -> object | None:
    """The caller's OpenTelemetry context, to carry into another thread (None when off)."""
    if _off() or sdk_tracer_provider() is None:
        return None
    from opentelemetry import context

    return context.get_current()


@contextmanager
def in_caller_context(carried: object | None) -> Iterator[None]:
    """Make ``carried`` (from :func:`caller_context`) the current context inside the block."""
    if carried is None:
        yield
        return
    from opentelemetry import context

    token = context.attach(carried)  # type: ignore[arg-type]
    try:
        yield
    finally:
        context.detach(token)


def _ns(at: datetime) -> int:
    return int(at.timestamp() * 1_000_000) * 1000


def readable_spans(records: Iterable[SpanRecord], resource: Any) -> list[Any]:
    """The SDK's ``ReadableSpan`` of each record (the SDK must be installed)."""
    from opentelemetry import trace
    from opentelemetry.sdk.trace import Event, ReadableSpan
    from opentelemetry.sdk.util.instrumentation import InstrumentationScope

    from loop_actors.telemetry.spans import SpanKind

    scope = InstrumentationScope(sc.INSTRUMENTATION_NAME, __version__, sc.SCHEMA_URL)
    flags = trace.TraceFlags(trace.TraceFlags.SAMPLED)
    kinds = {SpanKind.INTERNAL: trace.SpanKind.INTERNAL, SpanKind.CLIENT: trace.SpanKind.CLIENT}
    spans = []
    for record in records:

        def context(span_id: int, trace_id: int = record.trace_id) -> trace.SpanContext:
            return trace.SpanContext(trace_id, span_id, is_remote=False, trace_flags=flags)

        status = (
            trace.Status(trace.StatusCode.ERROR, str(record.attributes.get(sc.ERROR_TYPE, "")))
            if record.failed
            else trace.Status(trace.StatusCode.UNSET)
        )
        spans.append(
            ReadableSpan(
                name=record.name,
                context=context(record.span_id),
                parent=context(record.parent_span_id) if record.parent_span_id else None,
                resource=resource,
                attributes=dict(record.attributes),
                events=[
                    Event(event.name, dict(event.attributes), timestamp=_ns(event.at))
                    for event in record.events
                ],
                links=[trace.Link(context(link)) for link in record.links],
                kind=kinds[record.kind],
                status=status,
                start_time=_ns(record.start),
                end_time=_ns(record.end),
                instrumentation_scope=scope,
            )
        )
    return spans


def emit_spans(records: Sequence[SpanRecord]) -> None:
    """Hand finished spans to the global SDK tracer provider's processors (if it is one)."""
    provider = sdk_tracer_provider()
    if provider is None or not records:
        return
    # The SDK has no public way to end a span with given ids: its processor is what
    # ``Span.end()`` calls, and exporters read these spans as they read any other.
    processor = provider._active_span_processor
    sampled = _sampled_traces(provider, records)
    kept = [record for record in records if record.trace_id in sampled]
    for span in readable_spans(kept, provider.resource):
        processor.on_end(span)


def _sampled_traces(provider: Any, records: Sequence[SpanRecord]) -> set[int]:
    """The traces the provider's sampler keeps, asked once per trace id, as for a root span.

    A ratio sampler decides by trace id, so every drive of a run, in every process,
    gets the same answer.
    """
    kept = set()
    for trace_id in {record.trace_id for record in records}:
        result = provider.sampler.should_sample(None, trace_id, "invoke_agent")
        if result.decision.is_sampled():
            kept.add(trace_id)
    return kept


def _instrument(provider: Any, name: str) -> Any:
    made = _instruments.setdefault(provider, {})
    if name not in made:
        meter = provider.get_meter(sc.INSTRUMENTATION_NAME, __version__, sc.SCHEMA_URL)
        kind, unit, description = sc.INSTRUMENTS[name]
        match kind:
            case sc.InstrumentKind.COUNTER:
                made[name] = meter.create_counter(name, unit=unit, description=description)
            case sc.InstrumentKind.HISTOGRAM:
                made[name] = meter.create_histogram(name, unit=unit, description=description)
            case sc.InstrumentKind.GAUGE:
                made[name] = meter.create_observable_up_down_counter(
                    name, callbacks=[_observe_leases], unit=unit, description=description
                )
    return made[name]


def db_system_name(store_kind: str) -> str:
    """``db.system.name`` of a store: ``postgresql``, else ``sqlite`` (``memory://`` is too)."""
    return "postgresql" if store_kind == "postgresql" else "sqlite"


def record_transaction(db_system: str, done: TransactionWritten) -> None:
    """A Journal's transaction, as two histogram points (the Journal's ``on_transaction``).

    Nothing when no SDK meter provider is installed (or ``LOOP_ACTORS_OTEL=off``): a
    look at ``sys.modules`` per transaction.
    """
    provider = sdk_meter_provider()
    if provider is None or _off():
        return
    attributes = {sc.DB_SYSTEM_NAME: db_system, sc.JOURNAL_INLINE: done.inline}
    _instrument(provider, sc.JOURNAL_TRANSACTION_EVENTS).record(done.events, attributes)
    _instrument(provider, sc.JOURNAL_TRANSACTION_DURATION).record(done.duration_s, attributes)


class HoldsLeases(Protocol):
    """What holds leases in this process (a Runtime's or a Worker's lease keeper)."""

    @property
    def kind(self) -> HolderKind:
        """Whether it is a worker's or a Runtime's own."""
        ...

    @property
    def held(self) -> Mapping[str, object]:
        """Its leases now, by invocation id."""
        ...


_lease_holders: dict[int, weakref.ref[Any]] = {}
"""The live holders, by ``id`` (a lease keeper is a dataclass: not hashable)."""


def watch_leases(holder: HoldsLeases) -> None:
    """Count ``holder``'s leases in ``loop_actors.leases.held`` while it lives.

    The gauge is observed when the SDK collects, so holding a lease costs nothing; it
    is made on the meter provider installed now (if any) and at each drive's report.
    """
    key = id(holder)
    _lease_holders[key] = weakref.ref(holder, lambda _: _lease_holders.pop(key, None))
    provider = sdk_meter_provider()
    if provider is not None and not _off():
        _instrument(provider, sc.LEASES_HELD)


def _observe_leases(options: Any) -> Iterator[Any]:
    from opentelemetry.metrics import Observation  # the SDK asks: the API is imported

    by_kind: dict[str, int] = {kind.value: 0 for kind in HolderKind}
    for ref in list(_lease_holders.values()):
        holder = ref()
        if holder is not None:
            by_kind[holder.kind.value] += len(holder.held)
    for kind, count in by_kind.items():
        yield Observation(count, {sc.HOLDER_KIND: kind})


def emit_points(points: Sequence[MetricPoint]) -> None:
    """Record metric points with the global SDK meter provider (if it is one)."""
    provider = sdk_meter_provider()
    if provider is None:
        return
    if _lease_holders:
        _instrument(provider, sc.LEASES_HELD)
    for point in points:
        instrument = _instrument(provider, point.instrument)
        attributes = dict(point.attributes)
        if sc.INSTRUMENTS[point.instrument][0] is sc.InstrumentKind.COUNTER:
            instrument.add(point.value, attributes)
        else:
            instrument.record(point.value, attributes)
