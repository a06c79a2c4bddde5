"""Messages between actors: frozen models, imperative requests and past-tense replies."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from aggregates.decisions import ToolResult, Usage
from aggregates.invocation import DispatchedCall, Turn
from aggregates.results import Interruption
from aggregates.turn import ModelFailed, ModelTimedOut


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

    @property
    def results(self) -> list[ToolResult]:
        """Every committed tool result so far, in order."""
        return [result for turn in self.turns for result in turn.results]


class ModelReply(Message):
    """A model's answer: an untrusted proposal (a decision or its JSON shape) and its usage."""

    proposal: Any
    """A decision model, or its JSON shape (dict or JSON text); validated by the controller."""
    usage: Usage = Usage()


class Decide(Message):
    """Ask the model actor for the next decision."""

    kind: Literal["decide"] = "decide"
    request: ModelRequest
    deadline: float | None
    """trio clock time after which the model call is abandoned."""


class Decided(Message):
    """The model answered."""

    kind: Literal["decided"] = "decided"
    reply: ModelReply


ModelOutcome = Decided | ModelFailed | ModelTimedOut


# --------------------------------------------------------------------------- tools


class ExecuteBatch(Message):
    """Run a dispatched batch following its plan."""

    kind: Literal["execute_batch"] = "execute_batch"
    invocation_id: str
    step: int
    calls: list[DispatchedCall]
    plan: list[list[str]]
    deadline: float | None
    attempts: dict[str, int] = {}
    """Attempt number per write call id (1 when absent)."""


class CancelBatch(Message):
    """Stop the running batch: start no new call, answer unfinished calls ``cancelled``."""

    kind: Literal["cancel_batch"] = "cancel_batch"


class BatchExecuted(Message):
    """One result per call, in call order."""

    kind: Literal["batch_executed"] = "batch_executed"
    step: int
    results: list[ToolResult]
    interruption: Interruption


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
