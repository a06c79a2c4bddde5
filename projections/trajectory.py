"""The trajectory of one invocation: its steps, calls, results and how it ended.

Built from the committed events alone, so it can be rebuilt at any time.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from aggregates.decisions import Frozen, TerminalReason
from aggregates.invocation import (
    BatchDispatched,
    DecisionProposed,
    InvocationEvent,
    InvocationStarted,
    Paused,
    ResultsCommitted,
    Terminated,
)


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


class StepView(Frozen):
    """One model decision and, for a tool batch, its calls."""

    step: int
    kind: str
    """The decision kind, or ``rejected``."""
    summary: str
    calls: list[CallView] = []


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
