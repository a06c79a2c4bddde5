"""Messages between actors: frozen models, imperative requests and past-tense replies."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from aggregates.decisions import ToolResult, Usage
from aggregates.handoffs import HandoffOrigin
from aggregates.invocation import Turn
from aggregates.results import Interruption


class Message(BaseModel):
    """Base of every actor message."""

    model_config = ConfigDict(frozen=True, extra="forbid", arbitrary_types_allowed=True)


# --------------------------------------------------------------------------- model


class ToolSchema(Message):
    """A tool as a model sees it."""

    name: str
    description: str
    parameters: dict[str, Any]
    """The JSON Schema of the arguments (from the tool's pydantic model)."""


class ModelRequest(Message):
    """What a model is asked: the goal and the committed history, for one step."""

    invocation_id: str
    agent_name: str
    goal: str
    step: int
    """The step being decided (1 for the first decision)."""
    turns: list[Turn]
    """Every committed turn so far, oldest first, each with its results."""
    tools: list[ToolSchema]
    notices: list[str] = []
    """What trusted code tells the model about its budget (e.g. steps left)."""
    handoffs: list[str] = []
    """The agents the model may hand the conversation to (a ``handoff`` decision)."""
    handed_off_from: HandoffOrigin | None = None
    """For the target of a handoff: the agent it takes over from, why, and what it is told."""
    review: str | None = None
    """For a critic (reflection): the final answer it reviews; its reply is a verdict
    (``{"kind": "accept"}`` or ``{"kind": "revise", "critique": "..."}``), and ``step`` is
    its round."""
    planning: bool = False
    """True under a plan's read-only ceiling: ``tools`` are the read tools only, and the
    model may propose a ``plan`` decision (the adapters offer ``propose_plan`` for it)."""

    @property
    def results(self) -> list[ToolResult]:
        """Every committed tool result so far, in order."""
        return [result for turn in self.turns for result in turn.results]


class ModelReply(Message):
    """A model's answer: an untrusted proposal (a decision or its JSON shape) and its usage."""

    proposal: Any
    """A decision model, or its JSON shape (dict or JSON text); validated by the controller."""
    usage: Usage = Usage()


# --------------------------------------------------------------------------- tools


@dataclass(frozen=True, slots=True)
class BatchExecuted:
    """One result per call of a batch, in call order, and whether the batch was cut short.

    A plain dataclass: it only carries values the runtime made (results built by
    the tool runner, which the core checks before anything is stored).
    """

    step: int
    results: list[ToolResult]
    interruption: Interruption
    slept: dict[str, datetime] = field(default_factory=dict)
    """The calls that asked to sleep (``ctx.sleep_until``), with the time each asked for;
    their entries in ``results`` are placeholders."""


# --------------------------------------------------------------------------- journal


class Committed(Message):
    """The events are durable."""

    kind: Literal["committed"] = "committed"
    position: int


class CommitFailed(Message):
    """The store refused or failed; nothing of this commit was written."""

    kind: Literal["commit_failed"] = "commit_failed"
    error_type: str
    message: str
    conflict: bool
    """True when another writer appended to the same invocation first."""


CommitOutcome = Committed | CommitFailed


# --------------------------------------------------------------------------- reconciler


class ReconcileEffect(Message):
    """Ask the owning service of a write what became of an effect key."""

    kind: Literal["reconcile_effect"] = "reconcile_effect"
    effect_key: str
    tool: str
