"""What the turn core and its shell say to each other: the moment, observations, actions.

The shell tells the core the :class:`Moment` and what it observed (a model's
reply, the services' answers, a policy's verdict); the core answers with an
:data:`Action` to perform. The core asks the agent's tools through a
:class:`Catalogue`. All of it is importable from :mod:`aggregates.turn` as before.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, ClassVar, Literal, Protocol

from pydantic import JsonValue

from aggregates.children import ChildSpec
from aggregates.decisions import (
    Frozen,
    TerminalReason,
    ToolCall,
    ToolEffect,
    Usage,
)
from aggregates.effect import Resolution
from aggregates.invocation import DispatchedCall, Turn
from aggregates.model_input import ModelInput

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

    def sensitive_arguments(self, name: str) -> Sequence[tuple[str, ...]]:
        """The tool's sensitive argument paths (none for a tool the agent does not have)."""

    def redact_output(self, name: str, output: Any) -> Any:
        """An output as it may be stored."""

    def needs_approval(self, name: str, arguments: dict[str, Any]) -> bool:
        """Whether this call waits for a person."""

    def plan(self, calls: Sequence[DispatchedCall]) -> list[list[str]]:
        """Execution groups of call ids."""

    def child_spec(self, name: str) -> ChildSpec | None:
        """For a tool that starts a child invocation: its budget and edge policy; else None."""


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
    usage: Any = field(default_factory=Usage)
    """What the model reported it cost: untrusted too (the core admits it as a ``Usage``)."""
    model_input: ModelInput | None = None
    """The digests of the request the model answered (recorded with the decision)."""


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


@dataclass(frozen=True, slots=True)
class ModelQuotaWait:
    """The provider's shared rate limit has no quota for the call before ``until``.

    Past the wait its limit allows (``RateLimit.max_wait_s``): nothing was sent.
    """

    until: datetime
    limit: str
    """Which limit (``provider:model``)."""


ModelObservation = ModelAnswered | ModelFailed | ModelTimedOut | ModelInterrupted | ModelQuotaWait


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


class ChildWaits(Frozen):
    """The write started a child invocation that waits for a person: the call stays open.

    ``path`` runs from the child this call started down to the invocation that waits
    (itself a child of the one before); the rest is that one's pause, for the parent's.
    """

    kind: Literal["child_waits"] = "child_waits"
    effect_key: str
    path: list[str]
    reason: TerminalReason
    question: str | None = None
    proposal_digest: str | None = None
    calls: list[DispatchedCall] | None = None
    needs_approval: list[str] | None = None


ReconcileOutcome = EffectAnswered | ServiceUnreachable | ChildWaits


class AttemptStillRunning(Frozen):
    """An earlier attempt of the write may still be running: the service was not asked.

    A "not found" from the service while an attempt may still reach it proves
    nothing, so the write is not dispatched again.
    """

    kind: Literal["attempt_still_running"] = "attempt_still_running"
    effect_key: str
    waited_s: float


EffectObservation = EffectAnswered | ServiceUnreachable | AttemptStillRunning | ChildWaits


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
    read_only: bool = False
    """True under a plan's read-only ceiling (``aggregates.planning``): only the read tools
    are offered to the model."""


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
class Critique(_Action):
    """Ask the agent's critic for its verdict on the final answer (once that is durable).

    The request's ``step`` is the critic's ``round``; it is offered no tool.
    """

    commits_first: ClassVar[bool] = True
    round: int
    step: int
    """The step of the final answer under review."""
    answer: str
    turns: list[Turn]
    """The committed turns (stored form: the shell reveals secrets)."""
    instructions: str
    """What the critic is told (its recorded instructions)."""


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
    woken: dict[str, datetime] = field(default_factory=dict)
    """The calls that slept (``ctx.sleep_until``) and now run again: the time each slept
    until, by call id (their ``ctx.sleep_until`` up to it returns at once)."""
    woke_at: datetime | None = None
    """When they woke (None: none of them slept)."""


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
    after_critique: bool = False
    """True when the commit records a critic's ``revise`` verdict."""


@dataclass(frozen=True, slots=True)
class Finished(_Action):
    """Commit, then stop: the invocation is paused or terminated."""

    commits_first: ClassVar[bool] = True
    completed: bool = False
    """True when the commit records a completed answer."""
    detail: str | None = None
    """A detail for the outcome that the record does not carry (a repeated pause's why)."""


Action = (
    AskModel
    | Authorise
    | Verify
    | Critique
    | RunCalls
    | LoadEffects
    | Reconcile
    | Continue
    | Finished
)
"""What the core asks the shell to do next."""


# --------------------------------------------------------------------------- the core
