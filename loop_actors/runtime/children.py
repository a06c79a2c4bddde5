"""Child invocations: started, found again and driven by the runtime for a parent's tools.

A call of ``Agent.as_tool`` (or ``ToolContext.run_agent`` in a write tool's body) is
a write in the parent's ledger whose "service" is the store itself: the child's id
derives from the write's effect key, so asking the store whether that child exists
is the write's reconciliation (:meth:`ChildRunner.ask`). A child that does not exist
was never started (the write is dispatched again, under the same key); one that ended
gives its recorded outcome; one that did not is driven on here, or waited for while
another process holds its lease. The rules (ids, shares of the budget, limits) are in
:mod:`aggregates.children`; this module does the I/O.
"""

from __future__ import annotations

from typing import Protocol

import trio

from aggregates.children import (
    MAX_FAN_OUT,
    ChildOutcome,
    ChildSpec,
    ParentEnd,
    ParentLink,
    Spent,
    child_id_of,
    depth_problem,
)
from aggregates.decisions import ErrorClass
from aggregates.effect import Resolution
from aggregates.invocation import Invocation
from aggregates.standing import Standing
from aggregates.turn_messages import ChildWaits
from loop_actors._errors import (
    InvocationExistsError,
    InvocationNotFoundError,
    LeaseHeldError,
    ToolError,
)
from loop_actors.agent.agent import Agent
from loop_actors.agent.tools import ChildPausedError, Reconciled, SleepRequested, ToolContext
from loop_actors.runtime.arguments import StartRequest
from loop_actors.runtime.controller import Controller
from loop_actors.runtime.outcome import Outcome
from loop_actors.store.reader import StoreReader

HELD_POLL_S = 0.2
"""How often a child driven by another process is looked at until it stops."""


class ChildDriver(Protocol):
    """What a :class:`ChildRunner` needs of the Driver that drives the parent."""

    reads: StoreReader
    running: dict[str, Controller]

    async def standing(self, invocation: Invocation) -> Standing:
        """What can happen next to an invocation, looking at the child it waits for."""

    async def start(self, *, request: StartRequest) -> Outcome:
        """Record a new invocation and drive it."""

    async def resume(
        self,
        *,
        invocation_id: str,
        agent: Agent,
        allow_catalogue_change: bool,
        allow_settings_change: bool,
        take_over: bool,
    ) -> Outcome:
        """Drive a recorded invocation on."""


class ChildRunner:
    """The children of one run's invocation (made by the Driver for each drive)."""

    def __init__(self, driver: ChildDriver, parent: Controller) -> None:
        """Start and find the children of the invocation ``parent`` drives."""
        self.driver = driver
        self.parent = parent
        self._started_by_call: dict[str, int] = {}

    # ----------------------------------------------------------------- the tool's side

    async def run(
        self,
        agent: object,
        goal: str,
        context: ToolContext,
        *,
        key: str | None,
        spec: ChildSpec | None,
    ) -> ChildOutcome:
        """Start the child of this call (or find the one it started) and drive it to its end.

        Raises:
            ToolError: it cannot start (see ``ToolContext.run_agent``); nothing started.
            ChildPausedError: it paused for a person.
        """
        if not isinstance(agent, Agent):
            raise ToolError(
                f"run_agent() needs an Agent, got {type(agent).__name__}",
                error_class=ErrorClass.INVALID_ARGUMENTS,
            )
        if not isinstance(goal, str) or not goal.strip():
            raise ToolError(
                "a child's goal must be a non-empty string",
                error_class=ErrorClass.INVALID_ARGUMENTS,
            )
        if key is not None and (not isinstance(key, str) or not key):
            raise ToolError(
                "a child's key must be a non-empty string", error_class=ErrorClass.INVALID_ARGUMENTS
            )
        parent = self.parent.invocation
        effect_key = context.effect_key
        if effect_key is None:
            raise ToolError(
                "run_agent() is for write tools (effect='write'): starting a child is an "
                "effect in the parent's ledger, and its id derives from the call's effect key",
                error_class=ErrorClass.INVALID_ARGUMENTS,
            )
        if context.invocation_id != parent.id:
            raise ToolError(
                f"this context belongs to invocation {context.invocation_id}, not {parent.id}",
                error_class=ErrorClass.INVALID_ARGUMENTS,
            )
        child_id = child_id_of(effect_key, key)
        existing = await self._find(child_id)
        if existing is None:
            edge = spec.on_parent_end if spec is not None else ParentEnd.CANCEL
            outcome = await self._start(agent, goal, context, effect_key, child_id, key, edge)
        else:
            self._check_link(existing, effect_key, key)
            outcome = await self._attach(agent, existing)
        return await self._settled(effect_key, child_id, outcome)

    # ----------------------------------------------------------------- reconciliation

    async def ask(self, agent: object, effect_key: str) -> Reconciled:
        """What became of the child of ``effect_key``: not started, or its outcome.

        A child that has not stopped is driven on here first (or waited for while
        another process drives it).

        Raises:
            ChildPausedError: it is paused for a person (the write stays open).
            ToolError: the agent given is not an Agent.
        """
        if not isinstance(agent, Agent):
            raise ToolError(f"a child tool needs an Agent, got {type(agent).__name__}")
        child_id = child_id_of(effect_key)
        existing = await self._find(child_id)
        if existing is None:
            return Reconciled(status=Resolution.NOT_FOUND)
        self._check_link(existing, effect_key, None)
        outcome = await self._attach(agent, existing)
        try:
            settled = await self._settled(effect_key, child_id, outcome)
        except SleepRequested as sleeping:
            # It sleeps: the call is dispatched again (the same key finds the same
            # child), and sleeps with it.
            return Reconciled(
                status=Resolution.NOT_FOUND,
                reason=f"its child {child_id} sleeps until {sleeping.until.isoformat()}",
            )
        return Reconciled(status=Resolution.COMMITTED, receipt=settled.model_dump(mode="json"))

    # ----------------------------------------------------------------- helpers

    async def _find(self, child_id: str) -> Invocation | None:
        try:
            return await self.driver.reads.invocation(child_id)
        except InvocationNotFoundError:
            return None

    def _check_link(self, child: Invocation, effect_key: str, key: str | None) -> None:
        link = child.parent
        if link is None or link.effect_key != effect_key or link.key != key:
            raise ToolError(
                f"invocation {child.id} exists but was not started by this call "
                f"({effect_key}); it is left as it is"
            )

    async def _start(  # noqa: PLR0917 - one call site, each argument named there
        self,
        agent: Agent,
        goal: str,
        context: ToolContext,
        effect_key: str,
        child_id: str,
        key: str | None,
        edge: ParentEnd,
    ) -> Outcome:
        parent = self.parent.invocation
        problem = depth_problem(parent.depth)
        started = self._started_by_call.get(context.call_id, 0)
        if problem is None and started >= MAX_FAN_OUT:
            problem = f"not started: one call starts at most {MAX_FAN_OUT} children"
        if problem is None and self.parent.cancel_requested:
            problem = f"not started: its parent {parent.id} was cancelled"
        if problem is not None:
            raise ToolError(problem)
        reservation = parent.reservations.get(context.call_id)
        budget = agent.budget
        if reservation is not None and reservation.child_id == child_id:
            budget = reservation.allotment.bound(budget)
        else:
            left = self.parent.seconds_left()
            if left is not None and left > 0:
                deadline = budget.deadline_s
                budget = budget.model_copy(
                    update={"deadline_s": left if deadline is None else min(left, deadline)}
                )
        self._started_by_call[context.call_id] = started + 1
        request = StartRequest(
            agent=agent,
            goal=goal,
            invocation_id=child_id,
            actor=parent.actor,
            tenant=parent.tenant,
            parent=ParentLink(
                parent_id=parent.id,
                root_id=parent.parent.root_id if parent.parent is not None else parent.id,
                call_id=context.call_id,
                effect_key=effect_key,
                key=key,
                depth=parent.depth + 1,
                on_parent_end=edge,
            ),
            budget=budget,
        )
        # A cancel of the parent from here on reaches the child when the Driver
        # registers its run (``Driver.inherit_cancel``): it starts cancelled.
        try:
            return await self.driver.start(request=request)
        except InvocationExistsError:
            # Started meanwhile (another attempt of this call): that one is the child.
            return await self._attach(agent, await self.driver.reads.invocation(child_id))

    async def _attach(self, agent: Agent, child: Invocation) -> Outcome:
        """Drive a recorded child on to its end or pause, or wait while another drives it."""
        take_over = False
        while True:
            if await self.driver.standing(child) not in (Standing.DRIVABLE, Standing.SLEEPING):
                return Outcome.of(child)  # a sleeping child is resumed: woken if it is due
            if child.id not in self.driver.running:
                try:
                    return await self.driver.resume(
                        invocation_id=child.id,
                        agent=agent,
                        allow_catalogue_change=False,
                        allow_settings_change=False,
                        take_over=take_over,
                    )
                except LeaseHeldError as held:
                    # The holder this run took its parent over from held the child too
                    # (one process drives a tree): it is gone, so the child is taken over.
                    # Any other holder drives it now: wait for it to stop.
                    take_over = held.holder == self.parent.invocation.lease_taken_from
                    if take_over:
                        continue
            await trio.sleep(HELD_POLL_S)
            child = await self.driver.reads.invocation(child.id)

    async def _settled(self, effect_key: str, child_id: str, outcome: Outcome) -> ChildOutcome:
        """The child's outcome as the parent's call gives it (what it spent included).

        Raises:
            ChildPausedError: the child paused (its pause, and the path down to the
                invocation that waits, for the parent's).
        """
        child = await self.driver.reads.invocation(child_id)
        paused = child.paused
        if outcome.paused and paused is not None and paused.wake_at is not None:
            # The child sleeps: so does the call that runs it, until the child is due;
            # called again then, it finds the child and drives it on.
            raise SleepRequested(paused.wake_at)
        if outcome.paused and paused is not None:
            raise ChildPausedError(
                ChildWaits(
                    effect_key=effect_key,
                    path=[child_id, *(paused.child_path or [])],
                    reason=paused.reason,
                    question=paused.question,
                    proposal_digest=paused.proposal_digest,
                    calls=paused.calls,
                    needs_approval=paused.needs_approval,
                )
            )
        own = Spent(
            steps=child.step,
            tool_calls=child.tool_calls,
            tokens=child.input_tokens + child.output_tokens,
            cost=child.cost,
        )
        return ChildOutcome(
            child_id=child_id,
            terminal_reason=outcome.reason,
            answer=outcome.answer,
            detail=outcome.detail,
            spent=own.plus(child.children_spent).plus(child.reserved),
        )
