"""Replay: re-drive recorded invocations under an agent, calling nothing, writing nothing back.

For each recorded invocation, the given agent (the same tools by name; its budget,
policies, approval rules, verifier and compaction may differ) is driven in a store of
its own (``memory://`` unless told otherwise) with a model that answers the recorded
decisions step by step and tools that answer the recorded results. No tool function,
service, write or model is called, and the source store is only read. The recorded
people's decisions (approvals, denials, answers) are given again at the same steps.
Where the replay departs from the recorded run is the core's judgement
(``aggregates.replay``): that is what the loop's change did.
"""

from __future__ import annotations

import copy
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from functools import partial
from typing import Any, assert_never

from pydantic import JsonValue

from aggregates.critic import Verdict
from aggregates.decisions import CannotContinue, ErrorClass, Frozen, TerminalReason, ToolResult
from aggregates.invocation_events import (
    ApprovalDenied,
    ApprovalGranted,
    ClarificationProvided,
    CritiqueReturned,
    DecisionProposed,
    InvocationEvent,
    InvocationStarted,
    Paused,
    ResultsCommitted,
    SleepEnded,
    Terminated,
)
from aggregates.replay import Divergence, DivergenceKind, History, divergences
from loop_actors._errors import (
    InvocationNotFoundError,
    StoreUnavailableError,
    ToolError,
    UsageError,
)
from loop_actors._messages import ModelReply, ModelRequest
from loop_actors.agent.agent import Agent
from loop_actors.agent.model import model_identity
from loop_actors.agent.tools import SleepRequested, Tool, ToolContext
from loop_actors.runtime.arguments import StartRequest
from loop_actors.runtime.driver import Driver
from loop_actors.runtime.outcome import Outcome
from loop_actors.store.url import redacted_url


class ReplayMatch(StrEnum):
    """How a replayed call finds its recorded result."""

    STRICT = "strict"
    """By step and call id; the replay stops being compared at the first departure."""
    LENIENT = "lenient"
    """By step, tool and order; argument drift and calls left over are reported, and it goes on."""


class ReplayFilter(Frozen):
    """Which recorded invocations to replay (``--where reason=R,agent=A,task_class=C``)."""

    reason: TerminalReason | None = None
    """How it stopped (its terminal reason, or the reason it is paused)."""
    agent: str | None = None
    """The agent that ran it."""
    task_class: str | None = None

    @classmethod
    def parse(cls, text: str) -> ReplayFilter:
        """``reason=max_steps,agent=payer``: each condition ``name=value``, comma-separated.

        Raises:
            UsageError: an unknown name, a condition without ``=``, an unknown reason.
        """
        given: dict[str, str] = {}
        for part in (p.strip() for p in text.split(",")):
            if not part:
                continue
            name, sep, value = part.partition("=")
            name = name.strip()
            if not sep or not value.strip():
                raise UsageError(f"--where: {part!r} is not name=value")
            if name not in cls.model_fields:
                known = ", ".join(cls.model_fields)
                raise UsageError(f"--where: unknown condition {name!r} (known: {known})")
            given[name] = value.strip()
        if "reason" in given:
            try:
                TerminalReason(given["reason"])
            except ValueError:
                known = ", ".join(r.value for r in TerminalReason)
                raise UsageError(
                    f"--where: unknown reason {given['reason']!r} (known: {known})"
                ) from None
        return cls.model_validate(given)

    def admits(self, history: History, task_class: str | None) -> bool:
        """Whether a recorded invocation meets every condition."""
        return (
            (self.reason is None or history.stopped_for is self.reason)
            and (self.agent is None or history.agent_name == self.agent)
            and (self.task_class is None or task_class == self.task_class)
        )


class ReplayResult(Frozen):
    """One recorded invocation replayed."""

    invocation_id: str
    recorded_agent: str
    """The agent that ran it."""
    recorded: TerminalReason | None
    """How the recorded run stopped (None: it has not)."""
    replayed: TerminalReason | None
    """How the replay stopped (None: it has not, or it went past the recording)."""
    past_recording: bool = False
    """The replay asked for a decision the recorded run never made, and stopped there."""
    identical: bool
    """No departure: the replay is the recorded run."""
    divergences: list[Divergence]
    """The departures, in step order (a strict replay: up to the first that stops it)."""
    notes: list[str] = []
    """What the replay could not judge (e.g. no digest of the model's requests recorded)."""

    @property
    def first(self) -> Divergence | None:
        """The first departure, if any."""
        return self.divergences[0] if self.divergences else None


class ReplayReport(Frozen):
    """Every replayed invocation, and how many now end differently."""

    agent: str
    """The agent replayed with."""
    match: ReplayMatch
    results: list[ReplayResult]

    @property
    def identical(self) -> bool:
        """Whether every replay is identical to its recorded run."""
        return all(r.identical for r in self.results)

    @property
    def diverged(self) -> int:
        """How many replays depart from their recorded run."""
        return sum(1 for r in self.results if not r.identical)

    def endings(self) -> list[tuple[str, str, int]]:
        """(recorded reason, replayed reason, how many) of the runs that end differently."""
        counted: dict[tuple[str, str], int] = {}
        for result in self.results:
            if result.recorded is None:
                continue  # an unfinished recorded run has no ending to compare
            if result.recorded != result.replayed or result.past_recording:
                new = "past_recording" if result.past_recording else _shown(result.replayed)
                key = (_shown(result.recorded), new)
                counted[key] = counted.get(key, 0) + 1
        return [(old, new, n) for (old, new), n in sorted(counted.items())]


def _shown(reason: TerminalReason | None) -> str:
    return "running" if reason is None else reason.value


# --------------------------------------------------------------------------- the stand-ins


@dataclass
class _Recording:
    """What a recorded invocation answered: its decisions by step, its results by call.

    And its sleeps: the calls that slept (``ctx.sleep_until``) by step and call id,
    with the time they slept until, and the wakes recorded at each step, in order.
    """

    decisions: dict[int, DecisionProposed]
    results: dict[int, list[ToolResult]]
    match: ReplayMatch
    slept: dict[tuple[int, str], datetime] = field(default_factory=dict)
    wakes: dict[int, list[SleepEnded]] = field(default_factory=dict)
    critiques: dict[int, CritiqueReturned] = field(default_factory=dict)
    """The critic's rounds, by round."""
    step: int = 0
    """The step the replay's model was last asked for (its batch is the one that runs)."""
    served: dict[tuple[int, str], int] = field(default_factory=dict)
    past_recording: bool = False

    @classmethod
    def of(cls, events: Sequence[InvocationEvent], match: ReplayMatch) -> _Recording:
        recording = cls(decisions={}, results={}, match=match)
        for event in events:
            if isinstance(event, DecisionProposed):
                recording.decisions[event.step] = event
            elif isinstance(event, ResultsCommitted):
                recording.results[event.step] = list(event.results)
            elif isinstance(event, Paused) and event.wake_at is not None:
                for call_id in event.sleeping_calls or ():
                    recording.slept.setdefault((event.step, call_id), event.wake_at)
            elif isinstance(event, SleepEnded):
                recording.wakes.setdefault(event.step, []).append(event)
            elif isinstance(event, CritiqueReturned):
                recording.critiques[event.round] = event
        return recording

    def sleeps(self, call_id: str, context: ToolContext) -> datetime | None:
        """When a call sleeps until, if it slept in the recorded run and has not slept yet."""
        until = self.slept.get((self.step, call_id))
        if until is None or (context.slept_until is not None and context.slept_until >= until):
            return None
        return until

    def result_for(self, name: str, call_id: str) -> ToolResult | None:
        """The recorded result this call is answered with (None: the run made no such call)."""
        recorded = self.results.get(self.step, [])
        if self.match is ReplayMatch.STRICT:
            return next((r for r in recorded if r.call_id == call_id and r.name == name), None)
        order = self.served.get((self.step, name), 0)
        self.served[(self.step, name)] = order + 1
        same_tool = [r for r in recorded if r.name == name]
        return same_tool[order] if order < len(same_tool) else None


class ReplayModel:
    """A model that answers each step with the recorded decision (and its recorded usage).

    Asked for a step the recorded run never decided, it answers ``cannot_continue``
    (the replay then ends; the comparison reports it ``past_recording``). A recorded
    proposal that was refused is proposed again as the model sent it.
    """

    def __init__(self, recording: _Recording, identity: str) -> None:
        self._recording = recording
        self.model_identity = identity
        """The replayed agent's model: the requests' digests name it, not this stand-in."""

    async def decide(self, request: ModelRequest) -> ModelReply:
        """The recorded decision of ``request.step``."""
        recording = self._recording
        recording.step = request.step
        recorded = recording.decisions.get(request.step)
        if recorded is None:
            recording.past_recording = True
            reason = f"replay: the recorded run made no decision at step {request.step}"
            return ModelReply(proposal=CannotContinue(reason=reason))
        proposal: Any = recorded.decision
        if proposal is None and recorded.rejection is not None:
            proposal = recorded.rejection.raw
        return ModelReply(proposal=proposal, usage=recorded.usage)


class ReplayCritic:
    """A critic's model that answers each round with the recorded verdict (and its usage).

    A recorded ``revise`` or ``accept`` is replied again; a round that gave no verdict, or
    one the recorded run never had, is replied with a reply that is none (a spent round
    again): a replay never accepts an answer the recorded critic did not.
    """

    def __init__(self, recording: _Recording) -> None:
        self._recording = recording

    async def decide(self, request: ModelRequest) -> ModelReply:
        """The recorded verdict of round ``request.step``."""
        recorded = self._recording.critiques.get(request.step)
        if recorded is None:
            reason = f"replay: the recorded run had no critic round {request.step}"
            return ModelReply(proposal={"kind": "none", "reason": reason})
        match recorded.verdict:
            case Verdict.ACCEPT:
                proposal: Any = {"kind": "accept"}
            case Verdict.REVISE:
                proposal = {"kind": "revise", "critique": recorded.critique}
            case Verdict.MALFORMED | Verdict.FAILED:
                proposal = {"kind": "none", "reason": recorded.problem}
            case _:
                assert_never(recorded.verdict)
        return ModelReply(proposal=proposal, usage=recorded.usage)


def _replayed_tool(real: Tool, recording: _Recording) -> Tool:
    """``real`` answering with the recorded results: the same spec, no function, no service."""

    def answer(_replay: ToolContext, **_arguments: Any) -> JsonValue:
        until = recording.sleeps(_replay.call_id, _replay)
        if until is not None:
            raise SleepRequested(until)  # it slept there: so does the replay
        result = recording.result_for(real.name, _replay.call_id)
        if result is None:
            raise ToolError(
                f"replay: the recorded run made no call {_replay.call_id} of {real.name}",
                error_class=ErrorClass.UNAVAILABLE,
            )
        if result.error is not None:
            error = result.error
            raise ToolError(error.message, error_class=error.error_class, retryable=error.retryable)
        return result.output

    replayed = copy.copy(real)
    replayed.fn = answer
    replayed.is_async = False
    replayed.inline = True  # nothing to wait for
    replayed.context_parameter = "_replay"  # the call's id, to find its recorded result
    replayed.reconcile = None  # a recorded answer is certain; there is no service to ask
    return replayed


def replaying(agent: Agent, recording: _Recording) -> Agent:
    """``agent`` with the recorded model and tools in place of its own."""
    tools = [_replayed_tool(t, recording) for t in agent.toolbox.tools.values()]
    stand_in = agent.with_model(ReplayModel(recording, model_identity(agent.model)))
    if agent.critic is not None:  # its verdicts are the recorded ones: no critic is asked
        stand_in = stand_in.with_critic(agent.critic.with_model(ReplayCritic(recording)))
    return stand_in.with_tools(*tools) if tools else stand_in


def agents_of(agent: Agent) -> dict[str, Agent]:
    """``agent`` and every agent it reaches, by name: its sub-agents and its handoffs' targets.

    The ones offered with ``Agent.as_tool`` and handed off to, theirs, and so on (the
    first of a name found wins): a replay drives each recorded invocation with the one
    that ran it. A child run from a tool's body (``ToolContext.run_agent``) is not found.
    """
    found: dict[str, Agent] = {}
    waiting = [agent]
    while waiting:
        one = waiting.pop(0)
        if one.name in found:
            continue
        found[one.name] = one
        waiting.extend(
            tool_.child_agent
            for tool_ in one.toolbox.tools.values()
            if isinstance(tool_.child_agent, Agent)
        )
        waiting.extend(route.agent for route in one.handoffs.values())
    return found


def _utc_now() -> datetime:
    return datetime.now(UTC)


class ReplayClock:
    """The replay store's clock: ``base``'s time, except while a recorded wake is given again.

    A wake's time is in what the model is told next (``woke at ...``): given again at its
    recorded time, the replay asks the model what the recorded run asked it.
    """

    def __init__(self, base: Callable[[], datetime] | None = None) -> None:
        self._base = base or _utc_now
        self.at: datetime | None = None

    def __call__(self) -> datetime:
        """The time now, as the replay store records it."""
        return self.at if self.at is not None else self._base()


# --------------------------------------------------------------------------- driving


ASSUMED_BY = "replay --assume-approved"
"""Who approves a batch that waits in a replay and did not in the recorded run."""

MAX_PAUSES = 1_000
"""A bound on the pauses one replay gets through (each is a recorded or assumed decision)."""


def compatibility(started: InvocationStarted, agent: Agent) -> list[Divergence]:
    """What ``replay --check`` reports before re-driving: the catalogue and the settings.

    With the unchanged agent, a recorded tool that was removed or renamed, or whose
    schema or effect changed, and a budget or settings other than the recorded ones.
    """
    found: list[Divergence] = []
    tools = agent.toolbox.tools
    for spec in started.tools:
        current = tools.get(spec.name)
        if current is None:
            problem = f"tool {spec.name!r} was removed or renamed"
        elif current.schema_digest != spec.schema_digest:
            problem = f"tool {spec.name!r} changed its schema or effect"
        else:
            continue
        found.append(Divergence(kind=DivergenceKind.CATALOGUE_CHANGED, step=None, detail=problem))
    changed = []
    # A child's budget is its agent's within the share its parent reserved (the parent's
    # replay compares that share): it is the recorded one, given again.
    if started.budget != agent.budget and started.parent is None:
        changed.append("the budget")
    if started.settings is not None and started.settings != agent.settings:
        rules = started.settings.changed_approval_rules(agent.settings)
        changed.append(f"the approval rules of {', '.join(rules)}" if rules else "the run settings")
    if changed:
        found.append(
            Divergence(
                kind=DivergenceKind.SETTINGS_CHANGED,
                step=None,
                detail=" and ".join(changed) + " differ from the recorded ones",
            )
        )
    return found


def unreadable(invocation_id: str, error: Exception) -> ReplayResult:
    """A recorded invocation whose events no longer load: reported, not replayed."""
    return ReplayResult(
        invocation_id=invocation_id,
        recorded_agent="",
        recorded=None,
        replayed=None,
        identical=False,
        divergences=[
            Divergence(
                kind=DivergenceKind.EVENT_SHAPE,
                step=None,
                detail=f"its events do not load with this code ({type(error).__name__}: "
                f"{error}); a changed event shape needs an upcaster",
            )
        ],
    )


async def replay_invocation(
    events: Sequence[InvocationEvent],
    agent: Agent,
    target: Any,
    *,
    match: ReplayMatch = ReplayMatch.STRICT,
    assume_approved: bool = False,
    check: bool = False,
    clock: ReplayClock | None = None,
) -> ReplayResult:
    """Replay one recorded invocation (its events) under ``agent``, driven by ``target``.

    ``target`` is a :class:`~loop_actors.runtime.runtime.Runtime` on the store the
    replay is written to; the invocation keeps its id there, and where it came from (a
    fork's origin, a child's parent and budget, a handoff's source); a handoff is not
    followed (its target is an invocation of its own, replayed on its own). ``check``:
    the agent is meant to be the unchanged one, and its catalogue and settings are
    compared first. ``clock``: ``target``'s, to give the recorded wakes at their times.
    """
    started = events[0]
    assert isinstance(started, InvocationStarted)
    checked = compatibility(started, agent) if check else []
    recorded = History.of(events)
    recording = _Recording.of(events, match)
    stand_in = replaying(agent, recording)
    people = _people(events)
    iid = started.originator_id
    outcome = await _start(target, started, stand_in)
    for _ in range(MAX_PAUSES):
        if outcome.reason in _SLEEPS:
            woke = recording.wakes.get(outcome.steps)
            if not woke and recorded.paused in _SLEEPS and recorded.last_step == outcome.steps:
                break  # the recorded run still sleeps there
            # A replay waits for nothing: what slept is woken at once (as and when the
            # recorded run was, by whom it was), and goes on.
            await _wake(target, iid, woke.pop(0) if woke else None, clock)
            outcome = await _resume(target, iid, stand_in)
            continue
        if outcome.reason not in _PAUSES:
            break
        step = outcome.steps
        decided = people.get(step)
        if isinstance(decided, ApprovalGranted) and outcome.digest is not None:
            await target.approve(iid, digest=outcome.digest, by=decided.by, note=decided.note)
        elif isinstance(decided, ApprovalDenied):
            await target.deny(iid, by=decided.by, reason=decided.reason)
        elif isinstance(decided, ClarificationProvided):
            await target.clarify(iid, answer=decided.answer, by=decided.by)
        elif (
            assume_approved
            and outcome.reason is TerminalReason.APPROVAL_REQUIRED
            and outcome.digest is not None
        ):
            await target.approve(iid, digest=outcome.digest, by=ASSUMED_BY)
        else:
            break
        people.pop(step, None)
        outcome = await _resume(target, iid, stand_in)
    if (
        outcome.reason in _PAUSES
        and recorded.ended is TerminalReason.CANCELLED
        and recorded.last_step == outcome.steps
    ):
        # A person cancelled the recorded run while it waited there: so is the replay.
        await target.request_cancel(started.originator_id, reason=_cancel_detail(events))
    replayed = History.of(await target.history(started.originator_id))
    keep_going = frozenset({DivergenceKind.APPROVAL_REQUIRED}) if assume_approved else frozenset()
    found = checked + divergences(
        recorded, replayed, lenient=match is ReplayMatch.LENIENT, keep_going=keep_going
    )
    notes = []
    if recorded.stopped_for is None:
        notes.append(
            f"the recorded run has not ended: compared up to its step {recorded.last_step}"
        )
    if any(d.model_input is None for d in recording.decisions.values()):
        notes.append("no digest recorded of the model's requests: model inputs not compared")
    return ReplayResult(
        invocation_id=started.originator_id,
        recorded_agent=started.agent_name,
        recorded=recorded.stopped_for,
        replayed=None if recording.past_recording else replayed.stopped_for,
        past_recording=recording.past_recording,
        identical=not found,
        divergences=found,
        notes=notes,
    )


_PAUSES = frozenset(
    {
        TerminalReason.APPROVAL_REQUIRED,
        TerminalReason.CLARIFICATION_REQUIRED,
        TerminalReason.PLAN_APPROVAL_REQUIRED,  # a plan's approval (or denial) is given again
    }
)
_SLEEPS = frozenset({TerminalReason.SLEEPING, TerminalReason.RATE_LIMITED})

WOKEN_BY = "replay"
"""Who wakes a replayed invocation that sleeps where the recorded run did not."""


async def _start(target: Any, started: InvocationStarted, agent: Agent) -> Outcome:
    """Start the replay of ``started``'s invocation: its id, goal and origin, not followed."""
    request = StartRequest(
        agent=agent,
        goal=started.goal,
        invocation_id=started.originator_id,
        task_class=started.task_class,
        actor=started.actor,
        tenant=started.tenant,
        parent=started.parent,
        budget=started.budget if started.parent is not None else None,
        handed_off_from=started.handed_off_from,
        forked_from=started.forked_from,
    )
    request.check("replay")
    outcome: Outcome = await target.with_driver(lambda driver: driver.start(request=request))
    return outcome


async def _resume(target: Any, invocation_id: str, agent: Agent) -> Outcome:
    """Drive the replay on after a pause (a handoff it ends with is not followed)."""
    outcome: Outcome = await target.with_driver(
        partial(
            Driver.resume,
            invocation_id=invocation_id,
            agent=agent,
            allow_catalogue_change=False,
            allow_settings_change=False,
            take_over=False,
        )
    )
    return outcome


async def _wake(
    target: Any, invocation_id: str, recorded: SleepEnded | None, clock: ReplayClock | None
) -> None:
    """Wake the replay: as ``recorded`` was (its time and who), else now by :data:`WOKEN_BY`."""
    if recorded is None or clock is None:
        await target.wake(invocation_id, by=WOKEN_BY if recorded is None else recorded.by)
        return
    clock.at = recorded.timestamp
    try:
        await target.wake(invocation_id, by=recorded.by)
    finally:
        clock.at = None


def _cancel_detail(events: Sequence[InvocationEvent]) -> str | None:
    ended = events[-1]
    return ended.detail if isinstance(ended, Terminated) else None


def _people(
    events: Sequence[InvocationEvent],
) -> dict[int, ApprovalGranted | ApprovalDenied | ClarificationProvided]:
    """The recorded people's decisions, by the step they were made at (the last one a step)."""
    decided: dict[int, ApprovalGranted | ApprovalDenied | ClarificationProvided] = {}
    for event in events:
        if isinstance(event, ApprovalGranted | ApprovalDenied | ClarificationProvided):
            decided[event.step] = event
    return decided


def task_class_of(events: Sequence[InvocationEvent]) -> str | None:
    """The task class a recorded invocation was started with."""
    started = events[0] if events else None
    return started.task_class if isinstance(started, InvocationStarted) else None


async def replay_all(
    read_events: Callable[[str], Awaitable[list[InvocationEvent]]],
    invocation_ids: Sequence[str],
    agent: Agent,
    target: Any,
    *,
    where: ReplayFilter | None = None,
    match: ReplayMatch = ReplayMatch.STRICT,
    assume_approved: bool = False,
    check: bool = False,
    fresh_target: bool = True,
    clock: ReplayClock | None = None,
) -> ReplayReport:
    """Replay each of ``invocation_ids`` (read with ``read_events``) into ``target``.

    Each is driven by the agent that ran it among ``agent`` and the agents it reaches
    (:func:`agents_of`), else by ``agent``. ``fresh_target``: ``target`` is a new, empty
    store (``memory://``); otherwise an invocation it already holds is refused.

    Raises:
        UsageError: ``target`` already holds an invocation being replayed.
        InvocationNotFoundError: a named invocation is not in the source store.
        StoreUnavailableError: a store cannot be read.
    """
    results: list[ReplayResult] = []
    agents = agents_of(agent)
    for invocation_id in invocation_ids:
        try:
            events = await read_events(invocation_id)
        except (InvocationNotFoundError, StoreUnavailableError):
            raise
        except Exception as error:  # a row this code cannot decode: reported, not raised
            results.append(unreadable(invocation_id, error))
            continue
        if where is not None and not where.admits(History.of(events), task_class_of(events)):
            continue
        if not fresh_target and await _holds(target, invocation_id):
            raise UsageError(
                f"{redacted_url(target.db_url)} already holds {invocation_id}: replay into "
                "an empty store"
            )
        started = events[0] if events else None
        ran = (
            agents.get(started.agent_name, agent)
            if isinstance(started, InvocationStarted)
            else agent
        )
        results.append(
            await replay_invocation(
                events,
                ran,
                target,
                match=match,
                assume_approved=assume_approved,
                check=check,
                clock=clock,
            )
        )
    return ReplayReport(agent=agent.name, match=match, results=results)


async def _holds(target: Any, invocation_id: str) -> bool:
    try:
        await target.history(invocation_id)
    except InvocationNotFoundError:
        return False
    return True
