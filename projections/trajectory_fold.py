"""The trajectory of one invocation as a pure fold: its steps, calls, results and end.

One fold, :func:`evolve_trajectory`, turns an invocation's events (and the events
of its writes' effects) into a :class:`Trajectory`; :func:`build_trajectory` folds
a whole history (what ``loop-actors demo`` prints). Nothing here reads or writes a
database: :mod:`projections.trajectory` stores the fold's result as rows.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from enum import StrEnum
from typing import Any, TypeVar, cast

from pydantic import JsonValue, computed_field

from aggregates.decisions import (
    SET_DICT,
    SET_EXTRA,
    SET_FIELDS_SET,
    SET_PRIVATE,
    Decision,
    Effect,
    EffectStatus,
    ErrorClass,
    Frozen,
    Rejection,
    TerminalReason,
    ToolResult,
    built,
)
from aggregates.effect import EffectEvent, effect_status_after
from aggregates.events import ByClass, DomainEvent, isoformat
from aggregates.handoffs import handoff_id_of
from aggregates.invocation import (
    ApprovalDenied,
    ApprovalGranted,
    BatchDispatched,
    ClarificationProvided,
    ContextCompacted,
    CritiqueReturned,
    DecisionProposed,
    InvocationEvent,
    InvocationStarted,
    Paused,
    ResultsCommitted,
    SleepEnded,
    Terminated,
    VerificationFailed,
)
from aggregates.values import limit_size

_Model = TypeVar("_Model", bound=Frozen)


class InvocationStatus(StrEnum):
    """Where an invocation stands: running, paused (for a person or a service) or over."""

    RUNNING = "running"
    PAUSED = "paused"
    TERMINATED = "terminated"


class CallView(Frozen):
    """One call of a step and what became of it."""

    call_id: str
    name: str
    arguments: dict[str, Any]
    status: str
    """``ok``, an error class, or ``dispatched`` while no result is committed."""
    output: JsonValue = None
    """The output, or, over ``OUTPUT_PREVIEW_BYTES``, its truncated stand-in
    (``{"truncated": true, "size": ..., "sha256": ..., "head": ...}``)."""
    error_message: str | None = None
    duration_ms: float | None = None
    effect: Effect = Effect.READ
    effect_key: str | None = None
    """For a write: its effect key (the ``effects`` listing and the ledger use it)."""
    effect_status: str | None = None
    """For a write: what the effect ledger says (``committed``, ``reconciled``...)."""
    plan_step: int | None = None
    """For a write of the approved plan in force: the plan's step it made (1 for the first)."""


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
    latency_ms: float = 0.0
    decision: Decision | None = None
    rejection: Rejection | None = None
    approval: str | None = None
    """For a batch or a plan a person (or a policy) decided on: ``approved by NAME (note)``
    or ``denied by NAME: REASON``."""


class CritiqueView(Frozen):
    """One round of the agent's critic (reflection): its verdict on a final answer."""

    round: int
    step: int
    """The step of the final answer it reviewed."""
    verdict: str
    """``accept``, ``revise``, ``malformed`` or ``failed``."""
    critique: str | None = None
    """For ``revise``: what the critic asked to change."""
    problem: str | None = None
    """For ``malformed`` and ``failed``: why the round gave no verdict."""
    input_tokens: int = 0
    output_tokens: int = 0
    cost: float = 0.0
    latency_ms: float = 0.0


class Trajectory(Frozen):
    """The readable history of one invocation."""

    invocation_id: str
    goal: str
    agent_name: str
    agent_version: str = ""
    steps: list[StepView]
    reason: TerminalReason | None = None
    answer: str | None = None
    detail: str | None = None
    tool_calls: int = 0
    events: int = 0
    """The invocation's events folded so far (its version)."""
    status: InvocationStatus = InvocationStatus.RUNNING
    task_class: str | None = None
    started_at: str | None = None
    ended_at: str | None = None
    """When it last paused or ended; None while running."""
    input_tokens: int = 0
    output_tokens: int = 0
    cost: float = 0.0
    parent_id: str | None = None
    """For a child invocation: its parent's id (None for a root)."""
    forked_from: str | None = None
    """For a fork: the id of the invocation it was copied from."""
    handed_off_from: str | None = None
    """For the target of a handoff: the id of the invocation that handed off to it."""
    critiques: list[CritiqueView] = []
    """The critic's rounds, in order (apart from the steps: the critic is not the agent)."""

    @computed_field  # type: ignore[prop-decorator]
    @property
    def handed_off_to(self) -> str | None:
        """For an invocation that ended ``handed_off``: the id of its target (derived)."""
        if self.reason is not TerminalReason.HANDED_OFF:
            return None
        return handoff_id_of(self.invocation_id)

    @property
    def critic_input_tokens(self) -> int:
        """The critic's input tokens, in all its rounds (not in ``input_tokens``)."""
        return sum(c.input_tokens for c in self.critiques)

    @property
    def critic_output_tokens(self) -> int:
        """The critic's output tokens, in all its rounds (not in ``output_tokens``)."""
        return sum(c.output_tokens for c in self.critiques)

    @property
    def critic_cost(self) -> float:
        """What the critic cost, in all its rounds (not in ``cost``)."""
        return sum(c.cost for c in self.critiques)


def _summary(decision: Decision | None, rejection: Rejection | None) -> tuple[str, str]:
    """A step's kind and summary, from its decision or its rejection."""
    if rejection is not None:
        return "rejected", "; ".join(rejection.__dict__["problems"])
    assert decision is not None
    d = decision.__dict__  # the fields (see _head_row)
    match kind := d["kind"]:
        case "final":
            return "final", d["answer"]
        case "tool_calls":
            return "tool_calls", f"{len(d['calls'])} call(s)"
        case "clarification":
            return "clarification", d["question"]
        case "request_approval":
            return "request_approval", d["proposal_digest"]
        case "cannot_continue":
            return "cannot_continue", d["reason"]
        case "handoff":
            return "handoff", f"to {d['to']}: {d['reason']}"
        case "plan":
            writes = f"{len(d['steps'])} write(s)"
            return "plan", f"{writes}: {d['summary']}" if d["summary"] else writes
    return kind, ""


# --------------------------------------------------------------------------- the fold


def evolve_trajectory(trajectory: Trajectory | None, event: DomainEvent) -> Trajectory:
    """The trajectory after one more event: the one fold behind every trajectory shown.

    Pure. ``trajectory`` is None before the invocation's ``InvocationStarted``.
    Each event changes the trajectory's head and at most one step: the step it
    names, or for an effect event the step holding the call with its effect key.
    An effect event of a write this trajectory does not hold (yet) changes nothing,
    and so does any event that is not the invocation's or its effects'.

    Raises:
        ValueError: the events do not start with ``InvocationStarted``, or name a
            step the trajectory does not hold.
    """
    if trajectory is None:
        if not isinstance(event, InvocationStarted):
            raise ValueError("a trajectory starts with InvocationStarted")
        return built(
            Trajectory,
            {
                "invocation_id": event.originator_id,
                "goal": event.goal,
                "agent_name": event.agent_name,
                "agent_version": event.agent_version,
                "steps": [],
                "reason": None,
                "answer": None,
                "detail": None,
                "tool_calls": 0,
                "events": event.originator_version,
                "status": InvocationStatus.RUNNING,
                "task_class": event.task_class,
                "started_at": isoformat(event.timestamp),
                "ended_at": None,
                "input_tokens": 0,
                "output_tokens": 0,
                "cost": 0.0,
                "parent_id": event.parent.parent_id if event.parent is not None else None,
                "forked_from": (
                    event.forked_from.source_id if event.forked_from is not None else None
                ),
                "handed_off_from": (
                    event.handed_off_from.source_id if event.handed_off_from is not None else None
                ),
                "critiques": [],
            },
        )
    cls = type(event)
    fold = _INVOCATION_FOLDS[cls]
    if fold is None:  # not an invocation event
        return _on_effect(trajectory, event) if _IS_EFFECT[cls] else trajectory
    # The folds read the models' fields from their __dict__s (see _head_row): the event's
    # fields are handed to them as its __dict__.
    e = event.__dict__
    if e["originator_id"] != trajectory.__dict__["invocation_id"]:
        return trajectory
    head: dict[str, Any] = {"events": e["originator_version"]}
    fold(trajectory, e, head)
    return _replace(trajectory, head)


_Fold = Callable[[Trajectory, dict[str, Any], dict[str, Any]], None]
"""What an invocation event (its fields: its ``__dict__``) changes: it puts the head's new
values in the dict it is given."""


def _on_decision(trajectory: Trajectory, event: dict[str, Any], head: dict[str, Any]) -> None:
    decision, rejection = event["decision"], event["rejection"]
    kind, summary = _summary(decision, rejection)
    usage = event["usage"].__dict__  # read once each (see _head_row)
    input_tokens, output_tokens, cost = usage["input_tokens"], usage["output_tokens"], usage["cost"]
    step = built(
        StepView,
        {
            "step": event["step"],
            "kind": kind,
            "summary": summary,
            "calls": [],
            "input_tokens": input_tokens,
            "output_tokens": output_tokens,
            "cost": cost,
            "latency_ms": usage["latency_ms"],
            "decision": decision,
            "rejection": rejection,
            "approval": None,
        },
    )
    t = trajectory.__dict__
    head["steps"] = [*t["steps"], step]
    head["input_tokens"] = t["input_tokens"] + input_tokens
    head["output_tokens"] = t["output_tokens"] + output_tokens
    head["cost"] = t["cost"] + cost


def _on_dispatch(trajectory: Trajectory, event: dict[str, Any], head: dict[str, Any]) -> None:
    """A ``BatchDispatched``: its calls, dispatched, in the step."""
    calls = []
    for call in event["calls"]:
        c = call.__dict__
        key = c["effect_key"]
        calls.append(
            built(
                CallView,
                {
                    "call_id": c["call_id"],
                    "name": c["name"],
                    "arguments": c["arguments"],
                    "status": "dispatched",
                    "output": None,
                    "error_message": None,
                    "duration_ms": None,
                    "effect": c["effect"],
                    "effect_key": key,
                    "effect_status": "dispatched" if key else None,
                    "plan_step": c["plan_step"],
                },
            )
        )
    t = trajectory.__dict__
    index = _step_index(trajectory, event["step"])
    head["steps"] = _with_step(trajectory, index, _calls(t["steps"][index], calls))
    head["tool_calls"] = t["tool_calls"] + len(calls)


def _on_results(trajectory: Trajectory, event: dict[str, Any], head: dict[str, Any]) -> None:
    """A ``ResultsCommitted``: each call of the step with its result."""
    by_id = {result.__dict__["call_id"]: result for result in event["results"]}
    t = trajectory.__dict__
    index = _step_index(trajectory, event["step"])
    step = t["steps"][index]
    calls = [_settle(call, by_id.get(call.__dict__["call_id"])) for call in step.__dict__["calls"]]
    head["steps"] = _with_step(trajectory, index, _calls(step, calls))
    if t["status"] is InvocationStatus.PAUSED:  # after a reconciliation pause
        head |= _RUNNING


def _on_pause(trajectory: Trajectory, event: dict[str, Any], head: dict[str, Any]) -> None:
    head |= {
        "status": InvocationStatus.PAUSED,
        "reason": event["reason"],
        "detail": event["question"] or event["proposal_digest"],
        "ended_at": isoformat(event["timestamp"]),
    }


def _on_end(trajectory: Trajectory, event: dict[str, Any], head: dict[str, Any]) -> None:
    head |= {
        "status": InvocationStatus.TERMINATED,
        "reason": event["reason"],
        "answer": event["answer"],
        "detail": event["detail"],
        "ended_at": isoformat(event["timestamp"]),
    }


def _on_resume(trajectory: Trajectory, event: dict[str, Any], head: dict[str, Any]) -> None:
    head |= _RUNNING


def _on_approval(trajectory: Trajectory, event: dict[str, Any], head: dict[str, Any]) -> None:
    """An ``ApprovalGranted`` or ``ApprovalDenied``: the step says who decided (as its turn)."""
    head |= _RUNNING
    if "reason" in event:
        approval = f"denied by {event['by']}: {event['reason']}"
    else:
        approval = f"approved by {event['by']}" + (f" ({event['note']})" if event["note"] else "")
    index = _step_index(trajectory, event["step"])
    step = trajectory.__dict__["steps"][index]
    head["steps"] = _with_step(trajectory, index, _replace(step, {"approval": approval}))


def _on_second_start(trajectory: Trajectory, event: dict[str, Any], head: dict[str, Any]) -> None:
    raise ValueError(f"invocation {trajectory.invocation_id} started twice")


def _on_critique(trajectory: Trajectory, event: dict[str, Any], head: dict[str, Any]) -> None:
    """A ``CritiqueReturned``: the critic's round, after the ones before."""
    usage = event["usage"].__dict__
    critique = built(
        CritiqueView,
        {
            "round": event["round"],
            "step": event["step"],
            "verdict": event["verdict"].value,
            "critique": event["critique"],
            "problem": event["problem"],
            "input_tokens": usage["input_tokens"],
            "output_tokens": usage["output_tokens"],
            "cost": usage["cost"],
            "latency_ms": usage["latency_ms"],
        },
    )
    head["critiques"] = [*trajectory.__dict__["critiques"], critique]


def _counted(trajectory: Trajectory, event: dict[str, Any], head: dict[str, Any]) -> None:
    """Not shown in the trajectory (or not known to this version): counted among its events."""


_FOLDS: tuple[tuple[type, _Fold], ...] = (
    # The classes are disjoint; the order is the one a match over them would have.
    (DecisionProposed, _on_decision),
    (BatchDispatched, _on_dispatch),
    (ResultsCommitted, _on_results),
    (Paused, _on_pause),
    (Terminated, _on_end),
    (ApprovalGranted, _on_approval),
    (ApprovalDenied, _on_approval),
    (ClarificationProvided, _on_resume),
    (SleepEnded, _on_resume),
    (InvocationStarted, _on_second_start),
    (VerificationFailed, _counted),
    (ContextCompacted, _counted),
    (CritiqueReturned, _on_critique),
)


def _fold_of(cls: type) -> _Fold | None:
    """How an invocation event of ``cls`` changes a trajectory; None for any other event."""
    if not issubclass(cls, InvocationEvent):
        return None
    return next((fold for case, fold in _FOLDS if issubclass(cls, case)), _counted)


_INVOCATION_FOLDS: ByClass[_Fold | None] = ByClass(_fold_of)
_IS_EFFECT: ByClass[bool] = ByClass(lambda cls: issubclass(cls, EffectEvent))


OUTPUT_PREVIEW_BYTES = 4_096
"""The largest output (JSON bytes) the read model copies whole; a larger one is kept as its
truncated stand-in (``aggregates.values.truncated``: size, digest and the first characters)."""


def _preview(output: JsonValue) -> JsonValue:
    """What the read model copies of a stored output: all of it, or a preview and its size."""
    kept, _ = limit_size(output, max_bytes=OUTPUT_PREVIEW_BYTES)
    return cast("JsonValue", kept)


_RUNNING: dict[str, Any] = {
    "status": InvocationStatus.RUNNING,
    "reason": None,
    "detail": None,
    "ended_at": None,
}


def _replace(model: _Model, update: dict[str, Any]) -> _Model:
    """``model.model_copy(update=update)`` without its generic copying: the fold's hot path.

    As ``model_copy``, the values in ``update`` are not validated: the fold takes
    them from validated events.
    """
    copied = object.__new__(type(model))
    SET_DICT(copied, {**model.__dict__, **update})
    fields_set = model.__pydantic_fields_set__
    if not fields_set.issuperset(update):  # else shared: nothing changes a frozen model's
        fields_set = fields_set | update.keys()
    SET_FIELDS_SET(copied, fields_set)
    SET_EXTRA(copied, None)
    SET_PRIVATE(copied, None)
    return copied


def _settle(call: CallView, result: ToolResult | None) -> CallView:
    """The call with its result (as it was without one)."""
    if result is None:
        return call
    r = result.__dict__
    error, effect_status = r["error"], r["effect_status"]
    failure = error.__dict__ if error is not None else None
    return _replace(
        call,
        {
            "status": "ok" if failure is None else ENUM_VALUES[failure["error_class"]],
            "output": _preview(r["output"]) if failure is None else None,
            "error_message": failure["message"] if failure is not None else None,
            "duration_ms": r["duration_ms"],
            "effect_status": ENUM_VALUES[effect_status]
            if effect_status
            else call.__dict__["effect_status"],
        },
    )


def _calls(step: StepView, calls: list[CallView]) -> StepView:
    return _replace(step, {"calls": calls})


def _step_index(trajectory: Trajectory, number: int) -> int:
    """Where the step ``number`` is in the trajectory's steps (the first of that number)."""
    for index, step in enumerate(trajectory.__dict__["steps"]):
        if step.__dict__["step"] == number:
            return index
    raise ValueError(f"invocation {trajectory.invocation_id} has no step {number}")


def _with_step(trajectory: Trajectory, index: int, step: StepView) -> list[StepView]:
    """The trajectory's steps with ``step`` at ``index`` instead."""
    steps = list(trajectory.__dict__["steps"])
    steps[index] = step
    return steps


def _on_effect(trajectory: Trajectory, event: DomainEvent) -> Trajectory:
    """An effect event's change: the status of the call holding its effect key."""
    key = event.__dict__["originator_id"]
    steps = trajectory.__dict__["steps"]
    for holding, step in enumerate(steps):
        s = step.__dict__
        for call in s["calls"]:
            if call.__dict__["effect_key"] == key:
                break
        else:
            continue
        # The (first) step of the number of the step holding the key follows it.
        index = _step_index(trajectory, s["step"]) if holding else 0
        target = steps[index]
        status = effect_status_after(event)
        calls = [
            _replace(call, {"effect_status": status})
            if call.__dict__["effect_key"] == key
            else call
            for call in target.__dict__["calls"]
        ]
        return _replace(trajectory, {"steps": _with_step(trajectory, index, _calls(target, calls))})
    return trajectory


def step_changed_by(event: InvocationEvent) -> int | None:
    """The step already in the trajectory that ``event`` changes; None if it changes none.

    Part of the fold's contract (tests hold :func:`evolve_trajectory` to it): an
    invocation event changes the head, this step, and may append a new step,
    nothing else. An effect event changes the step holding its effect key.
    """
    match event:
        case BatchDispatched() | ResultsCommitted() | ApprovalGranted() | ApprovalDenied():
            return event.step
        case _:
            return None


def build_trajectory(events: Iterable[DomainEvent]) -> Trajectory:
    """Fold an invocation's events into its trajectory (what ``loop-actors demo`` prints).

    ``events`` are the invocation's, in order; the events of its writes' effects
    may be interleaved (in the store's order) to follow the ledger as the read
    model does. Other invocations' events are ignored.

    Raises:
        ValueError: the events do not start with ``InvocationStarted``.
    """
    trajectory: Trajectory | None = None
    for event in events:
        trajectory = evolve_trajectory(trajectory, event)
    if trajectory is None:
        raise ValueError("a trajectory starts with InvocationStarted")
    return trajectory


ENUM_VALUES: dict[StrEnum, str] = {
    m: m.value
    for e in (InvocationStatus, TerminalReason, Effect, ErrorClass, EffectStatus)
    for m in e
}
"""Each status, reason, effect, error class and effect status's value (a dict lookup: an
enum's ``value`` is a Python property)."""
