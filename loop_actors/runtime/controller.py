"""The Controller: the thin trio shell around the turn core of one invocation.

It asks the core (:class:`aggregates.turn.TurnCore`) for the next action,
performs it — the model, the tools, the reconciler, the policy, the verifier,
the Journal — and hands what came back to the core. It holds no rules: every
budget, guard and terminal reason is the core's. The helpers below come in the
order of a turn: ask the model, authorise, run the batch, settle its writes,
verify, commit.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import math
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from functools import partial
from typing import TYPE_CHECKING, Any, assert_never

import trio

from aggregates.children import Allotment, Spent
from aggregates.decisions import Budget, EffectStatus, ToolCalls, ToolEffect, ToolResult, built
from aggregates.effect import Effect
from aggregates.handoffs import HandoffOrigin
from aggregates.invocation import DispatchedCall, Invocation, Turn
from aggregates.lease import DEFAULT_LEASE_S, stop_for_lost_lease
from aggregates.ledger_check import missing_effects_problem
from aggregates.model_input import ModelInput
from aggregates.results import Interruption, split_unrevealed
from aggregates.settings import RunSettings
from aggregates.standing import stopped
from aggregates.turn import (
    Action,
    AskModel,
    AttemptStillRunning,
    Authorise,
    Continue,
    Critique,
    EffectObservation,
    Finished,
    LoadEffects,
    ModelInterrupted,
    ModelObservation,
    ModelQuotaWait,
    ModelTimedOut,
    Moment,
    PolicyVerdict,
    Reconcile,
    ReconcileOutcome,
    RunCalls,
    TurnCore,
    Verify,
    record_outside_cancellation,
    stop_after_failed_commit,
)
from loop_actors._errors import (
    InconsistentHistoryError,
    InvocationNotFoundError,
    ToolError,
    single_exception,
)
from loop_actors._faults import CrashPoint, fault_point
from loop_actors._guard import is_cancellation
from loop_actors._logs import fields, package_logger
from loop_actors._messages import (
    BatchExecuted,
    CommitFailed,
    Committed,
    ModelRequest,
    ReconcileEffect,
    ToolSchema,
)
from loop_actors.agent.agent import run_verifier
from loop_actors.agent.batch import BatchRun
from loop_actors.agent.model import Model, RequestDigests
from loop_actors.agent.policy import AccessRequest, check_access
from loop_actors.agent.quota import QuotaWaitError
from loop_actors.agent.replies import model_answer, model_failure
from loop_actors.runtime.leases import HeldLease, LeaseDrained
from loop_actors.runtime.outage import StoreOutages
from loop_actors.runtime.outcome import Outcome
from loop_actors.runtime.reconciler import run_effect_reconciler
from loop_actors.runtime.slots import Slot
from loop_actors.store.journal import Journal
from loop_actors.store.reader import StoreReader
from loop_actors.store.secrets import MISSING, Kind, SecretStore

if TYPE_CHECKING:
    from loop_actors.agent.agent import Agent

log = package_logger(__name__)


class LeaseGone:
    """Why a commit while a batch ran was not tried: the lease was lost or may have run out."""


CANCEL_GRACE_S = 10.0
"""How long a cancelled batch may take to report its finished calls."""

ATTEMPT_GRACE_S = 30.0
"""The longest wait for an abandoned attempt of a write to stop before its service is asked."""

CLEANUP_S = 10.0
"""How long recording a cancellation may take once the caller's scope was cancelled."""


class Controller:
    """Runs the turn core of one invocation until it terminates or pauses."""

    def __init__(
        self,
        invocation: Invocation,
        agent: Agent,
        *,
        settings: RunSettings,
        journal: Journal,
        reads: StoreReader,
        secrets: SecretStore,
        now: Callable[[], datetime],
        lease: HeldLease | None = None,
        slot: Slot | None = None,
        outages: StoreOutages | None = None,
    ) -> None:
        """Prepare a controller for an invocation loaded from (or just saved to) the store.

        ``settings`` are the recorded ones; the agent gives the model, the tools, the
        verifier and the policy (code, which the record cannot hold). ``lease`` is the
        lease this process holds on the invocation: a lost one commits nothing more,
        one that could not be renewed starts no call, and a draining one stops the run
        after its next commit (:class:`LeaseDrained`). ``slot`` is its hold on the
        runtime's work slots: held while it works, given back while it waits for its
        model or its tools (``loop_actors.runtime.slots``). ``outages``: where a store
        that cannot be read after a failed commit is reported (the runtime's, logged once
        per outage; without it, a new one).
        """
        self.core = TurnCore(
            invocation,
            settings=settings,
            catalogue=agent.toolbox,
            verifies=agent.verifier is not None,
            authorises=agent.policy is not None,
            critiques=agent.critic is not None,
            # A function of the secret store, not a method of this controller: a bound
            # method would make controller and core a reference cycle, so that every
            # finished invocation's objects waited for the cyclic garbage collector
            # (measured: a gen-2 collection every ~1,000 turns, ~50 us a turn).
            kept=partial(_kept, secrets, invocation.id),
        )
        self.agent = agent
        self.journal = journal
        self.reads = reads
        self.secrets = secrets
        self.now = now
        self.lease = lease
        self.outages = outages if outages is not None else StoreOutages(lease_s=DEFAULT_LEASE_S)
        self._slot = slot if slot is not None else Slot(None)
        self.cancel_requested = False
        self.cancel_detail: str | None = None
        self._wait_scope: trio.CancelScope | None = None
        """The scope of the model call in flight (a cancel request cancels it)."""
        self._batch: BatchRun | None = None
        """The batch in flight (a cancel request stops it)."""
        self.take_children_run_from_code: Callable[[], Mapping[str, list[str]]] = no_children
        """The children the calls' bodies ran (``run_agent``) since the last take, by call
        id: set by the Driver (its ``ChildRunner``); each result of a batch names its call's."""
        self._child_commits = trio.Lock()
        """Held while a child's share is recorded and committed (the batch running)."""
        self._failed_during_batch: CommitFailed | LeaseGone | None = None
        """Why a commit while the batch ran did not happen: the run stops after the batch."""
        self._nursery: trio.Nursery | None = None
        self._reconciler_send: trio.MemorySendChannel[ReconcileEffect] | None = None
        self._reconciler_replies: trio.MemoryReceiveChannel[ReconcileOutcome]
        # The deadline counts from the invocation's start, across resumes.
        started = invocation.started_at or now()
        self._elapsed_at_start = max(0.0, (now() - started).total_seconds())
        self._started = trio.current_time()
        self._confirmed = (invocation.step, invocation.tool_calls)
        self._digests = RequestDigests(agent.model, agent.toolbox.schemas)
        # Under a plan's read-only ceiling (AskModel.read_only) only these are offered.
        self._read_schemas = [
            s for s in agent.toolbox.schemas if agent.toolbox.effect_of(s.name) is ToolEffect.READ
        ]
        self._read_names = frozenset(s.name for s in self._read_schemas)

    @property
    def invocation(self) -> Invocation:
        """The invocation as the core holds it."""
        return self.core.invocation

    def seconds_left(self) -> float | None:
        """Seconds until the recorded deadline (None without one)."""
        return self.core.seconds_left(self._moment())

    def request_cancel(self, detail: str | None = None) -> None:
        """Ask the loop to stop: it starts no new call and ends ``cancelled``.

        ``detail`` (who asked and why) goes into the recorded ``Terminated``.
        """
        self.cancel_requested = True
        if detail:
            self.cancel_detail = detail
        if self._wait_scope is not None:
            self._wait_scope.cancel()
        if self._batch is not None:
            self._batch.cancel()

    # ----------------------------------------------------------------- entry point

    async def run(self) -> Outcome:
        """Drive the invocation to a pause or an end; return its outcome.

        Cancellation: if the caller's scope is cancelled, the cancellation is
        recorded (unfinished calls get ``cancelled`` results, then ``Terminated``
        with reason ``cancelled``) within a bounded, shielded wait, and
        ``trio.Cancelled`` is re-raised. A retry (``resume``) is safe.
        """
        try:
            return await self._run()
        except BaseExceptionGroup as group:
            raise single_exception(group) from None

    async def _run(self) -> Outcome:
        # The run's nursery holds the tasks of its tool calls (one per call in flight;
        # inline calls run in this task) and, once needed, the EffectReconciler. The
        # model is called from this task.
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            try:
                return await self._drive()
            except trio.Cancelled:
                if self.lease is not None and self.lease.abandoned:
                    raise  # the holder stops at once: the next holder continues, nothing ends
                # A real bound: what runs in here gives up when the bound passes
                # (threads are abandoned, the Journal's wait is cancellable).
                with trio.move_on_after(CLEANUP_S, shield=True):
                    await self._record_outside_cancellation()
                raise
            finally:
                if self._reconciler_send is not None:
                    self._reconciler_send.close()
                nursery.cancel_scope.cancel()  # nothing of this invocation outlives it

    # ----------------------------------------------------------------- the loop

    async def _drive(self) -> Outcome:
        await self._slot.take(mid_turn=False)
        try:
            return await self._steps()
        finally:
            self._slot.give_back()

    async def _steps(self) -> Outcome:
        core = self.core
        action: Action = core.next(self._moment())
        while True:
            self.secrets.keep(self.invocation.id, core.take_secrets())
            if action.commits_first:
                if isinstance(action, Finished) and action.completed:
                    fault_point(CrashPoint.BEFORE_FINAL_COMMIT)
                failed = await self._commit()
                if failed is not None:
                    return failed
            match action:
                case AskModel():
                    action = core.on_model(await self._ask_model(action), self._moment())
                case Authorise():
                    self._slot.give_back()  # no slot is held while user code decides
                    verdict = await self._authorise(action)
                    await self._slot.take(mid_turn=True)
                    action = core.on_authorised(verdict, self._moment())
                case RunCalls():
                    if action.first_dispatch:
                        fault_point(CrashPoint.AFTER_DISPATCH_COMMIT)
                    if self.lease is not None and not self.lease.may_start_calls():
                        # No write starts on a lease that may have run out.
                        return self._lease_lost()
                    executed = await self._run_calls(action)
                    if self._failed_during_batch is not None:
                        return await self._stop_after_batch(self._failed_during_batch)
                    action = self._on_executed(executed)
                    # No local variable keeps the batch's results alive while the next
                    # turn waits for the model.
                    del executed
                case LoadEffects():
                    action = core.on_effects_loaded(
                        await self._load_effects(action), self._moment()
                    )
                case Reconcile():
                    self._slot.give_back()  # nor while services are asked
                    observed = await self._reconcile(action)
                    await self._slot.take(mid_turn=True)
                    action = core.on_reconciled(observed, self._moment())
                case Verify():
                    self._slot.give_back()  # nor while the verifier runs
                    evidence = await self._verify(action)
                    await self._slot.take(mid_turn=True)
                    action = core.on_verified(evidence, self._moment())
                case Critique():
                    fault_point(CrashPoint.BEFORE_CRITIQUE)
                    action = core.on_critique(await self._ask_critic(action), self._moment())
                case Continue():
                    if action.after_results:
                        fault_point(CrashPoint.AFTER_RESULTS_COMMIT)
                    if action.after_critique:
                        fault_point(CrashPoint.AFTER_CRITIQUE_COMMIT)
                    action = core.next(self._moment())
                case Finished():
                    outcome = Outcome.of(self.invocation)
                    if action.detail is not None:
                        outcome = outcome.model_copy(update={"detail": action.detail})
                    return outcome
                case _:
                    assert_never(action)

    def _moment(self) -> Moment:
        return Moment(
            at=self.now(),
            elapsed_s=self._elapsed_at_start + (trio.current_time() - self._started),
            cancel_requested=self.cancel_requested,
            cancel_detail=self.cancel_detail,
        )

    def _deadline(self) -> float | None:
        """The recorded deadline on the trio clock, for the actors."""
        if self.core.budget.deadline_s is None:
            return None
        left = self.core.seconds_left(self._moment())
        return None if left is None else trio.current_time() + left

    # ----------------------------------------------------------------- the model

    async def _ask_model(self, action: AskModel) -> ModelObservation:
        """Ask for the next decision, bounded by the deadline; interrupted by a cancel request.

        One cancel scope bounds the call: the recorded deadline is its deadline, and a
        cancel request (:meth:`request_cancel`) cancels it.
        """
        inv = self.invocation
        request = self._request(
            action.step,
            action.turns,
            tools=self._read_schemas if action.read_only else self.agent.toolbox.schemas,
            notices=action.notices,
            handoffs=list(self.agent.handoffs),
            handed_off_from=inv.handed_off_from,
            planning=action.read_only,
        )
        return await self._observe(
            self.agent.model,
            request,
            lambda: self._digests.of(
                goal=inv.goal,
                notices=action.notices,
                turns=action.turns,
                offered=self._read_names if action.read_only else None,
            ),
        )

    async def _ask_critic(self, action: Critique) -> ModelObservation:
        """Ask the agent's critic for its verdict: as a model call, offered no tool."""
        critic = self.agent.critic
        assert critic is not None  # the core asks only with one (``critiques``)
        request = self._request(
            action.round, action.turns, notices=[action.instructions], review=action.answer
        )
        return await self._observe(critic.model, request, None)

    def _request(
        self,
        step: int,
        turns: list[Turn],
        *,
        notices: list[str],
        tools: list[ToolSchema] | None = None,
        handoffs: list[str] | None = None,
        handed_off_from: HandoffOrigin | None = None,
        review: str | None = None,
        planning: bool = False,
    ) -> ModelRequest:
        """A model's request for this invocation (the critic's: no tools, its ``review``)."""
        inv = self.invocation
        # Built without validation: every value comes from the core's validated state
        # (its turns, its notices) and the agent's tool schemas.
        return built(
            ModelRequest,
            {
                "invocation_id": inv.id,
                "agent_name": inv.agent_name,
                "goal": inv.goal,
                "step": step,
                "turns": self._reveal_turns(turns),
                "tools": tools if tools is not None else [],
                "notices": notices,
                "handoffs": handoffs if handoffs is not None else [],
                "handed_off_from": handed_off_from,
                "review": review,
                "planning": planning,
            },
        )

    async def _observe(
        self,
        model: Model,
        request: ModelRequest,
        model_input: Callable[[], ModelInput] | None,
    ) -> ModelObservation:
        """What one model call gave, bounded by the deadline; interrupted by a cancel request.

        ``model_input``: the digests its decision records (the agent's model), if any.
        """
        deadline = self._deadline()
        scope = trio.CancelScope(deadline=math.inf if deadline is None else deadline)
        if self.cancel_requested:
            scope.cancel()
        self._wait_scope = scope
        observation: ModelObservation | None = None
        self._slot.give_back()  # no slot is held while the model thinks
        try:
            with scope:
                try:
                    reply = await model.decide(request)
                except QuotaWaitError as waiting:  # nothing was sent: the run pauses
                    observation = ModelQuotaWait(until=waiting.until, limit=waiting.limit)
                except BaseException as error:  # a provider's failure is data for the core
                    if is_cancellation(error):
                        raise
                    observation = model_failure(error)
                else:
                    observation = model_answer(
                        reply, model_input() if model_input is not None else None
                    )
        finally:
            self._wait_scope = None
        if observation is None:
            observation = ModelInterrupted() if self.cancel_requested else ModelTimedOut()
        await self._slot.take(mid_turn=False)
        return observation

    # ----------------------------------------------------------------- the policy

    async def _authorise(self, action: Authorise) -> PolicyVerdict:
        """Ask the agent's policy about each call (with its real arguments)."""
        policy = self.agent.policy
        assert policy is not None
        inv = self.invocation
        refused: dict[str, str] = {}
        for call in action.calls:
            tool_ = self.agent.toolbox.tools[call.name]
            # A copy: a policy that changes what it is shown changes nothing that runs.
            arguments = copy.deepcopy(self._reveal_call(action.step, call).arguments)
            deny = await check_access(
                policy,
                AccessRequest(
                    actor=inv.actor,
                    tenant=inv.tenant,
                    operation=tool_.operation,
                    object=arguments.get(tool_.object_from) if tool_.object_from else None,
                    tool=call.name,
                    arguments=arguments,
                ),
            )
            if deny is None:
                continue
            if deny.stop:
                return PolicyVerdict(stop=f"call {call.call_id}: {deny.reason}")
            refused[call.call_id] = f"refused by policy: {deny.reason}"
        return PolicyVerdict(refused=refused)

    # ----------------------------------------------------------------- the tools

    def _on_executed(self, executed: BatchExecuted) -> Action:
        if log.isEnabledFor(logging.DEBUG):
            _log_results(self.invocation.id, executed)
        return self.core.on_executed(
            executed.results, executed.interruption, self._moment(), slept=executed.slept
        )

    async def _run_calls(self, action: RunCalls) -> BatchExecuted:
        """Run calls of the dispatched batch through the ToolActor; honour cancel requests.

        A call whose redacted arguments no secret store holds does not run.
        """
        revealed = [self._reveal_call(action.step, call) for call in action.calls]
        runnable, results = split_unrevealed(revealed)
        if not results:
            # Every call runs: the actor answers one result per call, in call order.
            return await self._execute(action, revealed)
        interruption = Interruption.NONE
        slept: dict[str, datetime] = {}
        if runnable:
            executed = await self._execute(action, runnable)
            results.update((r.call_id, r) for r in executed.results)
            interruption = executed.interruption
            slept = executed.slept
        return BatchExecuted(
            step=action.step,
            results=[results[c.call_id] for c in action.calls],
            interruption=interruption,
            slept=slept,
        )

    async def _execute(self, action: RunCalls, calls: list[DispatchedCall]) -> BatchExecuted:
        """Run calls in the run's nursery; a cancel request stops them (see :class:`BatchRun`)."""
        assert self._nursery is not None
        batch = BatchRun(
            self.agent.toolbox,
            invocation_id=self.invocation.id,
            step=action.step,
            calls=calls,
            plan=action.plan if len(calls) == len(action.calls) else self._plan(calls),
            deadline=self._deadline(),
            attempts=action.attempts,
            grace_s=CANCEL_GRACE_S,
            woken=action.woken,
            woke_at=action.woke_at,
        )
        if self.cancel_requested:
            batch.cancel()  # it starts no call
        self._batch = batch
        self._slot.give_back()  # nor while its tools run
        try:
            executed = await batch.run(self._nursery)
        finally:
            self._batch = None
        await self._slot.take(mid_turn=True)
        if self.core.children_from_code():
            await self._return_children_from_code(executed)
        return self._name_children(executed)

    def _name_children(self, executed: BatchExecuted) -> BatchExecuted:
        """The results, each naming the children its call's body ran (``ToolResult.child_ids``)."""
        named = self.take_children_run_from_code()
        if not named:
            return executed
        results = [
            r.model_copy(update={"child_ids": named[r.call_id]}) if r.call_id in named else r
            for r in executed.results
        ]
        return dataclasses.replace(executed, results=results)

    def _plan(self, calls: Sequence[DispatchedCall]) -> list[list[str]]:
        return self.agent.toolbox.plan(calls)

    # ----------------------------------------------------------------- children from code

    async def reserve_for_child(
        self, call_id: str, child_id: str, key: str | None, asked: Budget
    ) -> Allotment:
        """Set aside (and commit) the share of a child a write's body starts; return it.

        Called by the call's body (``ToolContext.run_agent``) while the batch runs, before
        the child starts: the core decides the share (``TurnCore.reserve_for_child``);
        the ``BudgetReserved`` is committed at once, one child at a time, so that a
        child never starts on a share the store does not hold. A share already set
        aside (the call runs again) is given as it is.

        Raises:
            ToolError: the child may not start (the core's reason), or the share could
                not be committed; then the batch is stopped and the run stops after it
                as after any failed commit (``checkpoint_failed`` or ``lease_lost``).
        """
        async with self._child_commits:
            if self._failed_during_batch is not None:
                raise ToolError(
                    f"not started: its parent {self.invocation.id} could not record its work"
                )
            known = child_id in self.invocation.reservations
            share = self.core.reserve_for_child(call_id, child_id, key, asked, self._moment())
            if isinstance(share, str):
                raise ToolError(share)
            if known:
                return share
            failure = await self._commit_during_batch()
            if failure is not None:
                self._failed_during_batch = failure
                if self._batch is not None:
                    self._batch.cancel()
                why = "its lease" if isinstance(failure, LeaseGone) else failure.message
                raise ToolError(
                    f"not started: its parent {self.invocation.id} could not record the "
                    f"child's share of its budget ({why})"
                )
            return share

    def return_from_child(self, child_id: str, spent: Spent) -> None:
        """A child a write's body started settled: its unused share comes back.

        Recorded now (so the next child's share counts it), committed with the next
        commit of this invocation.
        """
        self.core.return_from_child(child_id, spent, self._moment())

    async def _commit_during_batch(self) -> CommitFailed | LeaseGone | None:
        """Commit the core's pending events while the batch runs; why not, if it failed."""
        inv_id = self.invocation.id
        if self.secrets.has_unsaved(inv_id):
            try:
                await trio.to_thread.run_sync(self.secrets.save, inv_id)
            except Exception as error:
                return CommitFailed(
                    error_type=type(error).__name__, message=str(error), conflict=False
                )
        if self.lease is not None and (self.lease.lost or not self.lease.may_start_calls()):
            return LeaseGone()  # no child starts on a lease that may have run out
        outcome = await self.journal.commit(self.core.take_events())
        match outcome:
            case Committed():
                self._confirmed = (self.invocation.step, self.invocation.tool_calls)
                return None
            case CommitFailed():
                return outcome
            case _:
                assert_never(outcome)

    async def _stop_after_batch(self, failure: CommitFailed | LeaseGone) -> Outcome:
        """The run's outcome when a commit failed while its batch ran."""
        if isinstance(failure, LeaseGone):
            self.core.take_events()  # never committed: the invocation may be another's
            return self._lease_lost()
        return await self._checkpoint_failed(failure)

    async def _return_children_from_code(self, executed: BatchExecuted) -> None:
        """The shares of this batch's children from code that came to an end come back.

        A body that did not wait for its child's outcome (it failed, or was cancelled
        while the child ran) did not return the child's share: a child that ended gives
        what it used; one never started, of a call that has its result, uses nothing.
        A child still running keeps its share set aside. A store that cannot be read
        leaves the shares as they are (logged): too much set aside, never too little.
        """
        ran = {r.call_id: r for r in executed.results if r.call_id not in executed.slept}
        for reserved in list(self.invocation.reservations.values()):
            result = ran.get(reserved.call_id)
            if not reserved.from_code or result is None:
                continue
            try:
                child = await self.reads.invocation(reserved.child_id)
            except InvocationNotFoundError:
                if result.effect_status is not EffectStatus.OUTCOME_UNKNOWN:
                    # The call has its result: its body will not start this child.
                    self.return_from_child(reserved.child_id, Spent())
                continue
            except Exception as error:
                log.warning(
                    "cannot read child %s of %s (%s: %s); its share stays set aside",
                    reserved.child_id,
                    self.invocation.id,
                    type(error).__name__,
                    error,
                    extra=fields(invocation_id=self.invocation.id),
                )
                continue
            if child.terminated is not None:
                self.return_from_child(reserved.child_id, child.spent_in_tree)

    # ----------------------------------------------------------------- the ledger

    async def _load_effects(self, action: LoadEffects) -> dict[str, Effect | None]:
        """The ledger entries of the resumed batch's writes.

        Raises:
            InconsistentHistoryError: one of them is missing (deleted by hand).
        """
        effects = await self.reads.effects(action.keys)
        problem = missing_effects_problem(self.invocation, effects)
        if problem is not None:
            raise InconsistentHistoryError(self.invocation.id, problem)
        return effects

    async def _reconcile(self, action: Reconcile) -> Mapping[str, EffectObservation]:
        """Ask the EffectReconciler about each open write (started on first use)."""
        if self._reconciler_send is None:
            send, inbox = trio.open_memory_channel[ReconcileEffect](0)
            outbox, self._reconciler_replies = trio.open_memory_channel[ReconcileOutcome](1)
            assert self._nursery is not None
            await self._nursery.start(
                partial(run_effect_reconciler, inbox, outbox, toolbox=self.agent.toolbox)
            )
            self._reconciler_send = send
        toolbox = self.agent.toolbox
        answers: dict[str, EffectObservation] = {}
        asked = 0
        for key, tool in action.effects:
            if toolbox.attempt_running(key):
                # An abandoned attempt (a plain function's thread) may still reach the
                # service: wait for it, up to the tool's timeout, before asking.
                grace = min(toolbox.timeout_for(tool), ATTEMPT_GRACE_S)
                if not await toolbox.wait_for_attempt(key, grace):
                    answers[key] = AttemptStillRunning(effect_key=key, waited_s=grace)
                    continue
            # Asked at once (the reconciler answers each in a task of its own), answered
            # as the answers come.
            await self._reconciler_send.send(ReconcileEffect(effect_key=key, tool=tool))
            asked += 1
        for _ in range(asked):
            answer = await self._reconciler_replies.receive()
            answers[answer.effect_key] = answer
        return {key: answers[key] for key, _ in action.effects}  # in the batch's order

    # ----------------------------------------------------------------- the verifier

    async def _verify(self, action: Verify) -> str | None:
        verifier = self.agent.verifier
        assert verifier is not None
        return await run_verifier(verifier, action.answer, self._reveal_turns(action.turns))

    # ----------------------------------------------------------------- commits

    async def _commit(self) -> Outcome | None:
        """Commit the core's pending events (secrets they need first); on failure, stop."""
        inv_id = self.invocation.id
        if self.secrets.has_unsaved(inv_id):
            try:
                await trio.to_thread.run_sync(self.secrets.save, inv_id)
            except Exception as error:
                return await self._checkpoint_failed(
                    CommitFailed(
                        error_type=type(error).__name__, message=str(error), conflict=False
                    )
                )
        if self.lease is not None and self.lease.lost:
            self.core.take_events()  # never committed: the invocation is another holder's
            return self._lease_lost()
        outcome = await self.journal.commit(self.core.take_events())
        match outcome:
            case Committed():
                self._confirmed = (self.invocation.step, self.invocation.tool_calls)
                going_on = stopped(self.invocation.phase) is None
                if self.lease is not None and self.lease.draining and going_on:
                    raise LeaseDrained(self.invocation.id)
                return None
            case CommitFailed():
                return await self._checkpoint_failed(outcome)
            case _:
                assert_never(outcome)

    async def _checkpoint_failed(self, failure: CommitFailed) -> Outcome:
        """The store refused a commit: stop, record nothing, report where the store stands.

        The in-memory invocation is ahead of the store, so it is reloaded; the
        model is not asked again. Nothing more is written: after a conflict the
        invocation is the other worker's; otherwise the store stays at its last
        commit, a consistent point of the turn protocol from which ``resume``
        continues once the store works again.
        """
        reason, detail = stop_after_failed_commit(
            conflict=failure.conflict, error=f"{failure.error_type}: {failure.message}"
        )
        reloaded = await self._reload()
        if reloaded is None:
            # The store does not answer: report the totals it last confirmed.
            steps, tool_calls = self._confirmed
        else:
            steps, tool_calls = reloaded.step, reloaded.tool_calls
        return Outcome(
            invocation_id=self.invocation.id,
            reason=reason,
            answer=None,
            steps=steps,
            tool_calls=tool_calls,
            detail=detail,
        )

    def _lease_lost(self) -> Outcome:
        """This holder lost its lease (or could not renew it): stop, record nothing."""
        assert self.lease is not None
        self.lease.lost = True
        reason, detail = stop_for_lost_lease(self.lease.holder)
        steps, tool_calls = self._confirmed
        return Outcome(
            invocation_id=self.invocation.id,
            reason=reason,
            answer=None,
            steps=steps,
            tool_calls=tool_calls,
            detail=detail,
        )

    async def _reload(self) -> Invocation | None:
        try:
            reloaded = await self.reads.invocation(self.invocation.id)
        except Exception as error:  # the store is down: report without recording
            if not self.outages.failed(f"reloading {self.invocation.id}", error):
                log.warning(
                    "cannot reload %s after a failed commit",
                    self.invocation.id,
                    exc_info=True,
                    extra=fields(invocation_id=self.invocation.id),
                )
            return None
        self.core.invocation = reloaded
        return reloaded

    async def _record_outside_cancellation(self) -> None:
        """The caller's scope was cancelled: record ``cancelled`` (shielded by the caller)."""
        self.invocation.take_events()  # drop anything not yet sent: it was never committed
        reloaded = await self._reload()
        # A cancel requested of this run (its parent's, say) says who asked; else the caller.
        detail = self.cancel_detail if self.cancel_requested else None
        if reloaded is not None and record_outside_cancellation(
            reloaded, at=self.now(), detail=detail
        ):
            await self.journal.commit(reloaded.take_events(), abandon_on_cancel=True)

    # ----------------------------------------------------------------- secrets

    def _reveal_call(self, step: int, call: DispatchedCall) -> DispatchedCall:
        """The call with the real values of its redacted arguments, where they are kept."""
        real = self.secrets.lookup(self.invocation.id, step, call.call_id, "arguments")
        return call if real is MISSING else call.model_copy(update={"arguments": real})

    def _reveal_turns(self, turns: list[Turn]) -> list[Turn]:
        """Turns as the model and the verifier may see them: real values where kept."""
        if not self.agent.toolbox.redacts:
            return turns
        lookup, inv_id = self.secrets.lookup, self.invocation.id
        revealed = []
        for turn in turns:
            decision = turn.decision
            if isinstance(decision, ToolCalls):
                calls = []
                for call in decision.calls:
                    real = lookup(inv_id, turn.step, call.id, "arguments")
                    calls.append(
                        call if real is MISSING else call.model_copy(update={"arguments": real})
                    )
                decision = ToolCalls(calls=calls)
            results: list[ToolResult] = []
            for result in turn.results:
                real = lookup(inv_id, turn.step, result.call_id, "output")
                results.append(
                    result if real is MISSING else result.model_copy(update={"output": real})
                )
            revealed.append(turn.model_copy(update={"decision": decision, "results": results}))
        return revealed


def _log_results(invocation_id: str, executed: BatchExecuted) -> None:
    """One DEBUG record per call of a batch: its tool and outcome, never its output."""
    for result in executed.results:
        outcome = "ok" if result.error is None else result.error.error_class.value
        log.debug(
            "invocation %s step %d: %s %s",
            invocation_id,
            executed.step,
            result.name,
            outcome,
            extra=fields(
                invocation_id=invocation_id,
                step=executed.step,
                tool=result.name,
                outcome=outcome,
                effect_key=result.effect_key,
                effect_status=result.effect_status,
            ),
        )


def _kept(secrets: SecretStore, invocation_id: str, step: int, call_id: str, kind: Kind) -> Any:
    """The real value the secret store holds (for the core's scrubbing), or None."""
    real = secrets.lookup(invocation_id, step, call_id, kind)
    return None if real is MISSING else real


def no_children() -> Mapping[str, list[str]]:
    """No call's body ran children.

    What a Controller without a ``ChildRunner`` takes, or one whose drive is over (its
    runner let go, so that no reference cycle runs through it).
    """
    return {}
