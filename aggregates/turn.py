"""The turn core: every rule of a turn, once, with no I/O.

Given an invocation, its recorded settings and the moment (the time, how long
the invocation has run, whether a cancel was requested), :class:`TurnCore`
says what happens next — an :data:`Action`: ask the model, authorise or run a
batch, ask a service about a write, verify an answer, or stop — and turns each
observation (a model reply, a batch's results, a service's answers, a
verifier's evidence) into the events to record and the next action. The shell
(``loop_actors``) performs each action, hands the observation back, and commits
the core's pending events where the action says so. It holds no rules.

Every budget, guard, approval need and choice of terminal reason lives here:

* before the model is asked: cancel, deadline, ``max_steps``, token and cost
  budgets (with their reservations), compaction of the view, wind-down notices;
* on a reply: schema, empty answers and batches, duplicate call ids, unknown
  tools, invalid arguments (``invalid_decision``), usage overruns, the tool
  budget, repeated plans (``no_progress``), the policy's verdicts, approvals;
* on a batch: ledger entries for writes, interrupted calls, reconciliation
  (committed / rejected / not found → again with the same key / unreachable →
  pause), repeated failures;
* on a final answer: verification attempts, then the critic's rounds (reflection,
  in :mod:`aggregates.turn_critic`).

Because the core needs nothing but observations, a stored history's replies and
results can be fed back in to re-drive it (replay) with no second copy of the rules.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, assert_never

from aggregates.call_secrets import CallSecrets
from aggregates.children import (
    NOTHING_SPENT,
    Allotment,
    ChildOutcome,
    Left,
    Spent,
    allot,
    child_id_of,
    depth_problem,
    fan_out_problem,
    unspent_share,
)
from aggregates.context import compact
from aggregates.decisions import (
    Budget,
    CannotContinue,
    Clarification,
    Decision,
    EffectStatus,
    ErrorClass,
    ErrorInfo,
    Final,
    Handoff,
    Plan,
    Rejection,
    RequestApproval,
    TerminalReason,
    ToolCalls,
    ToolEffect,
    ToolResult,
    Usage,
    Wait,
)
from aggregates.digest import digest_of
from aggregates.effect import Effect, Resolution
from aggregates.errors import AggregateError
from aggregates.events import DomainEvent
from aggregates.fork import repeat_note, repeated_writes, reused_source_keys
from aggregates.fork_origin import ForkWrites, SourceWrite
from aggregates.invocation import ApprovalDenied, DispatchedCall, Invocation, Phase
from aggregates.model_input import ModelInput
from aggregates.planning import (
    POLICY_APPROVER,
    ApproveBy,
    PlannedWrite,
    match_planned,
    plan_call_id,
    planned_approval,
    planned_writes,
    planning_notices,
    refused_while_planning,
    stored_plan,
)
from aggregates.proposals import validate_proposal
from aggregates.redaction import (
    redacted_values,
)
from aggregates.results import (
    Interruption,
    denied_result,
    interrupted_result,
    known_result,
    unreported_result,
    write_result,
)
from aggregates.revalidation import admitted_usage
from aggregates.settings import RunSettings
from aggregates.standing import Stop, stopped
from aggregates.turn_critic import CriticRounds
from aggregates.turn_messages import (
    WITHHELD_WHY,
    Action,
    AskModel,
    AttemptStillRunning,
    Authorise,
    Catalogue,
    ChildWaits,
    Continue,
    Critique,
    EffectAnswered,
    EffectObservation,
    Finished,
    KeptSecret,
    KeptValues,
    LoadEffects,
    ModelAnswered,
    ModelFailed,
    ModelInterrupted,
    ModelObservation,
    ModelQuotaWait,
    ModelTimedOut,
    Moment,
    PolicyVerdict,
    Reconcile,
    ReconcileOutcome,
    RunCalls,
    ServiceUnreachable,
    Verify,
)
from aggregates.turn_records import (
    admit_receipt,
    batch_digest,
    cancel_paused,
    record_outcome,
    record_outside_cancellation,
    settle_ended_effect,
    stop_after_failed_commit,
)
from aggregates.values import (
    check_json,
    check_text,
    limit_size,
    safe_text,
    storable_bound,
    usage_problem,
)

MAX_DISPATCH_ROUNDS = 3
"""How many times one batch may dispatch a write whose service keeps answering "not found"."""

__all__ = [
    "MAX_DISPATCH_ROUNDS",
    "WITHHELD_WHY",
    # Defined here, and (the shell's vocabulary, the records) importable from here.
    "Action",
    "AskModel",
    "AttemptStillRunning",
    "Authorise",
    "Catalogue",
    "ChildWaits",
    "Continue",
    "Critique",
    "EffectAnswered",
    "EffectObservation",
    "Finished",
    "KeptSecret",
    "KeptValues",
    "LoadEffects",
    "ModelAnswered",
    "ModelFailed",
    "ModelInterrupted",
    "ModelObservation",
    "ModelQuotaWait",
    "ModelTimedOut",
    "Moment",
    "PolicyVerdict",
    "Reconcile",
    "ReconcileOutcome",
    "RunCalls",
    "ServiceUnreachable",
    "TurnCore",
    "Verify",
    "admit_receipt",
    "batch_digest",
    "cancel_paused",
    "record_outside_cancellation",
    "settle_ended_effect",
    "stop_after_failed_commit",
    "validate_proposal",
]


class TurnCore(CriticRounds):
    """The turn protocol of one invocation: next action in, observation out, events recorded."""

    def __init__(
        self,
        invocation: Invocation,
        *,
        settings: RunSettings,
        catalogue: Catalogue,
        verifies: bool = False,
        authorises: bool = False,
        kept: KeptValues | None = None,
        critiques: bool = False,
    ) -> None:
        """Drive ``invocation`` with its recorded ``settings`` and the agent's ``catalogue``.

        ``verifies`` / ``authorises``: whether the shell has a verifier / a policy
        (code, which the record cannot hold). ``kept``: the real values the runtime
        holds for redacted ones (of this invocation), which error texts are scrubbed of.
        ``critiques``: whether the shell has the critic the recorded settings name.
        """
        self.invocation = invocation
        self.settings = settings
        self.catalogue = catalogue
        self.verifies = verifies
        self.authorises = authorises
        self.critiques = critiques
        self._effects: dict[str, Effect] = {}
        """Ledger entries of the batch being settled, by call id."""
        self._results: dict[str, ToolResult] = {}
        self._round = 0
        self._planned: list[DispatchedCall] = []
        self._arguments: dict[str, dict[str, Any]] = {}
        """Real (normalised) arguments of the proposed batch, by call id."""
        self._approved = False
        self._plan_review = False
        """True while the agent's policy decides on the plan just proposed."""
        self._reused: dict[str, ToolResult] = {}
        """A fork's results of the writes that reuse its source's (``--writes dedupe``)."""
        self._call_secrets = CallSecrets(catalogue, kept)
        """The sensitive values of the calls met so far: kept, and scrubbed from texts."""

    @property
    def budget(self) -> Budget:
        """The recorded budget."""
        return self.invocation.budget

    # ----------------------------------------------------------------- shell interface

    def take_events(self) -> list[DomainEvent]:
        """Remove and return every pending event (the invocation's, then its writes')."""
        events: list[DomainEvent] = list(self.invocation.take_events())
        for effect in self._effects.values():
            events.extend(effect.take_events())
        if self.invocation.pending_batch is None:
            self._effects = {}
        return events

    def take_secrets(self) -> list[KeptSecret]:
        """Remove and return the real values of what was just recorded redacted."""
        return self._call_secrets.take()

    def seconds_left(self, moment: Moment) -> float | None:
        """Seconds until the recorded deadline (None without one)."""
        if self.budget.deadline_s is None:
            return None
        return self.budget.deadline_s - moment.elapsed_s

    def next(self, moment: Moment) -> Action:
        """What to do from the committed state (at the start and after each ``Continue``)."""
        inv = self.invocation
        # Paused for reconciliation, a batch still waits: it goes on (it settles its writes).
        resting = stopped(inv.phase)
        if resting is Stop.ENDED or (
            resting is Stop.PAUSED and (inv.pending_batch is None or inv.phase is Phase.SLEEPING)
        ):
            return Finished()  # a sleep goes on once its wake is recorded (SleepEnded)
        if inv.pending_batch is not None:
            # Resume a batch that has no committed results (DESIGN.md, Resume).
            keys = [c.effect_key for c in inv.pending_batch.calls if c.effect_key is not None]
            if keys:
                return LoadEffects(keys=keys)
            return self.on_effects_loaded({}, moment)
        if inv.phase is Phase.CALLS_PROPOSED and inv.approval is not None:
            return self._approved_batch(moment)
        if inv.phase is Phase.DECIDED and isinstance(inv.last_decision, Final):
            # A final answer committed before its critic's verdict: judged again.
            return self._judge(inv.last_decision.answer, moment)
        if inv.phase is not Phase.READY:
            raise AggregateError(f"invocation {inv.id} cannot go on from phase {inv.phase.value}")
        stop = self._stop_before_asking(moment)
        if stop is not None:
            return stop
        return self._ask(moment)

    # ----------------------------------------------------------------- asking the model

    def _stop_before_asking(self, moment: Moment) -> Action | None:
        inv = self.invocation
        budget = self.budget
        if moment.cancel_requested:
            return self._cancelled(moment, "cancel requested")
        if self._deadline_passed(moment):
            return self._end(TerminalReason.DEADLINE_EXCEEDED, moment)
        children = self._children_used()
        if inv.step + children.steps >= budget.max_steps:
            return self._end(TerminalReason.MAX_STEPS, moment, detail=self._steps_detail(children))
        exhausted = self._usage_exhausted(reserving=True)
        if exhausted is not None:
            return self._end(exhausted[0], moment, detail=exhausted[1])
        return None

    def _ask(self, moment: Moment) -> AskModel:
        inv = self.invocation
        turns = list(inv.turns)
        notices = self._notices()
        settings = self.settings
        if settings.context_limit is not None:
            turns, compaction = compact(
                turns, limit=settings.context_limit, keep_recent=settings.keep_recent_turns
            )
            if compaction is not None:
                # Committed with the decision it was made for.
                inv.record_compaction(
                    dropped_steps=compaction.dropped_steps,
                    kept_steps=compaction.kept_steps,
                    size_before=compaction.size_before,
                    size_after=compaction.size_after,
                    at=moment.at,
                )
                notices = [compaction.note, *notices]
        planning = inv.planning
        return AskModel(
            step=inv.step + 1,
            turns=turns,
            notices=[*planning_notices(planning), *notices],
            read_only=planning is not None and planning.read_only,
        )

    def _notices(self) -> list[str]:
        """What the model is told about its remaining budget (graceful wind-down)."""
        budget = self.budget
        steps_left = budget.max_steps - self.invocation.step
        notices = self._revision_notices() if self.invocation.critic_spent.rounds else []
        if budget.wind_down_steps is not None and steps_left <= budget.wind_down_steps:
            notices.append(self.settings.wind_down_notice.format(steps_left=steps_left))
        return notices

    def on_model(self, observation: ModelObservation, moment: Moment) -> Action:
        """Turn what the model call gave into events and the next action."""
        match observation:
            case ModelInterrupted():
                return self._cancelled(moment, "cancel requested")
            case ModelQuotaWait(until=until, limit=limit):
                left = self.seconds_left(moment)
                if left is not None and (until - moment.at).total_seconds() >= left:
                    return self._end(
                        TerminalReason.DEADLINE_EXCEEDED,
                        moment,
                        detail=f"no quota of {limit} before the deadline",
                    )
                self.invocation.pause(
                    TerminalReason.RATE_LIMITED,
                    question=f"no quota of {limit} before {until.isoformat()}",
                    wake_at=until,
                    at=moment.at,
                )
                return Finished()
            case ModelTimedOut():
                return self._end(
                    TerminalReason.DEADLINE_EXCEEDED,
                    moment,
                    detail="the model did not answer in time",
                )
            case ModelFailed(error_type=error_type, message=message):
                return self._end(
                    TerminalReason.MODEL_ERROR,
                    moment,
                    detail=self._call_secrets.scrub_all(f"{error_type}: {message}"),
                )
            case ModelAnswered(proposal=proposal, usage=usage, model_input=model_input):
                pass
            case _:
                assert_never(observation)
        # The usage is the provider's report, not the model's proposal: one that cannot
        # be recorded (NaN, negative, absurd, not a Usage) is a model error, decided
        # before anything.
        admitted = admitted_usage(usage)
        problem = admitted if isinstance(admitted, str) else None
        price = self.settings.price
        if isinstance(admitted, Usage):
            usage = admitted
            if price is not None and not usage.cost:
                usage = usage.model_copy(update={"cost": price.cost(usage)})
                problem = usage_problem(usage)
        if problem is not None:
            return self._end(
                TerminalReason.MODEL_ERROR,
                moment,
                detail=f"the model reported a usage that cannot be recorded: {problem}",
            )
        origin = self.invocation.handed_off_from
        verdict = validate_proposal(
            proposal,
            self.catalogue,
            self.settings,
            handoffs_made=origin.hops if origin is not None else 0,
        )
        if isinstance(verdict, Rejection):
            inv = self.invocation
            inv.reject(verdict, usage=usage, at=moment.at, model_input=model_input)
            if inv.invalid_streak > self.settings.max_invalid_proposals:
                return self._end(
                    TerminalReason.INVALID_DECISION, moment, detail="; ".join(verdict.problems)
                )
            # Recorded with its problems, which the model is shown: it proposes again.
            # Every budget still counts (the next action checks them).
            return Continue(after_results=False)
        decision, arguments = verdict
        return self._act(decision, arguments, usage, moment, model_input)

    def _act(
        self,
        decision: Decision,
        arguments: dict[str, dict[str, Any]],
        usage: Usage,
        moment: Moment,
        model_input: ModelInput | None = None,
    ) -> Action:
        """Record a valid decision and carry it out."""
        inv = self.invocation
        step = inv.step + 1
        stored = decision
        if isinstance(decision, ToolCalls):
            calls, redacted_any = [], False
            for call in decision.calls:
                redacted = self.catalogue.redact_arguments(call.name, call.arguments)
                if redacted is not call.arguments:
                    self._call_secrets.learn(
                        step, call.id, redacted_values(call.arguments, redacted)
                    )
                    self._call_secrets.keep(
                        step, call.id, call.name, "arguments", arguments[call.id]
                    )
                    call = call.model_copy(update={"arguments": redacted})  # noqa: PLW2901
                    redacted_any = True
                calls.append(call)
            if redacted_any:  # store the redacted copy; else the decision as it is
                stored = ToolCalls(calls=calls)
        writes: list[PlannedWrite] = []
        if isinstance(decision, Plan):
            # Stored as it is matched: validated arguments, redacted.
            writes = planned_writes(decision, arguments, self.catalogue)
            stored = stored_plan(decision, writes)
        inv.propose(stored, usage=usage, at=moment.at, model_input=model_input)
        overrun = self._usage_exhausted(reserving=False)
        if overrun is not None and not isinstance(decision, Final):
            # Paid for, recorded, and not acted on: the budget is spent.
            return self._end(overrun[0], moment, detail=overrun[1])
        match decision:
            case Final(answer=answer):
                return self._judge(answer, moment)
            case CannotContinue(reason=reason):
                return self._end(TerminalReason.CANNOT_CONTINUE, moment, detail=reason)
            case Handoff(to=to, reason=reason):
                # The runtime starts the target from the recorded decision.
                return self._end(
                    TerminalReason.HANDED_OFF,
                    moment,
                    detail=f"handed off to {to}: {reason}",
                )
            case Clarification(question=question):
                inv.pause(TerminalReason.CLARIFICATION_REQUIRED, question=question, at=moment.at)
                return Finished()
            case RequestApproval(proposal_digest=digest):
                inv.pause(TerminalReason.APPROVAL_REQUIRED, proposal_digest=digest, at=moment.at)
                return Finished()
            case Wait(reason=reason, until=until):
                left = self.seconds_left(moment)
                if left is not None and (until - moment.at).total_seconds() > left:
                    return self._end(
                        TerminalReason.DEADLINE_EXCEEDED,
                        moment,
                        detail=f"asked to wait until {until.isoformat()}, past the deadline",
                    )
                inv.pause(TerminalReason.SLEEPING, question=reason, wake_at=until, at=moment.at)
                return self._asleep(moment)
            case Plan(summary=summary):
                return self._plan_proposed(writes, summary, arguments, moment)
            case ToolCalls(calls=proposed):
                pass
            case _:
                assert_never(decision)

        # Ids and names come from the validated decision, the arguments are the
        # catalogue's normalised (checked storable) ones. Validated all the same: for a
        # model this small pydantic's validator is faster than its ``model_construct``.
        planned = [
            DispatchedCall(
                call_id=call.id,
                name=call.name,
                arguments=self.catalogue.redact_arguments(call.name, arguments[call.id]),
                effect=self._effect_of(call.name),
            )
            for call in proposed
        ]
        refused = self._refuse_dispatch(planned, moment)
        if refused is not None:
            return refused
        self._planned, self._arguments, self._approved = planned, arguments, False
        if self.authorises:
            return Authorise(step=inv.step, calls=planned)
        return self.on_authorised(PolicyVerdict(), moment)

    def _plan_proposed(
        self,
        writes: list[PlannedWrite],
        summary: str,
        arguments: dict[str, dict[str, Any]],
        moment: Moment,
    ) -> Action:
        """Record the plan; pause for a person, or ask the policy when the agent says so."""
        inv = self.invocation
        for index, write in enumerate(writes, start=1):
            real = arguments[plan_call_id(index)]
            if write.arguments is not real:  # redacted: the policy sees the real values
                self._call_secrets.keep(
                    inv.step, plan_call_id(index), write.tool, "arguments", real
                )
        digest = inv.propose_plan(writes, summary=summary, at=moment.at)
        planning = self.settings.planning
        if planning is not None and planning.approve_by is ApproveBy.POLICY and self.authorises:
            self._plan_review = True
            return Authorise(
                step=inv.step,
                calls=[
                    DispatchedCall(
                        call_id=plan_call_id(index),
                        name=write.tool,
                        arguments=write.arguments,
                        effect=ToolEffect.WRITE,
                    )
                    for index, write in enumerate(writes, start=1)
                ],
            )
        inv.pause(
            TerminalReason.PLAN_APPROVAL_REQUIRED,
            question=summary or None,
            proposal_digest=digest,
            at=moment.at,
        )
        return Finished()

    def _plan_reviewed(self, verdict: PolicyVerdict, moment: Moment) -> Action:
        """The policy's verdict on the plan: approved when it refused none of its writes."""
        self._plan_review = False
        inv = self.invocation
        state = inv.planning
        decision = inv.last_decision
        assert state is not None
        assert state.digest is not None
        assert isinstance(decision, Plan)
        inv.pause(
            TerminalReason.PLAN_APPROVAL_REQUIRED,
            question=decision.summary or None,
            proposal_digest=state.digest,
            at=moment.at,
        )
        if verdict.refused:
            reason = "; ".join(
                f"{step}: " + safe_text(self._call_secrets.scrub_call(inv.step, step, "", why))
                for step, why in sorted(verdict.refused.items())
            )
            inv.deny_approval(state.digest, by=POLICY_APPROVER, reason=reason, at=moment.at)
        else:
            inv.grant_approval(state.digest, by=POLICY_APPROVER, at=moment.at)
        return Continue(after_results=False)

    def _refuse_dispatch(self, planned: list[DispatchedCall], moment: Moment) -> Action | None:
        """The stop that comes before a batch would run, if any."""
        inv = self.invocation
        budget = self.budget
        children = self._children_used().tool_calls
        if inv.tool_calls + children + len(planned) > budget.max_tool_calls:
            by_children = f" ({children} by children)" if children else ""
            return self._end(
                TerminalReason.TOOL_BUDGET_EXHAUSTED,
                moment,
                detail=f"{len(planned)} call(s) proposed, {inv.tool_calls + children}"
                f"{by_children} of {budget.max_tool_calls} used",
            )
        # Repetition is judged on the calls as they would be dispatched: normalised
        # (defaults filled in) and redacted, as the aggregate checks them.
        if inv.repeat_streak_after(planned) > budget.max_repeated_plan:
            return self._end(
                TerminalReason.NO_PROGRESS,
                moment,
                detail=f"the same plan was proposed {budget.max_repeated_plan + 1} times in a row",
            )
        if moment.cancel_requested:
            return self._cancelled(moment, "cancel requested")
        if self._deadline_passed(moment):
            return self._end(TerminalReason.DEADLINE_EXCEEDED, moment)
        return None

    def _approved_batch(self, moment: Moment) -> Action:
        """After a person approved or denied the paused batch: exactly that batch goes on."""
        inv = self.invocation
        planned = list(inv.approved_calls or [])
        # The settings may have changed since the pause: the budget still holds.
        refused = self._refuse_dispatch(planned, moment)
        if refused is not None:
            return refused
        self._planned, self._arguments, self._approved = planned, {}, True
        if self.authorises:
            # The same policy decides again: a call it refused stays refused.
            return Authorise(step=inv.step, calls=planned)
        return self.on_authorised(PolicyVerdict(), moment)

    def on_authorised(self, verdict: PolicyVerdict, moment: Moment) -> Action:
        """The policy's verdict on the proposed (or approved) batch."""
        inv = self.invocation
        if verdict.stop is not None:
            return self._end(
                TerminalReason.INVALID_DECISION,
                moment,
                detail=self._call_secrets.scrub_all(f"refused by policy: {verdict.stop}"),
            )
        if self._plan_review:
            return self._plan_reviewed(verdict, moment)
        planned = self._planned
        names = {call.call_id: call.name for call in planned}
        refused = {
            call_id: safe_text(
                self._call_secrets.scrub_call(inv.step, call_id, names.get(call_id, ""), why)
            )
            for call_id, why in verdict.refused.items()
        }
        repeats, reused = self._source_repeats(planned, refused)
        # No write runs under the read-only ceiling of a run that plans.
        refused.update(
            refused_while_planning(
                inv.planning,
                [(c.call_id, c.name, c.effect) for c in planned if c.call_id not in refused],
            )
        )
        if not self._approved:
            planned = self._planned = self._with_plan_steps(planned, refused, reused)
        if self._approved:
            approval = inv.approval
            if isinstance(approval, ApprovalDenied):
                message = (
                    f"denied by {approval.by}: {approval.reason}; it did not run and "
                    "must not be retried as is"
                )
                refused.update(dict.fromkeys(inv.approval_needed, message))
            return self._dispatch(planned, refused, moment, reused)
        needing = [
            call.call_id
            for call in planned
            if call.call_id not in refused
            and call.call_id not in reused
            and (call.call_id in repeats or self._needs_approval(call))
        ]
        if needing:
            question = None
            if repeats and inv.forked_from is not None:
                question = "; ".join(
                    f"call {call_id}: {repeat_note(inv.forked_from, write)}; approve to make "
                    "it again under a new effect key"
                    for call_id, write in repeats.items()
                )
            inv.pause(
                TerminalReason.APPROVAL_REQUIRED,
                question=question,
                proposal_digest=batch_digest(inv.id, inv.step, planned),
                calls=planned,
                needs_approval=needing,
                at=moment.at,
            )
            return Finished()
        return self._dispatch(planned, refused, moment, reused)

    def _with_plan_steps(
        self,
        planned: list[DispatchedCall],
        refused: Mapping[str, str],
        reused: Mapping[str, SourceWrite],
    ) -> list[DispatchedCall]:
        """The batch with each write the plan in force authorises marked with its step."""
        matched = match_planned(
            self.invocation.planning,
            [
                (c.call_id, c.name, self._arguments[c.call_id])
                for c in planned
                if c.effect is ToolEffect.WRITE
                and c.call_id not in refused
                and c.call_id not in reused
            ],
        )
        if not matched:
            return planned
        return [
            c.model_copy(update={"plan_step": matched[c.call_id]}) if c.call_id in matched else c
            for c in planned
        ]

    def _needs_approval(self, call: DispatchedCall) -> bool:
        """Whether a call of a new batch waits for a person: the plan's rule, else its tool's."""
        by_plan = planned_approval(self.invocation.planning, call.effect, call.plan_step)
        if by_plan is not None:
            return by_plan
        return self.catalogue.needs_approval(call.name, self._arguments[call.call_id])

    def _source_repeats(
        self, planned: list[DispatchedCall], refused: dict[str, str]
    ) -> tuple[dict[str, SourceWrite], dict[str, SourceWrite]]:
        """A fork's writes that repeat its source's: those waiting for a person, those reused.

        By call id. ``--writes deny`` adds the repeats to ``refused``; ``live`` (and an
        invocation that is not a fork) has none.
        """
        inv = self.invocation
        origin = inv.forked_from
        if origin is None or not origin.source_writes or origin.writes is ForkWrites.LIVE:
            return {}, {}
        done = reused_source_keys(
            origin,
            (
                result.effect_key
                for turn in inv.turns
                if turn.step > origin.at_step
                for result in turn.results
            ),
        )
        repeats = repeated_writes(
            origin, [c for c in planned if c.call_id not in refused], reused_keys=done
        )
        match origin.writes:
            case ForkWrites.APPROVE:
                # A person approved the batch: its repeats run as new writes.
                return ({} if self._approved else repeats), {}
            case ForkWrites.DENY:
                for call_id, write in repeats.items():
                    refused[call_id] = (
                        f"not run: {repeat_note(origin, write)}; this fork does not repeat "
                        "its source's writes (writes=deny)"
                    )
                return {}, {}
            case ForkWrites.DEDUPE:
                return {}, repeats
            case ForkWrites.LIVE:  # pragma: no cover - returned above
                return {}, {}
            case _:
                assert_never(origin.writes)

    # ----------------------------------------------------------------- batches

    def _dispatch(
        self,
        planned: list[DispatchedCall],
        denied: dict[str, str],
        moment: Moment,
        reused: Mapping[str, SourceWrite],
    ) -> Action:
        """Record the batch and the ledger entries of its writes; then run it.

        ``denied`` calls are dispatched as part of the batch but never run: they
        get a ``denied`` result, and a write among them gets no effect key.
        ``reused`` (a fork's, ``--writes dedupe``): writes dispatched with the effect
        key of the source's write they repeat; they never run, the ledger's receipt
        is their result (a resumed batch finds it there by that key).
        """
        inv = self.invocation
        dispatched: list[DispatchedCall] = []
        effects: dict[str, Effect] = {}
        self._reused = {}
        denied = dict(denied)
        children = self._allot_children(planned, denied, reused, moment)
        for call in planned:
            if call.call_id in denied:
                # Recorded with the batch, so that a resumed batch does not run it either.
                dispatched.append(call.model_copy(update={"denied": denied[call.call_id]}))
                continue
            source = reused.get(call.call_id)
            if source is not None:
                call = call.model_copy(update={"effect_key": source.effect_key})  # noqa: PLW2901
                self._reused[call.call_id] = write_result(
                    call, source.status, receipt=source.receipt
                )
                dispatched.append(call)
                continue
            if call.effect is ToolEffect.WRITE:
                effect = Effect.prepare(
                    invocation_id=inv.id,
                    step=inv.step,
                    call_id=call.call_id,
                    tool=call.name,
                    arguments_digest=digest_of(call.arguments),
                    at=moment.at,
                )
                effect.dispatch(at=moment.at)
                effects[call.call_id] = effect
                update: dict[str, Any] = {"effect_key": effect.key}
                if call.call_id in children:
                    update["child_id"] = child_id_of(effect.key)
                call = call.model_copy(update=update)  # noqa: PLW2901
            dispatched.append(call)
        inv.dispatch(dispatched, self.catalogue.plan(dispatched), at=moment.at)
        for call in dispatched:
            if call.child_id is not None:
                inv.reserve_budget(
                    call.call_id, call.child_id, children[call.call_id], at=moment.at
                )
        self._planned, self._arguments = [], {}
        return self._settle(dispatched, effects, moment, first_dispatch=True)

    def _settle(
        self,
        calls: list[DispatchedCall],
        effects: dict[str, Effect],
        moment: Moment,
        *,
        first_dispatch: bool,
    ) -> Action:
        """Start settling a dispatched batch: denied calls and known writes have results."""
        self._effects, self._results, self._round = effects, {}, 0
        runnable: list[DispatchedCall] = []
        for call in calls:
            if call.denied is not None:
                self._results[call.call_id] = denied_result(call, call.denied)
                continue
            reused = self._reused.pop(call.call_id, None)
            if reused is not None:
                self._results[call.call_id] = reused
                continue
            effect = effects.get(call.call_id)
            known = known_result(call, effect) if effect is not None else None
            if known is not None:
                self._results[call.call_id] = known
            elif effect is None or first_dispatch:
                runnable.append(call)  # a read runs again; a new write runs
        return self._run(runnable, moment, first_dispatch=first_dispatch)

    def on_effects_loaded(self, effects: Mapping[str, Effect | None], moment: Moment) -> Action:
        """The ledger entries of a resumed batch's writes, by effect key.

        Reads run again. A write's known outcome is used as it is; an open one is
        reconciled with its service.
        """
        batch = self.invocation.pending_batch
        assert batch is not None
        by_call: dict[str, Effect] = {}
        for call in batch.calls:
            if call.effect_key is None:
                continue
            effect = effects.get(call.effect_key)
            if effect is None:  # saved with the batch: the runtime refuses a cut one first
                raise AggregateError(f"effect {call.effect_key} of call {call.call_id} is missing")
            by_call[call.call_id] = effect
        # An open write is not run again here: it is reconciled with its service first.
        return self._settle(batch.calls, by_call, moment, first_dispatch=False)

    def _run(
        self, runnable: list[DispatchedCall], moment: Moment, *, first_dispatch: bool
    ) -> Action:
        if not runnable:
            return self._reconcile_open(moment)
        if moment.cancel_requested:
            # Cancelled before anything started: nothing is handed to the tools.
            return self.on_executed(
                [interrupted_result(c, Interruption.CANCELLED, started=False) for c in runnable],
                Interruption.CANCELLED,
                moment,
            )
        woken = self.invocation.woken
        slept = set(woken.calls or []) if woken is not None else set()
        return RunCalls(
            step=self.invocation.step,
            calls=runnable,
            plan=self.catalogue.plan(runnable),
            attempts={
                call_id: effect.attempt
                for call_id, effect in self._effects.items()
                if any(c.call_id == call_id for c in runnable)
            },
            first_dispatch=first_dispatch,
            woken={c.call_id: woken.wake_at for c in runnable if c.call_id in slept}
            if woken is not None
            else {},
            woke_at=woken.timestamp if woken is not None else None,
        )

    def on_executed(
        self,
        results: Sequence[ToolResult],
        interruption: Interruption,
        moment: Moment,
        slept: Mapping[str, datetime] | None = None,
    ) -> Action:
        """The results of the calls run (real outputs: the core redacts what is stored).

        ``slept``: the calls that asked to sleep (``ctx.sleep_until``) and the time each
        asked for, by call id; their entries in ``results`` are placeholders. Unless the
        batch was cut short, the invocation pauses ``sleeping`` until the latest of those
        times with the batch still dispatched; a write among them goes back to
        ``prepared`` (the tool slept before it wrote: it runs again, with the same key).
        """
        inv = self.invocation
        batch = inv.pending_batch
        assert batch is not None
        slept = {} if slept is None or interruption is not Interruption.NONE else slept
        for result in results:
            if result.call_id in slept:
                continue  # no result yet: the call runs again when it wakes
            stored = self._conceal(batch.step, self._admit_result(result))
            self._results[stored.call_id] = stored
            if stored.effect_key is not None:
                record_outcome(self._effects[stored.call_id], stored, at=moment.at)
        if interruption is not Interruption.NONE:
            for call in batch.calls:
                if call.call_id not in self._results:
                    self._results[call.call_id] = unreported_result(call)
            self._commit(moment)
            if interruption is Interruption.DEADLINE:
                return self._end(
                    TerminalReason.DEADLINE_EXCEEDED,
                    moment,
                    detail="the deadline passed while tools ran",
                )
            return self._cancelled(moment, "cancel requested while tools ran")
        if slept:
            return self._sleep_batch(slept, moment)
        return self._reconcile_open(moment)

    def _sleep_batch(self, slept: Mapping[str, datetime], moment: Moment) -> Action:
        """Pause ``sleeping`` with the batch dispatched until the latest time asked for."""
        inv = self.invocation
        wake_at = max(slept.values())
        for call_id, until in slept.items():
            effect = self._effects.get(call_id)
            if effect is not None:
                effect.reconcile(
                    Resolution.NOT_FOUND,
                    reason=f"the tool slept until {until.isoformat()} before it wrote; "
                    "it runs again with the same key when it wakes",
                    at=moment.at,
                )
        inv.pause(
            TerminalReason.SLEEPING,
            question=f"{len(slept)} call(s) sleep until {wake_at.isoformat()}",
            wake_at=wake_at,
            sleeping_calls=[c.call_id for c in inv.pending_batch.calls if c.call_id in slept]
            if inv.pending_batch is not None
            else list(slept),
            at=moment.at,
        )
        return self._asleep(moment)

    def _asleep(self, moment: Moment) -> Action:
        """Just paused ``sleeping``: stop, or go on at once when the time has come."""
        paused = self.invocation.paused
        assert paused is not None
        assert paused.wake_at is not None
        if paused.wake_at > moment.at:
            return Finished()
        self.invocation.wake(at=moment.at)  # committed with the pause
        return Continue(after_results=False)

    def _admit_result(self, result: ToolResult) -> ToolResult:
        """A result as it may be stored (values checked, size limited).

        An unstorable output is an ``output_invalid`` error; a large one its truncated
        stand-in, made of the redacted output (no secret in it).

        A write keeps its effect status: the service did what it did, only its output
        is refused (the ledger records the write committed, without a receipt).
        """
        if result.error is not None:
            message = result.error.message
            if check_text(message) is None:
                return result
            error = result.error.model_copy(update={"message": safe_text(message)})
            return result.model_copy(update={"error": error})
        output = result.output
        if output is None:
            return result
        bound = storable_bound(output)  # storable, and a bound of its size, in one pass
        if bound is None:
            problem = check_json(output) or "it cannot be stored"
            error = ErrorInfo(
                error_class=ErrorClass.OUTPUT_INVALID,
                retryable=False,
                message=f"the output cannot be stored faithfully: {problem}",
            )
            return result.model_copy(update={"output": None, "error": error})
        redacted = self.catalogue.redact_output(result.name, output)
        stored, cut = limit_size(
            redacted,
            max_bytes=self.settings.output_limit,
            bound=bound if redacted is output else None,  # a redacted copy is measured
        )
        return result.model_copy(update={"output": stored}) if cut else result

    def _conceal(self, step: int, result: ToolResult) -> ToolResult:
        """A result as it is stored: its sensitive output redacted, its error text scrubbed."""
        if result.error is not None:
            message = self._call_secrets.scrub_call(
                step, result.call_id, result.name, result.error.message
            )
            if message == result.error.message:
                return result
            error = result.error.model_copy(update={"message": message})
            return result.model_copy(update={"error": error})
        stored = self.catalogue.redact_output(result.name, result.output)
        if stored is result.output:
            return result
        self._call_secrets.keep(step, result.call_id, result.name, "output", result.output)
        return result.model_copy(update={"output": stored})

    def _reconcile_open(self, moment: Moment) -> Action:
        asking = [(e.key, e.tool) for e in self._effects.values() if e.is_open]
        if asking:
            return Reconcile(effects=asking)
        return self.on_reconciled({}, moment)

    def on_reconciled(self, answers: Mapping[str, EffectObservation], moment: Moment) -> Action:
        """The services' answers, by effect key (or that an earlier attempt still runs)."""
        inv = self.invocation
        batch = inv.pending_batch
        assert batch is not None
        by_id = {call.call_id: call for call in batch.calls}
        unreachable: list[str] = []
        still_running: list[str] = []
        waiting: list[ChildWaits] = []
        for call_id, effect in self._effects.items():
            answer = answers.get(effect.key)
            match answer:
                case None:
                    continue
                case ChildWaits():
                    waiting.append(answer)
                case ServiceUnreachable(error=error):
                    error = self._call_secrets.scrub_call(  # stored scrubbed
                        batch.step, call_id, effect.tool, error, stored=by_id[call_id].arguments
                    )
                    unreachable.append(f"{effect.key} ({effect.tool}): {safe_text(error)}")
                case AttemptStillRunning(waited_s=waited_s):
                    still_running.append(
                        f"{effect.key} ({effect.tool}): attempt {effect.attempt} was still "
                        f"running after {waited_s:g} s more; it is not sent again while it may "
                        "still reach its service"
                    )
                case EffectAnswered():
                    admitted = admit_receipt(
                        self.catalogue, effect.tool, answer, max_bytes=self.settings.output_limit
                    )
                    if isinstance(admitted, str):
                        # Not a faithful answer: the effect stays open, as if unreachable.
                        unreachable.append(f"{effect.key} ({effect.tool}): {admitted}")
                        continue
                    redacted, receipt = admitted
                    if redacted is not answer.receipt:
                        self._call_secrets.keep(
                            batch.step, call_id, effect.tool, "output", answer.receipt
                        )
                    reason = answer.reason
                    if reason is not None:
                        reason = safe_text(
                            self._call_secrets.scrub_call(
                                batch.step,
                                call_id,
                                effect.tool,
                                reason,
                                stored=by_id[call_id].arguments,
                            )
                        )
                    effect.reconcile(answer.status, receipt=receipt, reason=reason, at=moment.at)
                    match answer.status:
                        case Resolution.COMMITTED:
                            self._results[call_id] = write_result(
                                by_id[call_id], EffectStatus.RECONCILED, receipt=receipt
                            )
                        case Resolution.REJECTED:
                            self._results[call_id] = write_result(
                                by_id[call_id],
                                EffectStatus.RECONCILED,
                                rejected=reason or "rejected by the service",
                            )
                        case Resolution.NOT_FOUND:
                            pass  # back to prepared: dispatched again below
                        case _:
                            assert_never(answer.status)
                case _:
                    assert_never(answer)
        if waiting and not unreachable:
            return self._pause_for_child(waiting[0], moment)
        if unreachable:
            return self._pause_for_reconciliation(
                "the outcome of a write is unknown and its service cannot be asked: "
                + "; ".join(unreachable + still_running),
                moment,
            )
        if still_running:
            return self._pause_for_reconciliation(
                "the outcome of a write is unknown and an earlier attempt may still be "
                "running: " + "; ".join(still_running),
                moment,
            )
        again = [cid for cid, e in self._effects.items() if e.status is EffectStatus.PREPARED]
        if again and moment.cancel_requested:
            # Cancelled: no new effect starts. These writes never reached their service.
            for call_id in again:
                self._results[call_id] = write_result(
                    by_id[call_id],
                    EffectStatus.PREPARED,
                    rejected="not dispatched again: the invocation was cancelled",
                )
            self._commit(moment)
            return self._cancelled(moment, "cancel requested while a write was being settled")
        if not again:
            return self._commit_results(moment)
        if self._round == MAX_DISPATCH_ROUNDS - 1:
            # No dispatch is recorded that will not run: pause instead.
            return self._pause_for_reconciliation(
                f"a write was dispatched {MAX_DISPATCH_ROUNDS} times and its service still "
                "does not know its key",
                moment,
            )
        self._round += 1
        for call_id in again:
            # The service never saw the key: dispatch again, with the same key.
            self._effects[call_id].dispatch(at=moment.at)
        return self._run([by_id[call_id] for call_id in again], moment, first_dispatch=False)

    def _commit_results(self, moment: Moment) -> Action:
        inv = self.invocation
        batch = inv.pending_batch
        assert batch is not None
        self._commit(moment)
        failing = [c for c in batch.calls if self._results[c.call_id].error is not None]
        if failing:
            limit = self.settings.failure_limit(failing[-1].name)
            if inv.failure_streak >= limit:
                # The results and the stop are one transaction.
                return self._end(
                    TerminalReason.REPEATED_FAILURE,
                    moment,
                    detail=f"the same call failed the same way {inv.failure_streak} times in a row",
                )
        return Continue(after_results=True)

    def _pause_for_child(self, waits: ChildWaits, moment: Moment) -> Finished:
        """A child this batch started waits for a person: pause with its pause (once).

        The parent's pause carries the path down to the invocation that waits, its
        question, the digest to approve and its waiting calls, so that whoever looks at
        the parent (or the root) sees what to decide, and for which invocation.
        """
        inv = self.invocation
        paused = inv.paused
        if (
            inv.phase is Phase.AWAITING_CHILD
            and paused is not None
            and paused.child_path == waits.path
            and paused.reason is waits.reason
            and paused.proposal_digest == waits.proposal_digest
        ):
            return Finished(detail=paused.question)
        inv.pause(
            waits.reason,
            question=waits.question,
            proposal_digest=waits.proposal_digest,
            calls=waits.calls,
            needs_approval=waits.needs_approval,
            child_path=waits.path,
            at=moment.at,
        )
        return Finished()

    def _pause_for_reconciliation(self, why: str, moment: Moment) -> Finished:
        """Wait for the service: pause (once), keeping what the ledger learnt meanwhile."""
        inv = self.invocation
        if inv.paused_for_reconciliation:
            return Finished(detail=why)
        inv.pause(TerminalReason.RECONCILIATION_REQUIRED, question=why, at=moment.at)
        return Finished()

    # ----------------------------------------------------------------- answers

    def _judge(self, answer: str, moment: Moment) -> Action:
        """A final answer: to the verifier, if there is one; then to the critic, or done."""
        if self.verifies:
            return Verify(answer=answer, turns=list(self.invocation.turns))
        return self._answered(moment)

    def on_verified(self, evidence: str | None, moment: Moment) -> Action:
        """The verifier's verdict: None passed, else its evidence (goes back to the model)."""
        inv = self.invocation
        decision = inv.last_decision
        assert isinstance(decision, Final)
        if evidence is None:
            return self._answered(moment)
        evidence = safe_text(self._call_secrets.scrub_all(evidence))
        inv.fail_verification(evidence, at=moment.at)
        if inv.verification_failures >= self.settings.max_verification_attempts:
            return self._end(
                TerminalReason.VERIFICATION_FAILED,
                moment,
                detail=f"{inv.verification_failures} answer(s) failed verification; "
                f"last: {evidence}",
            )
        return Continue(after_results=False)

    # ----------------------------------------------------------------- stops

    def _end(
        self,
        reason: TerminalReason,
        moment: Moment,
        *,
        answer: str | None = None,
        detail: str | None = None,
    ) -> Finished:
        if detail is not None:
            detail = safe_text(detail)
        self.invocation.terminate(reason, answer=answer, detail=detail, at=moment.at)
        return Finished(completed=reason is TerminalReason.COMPLETED)

    def _cancelled(self, moment: Moment, what: str) -> Finished:
        detail = f"{what}: {moment.cancel_detail}" if moment.cancel_detail else what
        return self._end(TerminalReason.CANCELLED, moment, detail=detail)

    def _deadline_passed(self, moment: Moment) -> bool:
        left = self.seconds_left(moment)
        return left is not None and left <= 0

    def _usage_exhausted(self, *, reserving: bool) -> tuple[TerminalReason, str] | None:
        """The exhausted token or cost budget, if any: before a call, with its reservation."""
        inv = self.invocation
        budget = self.budget
        children = self._children_used()
        tokens = inv.input_tokens + inv.output_tokens + children.tokens
        cost = inv.cost + children.cost
        if budget.max_tokens is not None:
            reserve = (budget.reserve_tokens or 0) if reserving else 0
            if tokens + reserve > budget.max_tokens or (reserving and tokens >= budget.max_tokens):
                return (
                    TerminalReason.TOKEN_BUDGET_EXHAUSTED,
                    f"{tokens} of {budget.max_tokens} tokens used"
                    + (f", {reserve} reserved for the next call" if reserve else ""),
                )
        if budget.max_cost is not None:
            reserve_cost = (budget.reserve_cost or 0.0) if reserving else 0.0
            if cost + reserve_cost > budget.max_cost or (reserving and cost >= budget.max_cost):
                return (
                    TerminalReason.COST_BUDGET_EXHAUSTED,
                    f"{cost:.6f} of {budget.max_cost:.6f} spent"
                    + (f", {reserve_cost:.6f} reserved for the next call" if reserve_cost else ""),
                )
        return None

    def _children_used(self) -> Spent:
        """What children used of this invocation's budget, and what is set aside for them."""
        inv = self.invocation
        if not inv.reservations and inv.children_started == 0:
            return NOTHING_SPENT  # every turn of a run without children: no model built
        return inv.children_spent.plus(inv.reserved)

    def _steps_detail(self, children: Spent) -> str:
        if not children.steps:
            return f"{self.budget.max_steps} steps taken"
        return (
            f"{self.budget.max_steps} steps taken ({children.steps} by children, "
            f"{self.invocation.step} by this invocation)"
        )

    def _left_for_children(self, batch_calls: int, moment: Moment) -> Left:
        """What this invocation has left to share among the children of a batch.

        It keeps one step of its own: the one that reads the children's results.
        """
        inv = self.invocation
        budget = self.budget
        used = self._children_used()
        tokens = None
        if budget.max_tokens is not None:
            tokens = budget.max_tokens - inv.input_tokens - inv.output_tokens - used.tokens
        cost = None if budget.max_cost is None else budget.max_cost - inv.cost - used.cost
        deadline = self.seconds_left(moment)
        return Left(
            steps=max(0, budget.max_steps - inv.step - used.steps - 1),
            tool_calls=max(
                0, budget.max_tool_calls - inv.tool_calls - batch_calls - used.tool_calls
            ),
            tokens=None if tokens is None else max(0, tokens),
            cost=None if cost is None else max(0.0, cost),
            deadline_s=deadline if deadline is not None and deadline > 0 else None,
        )

    def _allot_children(
        self,
        planned: list[DispatchedCall],
        denied: dict[str, str],
        reused: Mapping[str, SourceWrite],
        moment: Moment,
    ) -> dict[str, Allotment]:
        """The batch's calls that start a child, with each one's share of the budget.

        A child call that may not start (too deep, too many children, no step left to
        give it) is added to ``denied``: its result says why, and the model sees it.
        """
        asking = [
            (call, spec)
            for call in planned
            if call.call_id not in denied
            and call.call_id not in reused
            and call.effect is ToolEffect.WRITE
            and (spec := self.catalogue.child_spec(call.name)) is not None
        ]
        if not asking:
            return {}
        inv = self.invocation
        problem = depth_problem(inv.depth) or fan_out_problem(inv.children_started, len(asking))
        if problem is not None:
            denied.update((call.call_id, problem) for call, _ in asking)
            return {}
        shares = allot(
            self._left_for_children(len(planned), moment), [spec.budget for _, spec in asking]
        )
        allotted: dict[str, Allotment] = {}
        for (call, _), share in zip(asking, shares, strict=True):
            if share is None:
                denied[call.call_id] = (
                    "not started: this invocation has no step left to give a child "
                    f"({self._steps_detail(self._children_used())} of its budget)"
                )
            else:
                allotted[call.call_id] = share
        return allotted

    def reserve_for_child(
        self, call_id: str, child_id: str, key: str | None, asked: Budget, moment: Moment
    ) -> Allotment | str:
        """The share of a child a write's body starts (``run_agent``), set aside; or why not.

        Called while the batch runs, before the child starts: the child asks for
        ``asked`` (its agent's budget, or the one its body gives), capped by what this
        invocation has left once the shares already set aside are counted, one step
        kept for its next decision. A child that already has its share (the call runs
        again after a crash, or found it started) gets that one, and nothing new is
        recorded. Otherwise a ``BudgetReserved`` is pending, to be committed before
        the child starts. Refused (a text that says why, nothing recorded): no batch
        running, a call that is not a write of it, too deep, too many children, a
        cancel request, no step left to give.
        """
        inv = self.invocation
        reserved = inv.reservations.get(child_id)
        if reserved is not None:
            return reserved.allotment
        batch = inv.pending_batch
        call = (
            next((c for c in batch.calls if c.call_id == call_id), None)
            if batch is not None and inv.phase is Phase.DISPATCHED
            else None
        )
        if call is None or call.effect_key is None or call.child_id is not None:
            return f"not started: call {call_id} is not a write of the batch {inv.id} runs"
        if child_id != child_id_of(call.effect_key, key):
            return f"not started: call {call_id} does not start {child_id}"
        problem = depth_problem(inv.depth) or fan_out_problem(inv.children_started, 1)
        if problem is not None:
            return problem
        if moment.cancel_requested:
            return f"not started: its parent {inv.id} was cancelled"
        (share,) = allot(self._left_for_children(0, moment), [asked])
        if share is None:
            return (
                "not started: this invocation has no step left to give a child "
                f"({self._steps_detail(self._children_used())} of its budget)"
            )
        if share.tool_calls == 0 and asked.max_tool_calls > 0:
            held = inv.reserved.tool_calls
            return (
                "not started: this invocation has no tool call left to give a child "
                f"({inv.tool_calls} of {self.budget.max_tool_calls} made"
                + (f", {held} held by its running children" if held else "")
                + "); children run at once need budgets that fit together "
                "(run_agent(..., budget=Budget(...)))"
            )
        inv.reserve_budget(call_id, child_id, share, at=moment.at, from_code=True, key=key)
        return share

    def return_from_child(self, child_id: str, spent: Spent, moment: Moment) -> None:
        """A child a write's body started has settled: count ``spent``, the rest comes back.

        ``spent``: what it used, its own children's included. Nothing happens for a child
        with no share set aside (returned already, or started before shares were).
        The ``BudgetReturned`` is committed with the next commit: a crash before that
        finds the child settled again when the call runs again.
        """
        inv = self.invocation
        reserved = inv.reservations.get(child_id)
        if reserved is None or not reserved.from_code or inv.phase is not Phase.DISPATCHED:
            return
        returned = reserved.allotment.reserved.minus(spent)
        inv.return_budget(reserved.call_id, child_id, spent, returned, at=moment.at)

    def children_from_code(self) -> list[str]:
        """The children of the running batch's bodies whose shares are still set aside."""
        return [r.child_id for r in self.invocation.reservations.values() if r.from_code]

    def _commit(self, moment: Moment) -> None:
        """Commit the batch's results; a settled child's unused share comes back with them."""
        inv = self.invocation
        batch = inv.pending_batch
        assert batch is not None
        results = [self._results[c.call_id] for c in batch.calls]
        inv.commit_results(results, at=moment.at)
        children = {c.call_id: c.child_id for c in batch.calls if c.child_id is not None}
        for result in results:
            child_id = children.get(result.call_id)
            reservation = inv.reservations.get(child_id) if child_id is not None else None
            if reservation is None or result.effect_status is EffectStatus.OUTCOME_UNKNOWN:
                continue  # the child may still run: its share stays set aside
            if result.effect_status is EffectStatus.REJECTED and result.output is None:
                # It certainly did not start: all of its share comes back.
                spent, returned = Spent(), reservation.allotment.reserved
            else:
                outcome = ChildOutcome.read(result.output)
                spent, returned = unspent_share(reservation.allotment, outcome)
            inv.return_budget(result.call_id, reservation.child_id, spent, returned, at=moment.at)

    def _effect_of(self, name: str) -> ToolEffect:
        effect = self.catalogue.effect_of(name)
        assert effect is not None  # validated: the tool exists
        return effect


# --------------------------------------------------------------------------- stops from outside
