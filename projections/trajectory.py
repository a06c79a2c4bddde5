"""The trajectory of one invocation: its steps, calls, results and how it ended.

Built from the committed events alone, so it can be rebuilt at any time.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from eventsourcing.sqlite import SQLiteCursor

from aggregates.decisions import Frozen, TerminalReason
from aggregates.effect import effect_status_after
from aggregates.events import DomainEvent
from aggregates.invocation import (
    ApprovalDenied,
    ApprovalGranted,
    BatchDispatched,
    ClarificationProvided,
    DecisionProposed,
    InvocationEvent,
    InvocationStarted,
    Paused,
    ResultsCommitted,
    Terminated,
)
from projections.runner import Projection, ProjectionRunner


class CallView(Frozen):
    """One call of a step and what became of it."""

    call_id: str
    name: str
    arguments: dict[str, Any]
    status: str
    """``ok``, an error class, or ``dispatched`` while no result is committed."""
    output: Any = None
    error_message: str | None = None
    duration_ms: float | None = None
    effect_status: str | None = None
    """For a write: what the effect ledger says (``committed``, ``reconciled``...)."""


class StepView(Frozen):
    """One model decision and, for a tool batch, its calls."""

    step: int
    kind: str
    """The decision kind, or ``rejected``."""
    summary: str
    calls: list[CallView] = []
    input_tokens: int = 0
    output_tokens: int = 0
    cost: float = 0.0


class Trajectory(Frozen):
    """The readable history of one invocation."""

    invocation_id: str
    goal: str
    agent_name: str
    steps: list[StepView]
    reason: TerminalReason | None = None
    answer: str | None = None
    detail: str | None = None
    tool_calls: int = 0
    events: int = 0
    status: str | None = None
    """``running``, ``paused`` or ``terminated`` (read model only)."""
    task_class: str | None = None
    started_at: str | None = None
    ended_at: str | None = None
    input_tokens: int = 0
    output_tokens: int = 0
    cost: float = 0.0


def _summary(event: DecisionProposed) -> tuple[str, str]:
    if event.rejection is not None:
        return "rejected", "; ".join(event.rejection.problems)
    decision = event.decision
    assert decision is not None
    match decision.kind:
        case "final":
            return "final", decision.answer
        case "tool_calls":
            return "tool_calls", f"{len(decision.calls)} call(s)"
        case "clarification":
            return "clarification", decision.question
        case "request_approval":
            return "request_approval", decision.proposal_digest
        case "cannot_continue":
            return "cannot_continue", decision.reason
    return decision.kind, ""


def build_trajectory(events: Iterable[InvocationEvent]) -> Trajectory:
    """Fold an invocation's events into its trajectory.

    Raises:
        ValueError: the events do not start with ``InvocationStarted``.
    """
    steps: list[StepView] = []
    started: InvocationStarted | None = None
    ended: Terminated | Paused | None = None
    tool_calls = 0
    count = 0
    for event in events:
        count += 1
        match event:
            case InvocationStarted():
                started = event
            case DecisionProposed():
                kind, summary = _summary(event)
                steps.append(StepView(step=event.step, kind=kind, summary=summary))
            case BatchDispatched():
                calls = [
                    CallView(
                        call_id=c.call_id, name=c.name, arguments=c.arguments, status="dispatched"
                    )
                    for c in event.calls
                ]
                tool_calls += len(calls)
                steps[-1] = steps[-1].model_copy(update={"calls": calls})
            case ResultsCommitted():
                by_id = {r.call_id: r for r in event.results}
                calls = []
                for call in steps[-1].calls:
                    result = by_id[call.call_id]
                    calls.append(
                        call.model_copy(
                            update={
                                "status": "ok"
                                if result.error is None
                                else result.error.error_class,
                                "output": result.output,
                                "error_message": result.error.message if result.error else None,
                                "duration_ms": result.duration_ms,
                            }
                        )
                    )
                steps[-1] = steps[-1].model_copy(update={"calls": calls})
            case Paused() | Terminated():
                ended = event
            case _:
                pass
    if started is None:
        raise ValueError("a trajectory starts with InvocationStarted")
    return Trajectory(
        invocation_id=started.originator_id,
        goal=started.goal,
        agent_name=started.agent_name,
        steps=steps,
        reason=ended.reason if ended is not None else None,
        answer=ended.answer if isinstance(ended, Terminated) else None,
        detail=ended.detail
        if isinstance(ended, Terminated)
        else (ended.question or ended.proposal_digest if ended is not None else None),
        tool_calls=tool_calls,
        events=count,
    )


def _short(value: Any, limit: int = 60) -> str:
    text = json.dumps(value, separators=(",", ":"), sort_keys=True)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def render_text(trajectory: Trajectory) -> str:
    """A plain-text tree of the trajectory, one line per step and per call."""
    lines = [
        f"invocation {trajectory.invocation_id} · agent {trajectory.agent_name}",
        f"goal: {trajectory.goal}",
    ]
    for step in trajectory.steps:
        lines.append(f"├─ step {step.step}: {step.kind} — {step.summary}")
        for call in step.calls:
            timing = f" {call.duration_ms:.1f} ms" if call.duration_ms is not None else ""
            shown = _short(call.output) if call.status == "ok" else (call.error_message or "")
            lines.append(
                f"│   └─ {call.call_id} {call.name}({_short(call.arguments, 40)}) "
                f"→ {call.status}{timing}: {shown}"
            )
    reason = trajectory.reason.value if trajectory.reason else "running"
    lines.append(f"└─ {reason}" + (f": {trajectory.detail}" if trajectory.detail else ""))
    return "\n".join(lines)


# --------------------------------------------------------------------------- the read model


class TrajectoryProjection(Projection):
    """Per invocation: its steps, each call with its status, and how it ended."""

    name = "trajectory"
    version = 3

    def create(self) -> list[str]:
        """The tables."""
        return [
            "CREATE TABLE IF NOT EXISTS trajectory_invocations ("
            "invocation_id TEXT PRIMARY KEY, agent TEXT, agent_version TEXT, task_class TEXT, "
            "goal TEXT, status TEXT, reason TEXT, answer TEXT, detail TEXT, steps INTEGER, "
            "tool_calls INTEGER, input_tokens INTEGER, output_tokens INTEGER, cost REAL, "
            "started_at TEXT, ended_at TEXT, started_position INTEGER, events INTEGER)",
            "CREATE INDEX IF NOT EXISTS trajectory_invocations_order "
            "ON trajectory_invocations (started_position)",
            "CREATE TABLE IF NOT EXISTS trajectory_steps ("
            "invocation_id TEXT, step INTEGER, kind TEXT, summary TEXT, decision TEXT, "
            "rejection TEXT, input_tokens INTEGER, output_tokens INTEGER, cost REAL, "
            "latency_ms REAL, PRIMARY KEY (invocation_id, step))",
            "CREATE TABLE IF NOT EXISTS trajectory_calls ("
            "invocation_id TEXT, step INTEGER, call_order INTEGER, call_id TEXT, tool TEXT, "
            "arguments TEXT, effect TEXT, effect_key TEXT, status TEXT, error_class TEXT, "
            "error_message TEXT, output TEXT, duration_ms REAL, effect_status TEXT, "
            "PRIMARY KEY (invocation_id, step, call_id))",
            "CREATE INDEX IF NOT EXISTS trajectory_calls_effect ON trajectory_calls (effect_key)",
        ]

    def tables(self) -> list[str]:
        """The tables, for a rebuild."""
        return ["trajectory_invocations", "trajectory_steps", "trajectory_calls"]

    def apply(self, cursor: SQLiteCursor, event: DomainEvent, position: int) -> None:
        """Fold one event into the tables."""
        match event:
            case InvocationStarted():
                cursor.execute(
                    "INSERT INTO trajectory_invocations VALUES "
                    "(?, ?, ?, ?, ?, 'running', NULL, NULL, NULL, 0, 0, 0, 0, 0.0, ?, NULL, ?, 0)",
                    (
                        event.originator_id,
                        event.agent_name,
                        event.agent_version,
                        event.task_class,
                        event.goal,
                        _iso(event),
                        position,
                    ),
                )
            case DecisionProposed():
                kind, summary = _summary(event)
                usage = event.usage
                cursor.execute(
                    "INSERT INTO trajectory_steps VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (
                        event.originator_id,
                        event.step,
                        kind,
                        summary,
                        _json(event.decision.model_dump(mode="json") if event.decision else None),
                        _json(event.rejection.model_dump(mode="json") if event.rejection else None),
                        usage.input_tokens,
                        usage.output_tokens,
                        usage.cost,
                        usage.latency_ms,
                    ),
                )
                cursor.execute(
                    "UPDATE trajectory_invocations SET steps = ?, input_tokens = input_tokens + ?, "
                    "output_tokens = output_tokens + ?, cost = cost + ? WHERE invocation_id = ?",
                    (
                        event.step,
                        usage.input_tokens,
                        usage.output_tokens,
                        usage.cost,
                        event.originator_id,
                    ),
                )
            case BatchDispatched():
                for order, call in enumerate(event.calls):
                    cursor.execute(
                        "INSERT INTO trajectory_calls VALUES "
                        "(?, ?, ?, ?, ?, ?, ?, ?, 'dispatched', NULL, NULL, NULL, NULL, ?)",
                        (
                            event.originator_id,
                            event.step,
                            order,
                            call.call_id,
                            call.name,
                            _json(call.arguments),
                            call.effect.value,
                            call.effect_key,
                            "dispatched" if call.effect_key else None,
                        ),
                    )
                cursor.execute(
                    "UPDATE trajectory_invocations SET tool_calls = tool_calls + ? "
                    "WHERE invocation_id = ?",
                    (len(event.calls), event.originator_id),
                )
            case ResultsCommitted():
                # Results after a reconciliation pause: the invocation runs again.
                cursor.execute(
                    "UPDATE trajectory_invocations SET status = 'running', reason = NULL, "
                    "detail = NULL, ended_at = NULL "
                    "WHERE invocation_id = ? AND status = 'paused'",
                    (event.originator_id,),
                )
                for result in event.results:
                    error = result.error
                    cursor.execute(
                        "UPDATE trajectory_calls SET status = ?, error_class = ?, "
                        "error_message = ?, output = ?, duration_ms = ?, "
                        "effect_status = COALESCE(?, effect_status) "
                        "WHERE invocation_id = ? AND step = ? AND call_id = ?",
                        (
                            "ok" if error is None else "error",
                            error.error_class.value if error else None,
                            error.message if error else None,
                            _json(result.output) if error is None else None,
                            result.duration_ms,
                            result.effect_status.value if result.effect_status else None,
                            event.originator_id,
                            event.step,
                            result.call_id,
                        ),
                    )
            case Paused():
                cursor.execute(
                    "UPDATE trajectory_invocations SET status = 'paused', reason = ?, "
                    "detail = ?, ended_at = ? WHERE invocation_id = ?",
                    (
                        event.reason.value,
                        event.question or event.proposal_digest,
                        _iso(event),
                        event.originator_id,
                    ),
                )
            case ApprovalGranted() | ApprovalDenied() | ClarificationProvided():
                cursor.execute(
                    "UPDATE trajectory_invocations SET status = 'running', reason = NULL, "
                    "detail = NULL, ended_at = NULL WHERE invocation_id = ?",
                    (event.originator_id,),
                )
            case Terminated():
                cursor.execute(
                    "UPDATE trajectory_invocations SET status = 'terminated', reason = ?, "
                    "answer = ?, detail = ?, ended_at = ? WHERE invocation_id = ?",
                    (
                        event.reason.value,
                        event.answer,
                        event.detail,
                        _iso(event),
                        event.originator_id,
                    ),
                )
            case _:
                status = effect_status_after(event)
                if status is not None:
                    cursor.execute(
                        "UPDATE trajectory_calls SET effect_status = ? WHERE effect_key = ?",
                        (status, event.originator_id),
                    )
        _count_events(cursor, event)


def _count_events(cursor: SQLiteCursor, event: DomainEvent) -> None:
    if isinstance(event, InvocationEvent):
        cursor.execute(
            "UPDATE trajectory_invocations SET events = ? WHERE invocation_id = ?",
            (event.originator_version, event.originator_id),
        )


def _iso(event: DomainEvent) -> str:
    return event.timestamp.isoformat()


def _json(value: Any) -> str | None:
    return None if value is None else json.dumps(value, sort_keys=True, separators=(",", ":"))


def list_invocations(
    runner: ProjectionRunner,
    *,
    reason: str | None = None,
    agent: str | None = None,
    limit: int = 100,
) -> list[dict[str, Any]]:
    """Invocations from the trajectory read model, newest first, optionally filtered."""
    clauses, params = [], []
    if reason is not None:
        clauses.append("reason = ?")
        params.append(reason)
    if agent is not None:
        clauses.append("agent = ?")
        params.append(agent)
    where = f"WHERE {' AND '.join(clauses)}" if clauses else ""
    return runner.query(
        "SELECT invocation_id, agent, task_class, status, reason, steps, tool_calls, "
        f"started_at, ended_at, goal FROM trajectory_invocations {where} "
        "ORDER BY started_position DESC LIMIT ?",
        [*params, limit],
    )


def load_trajectory(runner: ProjectionRunner, invocation_id: str) -> Trajectory | None:
    """An invocation's trajectory as the read model holds it (None if unknown)."""
    rows = runner.query(
        "SELECT * FROM trajectory_invocations WHERE invocation_id = ?", [invocation_id]
    )
    if not rows:
        return None
    head = rows[0]
    steps = runner.query(
        "SELECT * FROM trajectory_steps WHERE invocation_id = ? ORDER BY step", [invocation_id]
    )
    calls = runner.query(
        "SELECT * FROM trajectory_calls WHERE invocation_id = ? ORDER BY step, call_order",
        [invocation_id],
    )
    by_step: dict[int, list[CallView]] = {}
    for call in calls:
        by_step.setdefault(call["step"], []).append(
            CallView(
                call_id=call["call_id"],
                name=call["tool"],
                arguments=json.loads(call["arguments"]),
                status="ok" if call["status"] == "ok" else call["error_class"] or call["status"],
                output=json.loads(call["output"]) if call["output"] else None,
                error_message=call["error_message"],
                duration_ms=call["duration_ms"],
                effect_status=call["effect_status"],
            )
        )
    return Trajectory(
        invocation_id=invocation_id,
        goal=head["goal"],
        agent_name=head["agent"],
        steps=[
            StepView(
                step=s["step"],
                kind=s["kind"],
                summary=s["summary"],
                calls=by_step.get(s["step"], []),
                input_tokens=s["input_tokens"],
                output_tokens=s["output_tokens"],
                cost=s["cost"],
            )
            for s in steps
        ],
        reason=TerminalReason(head["reason"]) if head["reason"] else None,
        answer=head["answer"],
        detail=head["detail"],
        tool_calls=head["tool_calls"],
        events=head["events"] or 0,
        status=head["status"],
        task_class=head["task_class"],
        started_at=head["started_at"],
        ended_at=head["ended_at"],
        input_tokens=head["input_tokens"],
        output_tokens=head["output_tokens"],
        cost=head["cost"],
    )
