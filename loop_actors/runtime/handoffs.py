"""Following handoffs: the target of an invocation that ended ``handed_off`` starts (once).

The rules (the target's id, what it is told, the chain's bound) are in
:mod:`aggregates.handoffs`; this module starts or finds each target and drives it, for
``Runtime.run`` and ``Runtime.resume``, until an invocation of the chain ends otherwise.
"""

from __future__ import annotations

from aggregates.decisions import Handoff, TerminalReason
from aggregates.handoffs import HandoffOrigin, handoff_id_of, seed_of
from aggregates.invocation import Invocation
from loop_actors._errors import InvocationExistsError, InvocationNotFoundError
from loop_actors._logs import package_logger
from loop_actors.agent.agent import Agent
from loop_actors.runtime.arguments import StartRequest
from loop_actors.runtime.driver import Driver
from loop_actors.runtime.outcome import Outcome

log = package_logger(__name__)


async def follow_handoffs(driver: Driver, outcome: Outcome, agent: Agent) -> Outcome:
    """The last outcome of the chain ``outcome`` starts, with the chain of ids.

    ``agent`` is the agent of ``outcome``'s invocation: its ``handoffs`` name the
    targets. A target that exists (started before a crash, or driven by another
    process) is driven on or read, never started twice.

    Raises:
        As ``Runtime.resume`` (for a target that exists), ``Runtime.run`` (for one
        that starts).
    """
    chain = [outcome.invocation_id]
    while outcome.reason is TerminalReason.HANDED_OFF:
        source = await driver.reads.invocation(outcome.invocation_id)
        target = target_of(source, agent)
        if target is None:
            break
        request, agent = target
        outcome = await _target_outcome(driver, request)
        chain.append(outcome.invocation_id)
    if len(chain) == 1:
        return outcome
    return outcome.model_copy(update={"chain": chain})


async def submit_target(driver: Driver, source: Invocation, agent: Agent) -> None:
    """Submit the target of ``source`` (which ended ``handed_off``) for any worker to claim.

    What a worker does when a run it drives hands off: the target is a runnable
    invocation of its agent, recorded once (a second submission finds it).

    Raises:
        StoreUnavailableError: it cannot be recorded now; submitting again is safe.
    """
    target = target_of(source, agent)
    if target is None:
        return
    request, _ = target
    try:
        await driver.submit(request=request)
    except InvocationExistsError:  # pragma: no cover - the target's id is the source's own
        log.warning("the target of %s exists for another goal or agent", source.id)


def target_of(source: Invocation, agent: Agent) -> tuple[StartRequest, Agent] | None:
    """The start of the target ``source`` handed off to, and its agent.

    ``agent`` is the source's: its ``handoffs`` name the target. None (logged) when
    it no longer hands off to the agent the decision names: the chain stops there.
    """
    decision = source.last_decision
    if not isinstance(decision, Handoff):  # pragma: no cover - the core ends so only after one
        return None
    route = agent.handoffs.get(decision.to)
    if route is None:
        log.warning(
            "invocation %s handed off to %r, which agent %s no longer hands off to; "
            "the chain stops there",
            source.id,
            decision.to,
            agent.name,
        )
        return None
    came = source.handed_off_from
    origin = HandoffOrigin(
        source_id=source.id,
        source_agent=source.agent_name,
        reason=decision.reason,
        history=route.history,
        seed=seed_of(route.history, list(source.turns)[:-1], decision.summary),
        hops=(came.hops + 1) if came is not None else 1,
        chain_root=came.chain_root if came is not None else source.id,
    )
    request = StartRequest(
        agent=route.agent,
        goal=source.goal,
        invocation_id=handoff_id_of(source.id),
        task_class=source.task_class,
        actor=source.actor,
        tenant=source.tenant,
        handed_off_from=origin,
    )
    return request, route.agent


async def _target_outcome(driver: Driver, request: StartRequest) -> Outcome:
    target_id = str(request.invocation_id)
    try:
        await driver.reads.invocation(target_id)
    except InvocationNotFoundError:
        pass
    else:
        return await _drive_existing(driver, target_id, request.agent)
    try:
        return await driver.start(request=request)
    except InvocationExistsError:
        # Started meanwhile by another follower of this chain: that one is the target.
        return await _drive_existing(driver, target_id, request.agent)


async def _drive_existing(driver: Driver, target_id: str, target: Agent) -> Outcome:
    return await driver.resume(
        invocation_id=target_id,
        agent=target,
        allow_catalogue_change=False,
        allow_settings_change=False,
        take_over=False,
    )
