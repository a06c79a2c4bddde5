"""From an invocation's committed events to the spans and metric points that report it.

Pure: no OpenTelemetry, no I/O, no clock. Everything — ids, times, attributes — is
a function of the committed history, so the live report of a run and a re-export of
its history (``loop-actors trace export``) are the same spans with the same ids.

**Drives.** An invocation is driven in one or more *drives*: from its start, or a
resume, to a pause, its end, or the loss of its lease. Each is one ``invoke_agent``
span; a paused interval is in no span. The boundaries are committed facts:
``Paused`` ends a drive (what a person answers while it waits belongs to the
pause), ``Terminated`` ends the last, and a ``LeaseAcquired`` after events of the
current drive cuts it (its holder died or was fenced off). A drive that stopped
without such a fact (a drained worker, a failed checkpoint) goes on in the next.

**Reporting once.** Every committed event belongs to exactly one drive, and a
drive's spans and metric points are reported once, by the process that commits the
fact that closes it (:func:`drives_to_report`): the driving process for a pause
or an end; for a lost drive, the process whose ``LeaseAcquired`` cut it. A resumed
or taken-over run is therefore counted once, and a write settled by reconciliation
is one ``reconcile`` span in the drive that committed its result, never a second
``execute_tool``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

from aggregates.decisions import EffectStatus, Final, TerminalReason, ToolCalls, ToolResult
from aggregates.invocation import (
    ApprovalDenied,
    ApprovalGranted,
    BatchDispatched,
    BudgetReturned,
    ClarificationProvided,
    DecisionProposed,
    DispatchedCall,
    InvocationEvent,
    InvocationStarted,
    LeaseAcquired,
    Paused,
    ResultsCommitted,
    SettingsChanged,
    SleepEnded,
    Terminated,
    TraceParent,
)
from loop_actors.telemetry import semconv as sc

AttributeValue = str | int | float | bool | tuple[str, ...]
Attributes = Mapping[str, AttributeValue]

_PAUSE_FACTS = (ApprovalGranted, ApprovalDenied, ClarificationProvided, SettingsChanged, SleepEnded)
"""What is committed while an invocation waits: it belongs to the pause, not to a drive."""

SUCCESS_REASONS = frozenset(
    {TerminalReason.COMPLETED, TerminalReason.HANDED_OFF, TerminalReason.CANCELLED}
)
"""Terminal reasons that are not failures: every other final reason sets ``error.type``."""


class SpanKind(StrEnum):
    """The OpenTelemetry span kinds used."""

    INTERNAL = "internal"
    CLIENT = "client"


class DriveEnd(StrEnum):
    """How a drive ended (``loop_actors.drive.end``)."""

    PAUSED = "paused"
    ENDED = "ended"
    LEASE_LOST = "lease_lost"
    """A later ``LeaseAcquired`` cut it: its process died or was fenced off."""
    OPEN = "open"
    """Still running, or stopped without a committed fact (it goes on in the next drive)."""


@dataclass(frozen=True)
class SpanEvent:
    """A timed event on a span."""

    name: str
    at: datetime
    attributes: Attributes = field(default_factory=dict)


@dataclass(frozen=True)
class SpanRecord:
    """One span, complete: ids, parent, times, attributes, events and links."""

    name: str
    kind: SpanKind
    trace_id: int
    span_id: int
    parent_span_id: int | None
    start: datetime
    end: datetime
    attributes: Attributes
    events: tuple[SpanEvent, ...] = ()
    links: tuple[int, ...] = ()
    """Span ids, in the same trace, this span follows from."""
    failed: bool = False
    """Status ERROR (else unset: a pause is not an error)."""


@dataclass(frozen=True)
class MetricPoint:
    """One measurement of an instrument of :data:`semconv.INSTRUMENTS`."""

    instrument: str
    value: float
    attributes: Attributes


@dataclass(frozen=True)
class Drive:
    """One drive of an invocation: its events, how it ended, what paused it before."""

    index: int
    events: tuple[InvocationEvent, ...]
    end: DriveEnd
    closed_at: int | None
    """The version of the fact that closed it (None while open)."""
    after_pause: Paused | None = None
    answers: tuple[InvocationEvent, ...] = ()
    """What was committed while it waited before this drive (approvals, clarifications)."""


@dataclass(frozen=True)
class Report:
    """The spans and metric points of some drives of an invocation."""

    spans: tuple[SpanRecord, ...]
    points: tuple[MetricPoint, ...]


# --------------------------------------------------------------------------- ids


def _digest(*parts: str) -> bytes:
    return hashlib.sha256("\x1f".join(parts).encode()).digest()


def trace_id_of(root_id: str, trace_parent: TraceParent | None) -> int:
    """The trace of a tree of invocations: the recorded parent's, else one from the root's id."""
    if trace_parent is not None:
        return int(trace_parent.trace_id, 16)
    return int.from_bytes(_digest("loop-actors trace", root_id)[:16]) or 1


def span_id_of(invocation_id: str, part: str, key: str) -> int:
    """The span id of one part (``drive``, ``chat``, ``call``) of an invocation, by its key."""
    return int.from_bytes(_digest("loop-actors span", invocation_id, part, key)[:8]) or 1


def call_key(step: int, call: DispatchedCall) -> str:
    """What names a call's span: its effect key when it has one (children find it so)."""
    return call.effect_key or f"{step}/{call.call_id}"


def effect_key_hash(effect_key: str) -> str:
    """What spans carry instead of an effect key."""
    return hashlib.sha256(effect_key.encode()).hexdigest()[:16]


# --------------------------------------------------------------------------- drives


def _copied_steps(events: Sequence[InvocationEvent]) -> int:
    """How many steps a fork copied from its source (0 for any other invocation)."""
    started = events[0] if events else None
    if isinstance(started, InvocationStarted) and started.forked_from is not None:
        return started.forked_from.at_step
    return 0


def drives_of(events: Sequence[InvocationEvent]) -> list[Drive]:
    """The drives of a history, in order (see the module's docstring for the boundaries)."""
    drives: list[Drive] = []
    current: list[InvocationEvent] = []
    pause: Paused | None = None
    answers: list[InvocationEvent] = []
    waiting = False

    def close(end: DriveEnd, at: int | None) -> None:
        drives.append(Drive(len(drives), tuple(current), end, at, pause, tuple(answers)))

    copied = _copied_steps(events)
    for event in events:
        step = getattr(event, "step", None)
        if copied and isinstance(step, int) and step <= copied:
            continue  # a fork's copy of its source's steps: nothing of it ran here
        if waiting:
            if isinstance(event, _PAUSE_FACTS):
                answers.append(event)
                continue
            waiting = False
        elif isinstance(event, LeaseAcquired) and current:
            close(DriveEnd.LEASE_LOST, event.originator_version)
            current, pause, answers = [], None, []
        current.append(event)
        if isinstance(event, Paused):
            close(DriveEnd.PAUSED, event.originator_version)
            current, answers, pause, waiting = [], [], event, True
        elif isinstance(event, Terminated):
            close(DriveEnd.ENDED, event.originator_version)
            current = []
    if current:
        close(DriveEnd.OPEN, None)
    return drives


def drives_to_report(history: Sequence[InvocationEvent], version_at_start: int) -> list[Drive]:
    """The drives a process reports once it stops driving, having begun at ``version_at_start``.

    ``version_at_start`` is the invocation's version when the process began to drive
    it, after the ``LeaseAcquired`` it recorded if it took the invocation over. Its
    own drive is the one that holds the first event it committed (that
    ``LeaseAcquired``, else the event after ``version_at_start``): it reports it if it
    paused or ended it, and the drive its own ``LeaseAcquired`` cut. A drive cut by
    another process's ``LeaseAcquired`` (this one lost its lease) is that process's
    to report, and so is everything that process committed after.
    """
    own_lease = None
    if 1 <= version_at_start <= len(history) and isinstance(
        history[version_at_start - 1], LeaseAcquired
    ):
        own_lease = version_at_start
    first_own = own_lease if own_lease is not None else version_at_start + 1

    def reported_here(drive: Drive) -> bool:
        if drive.end is DriveEnd.LEASE_LOST:
            return drive.closed_at == own_lease
        holds_own = any(event.originator_version == first_own for event in drive.events)
        return holds_own and drive.end in {DriveEnd.PAUSED, DriveEnd.ENDED}

    return [drive for drive in drives_of(history) if reported_here(drive)]


# --------------------------------------------------------------------------- spans


@dataclass(frozen=True)
class _Context:
    started: InvocationStarted
    trace_id: int
    parent_span_id: int | None
    content: bool
    batches: Mapping[int, BatchDispatched]
    history: Sequence[InvocationEvent]
    latest_experimental: bool = False
    """``OTEL_SEMCONV_STABILITY_OPT_IN=gen_ai_latest_experimental``: the draft names too."""

    @property
    def invocation_id(self) -> str:
        return self.started.originator_id


def _seconds(ms: float) -> timedelta:
    return timedelta(milliseconds=max(ms, 0.0))


def _json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)


def _chat(ctx: _Context, event: DecisionProposed) -> tuple[SpanRecord, list[MetricPoint]]:
    usage = event.usage
    model = usage.model
    attributes: dict[str, AttributeValue] = {
        sc.OPERATION_NAME: sc.Operation.CHAT.value,
        sc.STEP: event.step,
        sc.USAGE_INPUT_TOKENS: usage.input_tokens,
        sc.USAGE_OUTPUT_TOKENS: usage.output_tokens,
    }
    common: dict[str, AttributeValue] = {sc.OPERATION_NAME: sc.Operation.CHAT.value}
    if usage.provider is not None:
        attributes[sc.PROVIDER_NAME] = common[sc.PROVIDER_NAME] = usage.provider
    if model is not None:
        attributes[sc.REQUEST_MODEL] = common[sc.REQUEST_MODEL] = model
    if usage.response_model is not None:
        attributes[sc.RESPONSE_MODEL] = usage.response_model
    if usage.finish_reason is not None:
        attributes[sc.RESPONSE_FINISH_REASONS] = (usage.finish_reason,)
    if usage.cache_read_input_tokens is not None:
        attributes[sc.USAGE_CACHE_READ_INPUT_TOKENS] = usage.cache_read_input_tokens
    if usage.cache_write_input_tokens is not None:
        attributes[sc.USAGE_CACHE_WRITE_INPUT_TOKENS] = usage.cache_write_input_tokens
    if usage.cost:
        attributes[sc.COST] = usage.cost
    if event.rejection is not None:
        attributes[sc.REJECTION_CLASS] = event.rejection.rejection_class.value
    if ctx.content and event.decision is not None:
        attributes[sc.OUTPUT_MESSAGES] = _json(_output_message(event))
    end = event.timestamp
    span = SpanRecord(
        name=f"chat {model}" if model else "chat",
        kind=SpanKind.CLIENT,
        trace_id=ctx.trace_id,
        span_id=span_id_of(ctx.invocation_id, "chat", str(event.originator_version)),
        parent_span_id=None,  # set by the drive
        start=end - _seconds(usage.latency_ms),
        end=end,
        attributes=attributes,
    )
    points = [
        MetricPoint(sc.TOKEN_USAGE, usage.input_tokens, common | {sc.TOKEN_TYPE: "input"}),
        MetricPoint(sc.TOKEN_USAGE, usage.output_tokens, common | {sc.TOKEN_TYPE: "output"}),
        MetricPoint(sc.OPERATION_DURATION, usage.latency_ms / 1000.0, common),
        MetricPoint(sc.TURNS, 1, {sc.AGENT_NAME: ctx.started.agent_name}),
    ]
    if usage.cost:
        agent = {sc.AGENT_NAME: ctx.started.agent_name}
        points.append(MetricPoint(sc.COST_TOTAL, usage.cost, agent))
    if ctx.latest_experimental:
        text = common | {sc.TOKEN_MODALITY: "text"}
        counted = [
            (sc.INFERENCE_USAGE_INPUT, usage.input_tokens),
            (sc.INFERENCE_USAGE_OUTPUT, usage.output_tokens),
            (sc.INFERENCE_USAGE_CACHE_READ, usage.cache_read_input_tokens),
            (sc.INFERENCE_USAGE_CACHE_WRITE, usage.cache_write_input_tokens),
        ]
        points.extend(MetricPoint(name, n, text) for name, n in counted if n is not None)
    return span, points


def _output_message(event: DecisionProposed) -> list[dict[str, Any]]:
    decision = event.decision
    if isinstance(decision, Final):
        parts: list[dict[str, Any]] = [{"type": "text", "content": decision.answer}]
    elif isinstance(decision, ToolCalls):
        parts = [
            {"type": "tool_call", "id": call.id, "name": call.name, "arguments": call.arguments}
            for call in decision.calls
        ]
    else:
        parts = [{"type": "text", "content": _json(decision)}]
    return [{"role": "assistant", "parts": parts}]


def _starts(batch: BatchDispatched, results: Mapping[str, ToolResult]) -> dict[str, datetime]:
    """When each call began: its plan group's start (groups run one after another)."""
    starts: dict[str, datetime] = {}
    at = batch.timestamp
    for group in batch.plan:
        longest = 0.0
        for call_id in group:
            starts[call_id] = at
            result = results.get(call_id)
            longest = max(longest, result.duration_ms if result is not None else 0.0)
        at += _seconds(longest)
    return starts


def _tool_spans(
    ctx: _Context, event: ResultsCommitted, drive_start_version: int
) -> tuple[list[SpanRecord], list[MetricPoint]]:
    batch = ctx.batches.get(event.step)
    calls = {c.call_id: c for c in batch.calls} if batch is not None else {}
    by_id = {r.call_id: r for r in event.results}
    starts = _starts(batch, by_id) if batch is not None else {}
    same_drive = batch is not None and batch.originator_version >= drive_start_version
    spans: list[SpanRecord] = []
    points: list[MetricPoint] = []
    agent = ctx.started.agent_name
    for result in event.results:
        call = calls.get(result.call_id)
        reconciled = result.effect_status is EffectStatus.RECONCILED
        operation = sc.Operation.RECONCILE if reconciled else sc.Operation.EXECUTE_TOOL
        outcome = "ok" if result.error is None else result.error.error_class.value
        attributes: dict[str, AttributeValue] = {
            sc.OPERATION_NAME: operation.value,
            sc.TOOL_NAME: result.name,
            sc.TOOL_CALL_ID: result.call_id,
            sc.TOOL_TYPE: sc.TOOL_TYPE_FUNCTION,
            sc.STEP: event.step,
            sc.TOOL_OUTCOME: outcome,
        }
        if call is not None:
            attributes[sc.TOOL_EFFECT] = call.effect.value
            if call.child_id is not None:
                attributes[sc.CHILD_INVOCATION_ID] = call.child_id
        effect_key = result.effect_key or (call.effect_key if call is not None else None)
        if effect_key is not None:
            attributes[sc.EFFECT_KEY_HASH] = effect_key_hash(effect_key)
        if result.effect_status is not None:
            attributes[sc.EFFECT_STATUS] = result.effect_status.value
        if result.error is not None:
            attributes[sc.ERROR_TYPE] = result.error.error_class.value
        if ctx.content:
            if call is not None:
                attributes[sc.TOOL_CALL_ARGUMENTS] = _json(call.arguments)
            if result.error is None:
                attributes[sc.TOOL_CALL_RESULT] = _json(result.output)
        if same_drive and not reconciled and result.call_id in starts:
            start = starts[result.call_id]
            end = min(start + _seconds(result.duration_ms), event.timestamp)
        else:
            end = event.timestamp
            start = end - _seconds(result.duration_ms)
        key = call_key(event.step, call) if call is not None else f"{event.step}/{result.call_id}"
        spans.append(
            SpanRecord(
                name=f"{operation.value} {result.name}",
                kind=SpanKind.INTERNAL,
                trace_id=ctx.trace_id,
                span_id=span_id_of(ctx.invocation_id, "call", key),
                parent_span_id=None,
                start=start,
                end=end,
                attributes=attributes,
                failed=result.error is not None,
            )
        )
        tool_attributes: dict[str, AttributeValue] = {
            sc.OPERATION_NAME: operation.value,
            sc.TOOL_NAME: result.name,
        }
        if result.error is not None:
            tool_attributes[sc.ERROR_TYPE] = result.error.error_class.value
        if not reconciled:
            points.append(
                MetricPoint(sc.EXECUTE_TOOL_DURATION, result.duration_ms / 1000.0, tool_attributes)
            )
        points.append(
            MetricPoint(
                sc.TOOL_CALLS,
                1,
                {sc.AGENT_NAME: agent, sc.TOOL_NAME: result.name, sc.TOOL_OUTCOME: outcome},
            )
        )
        if result.effect_status is not None:
            points.append(
                MetricPoint(
                    sc.EFFECTS,
                    1,
                    {sc.TOOL_NAME: result.name, sc.EFFECT_STATUS: result.effect_status.value},
                )
            )
    return spans, points


def _tree_totals(history: Sequence[InvocationEvent]) -> dict[str, AttributeValue]:
    steps = tool_calls = tokens = 0
    cost = 0.0
    for event in history:
        if isinstance(event, DecisionProposed):
            steps += 1
            tokens += event.usage.input_tokens + event.usage.output_tokens
            cost += event.usage.cost
        elif isinstance(event, ResultsCommitted):
            tool_calls += len(event.results)
        elif isinstance(event, BudgetReturned):
            steps += event.spent.steps
            tool_calls += event.spent.tool_calls
            tokens += event.spent.tokens
            cost += event.spent.cost
    return {
        sc.TREE_STEPS: steps,
        sc.TREE_TOOL_CALLS: tool_calls,
        sc.TREE_TOKENS: tokens,
        sc.TREE_COST: cost,
    }


def _drive_report(ctx: _Context, drive: Drive, previous: int | None) -> Report:
    started = ctx.started
    span_id = span_id_of(ctx.invocation_id, "drive", str(drive.index))
    children: list[SpanRecord] = []
    points: list[MetricPoint] = []
    first_version = drive.events[0].originator_version if drive.events else 0
    for event in drive.events:
        if isinstance(event, DecisionProposed):
            span, more = _chat(ctx, event)
            children.append(span)
            points.extend(more)
        elif isinstance(event, ResultsCommitted):
            spans, more = _tool_spans(ctx, event, first_version)
            children.extend(spans)
            points.extend(more)
    # The drive began with its first fact after the start (a queued run waits before it)
    # or with the first call it made, whichever was first.
    facts = [e for e in drive.events if not isinstance(e, InvocationStarted)] or list(drive.events)
    start = min([facts[0].timestamp, *(s.start for s in children)])
    end = max([drive.events[-1].timestamp, *(s.end for s in children)])
    attributes: dict[str, AttributeValue] = {
        sc.OPERATION_NAME: sc.Operation.INVOKE_AGENT.value,
        sc.AGENT_NAME: started.agent_name,
        sc.AGENT_VERSION: started.agent_version,
        sc.CONVERSATION_ID: ctx.invocation_id,
        sc.INVOCATION_ID: ctx.invocation_id,
        sc.DRIVE: drive.index,
        sc.DRIVE_END: drive.end.value,
    }
    if started.task_class is not None:
        attributes[sc.TASK_CLASS] = started.task_class
    if started.parent is not None:
        attributes[sc.PARENT_INVOCATION_ID] = started.parent.parent_id
    if started.handed_off_from is not None:
        attributes[sc.HANDED_OFF_FROM] = started.handed_off_from.source_id
    if started.forked_from is not None and drive.index == 0:
        attributes[sc.FORKED_FROM] = started.forked_from.source_id
    events: list[SpanEvent] = []
    if previous is not None:
        attributes[sc.RESUMED_FROM] = f"{previous:016x}"
    if drive.after_pause is not None:
        paused_s = max((start - drive.after_pause.timestamp).total_seconds(), 0.0)
        attributes[sc.PAUSED_DURATION] = paused_s
        resumed = sc.EVENT_AGENT_RESUMED if ctx.latest_experimental else sc.EVENT_RESUMED
        events.append(SpanEvent(resumed, start, {sc.PAUSED_DURATION: paused_s}))
        points.append(
            MetricPoint(
                sc.PAUSED_DURATION_METRIC,
                paused_s,
                {sc.AGENT_NAME: started.agent_name, sc.PAUSE_REASON: drive.after_pause.reason},
            )
        )
        if drive.after_pause.reason is TerminalReason.APPROVAL_REQUIRED:
            for answer in drive.answers:
                if isinstance(answer, ApprovalGranted | ApprovalDenied):
                    wait = (answer.timestamp - drive.after_pause.timestamp).total_seconds()
                    agent = {sc.AGENT_NAME: started.agent_name}
                    points.append(MetricPoint(sc.APPROVAL_WAIT, max(wait, 0.0), agent))
    if drive.index == 0 and ctx.content:
        attributes[sc.INPUT_MESSAGES] = _json(
            [{"role": "user", "parts": [{"type": "text", "content": started.goal}]}]
        )
    failed = False
    last = drive.events[-1] if drive.events else None
    match drive.end:
        case DriveEnd.PAUSED:
            assert isinstance(last, Paused)
            attributes[sc.TERMINAL_REASON] = last.reason.value
            paused = {sc.PAUSE_REASON: last.reason.value}
            name = sc.EVENT_AGENT_PAUSED if ctx.latest_experimental else sc.EVENT_PAUSED
            events.append(SpanEvent(name, last.timestamp, paused))
        case DriveEnd.ENDED:
            assert isinstance(last, Terminated)
            attributes[sc.TERMINAL_REASON] = last.reason.value
            attributes.update(_tree_totals(ctx.history))
            if last.reason not in SUCCESS_REASONS:
                attributes[sc.ERROR_TYPE] = last.reason.value
                failed = True
            if ctx.content and last.answer is not None:
                attributes[sc.OUTPUT_MESSAGES] = _json(
                    [{"role": "assistant", "parts": [{"type": "text", "content": last.answer}]}]
                )
            run_attributes: dict[str, AttributeValue] = {
                sc.AGENT_NAME: started.agent_name,
                sc.TERMINAL_REASON: last.reason.value,
            }
            if started.task_class is not None:
                run_attributes[sc.TASK_CLASS] = started.task_class
            points.append(MetricPoint(sc.RUNS, 1, run_attributes))
        case DriveEnd.LEASE_LOST:
            attributes[sc.TERMINAL_REASON] = TerminalReason.LEASE_LOST.value
        case DriveEnd.OPEN:
            pass
    drive_span = SpanRecord(
        name=f"invoke_agent {started.agent_name}",
        kind=SpanKind.INTERNAL,
        trace_id=ctx.trace_id,
        span_id=span_id,
        parent_span_id=ctx.parent_span_id,
        start=start,
        end=end,
        attributes=attributes,
        events=tuple(events),
        links=(previous,) if previous is not None else (),
        failed=failed,
    )
    points.append(
        MetricPoint(
            sc.INVOKE_AGENT_DURATION,
            (end - start).total_seconds(),
            {
                sc.OPERATION_NAME: sc.Operation.INVOKE_AGENT.value,
                sc.AGENT_NAME: started.agent_name,
                sc.DRIVE_END: drive.end.value,
            },
        )
    )
    parented = tuple(_with_parent(s, span_id) for s in children)
    return Report((drive_span, *parented), tuple(points))


def _with_parent(span: SpanRecord, parent: int) -> SpanRecord:
    return SpanRecord(
        name=span.name,
        kind=span.kind,
        trace_id=span.trace_id,
        span_id=span.span_id,
        parent_span_id=parent,
        start=span.start,
        end=span.end,
        attributes=span.attributes,
        events=span.events,
        links=span.links,
        failed=span.failed,
    )


def root_id_of(started: InvocationStarted) -> str:
    """The invocation whose trace this one joins: its tree's root, its handoff chain's, or itself.

    A handoff target goes on with its source's conversation: its drives are in the trace
    of the chain's first invocation, beside its source's.
    """
    if started.parent is not None:
        return started.parent.root_id
    if started.handed_off_from is not None:
        return started.handed_off_from.chain_root
    return started.originator_id


def report(
    history: Sequence[InvocationEvent],
    *,
    root_trace_parent: TraceParent | None,
    content: bool = False,
    drives: Sequence[Drive] | None = None,
    latest_experimental: bool = False,
) -> Report:
    """The spans and metric points of ``drives`` (all of the history's by default).

    Args:
        history: every committed event of the invocation, in order.
        root_trace_parent: the ``trace_parent`` recorded by the invocation
            :func:`root_id_of` names (its own for a root), or None.
        content: include goal, decisions, arguments and outputs as stored (redacted
            values stay redacted: the real ones are never in the store).
        drives: which drives (of :func:`drives_of` on the same history).
        latest_experimental: the names still in drafts as well (see
            :data:`semconv.GEN_AI_LATEST_EXPERIMENTAL`).
    """
    started = history[0]
    assert isinstance(started, InvocationStarted)
    link = started.parent
    trace_id = trace_id_of(root_id_of(started), root_trace_parent)
    if link is not None:
        parent_span: int | None = span_id_of(link.parent_id, "call", link.effect_key)
    else:
        parent_span = int(root_trace_parent.span_id, 16) if root_trace_parent else None
    batches: dict[int, BatchDispatched] = {}
    for event in history:
        if isinstance(event, BatchDispatched):
            batches[event.step] = event
    ctx = _Context(started, trace_id, parent_span, content, batches, history, latest_experimental)
    every = drives_of(history)
    wanted = {d.index for d in (every if drives is None else drives)}
    spans: list[SpanRecord] = []
    points: list[MetricPoint] = []
    previous: int | None = None
    for drive in every:
        if drive.index in wanted:
            part = _drive_report(ctx, drive, previous)
            spans.extend(part.spans)
            points.extend(part.points)
        previous = span_id_of(ctx.invocation_id, "drive", str(drive.index))
    return Report(tuple(spans), tuple(points))
