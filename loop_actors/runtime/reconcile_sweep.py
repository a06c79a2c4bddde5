"""The reconcile sweep: settle the open effects of one agent's invocations."""

from __future__ import annotations

from collections.abc import Collection
from functools import partial

from aggregates.decisions import Frozen, TerminalReason
from aggregates.effect import Effect, Settler, who_settles
from aggregates.invocation import Invocation, Phase
from aggregates.turn import EffectAnswered, settle_ended_effect
from loop_actors._errors import LeaseHeldError
from loop_actors._logs import effect_key_hash, fields, package_logger
from loop_actors._messages import Committed, ReconcileEffect
from loop_actors.agent.agent import Agent
from loop_actors.agent.tools import using_child_runs
from loop_actors.runtime.children import EndedParentChildren
from loop_actors.runtime.driver import Driver, DriverSource
from loop_actors.runtime.outcome import Outcome
from loop_actors.runtime.reconciler import reconcile_effect

log = package_logger(__name__)


class NeedsPerson(Frozen):
    """An open effect that no sweep can settle: only a person can (``resolve_effect``)."""

    effect_key: str
    invocation_id: str
    tool: str
    why: str
    """Why no service can be asked (the tool has no ``reconcile``, or the agent no such tool)."""


class ReconcileReport(Frozen):
    """What a sweep of the effect ledger did."""

    resumed: list[Outcome]
    """Invocations that were paused for reconciliation and were resumed, with their outcomes."""
    effects_settled: int
    effects_open: int
    """Effects still open after the sweep (all agents)."""
    left_running: list[str]
    """Invocations with open effects that may still be running; resume them to settle."""
    needs_person: list[NeedsPerson] = []
    """Open effects of this agent's invocations that only a person can settle."""
    effects_waiting: int = 0
    """Open effects of this agent's invocations that a later sweep or resume may settle
    (the service was unreachable, or the invocation may still be running)."""
    invocations_waiting: int = 0
    """This agent's invocations still paused ``reconciliation_required`` after the sweep
    (resumed and paused again, or being resumed by another process): a later sweep
    resumes them again."""


def unaskable_reason(agent: Agent, tool_name: str) -> str | None:
    """Why no sweep can ask the service of a write of this tool (None: it can be asked)."""
    tool_ = agent.toolbox.tools.get(tool_name)
    if tool_ is None:
        return f"agent {agent.name!r} has no tool {tool_name!r} now"
    if tool_.reconcile is None:
        return f"tool {tool_name} has no reconcile function"
    return None


class ReconcileSweep:
    """``Runtime.reconcile``: one sweep of the effect ledger for one agent."""

    def __init__(self, source: DriverSource) -> None:
        """A sweep through ``source``'s Driver (the runtime opens for it if closed)."""
        self._source = source

    async def run(
        self, agent: Agent, *, invocation_ids: Collection[str] | None = None
    ) -> ReconcileReport:
        """Sweep the effect ledger: settle the open effects of ``agent``'s invocations.

        ``invocation_ids``: only these of them (the console's bulk reconcile over a
        filter); None: all of them.

        Every invocation of ``agent`` paused with ``reconciliation_required`` is
        resumed (its effects are reconciled, a write its service did not know is
        dispatched again with its key, then the loop continues), whether or not an
        effect of it is still open: a write dispatched again until the pause's bound
        ends ``prepared``, and one settled by hand is no longer open either. Open
        effects of invocations that already ended are reconciled and recorded.
        Effects of an invocation that may still be running elsewhere (dispatched, not
        paused) are left alone: resume that invocation to settle them.

        Cancellation: as :meth:`resume`, for the invocation being resumed.
        """
        only = None if invocation_ids is None else frozenset(invocation_ids)
        return await self._source.with_driver(partial(self._sweep, agent, only))

    async def _sweep(
        self, agent: Agent, only: frozenset[str] | None, driver: Driver
    ) -> ReconcileReport:
        open_effects = await driver.reads.open_effects()
        by_invocation: dict[str, list[Effect]] = {}
        for effect in open_effects:
            by_invocation.setdefault(effect.invocation_id, []).append(effect)
        paused = {i.id: i for i in await driver.reads.paused_for_reconciliation()}
        outcomes: list[Outcome] = []
        settled = 0
        left_alone: list[str] = []
        waiting: set[str] = set()
        swept: set[str] = set()
        ended: set[str] = set()
        for invocation_id in dict.fromkeys([*by_invocation, *paused]):
            if only is not None and invocation_id not in only:
                continue  # not asked for: another sweep settles it
            effects = by_invocation.get(invocation_id, [])
            if invocation_id in paused:
                invocation = paused[invocation_id]
            else:
                invocation = await driver.reads.invocation(invocation_id)
            if invocation.agent_name != agent.name:
                continue  # another agent's: its own sweep resumes it
            swept.add(invocation_id)
            if invocation.phase is Phase.TERMINATED:
                ended.add(invocation_id)
            if invocation.paused_for_reconciliation:
                try:
                    invocation, lease = await driver.take_lease(invocation, take_over=False)
                except LeaseHeldError:
                    left_alone.append(invocation_id)  # another process is resuming it
                    waiting.add(invocation_id)
                    continue
                outcome = await driver.drive_leased(invocation, agent, lease)
                outcomes.append(outcome)
                if outcome.reason is TerminalReason.RECONCILIATION_REQUIRED:
                    waiting.add(invocation_id)
                elif not outcome.paused:
                    settled += len(effects)
            elif invocation.phase is Phase.TERMINATED:
                settled += await self._settle_ended(invocation, effects, agent, driver)
            else:
                left_alone.append(invocation_id)
        still_open = await driver.reads.open_effects()
        needs_person: list[NeedsPerson] = []
        effects_waiting = 0
        for effect in still_open:
            if effect.invocation_id not in swept:
                continue  # another agent's: its own sweep reports it
            if effect.invocation_id in left_alone:
                effects_waiting += 1  # it may still be running: resume it to settle
                continue
            why = unaskable_reason(agent, effect.tool)
            settler = who_settles(
                invocation_ended=effect.invocation_id in ended, service_can_be_asked=why is None
            )
            if settler is Settler.SWEEPER or why is None:
                effects_waiting += 1
                continue
            needs_person.append(
                NeedsPerson(
                    effect_key=effect.key,
                    invocation_id=effect.invocation_id,
                    tool=effect.tool,
                    why=why,
                )
            )
        return ReconcileReport(
            resumed=outcomes,
            effects_settled=settled,
            effects_open=len(still_open),
            left_running=left_alone,
            needs_person=needs_person,
            effects_waiting=effects_waiting,
            invocations_waiting=len(waiting),
        )

    async def _settle_ended(
        self, invocation: Invocation, effects: list[Effect], agent: Agent, driver: Driver
    ) -> int:
        settled = 0
        for effect in effects:
            # A child tool's ``reconcile`` asks the store what became of its child.
            with using_child_runs(EndedParentChildren(driver.reads)):
                answer = await reconcile_effect(
                    agent.toolbox, ReconcileEffect(effect_key=effect.key, tool=effect.tool)
                )
            if not isinstance(answer, EffectAnswered):
                continue
            # Redacted, scrubbed and size-limited like every receipt and reason (the core's rule).
            problem = settle_ended_effect(
                invocation,
                effect,
                answer,
                agent.toolbox,
                max_bytes=agent.settings.output_limit,
                at=driver.now(),
            )
            if problem is not None:
                log.warning(
                    "effect %s of invocation %s (tool %s) left open: %s",
                    effect_key_hash(effect.key),
                    invocation.id,
                    effect.tool,
                    problem,
                    extra=fields(
                        invocation_id=invocation.id, tool=effect.tool, effect_key=effect.key
                    ),
                )
                continue
            outcome = await driver.journal.commit(effect.take_events())
            if isinstance(outcome, Committed):
                settled += 1
        return settled
