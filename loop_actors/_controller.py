"""The Controller: the turn protocol of one invocation.

decide → validate → budget → repeated-plan check → commit dispatch → execute →
correlate → commit results → continue or terminate. The controller owns the
loop and its stopping rules; the model and the tools are actors it talks to
over channels; every state change is an event the Journal commits before the
next stage starts.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import math
from collections.abc import Callable, Iterable
from datetime import datetime
from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar, assert_never

import trio
from pydantic import BaseModel, ValidationError
from pydantic_core import to_jsonable_python

from aggregates.context import compact
from aggregates.decisions import (
    CannotContinue,
    Clarification,
    Decision,
    EffectStatus,
    ErrorClass,
    ErrorInfo,
    Final,
    Rejection,
    RejectionClass,
    RequestApproval,
    TerminalReason,
    ToolCall,
    ToolCalls,
    ToolResult,
    Usage,
    parse_decision,
)
from aggregates.decisions import Effect as EffectKind
from aggregates.effect import Effect, Resolution
from aggregates.events import DomainEvent
from aggregates.invocation import ApprovalDenied, DispatchedCall, Invocation, Phase, Turn
from loop_actors._errors import LoopActorsError
from loop_actors._faults import CrashPoint, fault_point
from loop_actors._journal import Journal
from loop_actors._messages import (
    BatchExecuted,
    CancelBatch,
    CommitFailed,
    CommitOutcome,
    Committed,
    Decide,
    Decided,
    EffectAnswered,
    ExecuteBatch,
    Interruption,
    ModelFailed,
    ModelOutcome,
    ModelRequest,
    ModelTimedOut,
    ReconcileEffect,
    ReconcileOutcome,
    ServiceUnreachable,
)
from loop_actors._model import Model, run_model_actor
from loop_actors._outcome import Outcome
from loop_actors._policy import AccessRequest, Deny, check_access
from loop_actors._reconciler import run_effect_reconciler
from loop_actors._store import EventStore
from loop_actors._tools import REDACTED, interrupted_result, run_tool_actor

if TYPE_CHECKING:
    from loop_actors._runtime import Agent

DEFAULT_WIND_DOWN_NOTICE = "{steps_left} step(s) left: summarise what you have and stop."

CANCEL_GRACE_S = 10.0
"""How long a cancelled batch may take to report its finished calls."""

CLEANUP_S = 10.0
"""How long recording a cancellation may take once the caller's scope was cancelled."""


class Controller:
    """Runs the turn protocol for one invocation until it terminates or pauses."""

    def __init__(
        self,
        invocation: Invocation,
        agent: Agent,
        *,
        journal: Journal,
        store: EventStore,
        now: Callable[[], datetime],
        deadline: float = math.inf,
    ) -> None:
        """Prepare a controller for an invocation loaded from (or just saved to) the store.

        The agent's settings (model, tools, verifier, limits, policy, context) are read
        from ``agent``; ``deadline`` is on the trio clock.
        """
        self.invocation = invocation
        self.model: Model = agent.model
        self.toolbox = agent.toolbox
        self.journal = journal
        self.store = store
        self.now = now
        self.deadline = deadline
        self.agent = agent
        """Its settings (verifier, limits, price, policy, context) are read from here."""
        self.cancel_requested = False
        self.cancel_detail: str | None = None
        self._wait_scope: trio.CancelScope | None = None
        self._committed_totals = (invocation.step, invocation.tool_calls)
        self._nursery: trio.Nursery | None = None
        # Real values of redacted arguments and outputs, for the tools and the
        # model of this process only: the store holds "[redacted]".
        self._revealed_arguments: dict[tuple[int, str], dict[str, Any]] = {}
        self._revealed_outputs: dict[tuple[int, str], Any] = {}
        self._reconciler_send: trio.MemorySendChannel[ReconcileEffect] | None = None
        self._reconciler_replies: trio.MemoryReceiveChannel[ReconcileOutcome]

    def request_cancel(self, detail: str | None = None) -> None:
        """Ask the loop to stop: it starts no new call and ends ``cancelled``.

        ``detail`` (who asked and why) goes into the recorded ``Terminated``.
        """
        self.cancel_requested = True
        if detail:
            self.cancel_detail = detail
        if self._wait_scope is not None:
            self._wait_scope.cancel()

    # ----------------------------------------------------------------- entry point

    async def run(self) -> Outcome:
        """Drive the invocation to a pause or an end; return its outcome.

        Cancellation: if the caller's scope is cancelled, the cancellation is
        recorded (unfinished calls get ``cancelled`` results, then ``Terminated``
        with reason ``cancelled``) within a bounded, shielded wait, and
        ``trio.Cancelled`` is re-raised.
        """
        try:
            return await self._run()
        except BaseExceptionGroup as group:
            raise single_exception(group) from None

    async def _run(self) -> Outcome:
        model_send, model_inbox = trio.open_memory_channel[Decide](0)
        # Replies have a buffer of one: an actor never blocks on a controller that left.
        model_outbox, self._model_replies = trio.open_memory_channel[ModelOutcome](1)
        tool_send, tool_inbox = trio.open_memory_channel[ExecuteBatch | CancelBatch](0)
        tool_outbox, self._tool_replies = trio.open_memory_channel[BatchExecuted](1)
        self._model_send, self._tool_send = model_send, tool_send
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            # Not awaited until started: the first request handed to an actor waits
            # for it to be ready (the channels have no buffer), which saves a
            # scheduler trip per actor and invocation.
            model, toolbox = self.model, self.toolbox
            nursery.start_soon(partial(run_model_actor, model_inbox, model_outbox, model=model))
            nursery.start_soon(partial(run_tool_actor, tool_inbox, tool_outbox, toolbox=toolbox))
            try:
                stopped = None
                if self.invocation.pending_batch is not None:
                    stopped = await self._resume_batch()
                elif self.invocation.phase is Phase.CALLS_PROPOSED and self.invocation.approval:
                    stopped = await self._dispatch_approved()
                if stopped is not None:
                    return stopped
                return await self._loop()
            except trio.Cancelled:
                with trio.move_on_after(CLEANUP_S, shield=True):
                    await self._record_outside_cancellation()
                raise
            finally:
                model_send.close()
                tool_send.close()
                if self._reconciler_send is not None:
                    self._reconciler_send.close()
                nursery.cancel_scope.cancel()  # nothing of this invocation outlives it

    # ----------------------------------------------------------------- the loop

    async def _loop(self) -> Outcome:
        budget = self.invocation.budget
        while True:
            inv = self.invocation
            if inv.phase in (Phase.TERMINATED, Phase.PAUSED):
                return Outcome.of(inv)
            if self.cancel_requested:
                return await self._cancelled()
            if trio.current_time() >= self.deadline:
                return await self._end(TerminalReason.DEADLINE_EXCEEDED)
            if inv.step >= budget.max_steps:
                return await self._end(
                    TerminalReason.MAX_STEPS, detail=f"{budget.max_steps} steps taken"
                )
            exhausted = self._usage_budget_exhausted(reserving=True)
            if exhausted is not None:
                return await self._end(exhausted[0], detail=exhausted[1])

            answer = await self._ask_model()
            match answer:
                case None:
                    return await self._cancelled()
                case ModelTimedOut():
                    return await self._end(
                        TerminalReason.DEADLINE_EXCEEDED, detail="the model did not answer in time"
                    )
                case ModelFailed(error_type=error_type, message=message):
                    return await self._end(
                        TerminalReason.MODEL_ERROR, detail=f"{error_type}: {message}"
                    )
                case Decided(reply=reply):
                    usage = reply.usage
                    if self.agent.price is not None and not usage.cost:
                        usage = usage.model_copy(update={"cost": self.agent.price.cost(usage)})
                        reply = reply.model_copy(update={"usage": usage})
                case _:
                    assert_never(answer)

            verdict = self._validate(reply.proposal)
            if isinstance(verdict, Rejection):
                inv.reject(verdict, usage=reply.usage, at=self.now())
                return await self._end(
                    TerminalReason.INVALID_DECISION, detail="; ".join(verdict.problems)
                )
            decision, arguments = verdict
            outcome = await self._act(decision, arguments, reply.usage)
            if outcome is not None:
                return outcome

    async def _act(
        self, decision: Decision, arguments: dict[str, dict[str, Any]], usage: Usage
    ) -> Outcome | None:
        """Carry out a valid decision; return an outcome when the invocation stops."""
        inv = self.invocation
        budget = inv.budget
        stored = decision
        if isinstance(decision, ToolCalls) and self.toolbox.redacts:
            stored = ToolCalls(
                calls=[
                    call.model_copy(
                        update={
                            "arguments": self.toolbox.redact_arguments(call.name, call.arguments)
                        }
                    )
                    for call in decision.calls
                ]
            )
            for call in decision.calls:
                self._revealed_arguments[(inv.step + 1, call.id)] = arguments[call.id]
        inv.propose(stored, usage=usage, at=self.now())
        overrun = self._usage_budget_exhausted(reserving=False)
        if overrun is not None and not isinstance(decision, Final):
            # Paid for, recorded, and not acted on: the budget is spent.
            return await self._end(overrun[0], detail=overrun[1])
        match decision:
            case Final(answer=answer):
                return await self._verify_and_end(answer)
            case CannotContinue(reason=reason):
                return await self._end(TerminalReason.CANNOT_CONTINUE, detail=reason)
            case Clarification(question=question):
                inv.pause(TerminalReason.CLARIFICATION_REQUIRED, question=question, at=self.now())
                return await self._commit_or_fail()
            case RequestApproval(proposal_digest=digest):
                inv.pause(TerminalReason.APPROVAL_REQUIRED, proposal_digest=digest, at=self.now())
                return await self._commit_or_fail()
            case ToolCalls(calls=calls):
                pass
            case _:
                assert_never(decision)

        if inv.tool_calls + len(calls) > budget.max_tool_calls:
            return await self._end(
                TerminalReason.TOOL_BUDGET_EXHAUSTED,
                detail=f"{len(calls)} call(s) proposed, {inv.tool_calls} of "
                f"{budget.max_tool_calls} used",
            )
        # Repetition is judged on the calls as stored (secrets redacted): those are
        # what the aggregate checks, and all that a resumed run can see.
        assert isinstance(stored, ToolCalls)  # the decision itself, or its redacted copy
        if inv.repeat_streak_after(stored.calls) > budget.max_repeated_plan:
            return await self._end(
                TerminalReason.NO_PROGRESS,
                detail=f"the same plan was proposed {budget.max_repeated_plan + 1} times in a row",
            )
        if self.cancel_requested:
            return await self._cancelled()
        if trio.current_time() >= self.deadline:
            return await self._end(TerminalReason.DEADLINE_EXCEEDED)

        refused = await self._refused_by_policy(calls, arguments)
        if isinstance(refused, Deny):
            return await self._end(
                TerminalReason.INVALID_DECISION, detail=f"refused by policy: {refused.reason}"
            )
        planned = [
            DispatchedCall(
                call_id=call.id,
                name=call.name,
                arguments=self.toolbox.redact_arguments(call.name, arguments[call.id]),
                effect=self.toolbox.tools[call.name].effect,
            )
            for call in calls
        ]
        needing = [
            call.id
            for call in calls
            if call.id not in refused and self.toolbox.needs_approval(call.name, arguments[call.id])
        ]
        if needing:
            inv.pause(
                TerminalReason.APPROVAL_REQUIRED,
                proposal_digest=batch_digest(inv.id, inv.step, planned),
                calls=planned,
                needs_approval=needing,
                at=self.now(),
            )
            return await self._commit_or_fail()
        return await self._dispatch(planned, denied=refused)

    async def _refused_by_policy(
        self, calls: list[ToolCall], arguments: dict[str, dict[str, Any]]
    ) -> dict[str, str] | Deny:
        """The calls the agent's policy refuses (id → why), or the refusal that ends the run."""
        if self.agent.policy is None:
            return {}
        inv = self.invocation
        refused: dict[str, str] = {}
        for call in calls:
            tool_ = self.toolbox.tools[call.name]
            args = arguments[call.id]
            deny = await check_access(
                self.agent.policy,
                AccessRequest(
                    actor=inv.actor,
                    tenant=inv.tenant,
                    operation=tool_.operation,
                    object=args.get(tool_.object_from) if tool_.object_from else None,
                    tool=call.name,
                    arguments=args,
                ),
            )
            if deny is None:
                continue
            if deny.stop:
                return deny.model_copy(update={"reason": f"call {call.id}: {deny.reason}"})
            refused[call.id] = f"refused by policy: {deny.reason}"
        return refused

    async def _dispatch(
        self, planned: list[DispatchedCall], *, denied: dict[str, str]
    ) -> Outcome | None:
        """Record the batch (and the ledger entries of its writes) and run it.

        ``denied`` calls are dispatched as part of the batch but never run: they
        get a ``denied`` result, and a write among them gets no effect key.
        """
        inv = self.invocation
        dispatched: list[DispatchedCall] = []
        effects: dict[str, Effect] = {}
        for call in planned:
            if call.effect is EffectKind.WRITE and call.call_id not in denied:
                effect = Effect.prepare(
                    invocation_id=inv.id,
                    step=inv.step,
                    call_id=call.call_id,
                    tool=call.name,
                    arguments_digest=_digest(call.arguments),
                    at=self.now(),
                )
                effect.dispatch(at=self.now())
                effects[call.call_id] = effect
                call = call.model_copy(update={"effect_key": effect.key})  # noqa: PLW2901
            dispatched.append(call)
        inv.dispatch(dispatched, self.toolbox.plan(dispatched), at=self.now())
        # One transaction: the batch and the ledger entries of its writes.
        failed = await self._commit_or_fail(*effects.values())
        if failed is not None:
            return failed
        fault_point(CrashPoint.AFTER_DISPATCH_COMMIT)
        results = {
            call.call_id: _denied(call, denied[call.call_id])
            for call in dispatched
            if call.call_id in denied
        }
        runnable = [call for call in dispatched if call.call_id not in denied]
        return await self._settle_batch(effects, results, runnable)

    async def _dispatch_approved(self) -> Outcome | None:
        """After a person approved or denied the paused batch: dispatch exactly that batch."""
        inv = self.invocation
        planned = inv.approved_calls or []
        denied: dict[str, str] = {}
        if isinstance(inv.approval, ApprovalDenied):
            message = (
                f"denied by {inv.approval.by}: {inv.approval.reason}; it did not run and "
                "must not be retried as is"
            )
            denied = dict.fromkeys(inv.approval_needed, message)
        if self.agent.policy is not None:
            # The same policy decides again: a call it refused stays refused.
            proposed = inv.last_decision
            if isinstance(proposed, ToolCalls):
                args = {call.call_id: call.arguments for call in planned}
                refused = await self._refused_by_policy(proposed.calls, args)
                if isinstance(refused, Deny):
                    return await self._end(
                        TerminalReason.INVALID_DECISION,
                        detail=f"refused by policy: {refused.reason}",
                    )
                denied = {**refused, **denied}
        return await self._dispatch(planned, denied=denied)

    async def _verify_and_end(self, answer: str) -> Outcome | None:
        """Only a verified answer completes; a refused one goes back to the model."""
        if self.agent.verifier is None:
            return await self._end(TerminalReason.COMPLETED, answer=answer)
        evidence = await run_verifier(self.agent.verifier, answer, list(self.invocation.turns))
        if evidence is None:
            return await self._end(TerminalReason.COMPLETED, answer=answer)
        inv = self.invocation
        inv.fail_verification(evidence, at=self.now())
        if inv.verification_failures >= self.agent.max_verification_attempts:
            return await self._end(
                TerminalReason.VERIFICATION_FAILED,
                detail=f"{inv.verification_failures} answer(s) failed verification; "
                f"last: {evidence}",
            )
        return await self._commit_or_fail()

    # ----------------------------------------------------------------- batches

    async def _resume_batch(self) -> Outcome | None:
        """Finish a batch that was dispatched but has no committed results (DESIGN.md, Resume).

        Reads run again. Each write is looked up in the effect ledger: a known
        outcome is used as it is; an open one is reconciled with its service.
        """
        batch = self.invocation.pending_batch
        assert batch is not None
        keys = {call.call_id: call.effect_key for call in batch.calls if call.effect_key}
        loaded = await trio.to_thread.run_sync(
            lambda: {call_id: self.store.get_effect(key) for call_id, key in keys.items()}
        )
        effects: dict[str, Effect] = {}
        results: dict[str, ToolResult] = {}
        runnable: list[DispatchedCall] = []
        for call in batch.calls:
            if call.effect_key is None:
                runnable.append(call)
                continue
            effect = loaded[call.call_id]
            if effect is None:  # cannot happen: the ledger entry is saved with the batch
                raise LoopActorsError(f"effect {call.effect_key} of call {call.call_id} is missing")
            effects[call.call_id] = effect
            known = _known_result(call, effect)
            if known is not None:
                results[call.call_id] = known
        return await self._settle_batch(effects, results, runnable)

    async def _settle_batch(
        self,
        effects: dict[str, Effect],
        results: dict[str, ToolResult],
        runnable: list[DispatchedCall],
    ) -> Outcome | None:
        """Run what must run, reconcile what is unknown, then commit one result per call.

        Returns an outcome when the invocation stops (interrupted, paused for
        reconciliation, or the store failed); None when the loop goes on.
        """
        inv = self.invocation
        batch = inv.pending_batch
        assert batch is not None
        by_id = {call.call_id: call for call in batch.calls}
        for round_ in range(MAX_DISPATCH_ROUNDS):
            if runnable:
                executed = await self._execute(runnable, effects)
                for result in map(self._conceal, executed.results):
                    results[result.call_id] = result
                    if result.effect_key is not None:
                        _record_outcome(effects[result.call_id], result, at=self.now())
                if executed.interruption is not Interruption.NONE:
                    unsettled = _all_cancelled([c for c in batch.calls if c.call_id not in results])
                    results.update({r.call_id: r for r in unsettled.results})
                    inv.commit_results([results[c.call_id] for c in batch.calls], at=self.now())
                    if executed.interruption is Interruption.DEADLINE:
                        reason = TerminalReason.DEADLINE_EXCEEDED
                        detail = "the deadline passed while tools ran"
                    else:
                        reason = TerminalReason.CANCELLED
                        detail = self._cancel_detail("cancel requested while tools ran")
                    return await self._end(reason, detail=detail, effects=effects.values())
            runnable = []
            unreachable: list[str] = []
            for call_id, effect in effects.items():
                if not effect.is_open:
                    continue
                answer = await self._reconcile(effect)
                match answer:
                    case ServiceUnreachable(error=error):
                        unreachable.append(f"{effect.key} ({effect.tool}): {error}")
                    case EffectAnswered():
                        answered = _apply_answer(by_id[call_id], effect, answer, at=self.now())
                        if answered is not None:
                            results[call_id] = answered
                    case _:
                        assert_never(answer)
            if unreachable:
                return await self._pause_for_reconciliation(
                    "the outcome of a write is unknown and its service cannot be asked: "
                    + "; ".join(unreachable),
                    effects,
                )
            again = [call_id for call_id, e in effects.items() if e.status is EffectStatus.PREPARED]
            if again and self.cancel_requested:
                # Cancelled: no new effect starts. These writes never reached their service.
                for call_id in again:
                    results[call_id] = _write_result(
                        by_id[call_id],
                        EffectStatus.PREPARED,
                        rejected="not dispatched again: the invocation was cancelled",
                    )
                inv.commit_results([results[c.call_id] for c in batch.calls], at=self.now())
                return await self._end(
                    TerminalReason.CANCELLED,
                    detail=self._cancel_detail("cancel requested while a write was being settled"),
                    effects=effects.values(),
                )
            if again and round_ == MAX_DISPATCH_ROUNDS - 1:
                break  # no dispatch is recorded that will not run: pause below instead
            for call_id in again:
                # The service never saw the key: dispatch again, with the same key.
                effects[call_id].dispatch(at=self.now())
                runnable.append(by_id[call_id])
            if not runnable:
                return await self._commit_batch_results(results, effects)
            failed = await self._commit_or_fail(*effects.values())
            if failed is not None:
                return failed
        return await self._pause_for_reconciliation(
            f"a write was dispatched {MAX_DISPATCH_ROUNDS} times and its service still "
            "does not know its key",
            effects,
        )

    async def _commit_batch_results(
        self, results: dict[str, ToolResult], effects: dict[str, Effect]
    ) -> Outcome | None:
        batch = self.invocation.pending_batch
        assert batch is not None
        inv = self.invocation
        inv.commit_results([results[c.call_id] for c in batch.calls], at=self.now())
        limit = self._failure_limit(batch.calls, results)
        if limit is not None and inv.failure_streak >= limit:
            # The results and the stop are one transaction.
            return await self._end(
                TerminalReason.REPEATED_FAILURE,
                detail=f"the same call failed the same way {inv.failure_streak} times in a row",
                effects=effects.values(),
            )
        failed = await self._commit_or_fail(*effects.values())
        if failed is None:
            fault_point(CrashPoint.AFTER_RESULTS_COMMIT)
        return failed

    async def _cancelled(self) -> Outcome:
        return await self._end(
            TerminalReason.CANCELLED, detail=self._cancel_detail("cancel requested")
        )

    def _cancel_detail(self, what: str) -> str:
        return f"{what}: {self.cancel_detail}" if self.cancel_detail else what

    def _usage_budget_exhausted(self, *, reserving: bool) -> tuple[TerminalReason, str] | None:
        """The exhausted token or cost budget, if any: before a call, with its reservation."""
        inv = self.invocation
        budget = inv.budget
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

    def _notices(self) -> list[str]:
        """What the model is told about its remaining budget (graceful wind-down)."""
        budget = self.invocation.budget
        steps_left = budget.max_steps - self.invocation.step
        if budget.wind_down_steps is not None and steps_left <= budget.wind_down_steps:
            return [self.agent.wind_down_notice.format(steps_left=steps_left)]
        return []

    def _failure_limit(
        self, calls: list[DispatchedCall], results: dict[str, ToolResult]
    ) -> int | None:
        """The repeated-failure threshold of the tool whose failure ended the batch."""
        failing = [c for c in calls if results[c.call_id].error is not None]
        if not failing:
            return None
        tool_ = self.toolbox.tools.get(failing[-1].name)
        configured = tool_.max_repeated_failures if tool_ is not None else None
        return configured if configured is not None else self.agent.max_repeated_failures

    async def _pause_for_reconciliation(self, why: str, effects: dict[str, Effect]) -> Outcome:
        """Wait for the service: pause (once), keeping what the ledger learnt meanwhile."""
        inv = self.invocation
        already_paused = inv.paused_for_reconciliation
        if not already_paused:
            inv.pause(TerminalReason.RECONCILIATION_REQUIRED, question=why, at=self.now())
        failed = await self._commit_or_fail(*effects.values())
        if failed is not None:
            return failed
        outcome = Outcome.of(inv)
        return outcome.model_copy(update={"detail": why}) if already_paused else outcome

    # ----------------------------------------------------------------- redaction

    def _redact_raw(self, raw: Any) -> Any:
        """Redact the sensitive arguments of known tools in a rejected proposal."""
        if not self.toolbox.redacts or not isinstance(raw, dict):
            return raw
        proposed = raw.get("calls")
        if not isinstance(proposed, list):
            return raw
        calls = []
        for call in proposed:
            if isinstance(call, dict) and isinstance(call.get("arguments"), dict):
                arguments = self.toolbox.redact_arguments(str(call.get("name")), call["arguments"])
                calls.append({**call, "arguments": arguments})
            else:
                calls.append(call)
        return {**raw, "calls": calls}

    def _reveal_call(self, step: int, call: DispatchedCall) -> DispatchedCall:
        """The call with the real values of its redacted arguments (known in this process)."""
        real = self._revealed_arguments.get((step, call.call_id))
        return call if real is None else call.model_copy(update={"arguments": real})

    def _conceal(self, result: ToolResult) -> ToolResult:
        """Keep a result's real output for the model; return what may be stored."""
        stored = self.toolbox.redact_output(result.name, result.output)
        if stored is result.output:
            return result
        step = self.invocation.step
        self._revealed_outputs[(step, result.call_id)] = result.output
        return result.model_copy(update={"output": stored})

    def _reveal_turns(self) -> list[Turn]:
        """The committed turns as the model may see them in this process."""
        turns = self.invocation.turns
        if not self._revealed_arguments and not self._revealed_outputs:
            return list(turns)
        revealed = []
        for turn in turns:
            decision = turn.decision
            if isinstance(decision, ToolCalls):
                decision = ToolCalls(
                    calls=[
                        call.model_copy(
                            update={
                                "arguments": self._revealed_arguments.get(
                                    (turn.step, call.id), call.arguments
                                )
                            }
                        )
                        for call in decision.calls
                    ]
                )
            results = [
                r.model_copy(
                    update={"output": self._revealed_outputs.get((turn.step, r.call_id), r.output)}
                )
                for r in turn.results
            ]
            revealed.append(turn.model_copy(update={"decision": decision, "results": results}))
        return revealed

    async def _reconcile(self, effect: Effect) -> ReconcileOutcome:
        """Ask the EffectReconciler about one effect (started on first use)."""
        if self._reconciler_send is None:
            send, inbox = trio.open_memory_channel[ReconcileEffect](0)
            outbox, self._reconciler_replies = trio.open_memory_channel[ReconcileOutcome](1)
            assert self._nursery is not None
            await self._nursery.start(
                partial(run_effect_reconciler, inbox, outbox, toolbox=self.toolbox)
            )
            self._reconciler_send = send
        await self._reconciler_send.send(ReconcileEffect(effect_key=effect.key, tool=effect.tool))
        return await self._reconciler_replies.receive()

    # ----------------------------------------------------------------- stages

    async def _ask_model(self) -> ModelOutcome | None:
        """Ask for the next decision; ``None`` when a cancel request interrupted the wait."""
        inv = self.invocation
        turns = self._reveal_turns()
        notices = self._notices()
        if self.agent.context_limit is not None:
            turns, compaction = compact(
                turns, limit=self.agent.context_limit, keep_recent=self.agent.keep_recent_turns
            )
            if compaction is not None:
                # Committed with the decision it was made for.
                inv.record_compaction(
                    dropped_steps=compaction.dropped_steps,
                    kept_steps=compaction.kept_steps,
                    size_before=compaction.size_before,
                    size_after=compaction.size_after,
                    at=self.now(),
                )
                notices = [compaction.note, *notices]
        request = ModelRequest(
            invocation_id=inv.id,
            agent_name=inv.agent_name,
            goal=inv.goal,
            step=inv.step + 1,
            turns=turns,
            tools=self.toolbox.schemas,
            notices=notices,
        )
        deadline = None if math.isinf(self.deadline) else self.deadline
        with trio.CancelScope() as scope:
            self._wait_scope = scope
            await _hand_over(self._model_send, Decide(request=request, deadline=deadline))
            outcome = await self._model_replies.receive()
        self._wait_scope = None
        if scope.cancelled_caught:
            return None
        return outcome

    def _validate(self, proposal: object) -> tuple[Decision, dict[str, dict[str, Any]]] | Rejection:
        """Check a proposal against the decision schema and the tool catalogue."""
        try:
            decision = parse_decision(proposal)
        except ValidationError as error:
            problems = [
                f"{'.'.join(str(part) for part in item['loc']) or 'decision'}: {item['msg']}"
                for item in error.errors()
            ]
            return Rejection(
                rejection_class=RejectionClass.SCHEMA_INVALID,
                problems=problems,
                raw=self._redact_raw(_jsonable(proposal)),
            )
        arguments: dict[str, dict[str, Any]] = {}
        problems_by_class: list[tuple[RejectionClass, str]] = []
        match decision:
            case Final(answer=answer) if not answer.strip():
                problems_by_class.append((RejectionClass.EMPTY_ANSWER, "the final answer is empty"))
            case ToolCalls(calls=calls):
                if not calls:
                    problems_by_class.append(
                        (RejectionClass.EMPTY_BATCH, "the tool batch is empty")
                    )
                seen: set[str] = set()
                for call in calls:
                    if call.id in seen:
                        problems_by_class.append(
                            (RejectionClass.DUPLICATE_CALL_ID, f"duplicate call id {call.id!r}")
                        )
                    seen.add(call.id)
                    if call.name not in self.toolbox.tools:
                        problems_by_class.append(
                            (
                                RejectionClass.UNKNOWN_TOOL,
                                f"call {call.id}: unknown tool {call.name!r}",
                            )
                        )
                        continue
                    try:
                        arguments[call.id] = self.toolbox.check_arguments(call)
                    except ValidationError as error:
                        details = "; ".join(
                            f"{'.'.join(str(p) for p in item['loc']) or 'arguments'}: {item['msg']}"
                            for item in error.errors()
                        )
                        problems_by_class.append(
                            (
                                RejectionClass.INVALID_ARGUMENTS,
                                f"call {call.id}: arguments for {call.name} are invalid: {details}",
                            )
                        )
            case _:
                pass
        if problems_by_class:
            return Rejection(
                rejection_class=problems_by_class[0][0],
                problems=[problem for _, problem in problems_by_class],
                raw=self._redact_raw(_jsonable(proposal)),
            )
        return decision, arguments

    async def _execute(
        self, calls: list[DispatchedCall], effects: dict[str, Effect]
    ) -> BatchExecuted:
        """Run calls of the dispatched batch through the ToolActor; honour cancel requests."""
        batch = self.invocation.pending_batch
        assert batch is not None
        deadline = None if math.isinf(self.deadline) else self.deadline
        if self.cancel_requested:
            # Cancelled before anything started: nothing is handed to the tools.
            return BatchExecuted(
                step=batch.step,
                results=[
                    interrupted_result(call, Interruption.CANCELLED, started=False)
                    for call in calls
                ],
                interruption=Interruption.CANCELLED,
            )
        revealed = [self._reveal_call(batch.step, call) for call in calls]
        lost = [call for call in revealed if _holds_redacted(call.arguments)]
        calls = [call for call in revealed if not _holds_redacted(call.arguments)]
        if lost:
            ran = await self._execute(calls, effects) if calls else None
            results = {r.call_id: r for r in (ran.results if ran else [])}
            results.update({call.call_id: _arguments_gone(call) for call in lost})
            return BatchExecuted(
                step=batch.step,
                results=[results[call.call_id] for call in revealed],
                interruption=ran.interruption if ran else Interruption.NONE,
            )
        await _hand_over(
            self._tool_send,
            ExecuteBatch(
                invocation_id=self.invocation.id,
                step=batch.step,
                calls=calls,
                plan=self.toolbox.plan(calls),
                deadline=deadline,
                attempts={call_id: effect.attempt for call_id, effect in effects.items()},
            ),
        )
        with trio.CancelScope() as scope:
            self._wait_scope = scope
            if self.cancel_requested:
                scope.cancel()
            executed = await self._tool_replies.receive()
        self._wait_scope = None
        if not scope.cancelled_caught:
            return executed
        # A cancel request: ask the actor to stop the batch, wait a bounded time for
        # the calls that did finish, and only then give up on them.
        await self._tool_send.send(CancelBatch())
        with trio.move_on_after(CANCEL_GRACE_S):
            return await self._tool_replies.receive()
        return _all_cancelled(calls)

    # ----------------------------------------------------------------- commits

    async def _end(
        self,
        reason: TerminalReason,
        *,
        answer: str | None = None,
        detail: str | None = None,
        effects: Iterable[Effect] = (),
    ) -> Outcome:
        if reason is TerminalReason.COMPLETED:
            fault_point(CrashPoint.BEFORE_FINAL_COMMIT)
        self.invocation.terminate(reason, answer=answer, detail=detail, at=self.now())
        failed = await self._commit_or_fail(*effects)
        return failed if failed is not None else Outcome.of(self.invocation)

    async def _commit(self, *effects: Effect) -> CommitOutcome:
        events: list[DomainEvent] = list(self.invocation.take_events())
        for effect in effects:
            events.extend(effect.take_events())
        return await self.journal.commit(events)

    async def _commit_or_fail(self, *effects: Effect) -> Outcome | None:
        """Commit pending events (and the given effects'); on failure, stop.

        A conflict means another worker appended to this invocation first:
        ``lease_lost``. Any other failure is ``checkpoint_failed``.
        """
        outcome = await self._commit(*effects)
        match outcome:
            case Committed():
                self._committed_totals = (self.invocation.step, self.invocation.tool_calls)
                return None
            case CommitFailed():
                return await self._checkpoint_failed(outcome)
            case _:
                assert_never(outcome)

    async def _checkpoint_failed(self, failure: CommitFailed) -> Outcome:
        """The store refused a commit: stop, and record why if the store still answers.

        The in-memory aggregate is ahead of the store, so it is reloaded; the
        model is not asked again.
        """
        detail = f"{failure.error_type}: {failure.message}"
        reason = TerminalReason.CHECKPOINT_FAILED
        if failure.conflict:
            reason = TerminalReason.LEASE_LOST
            detail = f"another worker appended to this invocation first ({detail})"
        steps, tool_calls = self._committed_totals
        try:
            reloaded = await trio.to_thread.run_sync(self.store.get, self.invocation.id)
        except Exception:  # the store is down: report without recording
            reloaded = None
        if reloaded is not None:
            self.invocation = reloaded
            steps, tool_calls = reloaded.step, reloaded.tool_calls
            # Nothing is recorded after a conflict: the invocation belongs to the other worker.
            if not failure.conflict and reloaded.phase not in (
                Phase.TERMINATED,
                Phase.PAUSED,
                Phase.DISPATCHED,
            ):
                reloaded.terminate(TerminalReason.CHECKPOINT_FAILED, detail=detail, at=self.now())
                await self._commit()  # best effort: the outcome is returned either way
        return Outcome(
            invocation_id=self.invocation.id,
            reason=reason,
            answer=None,
            steps=steps,
            tool_calls=tool_calls,
            detail=detail,
        )

    async def _record_outside_cancellation(self) -> None:
        """The caller's scope was cancelled: record ``cancelled`` (shielded by the caller)."""
        inv = self.invocation
        inv.take_events()  # drop anything not yet sent: it was never committed
        try:
            inv = await trio.to_thread.run_sync(self.store.get, inv.id)
        except Exception:
            return
        self.invocation = inv
        if inv.phase is Phase.DISPATCHED and inv.pending_batch is not None:
            # Writes among them stay open in the ledger (dispatched): the reconciler's
            # backlog, since nobody knows whether they reached their service.
            inv.commit_results(_all_cancelled(inv.pending_batch.calls).results, at=self.now())
        if inv.phase in (Phase.TERMINATED, Phase.PAUSED):
            return
        inv.terminate(TerminalReason.CANCELLED, detail="the caller cancelled", at=self.now())
        await self._commit()


def _all_cancelled(calls: list[DispatchedCall]) -> BatchExecuted:
    results = [
        ToolResult(
            call_id=call.call_id,
            name=call.name,
            error=ErrorInfo(
                error_class=(
                    ErrorClass.OUTCOME_UNKNOWN if call.effect_key else ErrorClass.CANCELLED
                ),
                retryable=False,
                message="the invocation was cancelled before this call reported",
            ),
            effect_key=call.effect_key,
            effect_status=EffectStatus.OUTCOME_UNKNOWN if call.effect_key else None,
        )
        for call in calls
    ]
    step = 0
    return BatchExecuted(step=step, results=results, interruption=Interruption.CANCELLED)


M = TypeVar("M")


async def _hand_over(channel: trio.MemorySendChannel[M], message: M) -> None:
    """Send a request to an actor that is waiting for it, without yielding if it is.

    An actor serves one request of this controller at a time, so it is normally
    already waiting in ``receive`` and the hand-over needs no trip through the
    scheduler (the wait for the reply that follows is the checkpoint). Otherwise
    (the actor has just started) this is an ordinary ``send``.
    """
    try:
        channel.send_nowait(message)
    except trio.WouldBlock:
        await channel.send(message)


def _jsonable(proposal: object) -> Any:
    if isinstance(proposal, BaseModel):
        return proposal.model_dump(mode="json")
    try:
        return to_jsonable_python(proposal)
    except Exception:
        return repr(proposal)


MAX_DISPATCH_ROUNDS = 3
"""How many times one batch may dispatch a write whose service keeps answering "not found"."""


def _digest(arguments: dict[str, Any]) -> str:
    canonical = json.dumps(arguments, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def _write_result(
    call: DispatchedCall,
    status: EffectStatus,
    *,
    receipt: Any = None,
    rejected: str | None = None,
) -> ToolResult:
    error = None
    if rejected is not None:
        error = ErrorInfo(error_class=ErrorClass.REJECTED, retryable=False, message=rejected)
    return ToolResult(
        call_id=call.call_id,
        name=call.name,
        output=receipt if error is None else None,
        error=error,
        effect_key=call.effect_key,
        effect_status=status,
    )


def _known_result(call: DispatchedCall, effect: Effect) -> ToolResult | None:
    """The result the ledger already knows for a write, or None if it must still be settled."""
    match effect.status:
        case EffectStatus.COMMITTED:
            return _write_result(call, effect.status, receipt=effect.receipt)
        case EffectStatus.REJECTED:
            return _write_result(call, effect.status, rejected=effect.reason or "rejected")
        case EffectStatus.RECONCILED:
            if effect.resolution is Resolution.COMMITTED:
                return _write_result(call, effect.status, receipt=effect.receipt)
            return _write_result(call, effect.status, rejected=effect.reason or "rejected")
        case EffectStatus.PREPARED | EffectStatus.DISPATCHED | EffectStatus.OUTCOME_UNKNOWN:
            return None
        case _:
            assert_never(effect.status)


def _record_outcome(effect: Effect, result: ToolResult, *, at: datetime) -> None:
    """Put what the ToolActor saw of a write into its ledger entry."""
    message = result.error.message if result.error is not None else ""
    match result.effect_status:
        case EffectStatus.COMMITTED:
            effect.commit(result.output, at=at)
        case EffectStatus.REJECTED:
            effect.reject(message, at=at)
        case EffectStatus.OUTCOME_UNKNOWN:
            effect.mark_unknown(message, at=at)
        case _:
            raise LoopActorsError(f"a write ended without an effect status: {result}")


def _apply_answer(
    call: DispatchedCall, effect: Effect, answer: EffectAnswered, *, at: datetime
) -> ToolResult | None:
    """Record a service's answer; return the call's result, or None to dispatch it again."""
    resolution = Resolution(answer.status)
    effect.reconcile(resolution, receipt=answer.receipt, reason=answer.reason, at=at)
    match resolution:
        case Resolution.COMMITTED:
            return _write_result(call, EffectStatus.RECONCILED, receipt=answer.receipt)
        case Resolution.REJECTED:
            return _write_result(
                call, EffectStatus.RECONCILED, rejected=answer.reason or "rejected by the service"
            )
        case Resolution.NOT_FOUND:
            return None
        case _:
            assert_never(resolution)


def single_exception(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """The one exception a nursery wrapped, or the group itself when there are several.

    A controller's actors only fail by bugs; what the caller should see is the
    error itself, not trio's wrapper around it.
    """
    error: BaseException = group
    while isinstance(error, BaseExceptionGroup) and len(error.exceptions) == 1:
        error = error.exceptions[0]
    return error


def _holds_redacted(value: Any) -> bool:
    if value == REDACTED:
        return True
    if isinstance(value, dict):
        return any(_holds_redacted(v) for v in value.values())
    if isinstance(value, list):
        return any(_holds_redacted(v) for v in value)
    return False


def _arguments_gone(call: DispatchedCall) -> ToolResult:
    """The result of a call that cannot run again: its sensitive arguments were never stored."""
    return ToolResult(
        call_id=call.call_id,
        name=call.name,
        error=ErrorInfo(
            error_class=ErrorClass.INVALID_ARGUMENTS,
            retryable=True,
            message="not run again: its sensitive arguments were redacted before they were "
            "stored, and this process does not have them; propose the call again",
        ),
        effect_key=call.effect_key,
        effect_status=EffectStatus.REJECTED if call.effect_key else None,
    )


def batch_digest(invocation_id: str, step: int, calls: list[DispatchedCall]) -> str:
    """The digest of an exact proposed batch: what an approver approves."""
    canonical = json.dumps(
        {
            "invocation_id": invocation_id,
            "step": step,
            "calls": [call.model_dump(mode="json", exclude_none=True) for call in calls],
        },
        sort_keys=True,
        separators=(",", ":"),
    )
    return hashlib.sha256(canonical.encode()).hexdigest()


def _denied(call: DispatchedCall, message: str) -> ToolResult:
    """The result of a call that was denied (by a person or the policy): it did not run."""
    return ToolResult(
        call_id=call.call_id,
        name=call.name,
        error=ErrorInfo(error_class=ErrorClass.DENIED, retryable=False, message=message),
    )


Verifier = Callable[[str, list[Turn]], Any]
"""``verifier(answer, turns)``: True (or None) passes; False or a text (the evidence) refuses.

Plain or async. An exception is a refusal with the exception as evidence.
"""


async def run_verifier(verifier: Verifier, answer: str, turns: list[Turn]) -> str | None:
    """Run the agent's verifier; None when it passed, else its evidence."""
    try:
        verdict = verifier(answer, turns)
        if inspect.isawaitable(verdict):
            verdict = await verdict
    except Exception as error:  # a verifier that breaks does not pass an answer
        return f"the verifier raised {type(error).__name__}: {error}"
    if verdict is True or verdict is None:
        return None
    if verdict is False:
        return "the answer did not pass verification"
    return str(verdict)
