"""The Invocation's events: the persisted vocabulary of one agent run.

Each class carries its stored topic (``TOPIC``, ``aggregates.invocation:<name>``:
the module that held them first; see :mod:`aggregates.topics`), so that moving
them here changed no stored name and no chain hash. They are applied by
:meth:`aggregates.invocation.Invocation._evolve`, and importable from
:mod:`aggregates.invocation` as before.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, ClassVar

from eventsourcing.domain import CanInitAggregate
from pydantic import Field, field_validator

from aggregates.children import Allotment, ParentLink, Spent
from aggregates.critic import Verdict
from aggregates.decisions import (
    Budget,
    Decision,
    Frozen,
    Rejection,
    TerminalReason,
    ToolEffect,
    ToolResult,
    Usage,
)
from aggregates.events import DomainEvent
from aggregates.fork_origin import ForkOrigin
from aggregates.handoffs import HandoffOrigin
from aggregates.model_input import ModelInput
from aggregates.planning import PlannedWrite
from aggregates.settings import RunSettings


class InvocationEvent(DomainEvent):
    """Base of every Invocation event."""


class ToolSpec(Frozen):
    """A tool as the invocation saw it when it started: name, effect and schema digest."""

    name: str
    effect: ToolEffect
    schema_digest: str


class TraceParent(Frozen):
    """The OpenTelemetry span that was current when an application started an invocation.

    W3C trace-context ids as lower-case hex: the invocation's spans join that trace,
    under that span, in every process that drives or re-exports it.
    """

    trace_id: Annotated[str, Field(pattern=r"^[0-9a-f]{32}$")]
    span_id: Annotated[str, Field(pattern=r"^[0-9a-f]{16}$")]

    @field_validator("trace_id", "span_id")
    @classmethod
    def _not_all_zeros(cls, value: str) -> str:
        if not value.strip("0"):
            raise ValueError("an all-zero id is the W3C trace-context's invalid id")
        return value


class InvocationStarted(InvocationEvent, CanInitAggregate[str]):
    """An invocation was created with its goal, agent, tool catalogue and budget."""

    TOPIC: ClassVar[str] = "aggregates.invocation:InvocationStarted"

    originator_topic: str
    goal: str
    agent_name: str
    agent_version: str
    catalogue_digest: str
    tools: list[ToolSpec]
    budget: Budget
    task_class: str | None = None
    actor: str | None = None
    """Who the invocation acts for (checked by the agent's policy)."""
    tenant: str | None = None
    """Whose data it acts on (checked by the agent's policy)."""
    settings: RunSettings | None = None
    """The rest of what decides the run's course (None in invocations recorded before it was)."""
    forked_from: ForkOrigin | None = None
    """For a fork: the invocation and step it was copied from, by whom and why (from 0.2)."""
    parent: ParentLink | None = None
    """For a child invocation: its parent, the call that started it, its depth (from 0.2)."""
    handed_off_from: HandoffOrigin | None = None
    """For the target of a handoff: the source, why, and what it is told (from 0.2)."""
    trace_parent: TraceParent | None = None
    """The application's span current when it was started, if tracing was on."""


class SettingsChanged(InvocationEvent):
    """A resume was told to use the agent's current budget and settings instead of the record."""

    TOPIC: ClassVar[str] = "aggregates.invocation:SettingsChanged"

    budget: Budget
    settings: RunSettings
    by: str | None = None


class DecisionProposed(InvocationEvent):
    """The model answered: the normalised decision, or the rejected output and why."""

    TOPIC: ClassVar[str] = "aggregates.invocation:DecisionProposed"

    step: int
    decision: Decision | None = None
    rejection: Rejection | None = None
    usage: Usage = Usage()
    model_input: ModelInput | None = None
    """The digests of what the model was asked (recorded from version 0.2; None before)."""


class DispatchedCall(Frozen):
    """One call of a dispatched batch, as it will run."""

    call_id: str
    name: str
    arguments: dict[str, Any]
    effect: ToolEffect
    effect_key: str | None = None
    """For a write: its effect key (stable across retries, restarts and workers)."""
    denied: str | None = None
    """Why the call was denied (by a person or the policy): it is dispatched, never run."""
    child_id: str | None = None
    """For a call that starts a child invocation: its id, derived from the effect key."""
    plan_step: int | None = None
    """For a write of the approved plan in force (from 0.5): the plan's step it makes (1 for
    the first); such a write needs no other approval."""


class PlanProposed(InvocationEvent):
    """The model proposed a plan: the writes it will make, to be approved by their digest.

    Recorded with its ``plan`` decision (from 0.5, for an agent given ``planning``); the
    invocation then pauses ``plan_approval_required``. It supersedes the plan before it:
    until it is approved, no write runs.
    """

    TOPIC: ClassVar[str] = "aggregates.invocation:PlanProposed"

    step: int
    digest: str
    """What ``approve --digest`` names (``aggregates.planning.plan_digest``)."""
    writes: list[PlannedWrite]
    summary: str = ""
    supersedes: str | None = None
    """The digest of the plan it replaces (approved or not), if there was one."""


class BatchDispatched(InvocationEvent):
    """A validated tool batch is about to run; committed before any call starts."""

    TOPIC: ClassVar[str] = "aggregates.invocation:BatchDispatched"

    step: int
    calls: list[DispatchedCall]
    plan: list[list[str]]
    """Execution groups of call ids: groups run one after another, calls in a group together."""


class ResultsCommitted(InvocationEvent):
    """Every call of the dispatched batch has a result, in call order."""

    TOPIC: ClassVar[str] = "aggregates.invocation:ResultsCommitted"

    step: int
    results: list[ToolResult]


class BudgetReserved(InvocationEvent):
    """A share of the budget was set aside for a child of the dispatched batch.

    Committed before the child starts: with the batch for a call of a child tool
    (``Agent.as_tool``); while the batch runs, for a child a write's body starts
    (``ToolContext.run_agent``, ``from_code``). Parallel children cannot spend more
    than their parent has, since each reservation is an append on the parent's stream.
    """

    TOPIC: ClassVar[str] = "aggregates.invocation:BudgetReserved"

    step: int
    call_id: str
    child_id: str
    allotment: Allotment
    from_code: bool | None = None
    """True for a child a write's body starts (its id derives from the call's effect key
    and ``key``); None (left out) for the child of a child tool's call."""
    key: str | None = None
    """For a child started from code: the key its body gave (None: none given)."""


class BudgetReturned(InvocationEvent):
    """A child settled: what it used is counted, the rest of its share comes back once.

    For the child of a child tool's call, committed with the batch's results; for a
    child a write's body started, as soon as the body has its outcome (the batch still
    running).
    """

    TOPIC: ClassVar[str] = "aggregates.invocation:BudgetReturned"

    step: int
    call_id: str
    child_id: str
    spent: Spent
    """What the child (and its own children) used."""
    returned: Spent
    """What it did not use of its allotment."""


class Paused(InvocationEvent):
    """The invocation waits for a person (approval or clarification), a service, or a time."""

    TOPIC: ClassVar[str] = "aggregates.invocation:Paused"

    step: int
    reason: TerminalReason
    question: str | None = None
    proposal_digest: str | None = None
    calls: list[DispatchedCall] | None = None
    """For an approval: the exact batch that waits, as it would be dispatched."""
    needs_approval: list[str] | None = None
    """For an approval: the ids of the calls that require it."""
    child_path: list[str] | None = None
    """For the pause of a child invocation the dispatched batch started (from 0.2): the
    ids from that child down to the invocation that waits; the pause's other fields
    are that one's (its question, the digest to approve, its waiting calls)."""
    wake_at: datetime | None = None
    """For ``sleeping`` (from 0.2): when it may be woken (a worker claims it then)."""
    sleeping_calls: list[str] | None = None
    """For a sleep of tools (from 0.2): the ids of the dispatched batch's calls that called
    ``ctx.sleep_until``; the batch stays dispatched, and they are called again on waking.
    None for a ``wait`` decision."""


class SleepEnded(InvocationEvent):
    """A sleeping invocation woke: its time came, or someone woke it early (``wake``).

    Committed on its own, guarded by the invocation's version: one wake, one runnable
    transition, whoever (and however many) tried.
    """

    TOPIC: ClassVar[str] = "aggregates.invocation:SleepEnded"

    step: int
    wake_at: datetime
    """The time it slept until (the pause's)."""
    early: bool = False
    """True when it was woken before ``wake_at`` (by ``wake``)."""
    by: str | None = None
    """Who woke it early (None: it was due)."""
    calls: list[str] | None = None
    """The calls that slept (the pause's ``sleeping_calls``): they are called again."""


class ApprovalGranted(InvocationEvent):
    """A person approved the paused batch, identified by its digest."""

    TOPIC: ClassVar[str] = "aggregates.invocation:ApprovalGranted"

    step: int
    proposal_digest: str
    by: str
    note: str | None = None


class ApprovalDenied(InvocationEvent):
    """A person denied the paused batch; its calls that needed approval will not run."""

    TOPIC: ClassVar[str] = "aggregates.invocation:ApprovalDenied"

    step: int
    proposal_digest: str
    by: str
    reason: str


class ClarificationProvided(InvocationEvent):
    """A person answered the model's question."""

    TOPIC: ClassVar[str] = "aggregates.invocation:ClarificationProvided"

    step: int
    answer: str
    by: str | None = None


class VerificationFailed(InvocationEvent):
    """The agent's verifier refused the final answer; the evidence goes back to the model."""

    TOPIC: ClassVar[str] = "aggregates.invocation:VerificationFailed"

    step: int
    attempt: int
    evidence: str


class CritiqueReturned(InvocationEvent):
    """The agent's critic reviewed the committed final answer of ``step``: its verdict.

    ``revise`` sends the answer back to the agent's model with the critique; ``accept``
    lets it stand; ``malformed`` (the reply was no verdict) and ``failed`` (the critic's
    model failed) are spent rounds, which send nothing back.
    """

    TOPIC: ClassVar[str] = "aggregates.invocation:CritiqueReturned"

    step: int
    round: int
    """1 for the critic's first round in this invocation, then 2, ..."""
    verdict: Verdict
    critique: str | None = None
    """For ``revise``: what the critic asks to change (the agent's model is shown it)."""
    problem: str | None = None
    """For ``malformed`` and ``failed``: why the round gave no verdict."""
    usage: Usage = Usage()
    """What the critic's call cost (counted apart from the agent's usage)."""


class ContextCompacted(InvocationEvent):
    """Older turns were left out of the model's view to fit its context; what and why."""

    TOPIC: ClassVar[str] = "aggregates.invocation:ContextCompacted"

    step: int
    """The step the model was asked for with the compacted view."""
    dropped_steps: list[int]
    kept_steps: list[int]
    size_before: int
    size_after: int


class LeaseAcquired(InvocationEvent):
    """A worker took the invocation over with a lease: from now on only its appends are its.

    Recorded when a worker (or a ``resume``) takes an invocation whose previous holder
    did not release it (its lease expired, its process died, or it was fenced off
    deliberately). It moves the aggregate's version, so the previous holder's next
    append is refused: the aggregate version is the fence (``aggregates.lease``).
    """

    TOPIC: ClassVar[str] = "aggregates.invocation:LeaseAcquired"

    worker_id: str
    epoch: int
    """The lease's epoch: larger than every earlier ``LeaseAcquired`` of this invocation."""
    taken_from: str | None = None
    """The holder whose lease was taken over, when one was known."""


class Terminated(InvocationEvent):
    """The invocation is over for good, with a typed reason."""

    TOPIC: ClassVar[str] = "aggregates.invocation:Terminated"

    reason: TerminalReason
    answer: str | None = None
    detail: str | None = None
    steps: int
    tool_calls: int


EVENT_TYPES: tuple[type[InvocationEvent], ...] = (
    InvocationStarted,
    DecisionProposed,
    BatchDispatched,
    ResultsCommitted,
    BudgetReserved,
    BudgetReturned,
    Paused,
    ApprovalGranted,
    ApprovalDenied,
    ClarificationProvided,
    VerificationFailed,
    ContextCompacted,
    SettingsChanged,
    SleepEnded,
    LeaseAcquired,
    Terminated,
    PlanProposed,
    CritiqueReturned,
)
