"""The Invocation aggregate: the state machine of one agent run, and its snapshot.

Its events (the persisted vocabulary) are in :mod:`aggregates.invocation_events`,
its committed turns in :mod:`aggregates.turns`; both are importable from here.

The aggregate is a pure state machine (no I/O, no clock, no randomness: the
caller passes the time in). Every event goes through one transition function,
:meth:`Invocation._evolve`, which checks that the event is legal in the current
phase *before* it changes anything: an illegal transition raises
:class:`IllegalTransitionError` and nothing happens, whether the event comes from
a command or from a stored history being replayed.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from enum import StrEnum
from typing import Any, assert_never, cast

from eventsourcing.domain import CanSnapshotAggregate
from eventsourcing.utils import get_topic
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)

from aggregates import planning as plans
from aggregates.audit import AUDIT_FORMAT
from aggregates.children import Allotment, ParentLink, Spent, child_id_of
from aggregates.critic import NO_CRITIC, CriticSpent, Verdict
from aggregates.decisions import (
    Budget,
    CannotContinue,
    Clarification,
    Decision,
    Final,
    Frozen,
    Handoff,
    Plan,
    Rejection,
    RequestApproval,
    TerminalReason,
    ToolCall,
    ToolCalls,
    ToolResult,
    Usage,
    Wait,
)
from aggregates.digest import canonical_json, digest_of
from aggregates.errors import IllegalTransitionError
from aggregates.events import ChainedAggregate, fold, seal
from aggregates.fork_origin import ForkOrigin
from aggregates.handoffs import HandoffOrigin
from aggregates.ids import invocation_id_problem
from aggregates.invocation_events import (
    EVENT_TYPES,
    ApprovalDenied,
    ApprovalGranted,
    BatchDispatched,
    BudgetReserved,
    BudgetReturned,
    ClarificationProvided,
    ContextCompacted,
    CritiqueReturned,
    DecisionProposed,
    DispatchedCall,
    InvocationEvent,
    InvocationStarted,
    LeaseAcquired,
    Paused,
    PlanProposed,
    ResultsCommitted,
    SettingsChanged,
    SleepEnded,
    Terminated,
    ToolSpec,
    TraceParent,
    VerificationFailed,
)
from aggregates.model_input import ModelInput
from aggregates.planning import PlannedWrite, PlanState, plan_digest
from aggregates.settings import RunSettings
from aggregates.turns import LAZY_TURNS, Turn, Turns

__all__ = [
    # Defined here, and (the events, the turns) importable from here as before they moved.
    "EVENT_TYPES",
    "LAZY_TURNS",
    "PAUSED_PHASE",
    "TRANSITIONS",
    "ApprovalDenied",
    "ApprovalGranted",
    "BatchDispatched",
    "BudgetReserved",
    "BudgetReturned",
    "ClarificationProvided",
    "ContextCompacted",
    "CritiqueReturned",
    "DecisionProposed",
    "DispatchedCall",
    "Invocation",
    "InvocationEvent",
    "InvocationSnapshot",
    "InvocationStarted",
    "InvocationState",
    "LeaseAcquired",
    "Paused",
    "Phase",
    "PlanProposed",
    "ResultsCommitted",
    "SettingsChanged",
    "SleepEnded",
    "Terminated",
    "ToolSpec",
    "TraceParent",
    "Turn",
    "Turns",
    "VerificationFailed",
    "failure_signature",
    "plan_fingerprint",
    "replay",
]

# --------------------------------------------------------------------------- state


class Phase(StrEnum):
    """Where an invocation is in the turn protocol."""

    NEW = "new"
    """Nothing recorded yet: only ``InvocationStarted`` may come."""
    READY = "ready"
    """May ask the model (or stop before asking)."""
    CALLS_PROPOSED = "calls_proposed"
    """A tool batch was proposed (or approved): next is its dispatch, a pause or a stop."""
    DECIDED = "decided"
    """A non-tool decision (or a rejection) was recorded: next is a pause or a stop."""
    DISPATCHED = "dispatched"
    """A batch is running: only its results (or a pause for reconciliation) may follow."""
    AWAITING_APPROVAL = "awaiting_approval"
    """Paused: a person approves or denies a proposal."""
    AWAITING_CLARIFICATION = "awaiting_clarification"
    """Paused: a person answers the model's question."""
    AWAITING_RECONCILIATION = "awaiting_reconciliation"
    """Paused with the batch still dispatched: a write's service must say what became of it."""
    AWAITING_CHILD = "awaiting_child"
    """Paused with the batch still dispatched: a child invocation it started waits for a
    person (an approval or an answer, given to the child)."""
    SLEEPING = "sleeping"
    """Paused until ``paused.wake_at``: after a ``wait`` decision, or with the batch still
    dispatched when its tools slept (``ctx.sleep_until``)."""
    TERMINATED = "terminated"

    @property
    def paused(self) -> bool:
        """True for the phases in which the invocation waits."""
        return self in _PAUSED_PHASES


_PAUSED_PHASES = frozenset(
    {
        Phase.AWAITING_APPROVAL,
        Phase.AWAITING_CLARIFICATION,
        Phase.AWAITING_RECONCILIATION,
        Phase.AWAITING_CHILD,
        Phase.SLEEPING,
    }
)

PAUSED_PHASE: dict[TerminalReason, Phase] = {
    TerminalReason.APPROVAL_REQUIRED: Phase.AWAITING_APPROVAL,
    TerminalReason.CLARIFICATION_REQUIRED: Phase.AWAITING_CLARIFICATION,
    TerminalReason.RECONCILIATION_REQUIRED: Phase.AWAITING_RECONCILIATION,
    TerminalReason.SLEEPING: Phase.SLEEPING,
    TerminalReason.RATE_LIMITED: Phase.SLEEPING,
    TerminalReason.PLAN_APPROVAL_REQUIRED: Phase.AWAITING_APPROVAL,
}
"""The phase each pausing reason puts an invocation in."""


def _stays(phase: Phase) -> dict[type[InvocationEvent], frozenset[Phase]]:
    """The events every live phase accepts without leaving it (settings, a new lease)."""
    return {SettingsChanged: frozenset({phase}), LeaseAcquired: frozenset({phase})}


_READY = frozenset({Phase.READY})
_ENDED = frozenset({Phase.TERMINATED})

TRANSITIONS: dict[Phase, dict[type[InvocationEvent], frozenset[Phase]]] = {
    Phase.NEW: {InvocationStarted: _READY},
    Phase.READY: {
        # A tool batch, another decision, or a rejected proposal (the model is asked again).
        DecisionProposed: frozenset({Phase.CALLS_PROPOSED, Phase.DECIDED, Phase.READY}),
        ContextCompacted: _READY,
        Terminated: _ENDED,
        # What a child of the batch just settled did not use (committed with the results).
        BudgetReturned: _READY,
        # No quota for the model call yet (rate_limited): asleep until there is.
        Paused: frozenset({Phase.SLEEPING}),
        **_stays(Phase.READY),
    },
    Phase.CALLS_PROPOSED: {
        BatchDispatched: frozenset({Phase.DISPATCHED}),
        Paused: frozenset({Phase.AWAITING_APPROVAL}),
        Terminated: _ENDED,
        **_stays(Phase.CALLS_PROPOSED),
    },
    Phase.DECIDED: {
        # The plan a plan decision proposes (committed with it, then paused for approval).
        PlanProposed: frozenset({Phase.DECIDED}),
        Paused: frozenset({Phase.AWAITING_APPROVAL, Phase.AWAITING_CLARIFICATION, Phase.SLEEPING}),
        VerificationFailed: _READY,
        # The critic's verdict on the committed final answer: ``revise`` sends it back.
        CritiqueReturned: frozenset({Phase.DECIDED, Phase.READY}),
        Terminated: _ENDED,
        **_stays(Phase.DECIDED),
    },
    Phase.DISPATCHED: {
        ResultsCommitted: _READY,
        # A child's share of the budget: committed with the batch that starts it, or
        # while the batch runs for a child a write's body starts (``run_agent``) ...
        BudgetReserved: frozenset({Phase.DISPATCHED}),
        # ... whose share comes back as soon as the body has the child's outcome.
        BudgetReturned: frozenset({Phase.DISPATCHED}),
        Paused: frozenset({Phase.AWAITING_RECONCILIATION, Phase.AWAITING_CHILD, Phase.SLEEPING}),
        **_stays(Phase.DISPATCHED),
    },
    Phase.AWAITING_APPROVAL: {
        # Back to the batch (approved or denied calls), or, when the model itself
        # asked for approval, to a new decision.
        ApprovalGranted: frozenset({Phase.CALLS_PROPOSED, Phase.READY}),
        ApprovalDenied: frozenset({Phase.CALLS_PROPOSED, Phase.READY}),
        Terminated: _ENDED,
        **_stays(Phase.AWAITING_APPROVAL),
    },
    Phase.AWAITING_CLARIFICATION: {
        ClarificationProvided: _READY,
        Terminated: _ENDED,
        **_stays(Phase.AWAITING_CLARIFICATION),
    },
    # The batch is still dispatched: it ends with its results, never with a bare stop.
    Phase.AWAITING_RECONCILIATION: {
        ResultsCommitted: _READY,
        # Asked again, the write's service is a child that waits for a person.
        Paused: frozenset({Phase.AWAITING_CHILD}),
        **_stays(Phase.AWAITING_RECONCILIATION),
    },
    # The same: the batch ends with its results (the child's outcome among them).
    Phase.AWAITING_CHILD: {
        ResultsCommitted: _READY,
        # The child (or one below it) now waits for something else, or its service can't
        # be asked.
        Paused: frozenset({Phase.AWAITING_CHILD, Phase.AWAITING_RECONCILIATION}),
        **_stays(Phase.AWAITING_CHILD),
    },
    # Asleep: it wakes (back to the model, or to its dispatched batch), or is cancelled
    # (a dispatched batch ends with its results first).
    Phase.SLEEPING: {
        SleepEnded: frozenset({Phase.READY, Phase.DISPATCHED}),
        ResultsCommitted: _READY,
        Terminated: _ENDED,
        **_stays(Phase.SLEEPING),
    },
    Phase.TERMINATED: {},
}
"""The table of the turn protocol: phase and event → the phases the event may lead to.

An event outside its phase's row is refused before anything changes; an event
inside it is then checked against the history (steps, call ids, digests, totals),
and leads to one of the row's phases (which one, where there are two, its content
says: the kind of decision, the pausing reason, whether a batch waits for approval).
"""


class Invocation(ChainedAggregate):
    """One agent invocation: an event-sourced state machine of the turn protocol."""

    def __init__(self) -> None:
        """Construct an empty shell; ``InvocationStarted`` fills it in ``_evolve``."""
        self.goal = ""
        self.agent_name = ""
        self.agent_version = ""
        self.catalogue_digest = ""
        self.tools: list[ToolSpec] = []
        self.budget = Budget()
        self.settings: RunSettings | None = None
        self.task_class: str | None = None
        self.actor: str | None = None
        self.tenant: str | None = None
        self.forked_from: ForkOrigin | None = None
        """For a fork: where it was copied from (its start's ``forked_from``)."""
        self.parent: ParentLink | None = None
        """For a child invocation: its parent (its start's ``parent``)."""
        self.handed_off_from: HandoffOrigin | None = None
        """For the target of a handoff: where it comes from (its start's ``handed_off_from``)."""
        self.planning: PlanState | None = None
        """For an invocation that plans before it writes: its plan (``aggregates.planning``)."""
        self.children_started = 0
        """How many children were started (or may have been), in all batches."""
        self.reservations: dict[str, BudgetReserved] = {}
        """The budget set aside for children not yet settled, by child id."""
        self.children_spent = Spent()
        """What the children whose budget came back used (their own children's included)."""
        self.phase = Phase.NEW
        self.step = 0
        self.tool_calls = 0
        self.turns = Turns()
        self.pending_batch: BatchDispatched | None = None
        self.last_plan: str | None = None
        self.repeat_streak = 0
        self._fingerprinted: tuple[list[DispatchedCall], str] | None = None
        """The calls :meth:`repeat_streak_after` was last asked about, and their fingerprint."""
        self.paused: Paused | None = None
        self.woken: SleepEnded | None = None
        """The wake of the dispatched batch whose tools slept, until its results come."""
        self.terminated: Terminated | None = None
        self.started_at: datetime | None = None
        self.approval: ApprovalGranted | ApprovalDenied | None = None
        self.approved_calls: list[DispatchedCall] | None = None
        self.approval_needed: list[str] = []
        self.verification_failures = 0
        self.critic_spent: CriticSpent = NO_CRITIC
        """What the agent's critic did: its rounds, verdicts and usage (apart from the agent's)."""
        self.input_tokens = 0
        self.output_tokens = 0
        self.cost = 0.0
        self.failure_signature: str | None = None
        self.failure_streak = 0
        self.invalid_streak = 0
        self.lease_holder: str | None = None
        """The worker of the latest ``LeaseAcquired`` (None: never taken over)."""
        self.lease_epoch = 0
        self.lease_taken_from: str | None = None
        """The holder the latest ``LeaseAcquired`` took the invocation from (if one was known)."""

    # ----------------------------------------------------------------- commands

    @classmethod
    def start(
        cls,
        *,
        invocation_id: str,
        goal: str,
        agent_name: str,
        agent_version: str,
        catalogue_digest: str,
        tools: list[ToolSpec],
        budget: Budget,
        at: datetime,
        settings: RunSettings | None = None,
        task_class: str | None = None,
        actor: str | None = None,
        tenant: str | None = None,
        forked_from: ForkOrigin | None = None,
        parent: ParentLink | None = None,
        handed_off_from: HandoffOrigin | None = None,
        trace_parent: TraceParent | None = None,
    ) -> Invocation:
        """Create an invocation (records ``InvocationStarted``).

        A fork's says where it was copied from, a child's who its parent is.
        """
        problem = invocation_id_problem(invocation_id)
        if problem is not None:
            raise IllegalTransitionError(problem)
        return cls._create_chained(  # type: ignore[no-any-return]
            InvocationStarted,
            id=invocation_id,
            timestamp=at,
            goal=goal,
            agent_name=agent_name,
            agent_version=agent_version,
            catalogue_digest=catalogue_digest,
            tools=tools,
            budget=budget,
            settings=settings,
            task_class=task_class,
            actor=actor,
            tenant=tenant,
            forked_from=forked_from,
            parent=parent,
            handed_off_from=handed_off_from,
            trace_parent=trace_parent,
        )

    def propose(
        self,
        decision: Decision,
        *,
        usage: Usage,
        at: datetime,
        model_input: ModelInput | None = None,
    ) -> None:
        """Record the model's (valid) decision for the next step."""
        self.trigger_event(
            DecisionProposed,
            timestamp=at,
            step=self.step + 1,
            decision=decision,
            usage=usage,
            model_input=model_input,
        )

    def reject(
        self,
        rejection: Rejection,
        *,
        usage: Usage,
        at: datetime,
        model_input: ModelInput | None = None,
    ) -> None:
        """Record a model output that trusted code refused, for the next step."""
        self.trigger_event(
            DecisionProposed,
            timestamp=at,
            step=self.step + 1,
            rejection=rejection,
            usage=usage,
            model_input=model_input,
        )

    def propose_plan(self, writes: list[PlannedWrite], *, summary: str, at: datetime) -> str:
        """Record the plan the model just proposed (``PlanProposed``); returns its digest."""
        state = self.planning
        digest = plan_digest(self.step, writes)
        self.trigger_event(
            PlanProposed,
            timestamp=at,
            step=self.step,
            digest=digest,
            writes=writes,
            summary=summary,
            supersedes=state.digest if state is not None else None,
        )
        return digest

    def dispatch(self, calls: list[DispatchedCall], plan: list[list[str]], *, at: datetime) -> None:
        """Record that the proposed batch is about to run (before any call starts)."""
        self.trigger_event(BatchDispatched, timestamp=at, step=self.step, calls=calls, plan=plan)

    def commit_results(self, results: list[ToolResult], *, at: datetime) -> None:
        """Record one result per dispatched call, in call order."""
        self.trigger_event(ResultsCommitted, timestamp=at, step=self.step, results=results)

    def pause(
        self,
        reason: TerminalReason,
        *,
        at: datetime,
        question: str | None = None,
        proposal_digest: str | None = None,
        calls: list[DispatchedCall] | None = None,
        needs_approval: list[str] | None = None,
        child_path: list[str] | None = None,
        wake_at: datetime | None = None,
        sleeping_calls: list[str] | None = None,
    ) -> None:
        """Pause for a person, a service or a time (a pausing reason only)."""
        self.trigger_event(
            Paused,
            timestamp=at,
            step=self.step,
            reason=reason,
            question=question,
            proposal_digest=proposal_digest,
            calls=calls,
            needs_approval=needs_approval,
            child_path=child_path,
            wake_at=wake_at,
            sleeping_calls=sleeping_calls,
        )

    def wake(self, *, at: datetime, early: bool = False, by: str | None = None) -> None:
        """End a sleep: it is due at ``at``, or ``early`` (``by`` whom) it is woken before."""
        paused = self.paused
        if self.phase is not Phase.SLEEPING or paused is None or paused.wake_at is None:
            raise IllegalTransitionError(
                f"SleepEnded refused in phase {self.phase.value} at step {self.step}: "
                "the invocation does not sleep"
            )
        self.trigger_event(
            SleepEnded,
            timestamp=at,
            step=self.step,
            wake_at=paused.wake_at,
            early=early,
            by=by,
            calls=paused.sleeping_calls,
        )

    def grant_approval(
        self, proposal_digest: str, *, by: str, at: datetime, note: str | None = None
    ) -> None:
        """Approve the paused batch (its digest must match)."""
        self.trigger_event(
            ApprovalGranted,
            timestamp=at,
            step=self.step,
            proposal_digest=proposal_digest,
            by=by,
            note=note,
        )

    def deny_approval(self, proposal_digest: str, *, by: str, reason: str, at: datetime) -> None:
        """Deny the paused batch (its digest must match)."""
        self.trigger_event(
            ApprovalDenied,
            timestamp=at,
            step=self.step,
            proposal_digest=proposal_digest,
            by=by,
            reason=reason,
        )

    def provide_clarification(self, answer: str, *, at: datetime, by: str | None = None) -> None:
        """Answer the model's question."""
        self.trigger_event(
            ClarificationProvided, timestamp=at, step=self.step, answer=answer, by=by
        )

    def record_compaction(
        self,
        *,
        dropped_steps: list[int],
        kept_steps: list[int],
        size_before: int,
        size_after: int,
        at: datetime,
    ) -> None:
        """Record that the next model request leaves older turns out."""
        self.trigger_event(
            ContextCompacted,
            timestamp=at,
            step=self.step + 1,
            dropped_steps=dropped_steps,
            kept_steps=kept_steps,
            size_before=size_before,
            size_after=size_after,
        )

    def fail_verification(self, evidence: str, *, at: datetime) -> None:
        """Refuse the final answer with the verifier's evidence."""
        self.trigger_event(
            VerificationFailed,
            timestamp=at,
            step=self.step,
            attempt=self.verification_failures + 1,
            evidence=evidence,
        )

    def record_critique(
        self,
        verdict: Verdict,
        *,
        usage: Usage,
        at: datetime,
        critique: str | None = None,
        problem: str | None = None,
    ) -> None:
        """Record the critic's round on the committed final answer."""
        self.trigger_event(
            CritiqueReturned,
            timestamp=at,
            step=self.step,
            round=self.critic_spent.rounds + 1,
            verdict=verdict,
            critique=critique,
            problem=problem,
            usage=usage,
        )

    def change_settings(
        self, budget: Budget, settings: RunSettings, *, at: datetime, by: str | None = None
    ) -> None:
        """Follow new settings from now on (a resume that was allowed to change them)."""
        self.trigger_event(SettingsChanged, timestamp=at, budget=budget, settings=settings, by=by)

    def acquire_lease(
        self, worker_id: str, epoch: int, *, at: datetime, taken_from: str | None = None
    ) -> None:
        """Record that ``worker_id`` took the invocation over with a lease of ``epoch``."""
        self.trigger_event(
            LeaseAcquired, timestamp=at, worker_id=worker_id, epoch=epoch, taken_from=taken_from
        )

    def terminate(
        self,
        reason: TerminalReason,
        *,
        at: datetime,
        answer: str | None = None,
        detail: str | None = None,
    ) -> None:
        """End the invocation for good."""
        self.trigger_event(
            Terminated,
            timestamp=at,
            reason=reason,
            answer=answer,
            detail=detail,
            steps=self.step,
            tool_calls=self.tool_calls,
        )

    def reserve_budget(
        self,
        call_id: str,
        child_id: str,
        allotment: Allotment,
        *,
        at: datetime,
        from_code: bool = False,
        key: str | None = None,
    ) -> None:
        """Set a share of the budget aside for a child of a dispatched call.

        ``from_code``: a child the call's body starts (``run_agent``) with ``key``.
        """
        self.trigger_event(
            BudgetReserved,
            timestamp=at,
            step=self.step,
            call_id=call_id,
            child_id=child_id,
            allotment=allotment,
            from_code=True if from_code else None,
            key=key,
        )

    def return_budget(
        self, call_id: str, child_id: str, spent: Spent, returned: Spent, *, at: datetime
    ) -> None:
        """Count what a settled child used; the rest of its share comes back."""
        self.trigger_event(
            BudgetReturned,
            timestamp=at,
            step=self.step,
            call_id=call_id,
            child_id=child_id,
            spent=spent,
            returned=returned,
        )

    def take_events(self) -> list[InvocationEvent]:
        """Remove and return the events not yet saved (typed ``collect_events``)."""
        return cast("list[InvocationEvent]", self.collect_events())

    # ----------------------------------------------------------------- queries

    @property
    def last_decision(self) -> Decision | None:
        """The decision of the latest turn, if it was a valid one."""
        return self.turns[-1].decision if self.turns else None

    @property
    def paused_for_reconciliation(self) -> bool:
        """True when a dispatched batch waits for the owning service of a write to answer."""
        return self.phase is Phase.AWAITING_RECONCILIATION

    def repeat_streak_after(self, calls: Sequence[DispatchedCall]) -> int:
        """How many times in a row this plan would have run, counting this time."""
        fingerprint = plan_fingerprint(calls)
        # Kept for the dispatch of these very calls, which judges them again.
        self._fingerprinted = (list(calls), fingerprint)
        if fingerprint == self.last_plan:
            return self.repeat_streak + 1
        return 1

    def _fingerprint_of(self, calls: list[DispatchedCall]) -> str:
        """:func:`plan_fingerprint` of ``calls``; not again for the calls just asked about.

        The calls are frozen: the same objects, in the same order, have the same
        fingerprint (a write dispatched with its effect key is a copy, hashed anew).
        """
        known = self._fingerprinted
        self._fingerprinted = None
        if (
            known is not None
            and len(known[0]) == len(calls)
            and all(a is b for a, b in zip(known[0], calls, strict=True))
        ):
            return known[1]
        return plan_fingerprint(calls)

    # ----------------------------------------------------------------- transitions

    def _evolve(self, event: InvocationEvent) -> None:
        """Check that ``event`` is legal now, then apply it (the only place state changes).

        First the table (:data:`TRANSITIONS`): is this kind of event accepted in
        this phase at all; then the event's own checks against the history.
        """
        if type(event) not in TRANSITIONS[self.phase]:
            raise self._refuse(event, "not accepted in this phase")
        match event:
            case InvocationStarted():
                self._start(event)
            case DecisionProposed():
                self._on_decision(event)
            case PlanProposed():
                self._on_plan(event)
            case BatchDispatched():
                self._on_dispatch(event)
            case ResultsCommitted():
                self._on_results(event)
            case BudgetReserved():
                self._on_reserved(event)
            case BudgetReturned():
                self._on_returned(event)
            case Paused():
                self._on_pause(event)
            case ApprovalGranted() | ApprovalDenied():
                self._on_approval(event)
            case ClarificationProvided():
                self._on_clarification(event)
            case SleepEnded():
                self._on_sleep_ended(event)
            case VerificationFailed():
                self._on_verification_failed(event)
            case CritiqueReturned():
                self._on_critique(event)
            case ContextCompacted():
                if event.step != self.step + 1:
                    raise self._refuse(event, "the view is compacted just before a decision")
            case SettingsChanged():
                self.budget = event.budget
                self.settings = event.settings
            case LeaseAcquired():
                if event.epoch <= self.lease_epoch:
                    raise self._refuse(
                        event,
                        f"the lease epoch must grow past {self.lease_epoch}, got {event.epoch}",
                    )
                if not event.worker_id:
                    raise self._refuse(event, "a lease needs a worker id")
                self.lease_holder = event.worker_id
                self.lease_epoch = event.epoch
                self.lease_taken_from = event.taken_from
            case Terminated():
                self._on_terminate(event)
            case _:
                raise IllegalTransitionError(f"unknown event {type(event).__name__}")

    def _refuse(self, event: InvocationEvent, why: str) -> IllegalTransitionError:
        return IllegalTransitionError(
            f"{type(event).__name__} refused in phase {self.phase.value} at step {self.step}: {why}"
        )

    def _start(self, event: InvocationStarted) -> None:
        self.goal = event.goal
        self.agent_name = event.agent_name
        self.agent_version = event.agent_version
        self.catalogue_digest = event.catalogue_digest
        self.tools = list(event.tools)
        self.budget = event.budget
        self.settings = event.settings
        self.task_class = event.task_class
        self.actor = event.actor
        self.tenant = event.tenant
        self.forked_from = event.forked_from
        self.parent = event.parent
        self.handed_off_from = event.handed_off_from
        self.planning = plans.started(event.settings.planning if event.settings else None)
        self.started_at = event.timestamp
        self.phase = Phase.READY

    def _on_decision(self, event: DecisionProposed) -> None:
        if event.step != self.step + 1:
            raise self._refuse(event, f"step must be {self.step + 1}, got {event.step}")
        if event.step > self.budget.max_steps:
            raise self._refuse(event, f"max_steps {self.budget.max_steps} reached")
        if (event.decision is None) == (event.rejection is None):
            raise self._refuse(event, "carries exactly one of a decision or a rejection")
        decision = event.decision
        self.invalid_streak = self.invalid_streak + 1 if decision is None else 0
        match decision:
            case None:
                # A rejected proposal: the model may be asked again (with the problems),
                # or the run stops.
                phase = Phase.READY
            case ToolCalls(calls=calls):
                if not calls:
                    raise self._refuse(event, "an empty tool batch is not a decision")
                ids = [call.id for call in calls]
                if len(set(ids)) != len(ids):
                    raise self._refuse(event, "call ids must be unique within a batch")
                phase = Phase.CALLS_PROPOSED
            case Final(answer=answer):
                if not answer.strip():
                    raise self._refuse(event, "a final answer must not be empty")
                phase = Phase.DECIDED
            case RequestApproval() | Clarification() | CannotContinue() | Handoff() | Wait():
                phase = Phase.DECIDED
            case Plan():
                if self.planning is None:
                    raise self._refuse(event, "only an invocation that plans proposes a plan")
                phase = Phase.DECIDED
            case _:
                assert_never(decision)
        self.step = event.step
        self.input_tokens += event.usage.input_tokens
        self.output_tokens += event.usage.output_tokens
        self.cost += event.usage.cost
        self.turns.append(Turn(step=event.step, decision=decision, rejection=event.rejection))
        self.phase = phase

    def _on_plan(self, event: PlanProposed) -> None:
        if event.step != self.step:
            raise self._refuse(event, f"step must be {self.step}, got {event.step}")
        state = plans.proposed(
            self.planning,
            step=event.step,
            digest=event.digest,
            writes=event.writes,
            decision=self.last_decision,
            expected_digest=plan_digest(event.step, event.writes),
        )
        if isinstance(state, str):
            raise self._refuse(event, state)
        if event.supersedes != (self.planning.digest if self.planning is not None else None):
            raise self._refuse(event, "a plan supersedes the plan before it")
        self.planning = state

    def _on_dispatch(self, event: BatchDispatched) -> None:
        if event.step != self.step:
            raise self._refuse(event, f"step must be {self.step}, got {event.step}")
        decision = self.last_decision
        assert isinstance(decision, ToolCalls)  # guaranteed by Phase.CALLS_PROPOSED
        proposed = [(call.id, call.name) for call in decision.calls]
        dispatched = [(call.call_id, call.name) for call in event.calls]
        if proposed != dispatched:
            raise self._refuse(event, "the dispatched calls must be the proposed calls, in order")
        planned = [call_id for group in event.plan for call_id in group]
        if sorted(planned) != sorted(call_id for call_id, _ in proposed):
            raise self._refuse(event, "the plan must schedule every call exactly once")
        if self.tool_calls + len(event.calls) > self.budget.max_tool_calls:
            raise self._refuse(event, f"max_tool_calls {self.budget.max_tool_calls} exceeded")
        problem = plans.dispatch_problem(
            self.planning,
            [
                (c.name, c.effect, c.denied is not None, c.plan_step, c.arguments)
                for c in event.calls
            ],
            approved_by_person=isinstance(self.approval, ApprovalGranted),
        )
        if problem is not None:
            raise self._refuse(event, problem)
        # The plan is judged on the calls as dispatched: normalised (defaults filled
        # in) and redacted, the only form a resumed run can see.
        fingerprint = self._fingerprint_of(event.calls)
        streak = self.repeat_streak + 1 if fingerprint == self.last_plan else 1
        if streak > self.budget.max_repeated_plan:
            raise self._refuse(event, "the same plan repeated past max_repeated_plan")
        self.last_plan = fingerprint
        self.repeat_streak = streak
        self.approved_calls = None
        self.planning = plans.dispatched(
            self.planning,
            [c.plan_step for c in event.calls if c.plan_step is not None and c.denied is None],
        )
        self.tool_calls += len(event.calls)
        self.children_started += sum(1 for call in event.calls if call.child_id is not None)
        self.pending_batch = event
        self.phase = Phase.DISPATCHED

    def _on_results(self, event: ResultsCommitted) -> None:
        if self.pending_batch is None:  # pragma: no cover - the table's two phases have one
            raise self._refuse(event, "results need a dispatched batch")
        if event.step != self.step:
            raise self._refuse(event, f"step must be {self.step}, got {event.step}")
        expected = [(call.call_id, call.name) for call in self.pending_batch.calls]
        got = [(result.call_id, result.name) for result in event.results]
        if expected != got:
            raise self._refuse(
                event, "one result per dispatched call id, exactly once, in call order"
            )
        self.turns.replace_last(self.turns[-1].model_copy(update={"results": list(event.results)}))
        calls = {call.call_id: call for call in self.pending_batch.calls}
        for result in event.results:
            if result.error is None:
                self.failure_signature, self.failure_streak = None, 0
                continue
            signature = failure_signature(
                result.name, calls[result.call_id].arguments, result.error.error_class.value
            )
            if signature == self.failure_signature:
                self.failure_streak += 1
            else:
                self.failure_signature, self.failure_streak = signature, 1
        self.pending_batch = None
        self.paused = None
        self.woken = None
        self.approval = None
        self.phase = Phase.READY

    def _on_reserved(self, event: BudgetReserved) -> None:
        batch = self.pending_batch
        assert batch is not None  # guaranteed by Phase.DISPATCHED
        call = next((c for c in batch.calls if c.call_id == event.call_id), None)
        if call is None or call.denied is not None:
            raise self._refuse(event, "a reservation is for a call of the dispatched batch")
        if event.from_code:
            # A child the call's body starts: its id derives from the write's key and
            # the body's key (a call of a child tool starts its one child itself).
            if call.child_id is not None or call.effect_key is None:
                raise self._refuse(event, "a child from code is started by a write's body")
            expected: str | None = child_id_of(call.effect_key, event.key)
        else:
            if event.key is not None:
                raise self._refuse(event, "only a child started from code has a key")
            expected = call.child_id
        if event.child_id != expected:
            raise self._refuse(event, f"call {event.call_id} does not start {event.child_id}")
        if event.child_id in self.reservations:
            raise self._refuse(event, f"child {event.child_id} already has a reservation")
        self.reservations = {**self.reservations, event.child_id: event}
        if event.from_code:
            self.children_started += 1  # a child tool's call counted with its batch

    def _on_returned(self, event: BudgetReturned) -> None:
        reserved = self.reservations.get(event.child_id)
        if reserved is None or reserved.call_id != event.call_id:
            raise self._refuse(event, f"child {event.child_id} has no reservation to return")
        if event.returned != reserved.allotment.reserved.minus(event.spent):
            raise self._refuse(event, "what comes back is the allotment less what was used")
        self.reservations = {k: v for k, v in self.reservations.items() if k != event.child_id}
        self.children_spent = self.children_spent.plus(event.spent)

    @property
    def depth(self) -> int:
        """How deep in a tree of invocations this one is (a root: 0)."""
        return self.parent.depth if self.parent is not None else 0

    @property
    def reserved(self) -> Spent:
        """The budget set aside for children still running (or whose outcome is unknown)."""
        total = Spent()
        for reservation in self.reservations.values():
            total = total.plus(reservation.allotment.reserved)
        return total

    @property
    def spent_in_tree(self) -> Spent:
        """What this invocation used, with what its children used and what it holds for them.

        What a child gives back to its parent when it settles (``BudgetReturned.spent``).
        """
        own = Spent(
            steps=self.step,
            tool_calls=self.tool_calls,
            tokens=self.input_tokens + self.output_tokens,
            cost=self.cost,
        )
        return own.plus(self.children_spent).plus(self.reserved)

    def _on_pause(self, event: Paused) -> None:
        if not event.reason.pauses:
            raise self._refuse(event, f"{event.reason.value} is not a pausing reason")
        # Which pause each phase allows is where the table lets it lead: a running batch
        # waits only for a service; a proposed batch only for an approval; another
        # decision for a person.
        phase = PAUSED_PHASE[event.reason]
        if event.child_path is not None:
            # A child's pause: the batch that started it stays dispatched.
            if not event.child_path or event.reason is TerminalReason.RECONCILIATION_REQUIRED:
                raise self._refuse(event, "a child's pause names the child and its person's wait")
            phase = Phase.AWAITING_CHILD
        if phase not in TRANSITIONS[self.phase][Paused]:
            raise self._refuse(event, f"{event.reason.value} is not a pause of this phase")
        problem = self._sleep_problem(event)
        if (
            problem is None
            and event.reason is TerminalReason.PLAN_APPROVAL_REQUIRED
            and event.child_path is None  # a child's plan is checked by the child
        ):
            problem = plans.pause_problem(
                self.planning, step=event.step, digest=event.proposal_digest
            )
        if problem is not None:
            raise self._refuse(event, problem)
        if event.calls is not None and event.child_path is None:
            decision = self.last_decision
            proposed = (
                [(c.id, c.name) for c in decision.calls] if isinstance(decision, ToolCalls) else []
            )
            if proposed != [(c.call_id, c.name) for c in event.calls]:
                raise self._refuse(event, "the batch waiting for approval must be the proposed one")
        if event.step != self.step:
            raise self._refuse(event, f"step must be {self.step}, got {event.step}")
        self.paused = event
        self.phase = phase

    def _sleep_problem(self, event: Paused) -> str | None:
        """Why a pause's sleep fields do not fit its reason and phase (None: they do)."""
        quota = event.reason is TerminalReason.RATE_LIMITED
        if (self.phase is Phase.READY) != quota:
            return "only a model call waiting for quota pauses before a decision"
        if event.reason is not TerminalReason.SLEEPING and not quota:
            if event.wake_at is not None or event.sleeping_calls is not None:
                return "only a sleep has a wake time and sleeping calls"
            return None
        wake_at = event.wake_at
        if wake_at is None or wake_at.tzinfo is None or wake_at.utcoffset() is None:
            return "a sleep needs a wake time with a time zone"
        if event.child_path is not None or event.calls is not None:
            return "a sleep waits for no child and no approval"
        if quota:
            return None if event.sleeping_calls is None else "a wait for quota has no calls"
        batch = self.pending_batch
        if batch is None:
            decision = self.last_decision
            if not isinstance(decision, Wait) or decision.until != wake_at:
                return "a sleep without a batch follows a wait decision, until its time"
            if event.sleeping_calls is not None:
                return "a wait decision has no sleeping calls"
            return None
        slept = event.sleeping_calls or []
        ids = {call.call_id for call in batch.calls}
        if not slept or len(set(slept)) != len(slept) or not set(slept) <= ids:
            return "a sleep of tools names calls of the dispatched batch, each once"
        return None

    def _on_sleep_ended(self, event: SleepEnded) -> None:
        paused = self.paused
        assert paused is not None
        assert paused.wake_at is not None
        if event.step != self.step:
            raise self._refuse(event, f"step must be {self.step}, got {event.step}")
        if event.wake_at != paused.wake_at or event.calls != paused.sleeping_calls:
            raise self._refuse(event, "a wake names the sleep's time and calls")
        if event.early != (event.timestamp < paused.wake_at):
            raise self._refuse(
                event,
                "a wake before its time is early, and only one before its time is"
                if event.early
                else f"not due before {paused.wake_at.isoformat()}",
            )
        self.paused = None
        if self.pending_batch is not None:
            self.woken = event
            self.phase = Phase.DISPATCHED
            return
        if paused.reason is TerminalReason.RATE_LIMITED:
            self.phase = Phase.READY  # the model is asked again, as if nothing happened
            return
        woke = f"woke at {event.timestamp.isoformat()}"
        if event.early:
            woke += f" (early, by {event.by})"
        self.turns.replace_last(self.turns[-1].model_copy(update={"reply": woke}))
        self.phase = Phase.READY

    def _on_approval(self, event: ApprovalGranted | ApprovalDenied) -> None:
        paused = self.paused
        assert paused is not None  # guaranteed by Phase.AWAITING_APPROVAL
        if event.step != self.step:
            raise self._refuse(event, f"step must be {self.step}, got {event.step}")
        if event.proposal_digest != paused.proposal_digest:
            raise self._refuse(event, "the digest is not the one of the paused batch")
        if isinstance(event, ApprovalGranted):
            note = f" ({event.note})" if event.note else ""
            summary = f"approved by {event.by}{note}"
        else:
            summary = f"denied by {event.by}: {event.reason}"
        self.turns.replace_last(self.turns[-1].model_copy(update={"approval": summary}))
        self.paused = None
        if paused.reason is TerminalReason.PLAN_APPROVAL_REQUIRED and self.planning is not None:
            denial = event.reason if isinstance(event, ApprovalDenied) else None
            self.planning = plans.decided(self.planning, by=event.by, denial=denial)
        if paused.calls is None:
            # The model itself asked for approval of a proposal: it is told the
            # decision (in its turn) and decides again.
            self.phase = Phase.READY
            return
        self.approval = event
        self.approved_calls = list(paused.calls)
        self.approval_needed = list(
            paused.needs_approval or [call.call_id for call in self.approved_calls]
        )
        self.phase = Phase.CALLS_PROPOSED

    def _on_clarification(self, event: ClarificationProvided) -> None:
        if event.step != self.step:
            raise self._refuse(event, f"step must be {self.step}, got {event.step}")
        self.turns.replace_last(self.turns[-1].model_copy(update={"reply": event.answer}))
        self.paused = None
        self.phase = Phase.READY

    def _on_verification_failed(self, event: VerificationFailed) -> None:
        if not isinstance(self.last_decision, Final):
            raise self._refuse(event, "only a proposed final answer is verified")
        if event.step != self.step or event.attempt != self.verification_failures + 1:
            raise self._refuse(event, "step and attempt must follow the history")
        self.turns.replace_last(self.turns[-1].model_copy(update={"verification": event.evidence}))
        self.verification_failures = event.attempt
        self.phase = Phase.READY

    def _on_critique(self, event: CritiqueReturned) -> None:
        if not isinstance(self.last_decision, Final):
            raise self._refuse(event, "only a proposed final answer is reviewed")
        if event.step != self.step or event.round != self.critic_spent.rounds + 1:
            raise self._refuse(event, "step and round must follow the history")
        revise = event.verdict is Verdict.REVISE
        critique = event.critique
        if revise != (critique is not None and bool(critique.strip())):
            raise self._refuse(event, "a critique comes with a revise verdict, and only with one")
        spent_round = event.verdict in (Verdict.MALFORMED, Verdict.FAILED)
        if spent_round != (event.problem is not None):
            raise self._refuse(event, "a problem comes with a malformed or failed round only")
        self.critic_spent = self.critic_spent.plus(event.verdict, event.usage)
        if revise:
            self.turns.replace_last(self.turns[-1].model_copy(update={"critique": event.critique}))
            self.phase = Phase.READY

    def _on_terminate(self, event: Terminated) -> None:
        if event.reason.pauses:
            raise self._refuse(event, f"{event.reason.value} pauses, it does not terminate")
        if self.pending_batch is not None:
            raise self._refuse(event, "a dispatched batch ends with its results first")
        if event.steps != self.step or event.tool_calls != self.tool_calls:
            raise self._refuse(event, "totals must match the committed history")
        if event.reason is TerminalReason.COMPLETED:
            decision = self.last_decision
            if (
                self.phase is not Phase.DECIDED
                or not isinstance(decision, Final)
                or decision.answer != event.answer
            ):
                raise self._refuse(event, "completed needs the committed final answer")
        self.terminated = event
        self.paused = None
        self.phase = Phase.TERMINATED


def plan_fingerprint(calls: Iterable[DispatchedCall | ToolCall]) -> str:
    """A digest of a batch that ignores call ids and call order (seed 000's fingerprint).

    Judged on the calls as dispatched (normalised, redacted arguments).
    """
    return digest_of(sorted([call.name, canonical_json(call.arguments)] for call in calls))


def failure_signature(tool: str, arguments: dict[str, Any], error_class: str) -> str:
    """What makes two failures "the same": the tool, its normalised arguments, the error class."""
    return digest_of([tool, arguments, error_class])


class InvocationState(Frozen):
    """Everything an Invocation holds, as a typed value (the body of a snapshot)."""

    goal: str
    agent_name: str
    agent_version: str
    catalogue_digest: str
    tools: list[ToolSpec]
    budget: Budget
    settings: RunSettings | None = None
    task_class: str | None = None
    actor: str | None = None
    tenant: str | None = None
    forked_from: ForkOrigin | None = None
    parent: ParentLink | None = None
    handed_off_from: HandoffOrigin | None = None
    planning: PlanState | None = None
    children_started: int = 0
    reservations: dict[str, BudgetReserved] = {}
    """By child id (snapshots taken before children ran from code keyed them by call id)."""
    children_spent: Spent = Spent()
    phase: Phase
    step: int
    tool_calls: int
    turns: Turns
    pending_batch: BatchDispatched | None = None
    last_plan: str | None = None
    repeat_streak: int
    paused: Paused | None = None
    woken: SleepEnded | None = None
    terminated: Terminated | None = None
    started_at: datetime | None = None
    approval: ApprovalGranted | ApprovalDenied | None = None
    approved_calls: list[DispatchedCall] | None = None
    approval_needed: list[str] = []
    verification_failures: int = 0
    critic_spent: CriticSpent = NO_CRITIC
    input_tokens: int = 0
    output_tokens: int = 0
    cost: float = 0.0
    failure_signature: str | None = None
    failure_streak: int = 0
    invalid_streak: int = 0
    lease_holder: str | None = None
    lease_epoch: int = 0
    lease_taken_from: str | None = None
    last_hash: str
    created_on: datetime
    modified_on: datetime

    @field_validator("reservations", mode="after")
    @classmethod
    def _by_child(cls, reservations: dict[str, BudgetReserved]) -> dict[str, BudgetReserved]:
        """Keyed by child id, as the aggregate keys them (older snapshots: by call id)."""
        if all(key == reserved.child_id for key, reserved in reservations.items()):
            return reservations
        return {reserved.child_id: reserved for reserved in reservations.values()}

    @model_validator(mode="before")
    @classmethod
    def _name_the_pause(cls, data: Any) -> Any:
        """Snapshots taken before the pauses were named say ``paused``: name it."""
        if isinstance(data, dict) and data.get("phase") == "paused":
            paused = data.get("paused") or {}
            reason = paused.get("reason") if isinstance(paused, dict) else paused.reason
            data = {**data, "phase": PAUSED_PHASE[TerminalReason(str(reason))].value}
        return data


class InvocationSnapshot(BaseModel, CanSnapshotAggregate[str]):
    """An Invocation's state at a version, so that a long history replays from there.

    A snapshot is *sealed* as an event is chained (``aggregates.audit``, format 2): its
    ``chain_hash`` is the hash over the chain hash of the event at its version (the
    state's ``last_hash``) and the snapshot's body as stored. A snapshot whose seal
    holds against the stored event at its version is the one the runtime wrote after
    that event, byte for byte: :func:`aggregates.snapshot_seal.seal_problem`. Snapshots
    written before seals existed have none (``chain_hash`` empty).
    """

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    originator_id: str
    originator_version: int
    timestamp: datetime
    topic: str
    state: InvocationState
    chain_hash: str = ""
    """The seal (see the class); empty for a snapshot written before seals."""
    audit_format: int | None = Field(default=None, le=AUDIT_FORMAT)
    """2 for a sealed snapshot; None (left out) for one written before seals (a higher
    format is a newer loop-actors': refused when read)."""

    __slots__ = ("_sealed_body",)
    # The body the seal was computed over, for the store to write as it is (as an event's).

    @classmethod
    def take(cls, aggregate: Any) -> InvocationSnapshot:
        """Snapshot an invocation, sealed (no clock read: stamped with its last event's time)."""
        snapshot = cls.of(aggregate, audit_format=AUDIT_FORMAT)
        seal(snapshot, aggregate.last_hash)
        return snapshot

    @classmethod
    def of(cls, aggregate: Any, *, audit_format: int | None = None) -> InvocationSnapshot:
        """The invocation's snapshot, unsealed (to compare with a stored one's state)."""
        fields = {name: getattr(aggregate, name) for name in _STATE_FIELDS}
        return cls(
            originator_id=aggregate.id,
            originator_version=aggregate.version,
            timestamp=aggregate.modified_on,
            topic=get_topic(type(aggregate)),
            state=InvocationState(
                **fields, created_on=aggregate.created_on, modified_on=aggregate.modified_on
            ),
            audit_format=audit_format,
        )

    def same_state(self, other: InvocationSnapshot) -> bool:
        """Whether two snapshots hold the same invocation at the same version (seals aside)."""
        return (
            self.originator_id == other.originator_id
            and self.originator_version == other.originator_version
            and self.timestamp == other.timestamp
            and self.topic == other.topic
            and self.state == other.state
        )

    def mutate(self, _: Any) -> Any:
        """Rebuild the invocation this snapshot was taken of."""
        invocation = Invocation.__new__(Invocation)
        invocation.__base_init__(self.originator_id, self.originator_version, self.state.created_on)
        Invocation.__init__(invocation)
        for name in _STATE_FIELDS:
            value = getattr(self.state, name)
            if isinstance(value, list | Turns):
                value = value.copy()  # the aggregate changes its own; the snapshot is frozen
            setattr(invocation, name, value)
        invocation.modified_on = self.state.modified_on
        return invocation


_STATE_FIELDS = tuple(
    name for name in InvocationState.model_fields if name not in ("created_on", "modified_on")
)
Invocation.Snapshot = InvocationSnapshot  # type: ignore[attr-defined]


def replay(invocation: Invocation | None, events: Iterable[InvocationEvent]) -> Invocation | None:
    """Fold events into an invocation (a projector for ``Repository.get``)."""
    return cast("Invocation | None", fold(invocation, events))
