"""The turn core's shell without I/O, for tests that drive aggregates.turn directly.

A :class:`Shell` stands in for ``loop_actors``: it hands the core scripted
observations, commits (collects) the pending events where an action says
``commits_first``, and follows ``Continue`` by asking for the next action. The
tools are a :class:`FakeCatalogue` whose arguments are pydantic models, so
invalid arguments raise real ``ValidationError`` s and defaults are filled in.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict

from aggregates.children import ChildSpec
from aggregates.decisions import (
    Budget,
    EffectStatus,
    ErrorClass,
    ToolCall,
    ToolEffect,
    ToolResult,
    Usage,
)
from aggregates.effect import Effect, EffectEvent
from aggregates.events import DomainEvent, fold
from aggregates.invocation import (
    DecisionProposed,
    DispatchedCall,
    Invocation,
    InvocationEvent,
    Paused,
    Terminated,
    replay,
)
from aggregates.results import Interruption, error_result
from aggregates.settings import RunSettings
from aggregates.turn import (
    Action,
    AskModel,
    Authorise,
    Continue,
    Critique,
    EffectObservation,
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
    RunCalls,
    TurnCore,
    Verify,
)

AT = datetime(2026, 1, 1, tzinfo=UTC)
INV = "inv-1"
REDACTED = "[redacted]"


# --------------------------------------------------------------------------- the fake tools


class SearchArguments(BaseModel):
    model_config = ConfigDict(extra="forbid")
    q: str
    limit: int = 10


class SendArguments(BaseModel):
    model_config = ConfigDict(extra="forbid")
    to: str
    body: str = ""


class DeleteArguments(BaseModel):
    model_config = ConfigDict(extra="forbid")
    path: str


class LoginArguments(BaseModel):
    model_config = ConfigDict(extra="forbid")
    user: str
    password: str
    limit: int = 10


class MintArguments(BaseModel):
    model_config = ConfigDict(extra="forbid")
    scope: str


@dataclass(frozen=True)
class FakeTool:
    """One tool as the core sees it: its effect, its argument schema, approval and redaction."""

    effect: ToolEffect
    arguments: type[BaseModel]
    needs_approval: bool = False
    child: ChildSpec | None = None
    """For a tool that starts a child invocation."""
    sensitive_arguments: frozenset[str] = frozenset()
    sensitive_output: frozenset[str] = frozenset()


TOOLS: dict[str, FakeTool] = {
    "search": FakeTool(ToolEffect.READ, SearchArguments),
    "send": FakeTool(ToolEffect.WRITE, SendArguments),
    "delete": FakeTool(ToolEffect.WRITE, DeleteArguments, needs_approval=True),
    "login": FakeTool(ToolEffect.READ, LoginArguments, sensitive_arguments=frozenset({"password"})),
    "mint": FakeTool(ToolEffect.READ, MintArguments, sensitive_output=frozenset({"token"})),
}


class FakeCatalogue:
    """A ``Catalogue`` over :data:`TOOLS`: pydantic validation, redaction by top-level field.

    Like the real Toolbox, redaction returns the very same object when there is
    nothing to redact (the core tells a redacted value by identity).
    """

    def __init__(self, tools: Mapping[str, FakeTool] = TOOLS) -> None:
        self.tools = dict(tools)

    @property
    def redacts(self) -> bool:
        return any(t.sensitive_arguments or t.sensitive_output for t in self.tools.values())

    def effect_of(self, name: str) -> ToolEffect | None:
        tool = self.tools.get(name)
        return tool.effect if tool is not None else None

    def check_arguments(self, call: ToolCall) -> dict[str, Any]:
        return (
            self.tools[call.name].arguments.model_validate(call.arguments).model_dump(mode="json")
        )

    def redact_arguments(self, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        tool = self.tools.get(name)
        if tool is None or not tool.sensitive_arguments:
            return arguments
        return {k: REDACTED if k in tool.sensitive_arguments else v for k, v in arguments.items()}

    def sensitive_arguments(self, name: str) -> tuple[tuple[str, ...], ...]:
        tool = self.tools.get(name)
        return () if tool is None else tuple((field,) for field in sorted(tool.sensitive_arguments))

    def redact_output(self, name: str, output: Any) -> Any:
        tool = self.tools.get(name)
        if tool is None or not tool.sensitive_output or not isinstance(output, dict):
            return output
        return {k: REDACTED if k in tool.sensitive_output else v for k, v in output.items()}

    def needs_approval(self, name: str, arguments: dict[str, Any]) -> bool:
        return self.tools[name].needs_approval

    def child_spec(self, name: str) -> ChildSpec | None:
        tool = self.tools.get(name)
        return None if tool is None else tool.child

    def plan(self, calls: Sequence[DispatchedCall]) -> list[list[str]]:
        """Consecutive reads run together; each write alone (as the Toolbox plans)."""
        groups: list[list[str]] = []
        reads: list[str] = []
        for call in calls:
            if call.effect is ToolEffect.READ:
                reads.append(call.call_id)
                continue
            if reads:
                groups.append(reads)
                reads = []
            groups.append([call.call_id])
        if reads:
            groups.append(reads)
        return groups


# --------------------------------------------------------------------------- observations


@dataclass(frozen=True)
class Ran:
    """What running the calls of a ``RunCalls`` gave."""

    results: list[ToolResult]
    interruption: Interruption = Interruption.NONE
    slept: dict[str, datetime] = field(default_factory=dict)
    """The calls that asked to sleep, and until when (their results are placeholders)."""


@dataclass(frozen=True)
class Loaded:
    """The ledger entries a ``LoadEffects`` read."""

    effects: dict[str, Effect | None]


@dataclass(frozen=True)
class Answers:
    """The services' answers to a ``Reconcile``."""

    answers: dict[str, EffectObservation]


@dataclass(frozen=True)
class Verdict:
    """The verifier's verdict on a ``Verify``: None passed, else its evidence."""

    evidence: str | None


Observation = ModelObservation | PolicyVerdict | Ran | Loaded | Answers | Verdict


A = TypeVar("A")


@dataclass
class Shell:
    """The shell without I/O: scripted observations in, committed events collected."""

    invocation: Invocation
    core: TurnCore
    now: Moment = field(default_factory=lambda: Moment(at=AT, elapsed_s=0.0))
    committed: list[DomainEvent] = field(default_factory=list)
    """Every event the core asked to commit, in order."""
    actions: list[Action] = field(default_factory=list)
    fed: list[Observation] = field(default_factory=list)
    """Every observation handed to the core, in order (a recording of the run)."""
    action: Action | None = None

    @classmethod
    def over(
        cls,
        invocation: Invocation | None = None,
        *,
        budget: Budget | None = None,
        settings: RunSettings | None = None,
        verifies: bool = False,
        authorises: bool = False,
        catalogue: FakeCatalogue | None = None,
        critiques: bool | None = None,
    ) -> Shell:
        """``critiques``: whether the shell has a critic (default: when the settings name one)."""
        settings = settings or RunSettings()
        if invocation is None:
            invocation = Invocation.start(
                invocation_id=INV,
                goal="find x",
                agent_name="agent",
                agent_version="1",
                catalogue_digest="catalogue",
                tools=[],
                budget=budget or Budget(),
                settings=settings,
                at=AT,
            )
        shell = cls(
            invocation=invocation,
            core=TurnCore(
                invocation,
                settings=settings,
                catalogue=catalogue or FakeCatalogue(),
                verifies=verifies,
                authorises=authorises,
                critiques=settings.critic is not None if critiques is None else critiques,
            ),
        )
        shell.committed.extend(invocation.take_events())  # saved when it was started
        return shell

    # ------------------------------------------------------------ driving

    def begin(self) -> Action:
        """Ask the core for its first action."""
        return self._then(self.core.next(self.now))

    def resume(self) -> Action:
        """A new core over the same invocation (as a later run would make), asked what is next."""
        self.core = TurnCore(
            self.invocation,
            settings=self.core.settings,
            catalogue=self.core.catalogue,
            verifies=self.core.verifies,
            authorises=self.core.authorises,
            critiques=self.core.critiques,
        )
        self.committed.extend(self.invocation.take_events())
        return self.begin()

    def feed(self, observation: Observation) -> Action:
        """Hand the core what performing the current action gave."""
        core, now, action = self.core, self.now, self.action
        self.fed.append(observation)
        match action:
            case AskModel():
                assert isinstance(
                    observation, ModelAnswered | ModelFailed | ModelTimedOut | ModelInterrupted
                )
                return self._then(core.on_model(observation, now))
            case Authorise():
                assert isinstance(observation, PolicyVerdict)
                return self._then(core.on_authorised(observation, now))
            case RunCalls():
                assert isinstance(observation, Ran)
                return self._then(
                    core.on_executed(
                        observation.results, observation.interruption, now, slept=observation.slept
                    )
                )
            case LoadEffects():
                assert isinstance(observation, Loaded)
                return self._then(core.on_effects_loaded(observation.effects, now))
            case Reconcile():
                assert isinstance(observation, Answers)
                return self._then(core.on_reconciled(observation.answers, now))
            case Verify():
                assert isinstance(observation, Verdict)
                return self._then(core.on_verified(observation.evidence, now))
            case Critique():
                assert isinstance(
                    observation,
                    ModelAnswered | ModelFailed | ModelTimedOut | ModelInterrupted | ModelQuotaWait,
                )
                return self._then(core.on_critique(observation, now))
            case _:
                raise AssertionError(f"nothing to observe for {action!r}")

    def run(self, observations: Iterable[Observation]) -> Action:
        """Begin, then feed every observation in order."""
        action = self.begin()
        for observation in observations:
            action = self.feed(observation)
        return action

    def answer(self, proposal: Any, usage: Usage | None = None) -> Action:
        return self.feed(ModelAnswered(proposal=proposal, usage=usage or Usage()))

    def ran(self, *results: ToolResult, interruption: Interruption = Interruption.NONE) -> Action:
        return self.feed(Ran(list(results), interruption))

    def _then(self, action: Action) -> Action:
        self.actions.append(action)
        if action.commits_first:
            self.committed.extend(self.core.take_events())
        if isinstance(action, Continue):
            return self._then(self.core.next(self.now))
        self.action = action
        return action

    # ------------------------------------------------------------ looking

    def expect(self, kind: type[A]) -> A:
        """The current action, which must be a ``kind``."""
        assert isinstance(self.action, kind), f"expected {kind.__name__}, got {self.action!r}"
        return self.action

    def of_type(self, kind: type[A]) -> list[A]:
        """The committed events of one type."""
        return [event for event in self.committed if isinstance(event, kind)]

    @property
    def terminated(self) -> Terminated:
        ended = self.invocation.terminated
        assert ended is not None, f"not terminated: phase {self.invocation.phase}"
        assert self.of_type(Terminated) == [ended], "the Terminated event was not committed"
        return ended

    @property
    def paused(self) -> Paused:
        paused = self.invocation.paused
        assert paused is not None, f"not paused: phase {self.invocation.phase}"
        assert self.of_type(Paused)[-1] == paused, "the Paused event was not committed"
        return paused

    def effect_events(self, key: str) -> list[EffectEvent]:
        return [e for e in self.committed if isinstance(e, EffectEvent) and e.originator_id == key]


def ok(call: DispatchedCall, output: Any = None) -> ToolResult:
    if call.effect_key is not None:
        return ToolResult(
            call_id=call.call_id,
            name=call.name,
            output=output if output is not None else {"sent": True},
            effect_key=call.effect_key,
            effect_status=EffectStatus.COMMITTED,
        )
    return ToolResult(
        call_id=call.call_id, name=call.name, output=output if output is not None else {"hits": 1}
    )


def failed(call: DispatchedCall, message: str = "the index is down") -> ToolResult:
    return error_result(call, ErrorClass.TOOL_FAILED, message)


def unknown(call: DispatchedCall) -> ToolResult:
    """A write whose connection was lost: nobody knows whether it happened."""
    return error_result(
        call,
        ErrorClass.OUTCOME_UNKNOWN,
        "connection lost",
        effect_status=EffectStatus.OUTCOME_UNKNOWN,
    )


def call_of(action: RunCalls, call_id: str) -> DispatchedCall:
    return next(call for call in action.calls if call.call_id == call_id)


def key_of(action: RunCalls, call_id: str) -> str:
    key = call_of(action, call_id).effect_key
    assert key is not None
    return key


def replayed_effect(events: Iterable[DomainEvent], key: str) -> Effect:
    """The ledger entry as the store would load it (no pending events)."""
    effect = fold(
        None, [e for e in events if isinstance(e, EffectEvent) and e.originator_id == key]
    )
    assert isinstance(effect, Effect)
    return effect


def replayed_invocation(events: Iterable[DomainEvent]) -> Invocation:
    """The invocation as the store would load it."""
    invocation = replay(None, [e for e in events if isinstance(e, InvocationEvent)])
    assert invocation is not None
    return invocation


def types(events: Iterable[DomainEvent]) -> list[str]:
    return [type(event).__name__ for event in events]


def proposed(shell: Shell) -> DecisionProposed:
    return shell.of_type(DecisionProposed)[-1]
