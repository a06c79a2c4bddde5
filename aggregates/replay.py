"""Replay's judgement: where a re-driven history first departs from the recorded one.

A replay drives a recorded invocation again under a (possibly changed) agent, with a
model that answers the recorded decisions and tools that answer the recorded results:
everything that differs is the loop's doing (its budgets, policies, approval rules,
verifier, compaction, catalogue). :func:`divergences` compares the two histories step
by step and names each departure by kind; the first one is where the replay stopped
being the recorded run.

Pure: the histories are lists of events, nothing is read or run here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from aggregates.decisions import Decision, Frozen, Rejection, TerminalReason, ToolResult
from aggregates.invocation_events import (
    ApprovalDenied,
    ApprovalGranted,
    BatchDispatched,
    ContextCompacted,
    DecisionProposed,
    DispatchedCall,
    InvocationEvent,
    InvocationStarted,
    Paused,
    ResultsCommitted,
    Terminated,
    VerificationFailed,
)
from aggregates.model_input import ModelInput, carried, first_difference


class DivergenceKind(StrEnum):
    """How a replayed history departs from the recorded one."""

    TERMINAL_REASON_CHANGED = "terminal_reason_changed"
    """It ends (or pauses) for another reason."""
    STOPPED_BEFORE_CALL = "stopped_before_call"
    """It ended before a step at which the recorded run made calls."""
    STOPPED_EARLY = "stopped_early"
    """It ended before a step the recorded run went on to (one without calls)."""
    PAST_RECORDING = "past_recording"
    """It asked the model for a step the recorded run never decided."""
    PROPOSAL_REFUSED = "proposal_refused"
    """A recorded decision is refused now (a tool removed, arguments no longer valid)."""
    APPROVAL_REQUIRED = "approval_required"
    """A batch that ran in the recorded run now waits for approval."""
    APPROVAL_NO_LONGER_REQUIRED = "approval_no_longer_required"
    """A batch that waited for approval in the recorded run now runs without it."""
    REFUSED_BY_POLICY = "refused_by_policy"
    """A call that ran in the recorded run is refused by the policy now."""
    NO_LONGER_REFUSED = "no_longer_refused"
    """A call the policy refused in the recorded run is allowed now."""
    FINAL_ANSWER_REFUSED = "final_answer_refused"
    """The verifier refuses a final answer it accepted in the recorded run."""
    FINAL_ANSWER_ACCEPTED = "final_answer_accepted"
    """The verifier accepts a final answer it refused in the recorded run."""
    COMPACTION_CHANGED = "compaction_changed"
    """The model's view was compacted differently (or only in one of the runs)."""
    UNRECORDED_CALL = "unrecorded_call"
    """A call the recorded run did not make."""
    ARGUMENT_DRIFT = "argument_drift"
    """(lenient) A call matched by step, tool and order has other arguments."""
    RECORDED_CALLS_LEFT_OVER = "recorded_calls_left_over"
    """(lenient) Recorded calls of a step that the replay did not make."""
    MODEL_INPUT_CHANGED = "model_input_changed"
    """The model is asked something else than it was (instructions, a tool, the view)."""
    EVENT_SHAPE = "event_shape"
    """(check) A stored event no longer loads with this code: it needs an upcaster."""
    CATALOGUE_CHANGED = "catalogue_changed"
    """(check) A recorded tool was removed or renamed, or its schema changed."""
    SETTINGS_CHANGED = "settings_changed"
    """(check) The agent's budget or settings are not the recorded ones."""


STOPPING = frozenset(DivergenceKind) - {
    DivergenceKind.MODEL_INPUT_CHANGED,
    DivergenceKind.ARGUMENT_DRIFT,
    DivergenceKind.RECORDED_CALLS_LEFT_OVER,
    DivergenceKind.CATALOGUE_CHANGED,
    DivergenceKind.SETTINGS_CHANGED,
}
"""The kinds after which the replay is no longer the recorded run (a strict replay stops).

The others say that something differs while the run goes on as recorded."""


class Divergence(Frozen):
    """One departure of a replay from the recorded run."""

    kind: DivergenceKind
    step: int | None
    """The step it happened at (None: the run as a whole, e.g. its catalogue)."""
    detail: str


@dataclass
class _Step:
    """What one step of a history shows."""

    decision: Decision | None = None
    rejection: Rejection | None = None
    model_input: ModelInput | None = None
    compaction: tuple[tuple[int, ...], tuple[int, ...]] | None = None
    calls: list[DispatchedCall] = field(default_factory=list)
    paused: TerminalReason | None = None
    waiting: list[DispatchedCall] = field(default_factory=list)
    approved: bool = False
    denied: bool = False
    verification_failed: bool = False
    results: list[ToolResult] = field(default_factory=list)


@dataclass
class History:
    """A history read step by step: what each step shows, and how it ended."""

    steps: dict[int, _Step]
    ended: TerminalReason | None
    """The terminal reason; None while it has not ended."""
    paused: TerminalReason | None
    """The reason of its last pause, when it is paused now."""
    agent_name: str
    goal: str

    @property
    def last_step(self) -> int:
        """The last step any event names (0 for none)."""
        return max(self.steps, default=0)

    @property
    def stopped_for(self) -> TerminalReason | None:
        """Why it stopped: its terminal reason, else the reason it is paused."""
        return self.ended or self.paused

    @classmethod
    def of(cls, events: Sequence[InvocationEvent]) -> History:
        """Read a history (an invocation's events in order)."""
        steps: dict[int, _Step] = {}
        ended: TerminalReason | None = None
        paused: TerminalReason | None = None
        agent_name = goal = ""
        asked: ModelInput | None = None  # the full digests of the last request
        for event in events:
            match event:
                case InvocationStarted():
                    agent_name, goal = event.agent_name, event.goal
                case DecisionProposed(step=step):
                    one = steps.setdefault(step, _Step())
                    one.decision, one.rejection = event.decision, event.rejection
                    if event.model_input is not None:
                        asked = carried(asked, event.model_input)
                    one.model_input = asked if event.model_input is not None else None
                case ContextCompacted(step=step):
                    steps.setdefault(step, _Step()).compaction = (
                        tuple(event.dropped_steps),
                        tuple(event.kept_steps),
                    )
                case BatchDispatched(step=step):
                    steps.setdefault(step, _Step()).calls = list(event.calls)
                    paused = None
                case Paused(step=step):
                    one = steps.setdefault(step, _Step())
                    one.paused = paused = event.reason
                    one.waiting = list(event.calls or [])
                case ApprovalGranted(step=step):
                    steps.setdefault(step, _Step()).approved = True
                    paused = None
                case ApprovalDenied(step=step):
                    steps.setdefault(step, _Step()).denied = True
                    paused = None
                case VerificationFailed(step=step):
                    steps.setdefault(step, _Step()).verification_failed = True
                case ResultsCommitted(step=step):
                    steps.setdefault(step, _Step()).results = list(event.results)
                case Terminated():
                    ended, paused = event.reason, None
                case _:
                    pass
        return cls(steps=steps, ended=ended, paused=paused, agent_name=agent_name, goal=goal)


def divergences(
    recorded: History,
    replayed: History,
    *,
    lenient: bool = False,
    keep_going: frozenset[DivergenceKind] = frozenset(),
) -> list[Divergence]:
    """The departures of ``replayed`` from ``recorded``, in step order, then the ending.

    The comparison stops after the first step with a departure of a :data:`STOPPING`
    kind that is not in ``keep_going`` (an approval the replay granted by itself):
    from there on the replay is another run. ``lenient``: calls are matched by step,
    tool and order (not call id); a call whose arguments differ, a call the recorded
    run did not make and recorded calls the replay did not make are reported as they
    are found, and the comparison goes on.
    """
    if lenient:
        keep_going = keep_going | {DivergenceKind.UNRECORDED_CALL}
    found: list[Divergence] = []
    unfinished = recorded.stopped_for is None
    # An unfinished recorded run (killed mid-step) is compared up to its last step: what
    # the replay does after it, the recording cannot say.
    last = recorded.last_step if unfinished else max(recorded.last_step, replayed.last_step)
    for step in range(1, last + 1):
        source, replay = recorded.steps.get(step), replayed.steps.get(step)
        if source is None and replay is None:
            continue
        if replay is None or (replay.decision is None and replay.rejection is None):
            if source is not None and (source.decision is not None or source.rejection):
                found.append(_stopped(step, source, replayed))
                return found
            continue
        if source is None or (source.decision is None and source.rejection is None):
            found.append(
                Divergence(
                    kind=DivergenceKind.PAST_RECORDING,
                    step=step,
                    detail=f"the model was asked for step {step}; the recorded run "
                    f"{_ending(recorded)} after step {recorded.last_step}",
                )
            )
            return found
        found += _compare_step(step, source, replay, lenient=lenient)
        if any(d.kind in STOPPING and d.kind not in keep_going for d in found):
            return found
    if not unfinished and recorded.stopped_for != replayed.stopped_for:
        found.append(
            Divergence(
                kind=DivergenceKind.TERMINAL_REASON_CHANGED,
                step=replayed.last_step or None,
                detail=f"{_reason(recorded.stopped_for)} → {_reason(replayed.stopped_for)}",
            )
        )
    return found


def _compare_step(step: int, source: _Step, replay: _Step, *, lenient: bool) -> list[Divergence]:
    found: list[Divergence] = []

    def add(kind: DivergenceKind, detail: str) -> None:
        found.append(Divergence(kind=kind, step=step, detail=detail))

    if source.model_input is not None and replay.model_input is not None:
        changed = first_difference(source.model_input, replay.model_input)
        if changed is not None:
            add(
                DivergenceKind.MODEL_INPUT_CHANGED,
                f"what the model is asked differs first in {changed}",
            )
    if source.decision is not None and replay.rejection is not None:
        add(
            DivergenceKind.PROPOSAL_REFUSED,
            "the recorded decision is refused now: " + "; ".join(replay.rejection.problems),
        )
        return found
    if source.compaction != replay.compaction:
        add(DivergenceKind.COMPACTION_CHANGED, _compaction(source, replay))
    if (
        replay.paused is TerminalReason.APPROVAL_REQUIRED
        and source.paused is not TerminalReason.APPROVAL_REQUIRED
    ):
        names = ", ".join(c.name for c in replay.waiting) or "the batch"
        add(DivergenceKind.APPROVAL_REQUIRED, f"{names} now waits for approval")
    elif source.paused is TerminalReason.APPROVAL_REQUIRED and replay.paused is None:
        add(DivergenceKind.APPROVAL_NO_LONGER_REQUIRED, "the batch runs without approval now")
    if replay.verification_failed and not source.verification_failed:
        add(DivergenceKind.FINAL_ANSWER_REFUSED, "the verifier refuses the final answer now")
    elif source.verification_failed and not replay.verification_failed:
        add(DivergenceKind.FINAL_ANSWER_ACCEPTED, "the verifier accepts the final answer now")
    found += _compare_calls(step, source, replay, lenient=lenient)
    return found


def _compare_calls(step: int, source: _Step, replay: _Step, *, lenient: bool) -> list[Divergence]:
    found: list[Divergence] = []
    if not replay.calls:
        return found
    if source.denied and not replay.denied:
        return found  # a person denied it then; the approval divergence says the rest
    recorded = {_call_key(c, i, source.calls, lenient): c for i, c in enumerate(source.calls)}
    served: set[tuple[str, ...]] = set()
    for index, call in enumerate(replay.calls):
        key = _call_key(call, index, replay.calls, lenient)
        before = recorded.get(key)
        if before is None:
            found.append(
                Divergence(
                    kind=DivergenceKind.UNRECORDED_CALL,
                    step=step,
                    detail=f"{call.name} (call {call.call_id}) was not made by the recorded run",
                )
            )
            continue
        served.add(key)
        if call.denied is not None and before.denied is None and not source.denied:
            found.append(
                Divergence(
                    kind=DivergenceKind.REFUSED_BY_POLICY,
                    step=step,
                    detail=f"{call.name} (call {call.call_id}): {call.denied}",
                )
            )
        elif before.denied is not None and call.denied is None and not replay.denied:
            found.append(
                Divergence(
                    kind=DivergenceKind.NO_LONGER_REFUSED,
                    step=step,
                    detail=f"{call.name} (call {call.call_id}) runs now; it was {before.denied}",
                )
            )
        if lenient and call.arguments != before.arguments:
            found.append(
                Divergence(
                    kind=DivergenceKind.ARGUMENT_DRIFT,
                    step=step,
                    detail=f"{call.name} (call {call.call_id}) has other arguments",
                )
            )
    left = [
        c
        for i, c in enumerate(source.calls)
        if _call_key(c, i, source.calls, lenient) not in served
    ]
    if lenient and left:
        found.append(
            Divergence(
                kind=DivergenceKind.RECORDED_CALLS_LEFT_OVER,
                step=step,
                detail="not made: " + ", ".join(f"{c.name} (call {c.call_id})" for c in left),
            )
        )
    return found


def _call_key(
    call: DispatchedCall, index: int, calls: Sequence[DispatchedCall], lenient: bool
) -> tuple[str, ...]:
    """A call's identity in its batch: its id, or (lenient) its tool and its order among them."""
    if not lenient:
        return (call.name, call.call_id)
    order = sum(1 for c in calls[:index] if c.name == call.name)
    return (call.name, str(order))


def _stopped(step: int, source: _Step, replayed: History) -> Divergence:
    ran = [c for c in source.calls if c.denied is None]
    ending = _ending(replayed)
    if ran:
        names = ", ".join(c.name for c in ran)
        return Divergence(
            kind=DivergenceKind.STOPPED_BEFORE_CALL,
            step=step,
            detail=f"the replay {ending} before step {step}, where the recorded run called {names}",
        )
    return Divergence(
        kind=DivergenceKind.STOPPED_EARLY,
        step=step,
        detail=f"the replay {ending} before step {step}, which the recorded run went on to",
    )


def _ending(history: History) -> str:
    if history.ended is not None:
        return f"ended {history.ended.value}"
    if history.paused is not None:
        return f"paused {history.paused.value}"
    return "stopped"


def _reason(reason: TerminalReason | None) -> str:
    return "running" if reason is None else reason.value


def _compaction(source: _Step, replay: _Step) -> str:
    def shown(compaction: tuple[tuple[int, ...], tuple[int, ...]] | None) -> str:
        if compaction is None:
            return "not compacted"
        return f"dropped steps {list(compaction[0])}"

    return f"{shown(source.compaction)} → {shown(replay.compaction)}"
