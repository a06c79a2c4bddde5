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
* on a final answer: verification attempts.

Because the core needs nothing but observations, a stored history's replies and
results can be fed back in to re-drive it (replay) with no second copy of the rules.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, ClassVar, Literal, Protocol, assert_never

from pydantic import BaseModel, JsonValue, ValidationError
from pydantic_core import to_jsonable_python

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
    Frozen,
    Rejection,
    RejectionClass,
    RequestApproval,
    TerminalReason,
    ToolCall,
    ToolCalls,
    ToolEffect,
    ToolResult,
    Usage,
    parse_decision,
)
from aggregates.digest import digest_of
from aggregates.effect import Effect, Resolution, receipt_problem
from aggregates.errors import AggregateError
from aggregates.events import DomainEvent
from aggregates.invocation import ApprovalDenied, DispatchedCall, Invocation, Phase, Turn
from aggregates.redaction import (
    holds_redacted,
    redact_proposal,
    redacted_values,
    scrub,
    withheld,
)
from aggregates.results import (
    Interruption,
    denied_result,
    interrupted_result,
    known_result,
    unreported_result,
    write_result,
)
from aggregates.settings import RunSettings
from aggregates.values import (
    NotJsonError,
    UnstorableError,
    check_json,
    check_text,
    describe_error,
    json_size,
    json_text,
    limit_size,
    parse_json_text,
    safe_text,
    storable_bound,
    truncated,
    unstorable,
    usage_problem,
)

MAX_DISPATCH_ROUNDS = 3
"""How many times one batch may dispatch a write whose service keeps answering "not found"."""


# --------------------------------------------------------------------------- inputs


@dataclass(frozen=True, slots=True)
class Moment:
    """What the shell knows when it asks the core: the time, and whether to stop."""

    at: datetime
    """The time recorded on events made now."""
    elapsed_s: float
    """Seconds since the invocation started (across resumes)."""
    cancel_requested: bool = False
    cancel_detail: str | None = None
    """Who asked to cancel, and why, when someone did."""


class Catalogue(Protocol):
    """The agent's tools as the core needs them: pure lookups and checks."""

    @property
    def redacts(self) -> bool:
        """True when some tool declares sensitive fields."""

    def effect_of(self, name: str) -> ToolEffect | None:
        """The tool's effect, or None when there is no such tool."""

    def check_arguments(self, call: ToolCall) -> dict[str, Any]:
        """A call's arguments validated and normalised (``pydantic.ValidationError`` if not)."""

    def redact_arguments(self, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        """Arguments as they may be stored."""

    def redact_output(self, name: str, output: Any) -> Any:
        """An output as it may be stored."""

    def needs_approval(self, name: str, arguments: dict[str, Any]) -> bool:
        """Whether this call waits for a person."""

    def plan(self, calls: Sequence[DispatchedCall]) -> list[list[str]]:
        """Execution groups of call ids."""


class KeptValues(Protocol):
    """The runtime's secret store as the core reads it: the real values it holds."""

    def __call__(self, step: int, call_id: str, kind: Literal["arguments", "output"]) -> Any:
        """The real arguments or output of a call, or None when none is kept."""


WITHHELD_WHY = (
    "a text about a call whose sensitive arguments are no longer held, so it cannot be "
    "scrubbed of them"
)
"""Why a text is stored withheld (see :func:`aggregates.redaction.withheld`)."""


@dataclass(frozen=True, slots=True)
class KeptSecret:
    """A real value that was stored redacted, for the secret store of the runtime."""

    step: int
    call_id: str
    kind: Literal["arguments", "output"]
    value: JsonValue


# --------------------------------------------------------------------------- observations


@dataclass(frozen=True, slots=True)
class ModelAnswered:
    """The model proposed something (untrusted until the core validated it)."""

    proposal: Any
    usage: Usage = field(default_factory=Usage)


class ModelFailed(Frozen):
    """The model call raised."""

    kind: Literal["model_failed"] = "model_failed"
    error_type: str
    message: str


class ModelTimedOut(Frozen):
    """The model did not answer before the deadline."""

    kind: Literal["model_timed_out"] = "model_timed_out"


@dataclass(frozen=True, slots=True)
class ModelInterrupted:
    """A cancel request interrupted the wait for the model."""


ModelObservation = ModelAnswered | ModelFailed | ModelTimedOut | ModelInterrupted


class EffectAnswered(Frozen):
    """The owning service said what became of an effect key."""

    kind: Literal["effect_answered"] = "effect_answered"
    effect_key: str
    status: Resolution
    receipt: Any = None
    reason: str | None = None


class ServiceUnreachable(Frozen):
    """The service could not be asked (``reconcile`` raised, timed out, or does not exist)."""

    kind: Literal["service_unreachable"] = "service_unreachable"
    effect_key: str
    error: str


ReconcileOutcome = EffectAnswered | ServiceUnreachable


class AttemptStillRunning(Frozen):
    """An earlier attempt of the write may still be running: the service was not asked.

    A "not found" from the service while an attempt may still reach it proves
    nothing, so the write is not dispatched again.
    """

    kind: Literal["attempt_still_running"] = "attempt_still_running"
    effect_key: str
    waited_s: float


EffectObservation = EffectAnswered | ServiceUnreachable | AttemptStillRunning


@dataclass(frozen=True, slots=True)
class PolicyVerdict:
    """What the agent's policy said of a batch: the calls it refuses, or a refusal of the run."""

    refused: dict[str, str] = field(default_factory=dict)
    """Call id → why (the call gets a ``denied`` result and does not run)."""
    stop: str | None = None
    """Why the whole run must end (``invalid_decision``)."""


# --------------------------------------------------------------------------- actions


@dataclass(frozen=True, slots=True)
class _Action:
    commits_first: ClassVar[bool] = False
    """True when the core's pending events must be durable before the action is performed."""


@dataclass(frozen=True, slots=True)
class AskModel(_Action):
    """Ask the model for the decision of ``step`` with this view of the history."""

    step: int
    turns: list[Turn]
    """The committed turns in the model's view (stored form: the shell reveals secrets)."""
    notices: list[str]


@dataclass(frozen=True, slots=True)
class Authorise(_Action):
    """Ask the agent's policy about each call of the batch (stored form)."""

    step: int
    calls: list[DispatchedCall]


@dataclass(frozen=True, slots=True)
class Verify(_Action):
    """Run the agent's verifier on a final answer."""

    answer: str
    turns: list[Turn]


@dataclass(frozen=True, slots=True)
class RunCalls(_Action):
    """Run these calls of the dispatched batch (after its dispatch is durable)."""

    commits_first: ClassVar[bool] = True
    step: int
    calls: list[DispatchedCall]
    plan: list[list[str]]
    attempts: dict[str, int]
    """Attempt number per write call id."""
    first_dispatch: bool
    """True when the commit before it records the batch's dispatch."""


@dataclass(frozen=True, slots=True)
class LoadEffects(_Action):
    """Read the ledger entries of a dispatched batch's writes (on resume)."""

    keys: list[str]


@dataclass(frozen=True, slots=True)
class Reconcile(_Action):
    """Ask the owning service of each open write what became of its effect key."""

    effects: list[tuple[str, str]]
    """(effect key, tool) of each open write."""


@dataclass(frozen=True, slots=True)
class Continue(_Action):
    """Commit, then ask the core for the next action."""

    commits_first: ClassVar[bool] = True
    after_results: bool
    """True when the commit records a batch's results."""


@dataclass(frozen=True, slots=True)
class Finished(_Action):
    """Commit, then stop: the invocation is paused or terminated."""

    commits_first: ClassVar[bool] = True
    completed: bool = False
    """True when the commit records a completed answer."""
    detail: str | None = None
    """A detail for the outcome that the record does not carry (a repeated pause's why)."""


Action = AskModel | Authorise | Verify | RunCalls | LoadEffects | Reconcile | Continue | Finished
"""What the core asks the shell to do next."""


# --------------------------------------------------------------------------- the core


class TurnCore:
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
    ) -> None:
        """Drive ``invocation`` with its recorded ``settings`` and the agent's ``catalogue``.

        ``verifies`` / ``authorises``: whether the shell has a verifier / a policy
        (code, which the record cannot hold). ``kept``: the real values the runtime
        holds for redacted ones (of this invocation), which error texts are scrubbed of.
        """
        self.invocation = invocation
        self.settings = settings
        self.catalogue = catalogue
        self.verifies = verifies
        self.authorises = authorises
        self._effects: dict[str, Effect] = {}
        """Ledger entries of the batch being settled, by call id."""
        self._results: dict[str, ToolResult] = {}
        self._round = 0
        self._planned: list[DispatchedCall] = []
        self._arguments: dict[str, dict[str, Any]] = {}
        """Real (normalised) arguments of the proposed batch, by call id."""
        self._approved = False
        self._secrets: list[KeptSecret] = []
        self._kept = kept
        self._redacts = catalogue.redacts
        self._sensitive: dict[tuple[int, str], list[str]] = {}
        """The texts of the sensitive values of each call met so far, by (step, call id)."""
        self._known_arguments: set[tuple[int, str]] = set()
        """Calls whose real arguments this core has seen (its own, or the secret store's)."""
        self._looked_up: set[tuple[int, str]] = set()

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
        secrets, self._secrets = self._secrets, []
        return secrets

    def seconds_left(self, moment: Moment) -> float | None:
        """Seconds until the recorded deadline (None without one)."""
        if self.budget.deadline_s is None:
            return None
        return self.budget.deadline_s - moment.elapsed_s

    def next(self, moment: Moment) -> Action:
        """What to do from the committed state (at the start and after each ``Continue``)."""
        inv = self.invocation
        if inv.phase is Phase.TERMINATED or (inv.phase.paused and inv.pending_batch is None):
            return Finished()
        if inv.pending_batch is not None:
            # Resume a batch that has no committed results (DESIGN.md, Resume).
            keys = [c.effect_key for c in inv.pending_batch.calls if c.effect_key is not None]
            if keys:
                return LoadEffects(keys=keys)
            return self.on_effects_loaded({}, moment)
        if inv.phase is Phase.CALLS_PROPOSED and inv.approval is not None:
            return self._approved_batch(moment)
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
        if inv.step >= budget.max_steps:
            return self._end(
                TerminalReason.MAX_STEPS, moment, detail=f"{budget.max_steps} steps taken"
            )
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
        return AskModel(step=inv.step + 1, turns=turns, notices=notices)

    def _notices(self) -> list[str]:
        """What the model is told about its remaining budget (graceful wind-down)."""
        budget = self.budget
        steps_left = budget.max_steps - self.invocation.step
        if budget.wind_down_steps is not None and steps_left <= budget.wind_down_steps:
            return [self.settings.wind_down_notice.format(steps_left=steps_left)]
        return []

    def on_model(self, observation: ModelObservation, moment: Moment) -> Action:
        """Turn what the model call gave into events and the next action."""
        match observation:
            case ModelInterrupted():
                return self._cancelled(moment, "cancel requested")
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
                    detail=self._scrub_all(f"{error_type}: {message}"),
                )
            case ModelAnswered(proposal=proposal, usage=usage):
                pass
            case _:
                assert_never(observation)
        # The usage is the provider's report, not the model's proposal: one that cannot
        # be recorded (NaN, negative, absurd) is a model error, decided before anything.
        problem = usage_problem(usage)
        price = self.settings.price
        if problem is None and price is not None and not usage.cost:
            usage = usage.model_copy(update={"cost": price.cost(usage)})
            problem = usage_problem(usage)
        if problem is not None:
            return self._end(
                TerminalReason.MODEL_ERROR,
                moment,
                detail=f"the model reported a usage that cannot be recorded: {problem}",
            )
        verdict = self._validate(proposal)
        if isinstance(verdict, Rejection):
            inv = self.invocation
            inv.reject(verdict, usage=usage, at=moment.at)
            if inv.invalid_streak > self.settings.max_invalid_proposals:
                return self._end(
                    TerminalReason.INVALID_DECISION, moment, detail="; ".join(verdict.problems)
                )
            # Recorded with its problems, which the model is shown: it proposes again.
            # Every budget still counts (the next action checks them).
            return Continue(after_results=False)
        decision, arguments = verdict
        return self._act(decision, arguments, usage, moment)

    def _validate(self, proposal: object) -> tuple[Decision, dict[str, dict[str, Any]]] | Rejection:
        """Check a proposal against the decision schema and the tool catalogue."""
        admitted = self._admit(proposal)
        if isinstance(admitted, Rejection):
            return admitted
        proposal = admitted
        try:
            decision = parse_decision(proposal)
        except ValidationError as error:
            return self._rejection(
                proposal,
                [
                    (
                        RejectionClass.SCHEMA_INVALID,
                        f"{'.'.join(str(p) for p in item['loc']) or 'decision'}: {item['msg']}",
                    )
                    for item in error.errors()
                ],
            )
        arguments: dict[str, dict[str, Any]] = {}
        problems: list[tuple[RejectionClass, str]] = []
        match decision:
            case Final(answer=answer) if not answer.strip():
                problems.append((RejectionClass.EMPTY_ANSWER, "the final answer is empty"))
            case ToolCalls(calls=calls):
                if not calls:
                    problems.append((RejectionClass.EMPTY_BATCH, "the tool batch is empty"))
                seen: set[str] = set()
                for call in calls:
                    if call.id in seen:
                        problems.append(
                            (RejectionClass.DUPLICATE_CALL_ID, f"duplicate call id {call.id!r}")
                        )
                    seen.add(call.id)
                    if self.catalogue.effect_of(call.name) is None:
                        problems.append(
                            (
                                RejectionClass.UNKNOWN_TOOL,
                                f"call {call.id}: unknown tool {call.name!r}",
                            )
                        )
                        continue
                    try:
                        checked = self.catalogue.check_arguments(call)
                    except ValidationError as error:
                        details = "; ".join(
                            f"{'.'.join(str(p) for p in item['loc']) or 'arguments'}: {item['msg']}"
                            for item in error.errors()
                        )
                        problems.append(
                            (
                                RejectionClass.INVALID_ARGUMENTS,
                                f"call {call.id}: arguments for {call.name} are invalid: {details}",
                            )
                        )
                        continue
                    except Exception as error:  # a validator of the tool's types that broke
                        problems.append(
                            (
                                RejectionClass.INVALID_ARGUMENTS,
                                f"call {call.id}: arguments for {call.name} could not be "
                                f"checked: {describe_error(error)}",
                            )
                        )
                        continue
                    # The tool's types may make an unstorable value (e.g. "Infinity" as a float).
                    problem = check_json(checked)
                    if problem is not None:
                        problems.append(
                            (
                                RejectionClass.VALUE_INVALID,
                                f"call {call.id}: arguments for {call.name} cannot be stored "
                                f"faithfully once validated: {problem}",
                            )
                        )
                        continue
                    arguments[call.id] = checked
            case _:
                pass
        if problems:
            return self._rejection(proposal, problems)
        return decision, arguments

    def _rejection(self, proposal: object, problems: list[tuple[RejectionClass, str]]) -> Rejection:
        """A refused proposal as it is stored: redacted, its problems scrubbed of its secrets."""
        raw, secrets = redact_proposal(_jsonable(proposal), self.catalogue)
        return Rejection(
            rejection_class=problems[0][0],
            problems=[scrub(problem, secrets) for _, problem in problems],
            raw=raw,
        )

    def _admit(self, proposal: object) -> Any:
        """The proposal as a storable value (JSON text parsed), or its rejection.

        A value that cannot be stored faithfully is refused ``value_invalid`` and one
        over ``max_proposal_bytes`` ``too_large``; either is recorded as a stand-in
        (``aggregates.values.unstorable`` / ``truncated``), never in a changed form.
        """
        limit = self.settings.proposal_limit
        if isinstance(proposal, str | bytes):
            data = (
                proposal.encode("utf-8", "surrogatepass") if isinstance(proposal, str) else proposal
            )
            if len(data) > limit:
                return _refused(
                    RejectionClass.TOO_LARGE,
                    f"the proposal is {len(data)} bytes, over the limit of {limit}",
                    truncated(data, max_bytes=limit, head=False),
                )
            try:
                return parse_json_text(proposal)
            except NotJsonError:
                return proposal  # refused as before: not a decision
            except UnstorableError as error:
                why = f"the proposal cannot be stored faithfully: {error}"
                # Text that cannot be parsed cannot be redacted: only its size and digest.
                return _refused(
                    RejectionClass.VALUE_INVALID, why, unstorable(proposal, why, show=False)
                )
        problem: str | None = None
        bound: int | None = None
        if isinstance(proposal, BaseModel):
            try:
                value: Any = proposal.model_dump()
            except Exception as error:  # a model built without validation may not dump
                value = error
                problem = f"it cannot be read: {safe_text(error)}"
        else:
            value = proposal
        if problem is None:
            # One pass says whether it is storable and bounds its size: only a value
            # whose bound is over the limit is encoded to be measured.
            bound = storable_bound(value)
            if bound is None:
                problem = check_json(value) or "it cannot be stored"
        if problem is not None:
            why = f"the proposal cannot be stored faithfully: {problem}"
            redacted, show = self._try_redact(value)
            return _refused(RejectionClass.VALUE_INVALID, why, unstorable(redacted, why, show=show))
        if bound is not None and bound <= limit:
            return proposal
        size = json_size(value)
        if size > limit:
            redacted, show = self._try_redact(value)
            return _refused(
                RejectionClass.TOO_LARGE,
                f"the proposal is {size} bytes, over the limit of {limit}",
                truncated(json_text(redacted), max_bytes=limit, head=show),
            )
        return proposal

    def _try_redact(self, value: Any) -> tuple[Any, bool]:
        """A refused value redacted for its stand-in, and whether it may be shown."""
        try:
            raw, _ = redact_proposal(value, self.catalogue)
        except Exception:  # what cannot be redacted is not shown
            return value, False
        return raw, True

    def _act(
        self,
        decision: Decision,
        arguments: dict[str, dict[str, Any]],
        usage: Usage,
        moment: Moment,
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
                    self._learn(step, call.id, redacted_values(call.arguments, redacted))
                    self._keep(step, call.id, call.name, "arguments", arguments[call.id])
                    call = call.model_copy(update={"arguments": redacted})  # noqa: PLW2901
                    redacted_any = True
                calls.append(call)
            if redacted_any:  # store the redacted copy; else the decision as it is
                stored = ToolCalls(calls=calls)
        inv.propose(stored, usage=usage, at=moment.at)
        overrun = self._usage_exhausted(reserving=False)
        if overrun is not None and not isinstance(decision, Final):
            # Paid for, recorded, and not acted on: the budget is spent.
            return self._end(overrun[0], moment, detail=overrun[1])
        match decision:
            case Final(answer=answer):
                if self.verifies:
                    return Verify(answer=answer, turns=list(inv.turns))
                return self._end(TerminalReason.COMPLETED, moment, answer=answer)
            case CannotContinue(reason=reason):
                return self._end(TerminalReason.CANNOT_CONTINUE, moment, detail=reason)
            case Clarification(question=question):
                inv.pause(TerminalReason.CLARIFICATION_REQUIRED, question=question, at=moment.at)
                return Finished()
            case RequestApproval(proposal_digest=digest):
                inv.pause(TerminalReason.APPROVAL_REQUIRED, proposal_digest=digest, at=moment.at)
                return Finished()
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

    def _refuse_dispatch(self, planned: list[DispatchedCall], moment: Moment) -> Action | None:
        """The stop that comes before a batch would run, if any."""
        inv = self.invocation
        budget = self.budget
        if inv.tool_calls + len(planned) > budget.max_tool_calls:
            return self._end(
                TerminalReason.TOOL_BUDGET_EXHAUSTED,
                moment,
                detail=f"{len(planned)} call(s) proposed, {inv.tool_calls} of "
                f"{budget.max_tool_calls} used",
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
                detail=self._scrub_all(f"refused by policy: {verdict.stop}"),
            )
        planned = self._planned
        names = {call.call_id: call.name for call in planned}
        refused = {
            call_id: safe_text(self._scrub_call(inv.step, call_id, names.get(call_id, ""), why))
            for call_id, why in verdict.refused.items()
        }
        if self._approved:
            approval = inv.approval
            if isinstance(approval, ApprovalDenied):
                message = (
                    f"denied by {approval.by}: {approval.reason}; it did not run and "
                    "must not be retried as is"
                )
                refused.update(dict.fromkeys(inv.approval_needed, message))
            return self._dispatch(planned, refused, moment)
        needing = [
            call.call_id
            for call in planned
            if call.call_id not in refused
            and self.catalogue.needs_approval(call.name, self._arguments[call.call_id])
        ]
        if needing:
            inv.pause(
                TerminalReason.APPROVAL_REQUIRED,
                proposal_digest=batch_digest(inv.id, inv.step, planned),
                calls=planned,
                needs_approval=needing,
                at=moment.at,
            )
            return Finished()
        return self._dispatch(planned, refused, moment)

    # ----------------------------------------------------------------- batches

    def _dispatch(
        self, planned: list[DispatchedCall], denied: dict[str, str], moment: Moment
    ) -> Action:
        """Record the batch and the ledger entries of its writes; then run it.

        ``denied`` calls are dispatched as part of the batch but never run: they
        get a ``denied`` result, and a write among them gets no effect key.
        """
        inv = self.invocation
        dispatched: list[DispatchedCall] = []
        effects: dict[str, Effect] = {}
        for call in planned:
            if call.call_id in denied:
                # Recorded with the batch, so that a resumed batch does not run it either.
                dispatched.append(call.model_copy(update={"denied": denied[call.call_id]}))
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
                call = call.model_copy(update={"effect_key": effect.key})  # noqa: PLW2901
            dispatched.append(call)
        inv.dispatch(dispatched, self.catalogue.plan(dispatched), at=moment.at)
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
            if effect is None:  # cannot happen: the ledger entry is saved with the batch
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
        )

    def on_executed(
        self, results: Sequence[ToolResult], interruption: Interruption, moment: Moment
    ) -> Action:
        """The results of the calls run (real outputs: the core redacts what is stored)."""
        inv = self.invocation
        batch = inv.pending_batch
        assert batch is not None
        for result in results:
            stored = self._conceal(batch.step, self._admit_result(result))
            self._results[stored.call_id] = stored
            if stored.effect_key is not None:
                _record_outcome(self._effects[stored.call_id], stored, at=moment.at)
        if interruption is not Interruption.NONE:
            for call in batch.calls:
                if call.call_id not in self._results:
                    self._results[call.call_id] = unreported_result(call)
            inv.commit_results([self._results[c.call_id] for c in batch.calls], at=moment.at)
            if interruption is Interruption.DEADLINE:
                return self._end(
                    TerminalReason.DEADLINE_EXCEEDED,
                    moment,
                    detail="the deadline passed while tools ran",
                )
            return self._cancelled(moment, "cancel requested while tools ran")
        return self._reconcile_open(moment)

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
            message = self._scrub_call(step, result.call_id, result.name, result.error.message)
            if message == result.error.message:
                return result
            error = result.error.model_copy(update={"message": message})
            return result.model_copy(update={"error": error})
        stored = self.catalogue.redact_output(result.name, result.output)
        if stored is result.output:
            return result
        self._keep(step, result.call_id, result.name, "output", result.output)
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
        for call_id, effect in self._effects.items():
            answer = answers.get(effect.key)
            match answer:
                case None:
                    continue
                case ServiceUnreachable(error=error):
                    error = self._scrub_call(  # stored scrubbed
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
                        self._keep(batch.step, call_id, effect.tool, "output", answer.receipt)
                    reason = answer.reason
                    if reason is not None:
                        reason = safe_text(
                            self._scrub_call(
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
            inv.commit_results([self._results[c.call_id] for c in batch.calls], at=moment.at)
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
        inv.commit_results([self._results[c.call_id] for c in batch.calls], at=moment.at)
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

    def _pause_for_reconciliation(self, why: str, moment: Moment) -> Finished:
        """Wait for the service: pause (once), keeping what the ledger learnt meanwhile."""
        inv = self.invocation
        if inv.paused_for_reconciliation:
            return Finished(detail=why)
        inv.pause(TerminalReason.RECONCILIATION_REQUIRED, question=why, at=moment.at)
        return Finished()

    # ----------------------------------------------------------------- answers

    def on_verified(self, evidence: str | None, moment: Moment) -> Action:
        """The verifier's verdict: None passed, else its evidence (goes back to the model)."""
        inv = self.invocation
        decision = inv.last_decision
        assert isinstance(decision, Final)
        if evidence is None:
            return self._end(TerminalReason.COMPLETED, moment, answer=decision.answer)
        evidence = safe_text(self._scrub_all(evidence))
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
        tokens = inv.input_tokens + inv.output_tokens
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
            if inv.cost + reserve_cost > budget.max_cost or (
                reserving and inv.cost >= budget.max_cost
            ):
                return (
                    TerminalReason.COST_BUDGET_EXHAUSTED,
                    f"{inv.cost:.6f} of {budget.max_cost:.6f} spent"
                    + (f", {reserve_cost:.6f} reserved for the next call" if reserve_cost else ""),
                )
        return None

    def _effect_of(self, name: str) -> ToolEffect:
        effect = self.catalogue.effect_of(name)
        assert effect is not None  # validated: the tool exists
        return effect

    def _keep(
        self, step: int, call_id: str, name: str, kind: Literal["arguments", "output"], value: Any
    ) -> None:
        """Hand a real value to the runtime's secret store, and remember its sensitive texts."""
        self._secrets.append(KeptSecret(step=step, call_id=call_id, kind=kind, value=value))
        if kind == "arguments":
            self._known_arguments.add((step, call_id))
        self._learn(step, call_id, self._sensitive_in(name, kind, value))

    def _sensitive_in(
        self, name: str, kind: Literal["arguments", "output"], value: Any
    ) -> list[str]:
        if kind == "arguments" and isinstance(value, dict):
            return redacted_values(value, self.catalogue.redact_arguments(name, value))
        if kind == "output":
            return redacted_values(value, self.catalogue.redact_output(name, value))
        return []

    def _learn(self, step: int, call_id: str, values: list[str]) -> None:
        if values:
            self._sensitive.setdefault((step, call_id), []).extend(values)

    def _scrub_call(
        self,
        step: int,
        call_id: str,
        name: str,
        text: str,
        *,
        stored: dict[str, Any] | None = None,
    ) -> str:
        """A text about one call (an error, a service's reason) as it may be stored.

        Scrubbed of the call's sensitive values: those met in this run, and those the
        runtime's secret store holds. When the call's ``stored`` arguments hold a
        redacted value whose real value neither knows, the text is withheld.
        """
        if not self._redacts:
            return text  # no tool declares a sensitive field: nothing to scrub
        key = (step, call_id)
        if self._kept is not None and key not in self._looked_up:
            self._looked_up.add(key)
            arguments = self._kept(step, call_id, "arguments")
            if arguments is not None:
                self._known_arguments.add(key)
                self._learn(step, call_id, self._sensitive_in(name, "arguments", arguments))
            output = self._kept(step, call_id, "output")
            if output is not None:
                self._learn(step, call_id, self._sensitive_in(name, "output", output))
        if stored is not None and key not in self._known_arguments and holds_redacted(stored):
            return withheld(text, WITHHELD_WHY)
        return scrub(text, self._sensitive.get(key, ()))

    def _scrub_all(self, text: str) -> str:
        """A text that may quote any value met in this run (a model failure, an evidence)."""
        return scrub(text, [v for values in self._sensitive.values() for v in values])


# --------------------------------------------------------------------------- stops from outside


def stop_after_failed_commit(*, conflict: bool, error: str) -> tuple[TerminalReason, str]:
    """Why a run stops when the store refused a commit, and the detail to report.

    Nothing is recorded either way. A conflict means another worker appended to
    this invocation first: ``lease_lost`` (the invocation is the other worker's).
    Any other failure is ``checkpoint_failed``: the store stays at the last commit,
    a consistent point of the turn protocol, and ``resume`` continues from there
    once the store works again (DESIGN.md, Resume).
    """
    if conflict:
        return (
            TerminalReason.LEASE_LOST,
            f"another worker appended to this invocation first ({error})",
        )
    return (
        TerminalReason.CHECKPOINT_FAILED,
        f"{error}; nothing of this step was recorded: resume continues from the last commit",
    )


def record_outside_cancellation(invocation: Invocation, *, at: datetime) -> bool:
    """The caller's scope was cancelled: record ``cancelled`` in the reloaded invocation.

    A running batch gets results first (writes among them stay open in the ledger:
    nobody knows whether they reached their service). Returns whether anything
    was recorded.
    """
    if invocation.phase is Phase.DISPATCHED and invocation.pending_batch is not None:
        invocation.commit_results(
            [unreported_result(call) for call in invocation.pending_batch.calls], at=at
        )
    if invocation.phase is Phase.TERMINATED or invocation.phase.paused:
        return bool(invocation.pending_events)
    invocation.terminate(TerminalReason.CANCELLED, detail="the caller cancelled", at=at)
    return True


def cancel_paused(invocation: Invocation, detail: str, *, at: datetime) -> None:
    """End a paused invocation ``cancelled`` (a batch waiting for its service gets results)."""
    if invocation.phase is Phase.AWAITING_RECONCILIATION and invocation.pending_batch is not None:
        invocation.commit_results(
            [unreported_result(call) for call in invocation.pending_batch.calls], at=at
        )
    invocation.terminate(TerminalReason.CANCELLED, detail=detail, at=at)


def settle_ended_effect(
    invocation: Invocation,
    effect: Effect,
    answer: EffectAnswered,
    catalogue: Catalogue,
    *,
    max_bytes: int,
    at: datetime,
) -> str | None:
    """Record a service's answer about an open write of an invocation that has ended.

    The receipt is stored as the tool redacts its output, within ``max_bytes``; the
    service's reason is scrubbed of the receipt's sensitive values, and withheld when
    the call's stored arguments hold a redacted value (its real value was deleted
    with the invocation's secrets when it ended, so the reason cannot be scrubbed of
    it). A receipt that cannot be stored faithfully is not recorded: the effect stays
    open, and the problem is returned (None when the answer was recorded).
    """
    admitted = admit_receipt(catalogue, effect.tool, answer, max_bytes=max_bytes)
    if isinstance(admitted, str):
        return admitted
    _, receipt = admitted
    reason = answer.reason
    if reason is not None:
        if holds_redacted(_proposed_arguments(invocation, effect.step, effect.call_id)):
            reason = withheld(reason, WITHHELD_WHY)
        else:
            reason = safe_text(scrub(reason, redacted_values(answer.receipt, receipt)))
    effect.reconcile(answer.status, receipt=receipt, reason=reason, at=at)
    return None


def admit_receipt(
    catalogue: Catalogue, tool: str, answer: EffectAnswered, *, max_bytes: int
) -> tuple[Any, Any] | str:
    """A service's receipt as the ledger stores it, or why it cannot be (the one admission).

    The receipt is checked by :func:`aggregates.effect.receipt_problem` (the rules of
    every stored JSON value, as for a receipt given by hand), then redacted as the
    tool redacts its output (a receipt is an output of the write), then cut to
    ``max_bytes``. Returns ``(redacted, stored)``: the receipt as redacted (the same
    object when the tool redacts nothing) and as stored; or the problem, as text.
    """
    problem = receipt_problem(answer.receipt)
    if problem is not None:
        return f"its receipt cannot be stored faithfully: {problem}"
    redacted = catalogue.redact_output(tool, answer.receipt)
    stored, _ = limit_size(redacted, max_bytes=max_bytes)
    return redacted, stored


def _proposed_arguments(invocation: Invocation, step: int, call_id: str) -> Any:
    """A call's arguments as they were stored with its decision (None if not found)."""
    for turn in invocation.turns:
        if turn.step == step and isinstance(turn.decision, ToolCalls):
            for call in turn.decision.calls:
                if call.id == call_id:
                    return call.arguments
    return None


# --------------------------------------------------------------------------- helpers


def batch_digest(invocation_id: str, step: int, calls: list[DispatchedCall]) -> str:
    """The digest of an exact proposed batch: what an approver approves."""
    return digest_of(
        {
            "invocation_id": invocation_id,
            "step": step,
            "calls": [call.model_dump(mode="json", exclude_none=True) for call in calls],
        }
    )


def _record_outcome(effect: Effect, result: ToolResult, *, at: datetime) -> None:
    """Put what the tool run saw of a write into its ledger entry."""
    message = result.error.message if result.error is not None else ""
    match result.effect_status:
        case EffectStatus.COMMITTED:
            effect.commit(result.output, at=at)
        case EffectStatus.REJECTED:
            effect.reject(message, at=at)
        case EffectStatus.OUTCOME_UNKNOWN:
            effect.mark_unknown(message, at=at)
        case _:
            raise AggregateError(f"a write ended without an effect status: {result}")


def _refused(rejection_class: RejectionClass, problem: str, raw: Any) -> Rejection:
    return Rejection(rejection_class=rejection_class, problems=[problem], raw=raw)


def _jsonable(proposal: object) -> Any:
    if isinstance(proposal, BaseModel):
        return proposal.model_dump(mode="json")
    try:
        return to_jsonable_python(proposal)
    except Exception:
        return repr(proposal)
