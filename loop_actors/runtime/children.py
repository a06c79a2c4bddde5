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

import contextlib
from typing import NamedTuple, Protocol

import trio

from aggregates.children import (
    ChildOutcome,
    ChildSpec,
    ParentEnd,
    ParentLink,
    child_id_of,
    depth_problem,
    parent_cancelled,
)
from aggregates.decisions import Budget, ErrorClass
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
from loop_actors._logs import fields, package_logger
from loop_actors.agent.agent import Agent
from loop_actors.agent.tools import ChildPausedError, Reconciled, SleepRequested, ToolContext
from loop_actors.runtime.arguments import StartRequest
from loop_actors.runtime.controller import Controller
from loop_actors.runtime.outage import one_line
from loop_actors.runtime.outcome import Outcome
from loop_actors.store.reader import StoreReader

HELD_POLL_S = 0.2
"""How often a child driven by another process is looked at until it stops."""

CANCEL_CHILD_S = 5.0
"""How long a cancelled parent tries to record the cancel request of a child driven elsewhere."""

log = package_logger(__name__)


class OfferedChildren(NamedTuple):
    """A worker's offer of its runs' children to the workers of its store."""

    agent_names: frozenset[str]
    """The agents whose children are submitted (those the workers serve); a child of
    another agent is driven at once by the run that starts it."""
    within_s: float
    """How long a submitted child is left for a worker to claim before the run that
    started it drives it itself (every worker may be busy)."""


class ChildDriver(Protocol):
    """What a :class:`ChildRunner` needs of the Driver that drives the parent."""

    reads: StoreReader
    running: dict[str, Controller]
    offer_children: OfferedChildren | None

    async def submit(self, *, request: StartRequest) -> str:
        """Record a new invocation as runnable, for any worker to claim."""

    async def request_cancel(
        self, *, invocation_id: str, by: str | None, reason: str | None
    ) -> object:
        """Record a cancel request and act on it here."""

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
        self._run_from_code: dict[str, list[str]] = {}
        """The children each call's body ran (``run_agent``) in the batch under way, in
        order, by call id (taken when the batch has its results)."""

    # ----------------------------------------------------------------- the tool's side

    async def run(
        self,
        agent: object,
        goal: str,
        context: ToolContext,
        *,
        key: str | None,
        spec: ChildSpec | None,
        budget: Budget | None = None,
    ) -> ChildOutcome:
        """Start the child of this call (or find the one it started) and drive it to its end.

        ``spec``: the child tool's, for the call of a child tool (its share was set aside
        with the batch); None for a child the call's body starts, whose share is set
        aside now (``budget``: what it asks for; None: its agent's budget) and comes back
        when it settles.

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
        if budget is not None and not isinstance(budget, Budget):
            raise ToolError(
                f"a child's budget must be a Budget, got {type(budget).__name__}",
                error_class=ErrorClass.INVALID_ARGUMENTS,
            )
        child_id = child_id_of(effect_key, key)
        existing = await self._find(child_id)
        if existing is None:
            edge = spec.on_parent_end if spec is not None else ParentEnd.CANCEL
            asked = None if spec is not None else (budget or agent.budget)
            outcome = await self._start(
                agent, goal, context, effect_key, child_id, key, edge, asked
            )
        else:
            self._check_link(existing, effect_key, key)
            if spec is None:
                self._name(context.call_id, child_id)
            outcome = await self._attach(agent, existing)
        settled = await self._settled(effect_key, child_id, outcome)
        if spec is None and not settled.terminal_reason.pauses:
            self.parent.return_from_child(child_id, settled.spent)
        return settled

    def _name(self, call_id: str, child_id: str) -> None:
        """Note a child the body of ``call_id`` runs: its result names it."""
        named = self._run_from_code.setdefault(call_id, [])
        if child_id not in named:
            named.append(child_id)

    def take_run_from_code(self) -> dict[str, list[str]]:
        """The children each call's body ran (or found) since the last take, by call id."""
        taken, self._run_from_code = self._run_from_code, {}
        return taken

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
        asked: Budget | None,
    ) -> Outcome:
        """Start a child that does not exist (``asked``: for a child from code, its budget)."""
        parent = self.parent.invocation
        problem = depth_problem(parent.depth)
        if problem is None and self.parent.cancel_requested:
            problem = f"not started: its parent {parent.id} was cancelled"
        if problem is not None:
            raise ToolError(problem)
        if asked is not None:
            # A child from code: its share is set aside (and committed) before it starts,
            # then it is named, as a batch names a child tool's child.
            await self.parent.reserve_for_child(context.call_id, child_id, key, asked)
            self._name(context.call_id, child_id)
        reservation = self.parent.invocation.reservations.get(child_id)
        budget = agent.budget
        if reservation is not None:
            budget = reservation.allotment.bound(budget)
        else:  # a child tool's child recorded before shares were: its deadline, at least
            left = self.parent.seconds_left()
            if left is not None and left > 0:
                deadline = budget.deadline_s
                budget = budget.model_copy(
                    update={"deadline_s": left if deadline is None else min(left, deadline)}
                )
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
        offer = self.driver.offer_children
        if offer is not None and agent.name in offer.agent_names:
            # A worker's run: the child is runnable for any worker of the store (its
            # agent is served by those that serve the parent's); a cancel of the parent
            # reaches it as a recorded cancel request (``_wait_elsewhere``).
            with contextlib.suppress(InvocationExistsError):  # ``_check_link`` refuses it
                await self.driver.submit(request=request)
            child = await self.driver.reads.invocation(child_id)
            self._check_link(child, effect_key, key)
            return await self._attach(
                agent, child, offered_until=trio.current_time() + offer.within_s
            )
        # A cancel of the parent from here on reaches the child when the Driver
        # registers its run (``Driver.inherit_cancel``): it starts cancelled.
        try:
            return await self.driver.start(request=request)
        except InvocationExistsError:
            # Started meanwhile (another attempt of this call): that one is the child.
            return await self._attach(agent, await self.driver.reads.invocation(child_id))

    async def _attach(
        self, agent: Agent, child: Invocation, *, offered_until: float | None = None
    ) -> Outcome:
        """Drive a recorded child on to its end or pause, or wait while another drives it.

        ``offered_until``: until then (trio's clock) the child is left to the workers
        (it was just submitted); after that, if no worker holds it, it is driven here.
        """
        take_over = False
        while True:
            if await self.driver.standing(child) not in (Standing.DRIVABLE, Standing.SLEEPING):
                return Outcome.of(child)  # a sleeping child is resumed: woken if it is due
            offered = offered_until is not None and trio.current_time() < offered_until
            if child.id not in self.driver.running and not offered:
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
            child = await self._wait_elsewhere(child)

    async def _wait_elsewhere(self, child: Invocation) -> Invocation:
        """Wait a moment while another run (here or in another process) drives ``child``.

        Cancellation: when the parent itself was cancelled or ran out of time, a child
        whose edge says ``cancel`` is asked to stop by a recorded cancel request (the
        process driving it sees it within about a second), then ``trio.Cancelled`` is
        re-raised. A worker that stops (its runs drained or abandoned) leaves the child
        as it is: it goes on where it runs, and the parent's next drive finds it.
        """
        try:
            await trio.sleep(HELD_POLL_S)
            return await self.driver.reads.invocation(child.id)
        except trio.Cancelled:
            parent = self.parent
            left = parent.seconds_left()
            link = child.parent
            ends = parent.cancel_requested or (left is not None and left <= 0)
            if ends and link is not None and link.on_parent_end is ParentEnd.CANCEL:
                detail = parent.cancel_detail if parent.cancel_requested else "out of time"
                await self._cancel_elsewhere(
                    child.id, parent_cancelled(parent.invocation.id, detail)
                )
            raise

    async def _cancel_elsewhere(self, child_id: str, reason: str) -> None:
        """Record a cancel request for a child driven elsewhere (shielded, bounded, logged)."""
        with trio.CancelScope(shield=True), trio.move_on_after(CANCEL_CHILD_S) as bound:
            try:
                await self.driver.request_cancel(invocation_id=child_id, by=None, reason=reason)
            except Exception as error:  # the child goes on; its parent's next drive finds it
                log.warning(
                    "cannot ask child %s to stop (%s: %s); it goes on",
                    child_id,
                    type(error).__name__,
                    one_line(error),
                    extra=fields(invocation_id=child_id, error_type=type(error).__name__),
                )
        if bound.cancelled_caught:
            log.warning(
                "cannot ask child %s to stop within %g s; it goes on", child_id, CANCEL_CHILD_S
            )

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
        return child_outcome_of(child, outcome)


def child_outcome_of(child: Invocation, outcome: Outcome) -> ChildOutcome:
    """A child's outcome as its parent's call gives it, with what it (and its own) spent."""
    return ChildOutcome(
        child_id=child.id,
        terminal_reason=outcome.reason,
        answer=outcome.answer,
        detail=outcome.detail,
        spent=child.spent_in_tree,
    )


class EndedParentChildren:
    """The children of an invocation that ended, as the reconcile sweep asks after them.

    Read only: nothing is started or driven (a parent that ended drives no child). A
    child that ended gives its outcome; one never started was not (``not_found``); one
    that has not ended cannot be answered yet (its write waits: it may end by itself).
    """

    def __init__(self, reads: StoreReader) -> None:
        """Ask ``reads`` for the children."""
        self.reads = reads

    async def run(
        self,
        agent: object,
        goal: str,
        context: ToolContext,
        *,
        key: str | None,
        spec: ChildSpec | None,
        budget: Budget | None = None,
    ) -> ChildOutcome:
        """Refused: no child starts for an invocation that ended."""
        del agent, goal, key, spec, budget
        raise ToolError(f"invocation {context.invocation_id} has ended: it starts no child")

    async def ask(self, agent: object, effect_key: str) -> Reconciled:
        """What became of the child of ``effect_key``.

        Raises:
            ToolError: it has not ended (the write stays open), or ``agent`` is not an Agent.
        """
        if not isinstance(agent, Agent):
            raise ToolError(f"a child tool needs an Agent, got {type(agent).__name__}")
        child_id = child_id_of(effect_key)
        try:
            child = await self.reads.invocation(child_id)
        except InvocationNotFoundError:
            return Reconciled(status=Resolution.NOT_FOUND)
        if child.terminated is None:
            raise ToolError(f"its child {child_id} has not ended")
        outcome = child_outcome_of(child, Outcome.of(child))
        return Reconciled(status=Resolution.COMMITTED, receipt=outcome.model_dump(mode="json"))
