"""The Controller: the turn protocol of one invocation.

decide → validate → budget → repeated-plan check → commit dispatch → execute →
correlate → commit results → continue or terminate. The controller owns the
loop and its stopping rules; the model and the tools are actors it talks to
over channels; every state change is an event the Journal commits before the
next stage starts.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from datetime import datetime
from typing import Any, assert_never

import trio
from pydantic import BaseModel, ValidationError
from pydantic_core import to_jsonable_python

from aggregates.decisions import (
    CannotContinue,
    Clarification,
    Decision,
    ErrorClass,
    ErrorInfo,
    Final,
    Rejection,
    RejectionClass,
    RequestApproval,
    TerminalReason,
    ToolCalls,
    ToolResult,
    Usage,
    parse_decision,
)
from aggregates.invocation import DispatchedCall, Invocation, Phase
from loop_actors._journal import commit_events
from loop_actors._messages import (
    BatchExecuted,
    CancelBatch,
    Commit,
    CommitFailed,
    CommitOutcome,
    Committed,
    Decide,
    Decided,
    ExecuteBatch,
    Interruption,
    ModelFailed,
    ModelOutcome,
    ModelRequest,
    ModelTimedOut,
    ToolSchema,
)
from loop_actors._model import Model, run_model_actor
from loop_actors._outcome import Outcome
from loop_actors._store import EventStore
from loop_actors._tools import Toolbox, run_tool_actor

CANCEL_GRACE_S = 10.0
"""How long a cancelled batch may take to report its finished calls."""

CLEANUP_S = 10.0
"""How long recording a cancellation may take once the caller's scope was cancelled."""


class Controller:
    """Runs the turn protocol for one invocation until it terminates or pauses."""

    def __init__(
        self,
        invocation: Invocation,
        *,
        model: Model,
        toolbox: Toolbox,
        journal: trio.MemorySendChannel[Commit],
        store: EventStore,
        now: Callable[[], datetime],
        deadline: float = math.inf,
    ) -> None:
        """Prepare a controller for an invocation loaded from (or just saved to) the store."""
        self.invocation = invocation
        self.model = model
        self.toolbox = toolbox
        self.journal = journal
        self.store = store
        self.now = now
        self.deadline = deadline
        self.cancel_requested = False
        self._wait_scope: trio.CancelScope | None = None
        self._committed_totals = (invocation.step, invocation.tool_calls)
        self._commit_send, self._commit_recv = trio.open_memory_channel[CommitOutcome](1)
        self._tool_schemas = [
            ToolSchema(name=t.name, description=t.description, parameters=t.schema)
            for t in toolbox.tools.values()
        ]

    def request_cancel(self) -> None:
        """Ask the loop to stop: it starts no new call and ends ``cancelled``."""
        self.cancel_requested = True
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
        model_send, model_inbox = trio.open_memory_channel[Decide](0)
        # Replies have a buffer of one: an actor never blocks on a controller that left.
        model_outbox, self._model_replies = trio.open_memory_channel[ModelOutcome](1)
        tool_send, tool_inbox = trio.open_memory_channel[ExecuteBatch | CancelBatch](0)
        tool_outbox, self._tool_replies = trio.open_memory_channel[BatchExecuted](1)
        self._model_send, self._tool_send = model_send, tool_send
        async with trio.open_nursery() as nursery:
            await nursery.start(
                lambda task_status: run_model_actor(
                    model_inbox, model_outbox, model=self.model, task_status=task_status
                )
            )
            await nursery.start(
                lambda task_status: run_tool_actor(
                    tool_inbox, tool_outbox, toolbox=self.toolbox, task_status=task_status
                )
            )
            try:
                return await self._loop()
            except trio.Cancelled:
                with trio.move_on_after(CLEANUP_S, shield=True):
                    await self._record_outside_cancellation()
                raise
            finally:
                model_send.close()
                tool_send.close()
                nursery.cancel_scope.cancel()  # nothing of this invocation outlives it

    # ----------------------------------------------------------------- the loop

    async def _loop(self) -> Outcome:
        budget = self.invocation.budget
        while True:
            inv = self.invocation
            if inv.phase in (Phase.TERMINATED, Phase.PAUSED):
                return Outcome.of(inv)
            if self.cancel_requested:
                return await self._end(TerminalReason.CANCELLED, detail="cancel requested")
            if trio.current_time() >= self.deadline:
                return await self._end(TerminalReason.DEADLINE_EXCEEDED)
            if inv.step >= budget.max_steps:
                return await self._end(
                    TerminalReason.MAX_STEPS, detail=f"{budget.max_steps} steps taken"
                )

            answer = await self._ask_model()
            match answer:
                case None:
                    return await self._end(TerminalReason.CANCELLED, detail="cancel requested")
                case ModelTimedOut():
                    return await self._end(
                        TerminalReason.DEADLINE_EXCEEDED, detail="the model did not answer in time"
                    )
                case ModelFailed(error_type=error_type, message=message):
                    return await self._end(
                        TerminalReason.MODEL_ERROR, detail=f"{error_type}: {message}"
                    )
                case Decided(reply=reply):
                    pass
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
        inv.propose(decision, usage=usage, at=self.now())
        match decision:
            case Final(answer=answer):
                return await self._end(TerminalReason.COMPLETED, answer=answer)
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
        if inv.repeat_streak_after(calls) > budget.max_repeated_plan:
            return await self._end(
                TerminalReason.NO_PROGRESS,
                detail=f"the same plan was proposed {budget.max_repeated_plan + 1} times in a row",
            )
        if self.cancel_requested:
            return await self._end(TerminalReason.CANCELLED, detail="cancel requested")
        if trio.current_time() >= self.deadline:
            return await self._end(TerminalReason.DEADLINE_EXCEEDED)

        dispatched = [
            DispatchedCall(
                call_id=call.id,
                name=call.name,
                arguments=arguments[call.id],
                effect=self.toolbox.tools[call.name].effect,
            )
            for call in calls
        ]
        inv.dispatch(dispatched, self.toolbox.plan(dispatched), at=self.now())
        failed = await self._commit_or_fail()
        if failed is not None:
            return failed

        executed = await self._execute()
        inv.commit_results(executed.results, at=self.now())
        match executed.interruption:
            case Interruption.NONE:
                return await self._commit_or_fail()
            case Interruption.DEADLINE:
                return await self._end(
                    TerminalReason.DEADLINE_EXCEEDED, detail="the deadline passed while tools ran"
                )
            case Interruption.CANCELLED:
                return await self._end(
                    TerminalReason.CANCELLED, detail="cancel requested while tools ran"
                )
            case _:
                assert_never(executed.interruption)

    # ----------------------------------------------------------------- stages

    async def _ask_model(self) -> ModelOutcome | None:
        """Ask for the next decision; ``None`` when a cancel request interrupted the wait."""
        inv = self.invocation
        request = ModelRequest(
            invocation_id=inv.id,
            agent_name=inv.agent_name,
            goal=inv.goal,
            step=inv.step + 1,
            turns=list(inv.turns),
            tools=self._tool_schemas,
        )
        deadline = None if math.isinf(self.deadline) else self.deadline
        with trio.CancelScope() as scope:
            self._wait_scope = scope
            await self._model_send.send(Decide(request=request, deadline=deadline))
            outcome = await self._model_replies.receive()
        self._wait_scope = None
        if scope.cancelled_caught:
            return None
        return outcome

    def _validate(self, proposal: object) -> tuple[Decision, dict[str, dict[str, Any]]] | Rejection:
        """Check a proposal against the decision schema and the tool catalogue."""
        raw = _jsonable(proposal)
        try:
            decision = parse_decision(proposal)
        except ValidationError as error:
            problems = [
                f"{'.'.join(str(part) for part in item['loc']) or 'decision'}: {item['msg']}"
                for item in error.errors()
            ]
            return Rejection(
                rejection_class=RejectionClass.SCHEMA_INVALID, problems=problems, raw=raw
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
                raw=raw,
            )
        return decision, arguments

    async def _execute(self) -> BatchExecuted:
        """Run the dispatched batch through the ToolActor; honour cancel requests."""
        batch = self.invocation.pending_batch
        assert batch is not None
        deadline = None if math.isinf(self.deadline) else self.deadline
        await self._tool_send.send(
            ExecuteBatch(step=batch.step, calls=batch.calls, plan=batch.plan, deadline=deadline)
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
        return _all_cancelled(batch.calls)

    # ----------------------------------------------------------------- commits

    async def _end(
        self, reason: TerminalReason, *, answer: str | None = None, detail: str | None = None
    ) -> Outcome:
        self.invocation.terminate(reason, answer=answer, detail=detail, at=self.now())
        failed = await self._commit_or_fail()
        return failed if failed is not None else Outcome.of(self.invocation)

    async def _commit(self) -> CommitOutcome:
        return await commit_events(
            self.journal, self.invocation.take_events(), self._commit_send, self._commit_recv
        )

    async def _commit_or_fail(self) -> Outcome | None:
        """Commit pending events; on failure, stop with ``checkpoint_failed``."""
        outcome = await self._commit()
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
        steps, tool_calls = self._committed_totals
        try:
            reloaded = await trio.to_thread.run_sync(self.store.get, self.invocation.id)
        except Exception:  # the store is down: report without recording
            reloaded = None
        if reloaded is not None:
            self.invocation = reloaded
            steps, tool_calls = reloaded.step, reloaded.tool_calls
            if not failure.conflict and reloaded.phase not in (
                Phase.TERMINATED,
                Phase.PAUSED,
                Phase.DISPATCHED,
            ):
                reloaded.terminate(TerminalReason.CHECKPOINT_FAILED, detail=detail, at=self.now())
                await self._commit()  # best effort: the outcome is returned either way
        return Outcome(
            invocation_id=self.invocation.id,
            reason=TerminalReason.CHECKPOINT_FAILED,
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
                error_class=ErrorClass.CANCELLED,
                retryable=False,
                message="the invocation was cancelled before this call reported",
            ),
        )
        for call in calls
    ]
    step = 0
    return BatchExecuted(step=step, results=results, interruption=Interruption.CANCELLED)


def _jsonable(proposal: object) -> Any:
    if isinstance(proposal, BaseModel):
        return proposal.model_dump(mode="json")
    try:
        return to_jsonable_python(proposal)
    except Exception:
        return repr(proposal)
