"""Plan-then-approve, enforced: the values and the rules of a run that plans before it writes.

An agent given ``planning=Planning(...)`` starts under a read-only ceiling: its model is
offered only the read tools, and a write it proposes all the same is refused (the call
gets a ``denied`` result, which the model sees). Its ``plan`` decision lists the writes
it will make (each a tool and its arguments); it is recorded as ``PlanProposed`` and the
run pauses ``plan_approval_required`` until a person approves the plan by its digest, or
denies it. Only when the agent says so (``approve_by="policy"``) does its policy decide
instead of a person.

An approved plan pre-authorises exactly its writes: each step once, matched by its tool
and the digest of its validated arguments (defaults filled in; a sensitive value is
matched by its real value, and stored redacted). A write that is not in the plan, or
has other arguments, or repeats a step already made, waits for its own approval
(``approval_required``), whatever its tool's approval rule. A denied plan goes back to
the model with the denial; a new plan supersedes the last, and until it is approved the
ceiling is back.

The values and the pure rules only: the turn core (:mod:`aggregates.turn`) applies
them, the Invocation (:mod:`aggregates.invocation`) records and checks them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from enum import StrEnum
from typing import Any, Protocol

from pydantic import ValidationError

from aggregates.decisions import (
    Frozen,
    Plan,
    PlanStep,
    RejectionClass,
    ToolCall,
    ToolEffect,
)
from aggregates.digest import digest_of
from aggregates.revalidation import validation_problems
from aggregates.values import check_json, describe_error

MAX_PLAN_STEPS = 100
"""The most writes one plan may list."""

POLICY_APPROVER = "policy"
"""Who approves (or denies) a plan in the record when the agent's policy decides."""


class ApproveBy(StrEnum):
    """Who approves a plan."""

    PERSON = "person"
    """A person, with ``approve`` / ``deny`` and the plan's digest (the default)."""
    POLICY = "policy"
    """The agent's policy, asked about each planned write (only when the agent says so)."""


class Planning(Frozen):
    """An agent plans before it writes: ``Agent(..., planning=Planning(approve_by="person"))``.

    Recorded in ``RunSettings.planning`` and followed on resume. ``approve_by``: who
    approves its plans, ``person`` (the default) or ``policy`` (its policy decides; only
    when the agent says so).
    """

    approve_by: ApproveBy = ApproveBy.PERSON

    def __init__(self, approve_by: ApproveBy | str = ApproveBy.PERSON) -> None:
        """Plan before writing; ``approve_by`` says who approves the plans.

        Raises:
            pydantic.ValidationError: ``approve_by`` is neither ``person`` nor ``policy``.
        """
        # The pydantic plugin types the base __init__ as field-less Frozen's.
        super().__init__(approve_by=approve_by)  # type: ignore[call-arg]


class PlannedWrite(Frozen):
    """One step of a recorded plan: the write it will make."""

    tool: str
    arguments: dict[str, Any]
    """Its arguments validated (defaults filled in), redacted as the tool says."""
    arguments_digest: str
    """:func:`write_digest` of the tool and its validated (real) arguments: what a call
    must match to run under the plan."""
    description: str = ""


class PlanStage(StrEnum):
    """Where an invocation that plans stands."""

    PLANNING = "planning"
    """No plan in force (none proposed yet, or the last was denied): read-only."""
    PROPOSED = "proposed"
    """A plan waits for approval: read-only."""
    APPROVED = "approved"
    """A plan is in force: its writes run, each once, without another approval."""


class PlanState(Frozen):
    """The plan of an invocation that plans (``Invocation.planning``)."""

    stage: PlanStage = PlanStage.PLANNING
    step: int | None = None
    """The step the latest plan was proposed at (None before the first)."""
    digest: str | None = None
    """The latest plan's digest (what ``approve --digest`` names)."""
    writes: list[PlannedWrite] = []
    used: list[int] = []
    """The steps of the plan in force already made (1 for its first write)."""
    approved_by: str | None = None
    denial: str | None = None
    """The latest plan's denial (``denied by NAME: REASON``), told to the model."""

    @property
    def read_only(self) -> bool:
        """True while no plan is in force: no write runs."""
        return self.stage is not PlanStage.APPROVED


class _Tools(Protocol):
    """What the plan's checks ask of the agent's tools (the turn core's ``Catalogue``)."""

    def effect_of(self, name: str) -> ToolEffect | None:
        """The tool's effect, or None when there is no such tool."""

    def check_arguments(self, call: ToolCall) -> dict[str, Any]:
        """A call's arguments validated and normalised (``pydantic.ValidationError`` if not)."""

    def redact_arguments(self, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        """Arguments as they may be stored."""


# --------------------------------------------------------------------------- digests


def plan_call_id(index: int) -> str:
    """The id a plan's step ``index`` (1 for the first) goes by where a call's id is needed."""
    return f"plan-{index}"


def write_digest(tool: str, arguments: Mapping[str, Any]) -> str:
    """The digest a write is matched by: its tool and its validated arguments."""
    return digest_of(["planned-write", tool, dict(arguments)])


def plan_digest(step: int, writes: Sequence[PlannedWrite]) -> str:
    """The digest of a plan: what a person approves (``approve --digest``, with its id).

    Of its step and its writes, not of the invocation's id: a fork that copies the plan
    copies its digest with it, and the approval named by the digest still holds there.
    """
    return digest_of(["plan", step, [[w.tool, w.arguments_digest, w.description] for w in writes]])


# --------------------------------------------------------------------------- the proposal


def plan_problems(
    plan: Plan, tools: _Tools, planning: Planning | None
) -> tuple[list[tuple[RejectionClass, str]], dict[str, dict[str, Any]]]:
    """What is wrong with a proposed plan, and each step's validated arguments.

    The arguments are keyed by :func:`plan_call_id`. A plan from an agent that does not
    plan, one without steps, a step naming no tool the agent has, a step that reads, and
    arguments the tool refuses are each a problem the model is told.
    """
    problems: list[tuple[RejectionClass, str]] = []
    arguments: dict[str, dict[str, Any]] = {}
    if planning is None:
        problems.append(
            (RejectionClass.INVALID_PLAN, "this agent does not plan: act, or answer, instead")
        )
        return problems, arguments
    if not plan.steps:
        problems.append((RejectionClass.INVALID_PLAN, "a plan lists at least one write"))
    if len(plan.steps) > MAX_PLAN_STEPS:
        problems.append(
            (RejectionClass.INVALID_PLAN, f"a plan lists at most {MAX_PLAN_STEPS} writes")
        )
    for index, step in enumerate(plan.steps, start=1):
        problem = _step_problem(index, step, tools)
        if isinstance(problem, tuple):
            problems.append(problem)
        else:
            arguments[plan_call_id(index)] = problem
    return problems, arguments


def _step_problem(
    index: int, step: PlanStep, tools: _Tools
) -> tuple[RejectionClass, str] | dict[str, Any]:
    """A step's problem, or its validated arguments."""
    where = f"plan step {index}"
    effect = tools.effect_of(step.tool)
    if effect is None:
        return RejectionClass.UNKNOWN_TOOL, f"{where}: unknown tool {step.tool!r}"
    if effect is not ToolEffect.WRITE:
        return (
            RejectionClass.INVALID_PLAN,
            f"{where}: {step.tool} reads; a plan lists the writes it will make "
            "(reads need no approval: make them while planning)",
        )
    call = ToolCall(id=plan_call_id(index), name=step.tool, arguments=step.arguments)
    try:
        checked = tools.check_arguments(call)
    except ValidationError as error:
        details = "; ".join(validation_problems(error, whole="arguments"))
        return (
            RejectionClass.INVALID_ARGUMENTS,
            f"{where}: arguments for {step.tool} are invalid: {details}",
        )
    except Exception as error:  # a validator of the tool's types that broke
        return (
            RejectionClass.INVALID_ARGUMENTS,
            f"{where}: arguments for {step.tool} could not be checked: {describe_error(error)}",
        )
    problem = check_json(checked)
    if problem is not None:
        return (
            RejectionClass.VALUE_INVALID,
            f"{where}: arguments for {step.tool} cannot be stored faithfully once "
            f"validated: {problem}",
        )
    return checked


def planned_writes(
    plan: Plan, arguments: Mapping[str, dict[str, Any]], tools: _Tools
) -> list[PlannedWrite]:
    """A valid plan's writes as recorded: validated arguments, redacted, and their digests."""
    writes = []
    for index, step in enumerate(plan.steps, start=1):
        checked = arguments[plan_call_id(index)]
        writes.append(
            PlannedWrite(
                tool=step.tool,
                arguments=tools.redact_arguments(step.tool, checked),
                arguments_digest=write_digest(step.tool, checked),
                description=step.description,
            )
        )
    return writes


def stored_plan(plan: Plan, writes: Sequence[PlannedWrite]) -> Plan:
    """The plan decision as stored: each step's arguments as recorded in its write."""
    return plan.model_copy(
        update={
            "steps": [
                step.model_copy(update={"arguments": write.arguments})
                for step, write in zip(plan.steps, writes, strict=True)
            ]
        }
    )


# --------------------------------------------------------------------------- the turn's rules


def planning_notices(state: PlanState | None) -> list[str]:
    """What the model is told of its plan before it decides (nothing once one is in force)."""
    if state is None or not state.read_only:
        return []
    notices = [
        "You are planning: only read tools are offered, and no write runs yet. Look "
        'around, then propose a plan ({"kind": "plan", "steps": [{"tool": ..., '
        '"arguments": {...}, "description": ...}], "summary": ...}) listing each write '
        "you will make; once it is approved, exactly those writes run."
    ]
    if state.denial is not None:
        notices.append(f"Your last plan was {state.denial}. Propose a revised plan, or stop.")
    return notices


def refused_while_planning(
    state: PlanState | None, calls: Sequence[tuple[str, str, ToolEffect]]
) -> dict[str, str]:
    """The writes of a batch (``(call id, tool, effect)``) refused under the read-only ceiling."""
    if state is None or not state.read_only:
        return {}
    why = (
        "not run: no plan is approved yet; propose a plan listing this write "
        "and wait for its approval"
        if state.stage is PlanStage.PLANNING
        else "not run: the plan waits for approval"
    )
    return {call_id: why for call_id, _, effect in calls if effect is ToolEffect.WRITE}


def match_planned(
    state: PlanState | None, writes: Sequence[tuple[str, str, Mapping[str, Any]]]
) -> dict[str, int]:
    """The writes (``(call id, tool, validated arguments)``) the plan in force authorises.

    By call id, the step of the plan each one makes (1 for the first): the first step
    not made yet whose tool and argument digest it matches, each step once. A write
    left out needs its own approval.
    """
    if state is None or state.read_only:
        return {}
    free = [i for i in range(1, len(state.writes) + 1) if i not in state.used]
    matched: dict[str, int] = {}
    for call_id, tool, arguments in writes:
        digest = write_digest(tool, arguments)
        for index in free:
            write = state.writes[index - 1]
            if write.tool == tool and write.arguments_digest == digest:
                matched[call_id] = index
                free.remove(index)
                break
    return matched


def planned_approval(
    state: PlanState | None, effect: ToolEffect, plan_step: int | None
) -> bool | None:
    """Whether a call needs a person's approval under the plan; None: its tool's rule says.

    Under a plan in force a write of the plan needs none, any other write does.
    """
    if state is None or state.read_only or effect is not ToolEffect.WRITE:
        return None
    return plan_step is None


# --------------------------------------------------------------------------- the record's rules


def started(planning: Planning | None) -> PlanState | None:
    """The plan state of an invocation that starts with these settings (None: no planning)."""
    return PlanState() if planning is not None else None


def proposed(
    state: PlanState | None,
    *,
    step: int,
    digest: str,
    writes: Sequence[PlannedWrite],
    decision: object,
    expected_digest: str,
) -> PlanState | str:
    """The state after ``PlanProposed``, or why it is refused."""
    if state is None:
        return "this invocation does not plan"
    if not isinstance(decision, Plan):
        return "a plan follows a plan decision"
    if [(s.tool, s.description) for s in decision.steps] != [
        (w.tool, w.description) for w in writes
    ] or [s.arguments for s in decision.steps] != [w.arguments for w in writes]:
        return "the plan's writes must be the decision's steps, in order"
    if digest != expected_digest:
        return "the digest is not the plan's"
    return PlanState(stage=PlanStage.PROPOSED, step=step, digest=digest, writes=list(writes))


def pause_problem(state: PlanState | None, *, step: int, digest: str | None) -> str | None:
    """Why a pause for a plan's approval is refused (None: it fits the plan just proposed)."""
    if state is None or state.stage is not PlanStage.PROPOSED or state.step != step:
        return "only a plan just proposed waits for a plan's approval"
    if digest != state.digest:
        return "a plan's approval waits for the plan's digest"
    return None


def decided(state: PlanState, *, by: str, denial: str | None) -> PlanState:
    """The state after the plan was approved (``denial`` None) or denied."""
    if denial is None:
        return state.model_copy(update={"stage": PlanStage.APPROVED, "approved_by": by})
    return state.model_copy(
        update={"stage": PlanStage.PLANNING, "denial": f"denied by {by}: {denial}"}
    )


def dispatch_problem(
    state: PlanState | None,
    calls: Sequence[tuple[str, ToolEffect, bool, int | None, Mapping[str, Any]]],
    *,
    approved_by_person: bool,
) -> str | None:
    """Why a batch may not be dispatched under the plan (None: it may).

    ``calls``: ``(tool, effect, denied, plan step, stored arguments)`` of each call. Under
    the ceiling every write is denied; under a plan, a write that runs is a step not made
    yet (of the same tool and stored arguments), or the batch was approved by a person.
    """
    if state is None:
        if any(plan_step is not None for *_, plan_step, _ in calls):
            return "a call of an invocation that does not plan names a plan step"
        return None
    taken: set[int] = set()
    for tool, effect, denied, plan_step, arguments in calls:
        if denied:
            continue
        if plan_step is not None:
            if state.read_only or not 1 <= plan_step <= len(state.writes):
                return f"plan step {plan_step} is not a step of the plan in force"
            write = state.writes[plan_step - 1]
            if plan_step in state.used or plan_step in taken:
                return f"plan step {plan_step} was made already"
            if write.tool != tool or write.arguments != arguments:
                return f"plan step {plan_step} is another write"
            taken.add(plan_step)
            continue
        if effect is not ToolEffect.WRITE:
            continue
        if state.read_only:
            return "no write runs before a plan is approved"
        if not approved_by_person:
            return "a write outside the plan runs only once a person approved it"
    return None


def dispatched(state: PlanState | None, plan_steps: Sequence[int]) -> PlanState | None:
    """The state once these steps of the plan in force were dispatched."""
    if state is None or not plan_steps:
        return state
    return state.model_copy(update={"used": sorted({*state.used, *plan_steps})})
