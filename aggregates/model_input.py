"""What a model was asked, as digests: recorded with each decision, compared by replay.

A model request is the agent's model, the goal (the run's instructions), the notices
trusted code adds (budget wind-down, compaction), the tool schemas as the model sees
them (name, description, parameters) and the view: the turns shown, after compaction,
as stored (redacted values stay redacted: no digest is taken of a secret). Each part
has its own digest, so a replay that is asked something else can say which part
changed first. Every digest is ``digest_of`` (SHA-256 over canonical JSON).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from aggregates.decisions import Frozen
from aggregates.digest import digest_of, sha256_hex


class ModelInput(Frozen):
    """The digests of one model request (recorded in ``DecisionProposed.model_input``)."""

    model: str
    """The digest of the model's identity (its class, and its model name when it has one)."""
    instructions: str
    """The digest of the goal."""
    notices: str
    """The digest of the notices the request carried."""
    tools: dict[str, str]
    """Each tool's digest (its name, description and parameters), by name."""
    view: str
    """The digest of the turns shown, in order (``view_digest``)."""
    turns: int
    """How many turns the view showed."""


def tool_digest(name: str, description: str, parameters: Mapping[str, Any]) -> str:
    """The digest of a tool as a model sees it."""
    return digest_of({"name": name, "description": description, "parameters": parameters})


def view_digest(turn_digests: Sequence[str]) -> str:
    """The digest of a view from the digests of its turns, in order."""
    return sha256_hex(",".join(turn_digests))


def model_input(
    *,
    model_identity: str,
    goal: str,
    notices: Sequence[str],
    tools: Mapping[str, str],
    turn_digests: Sequence[str],
) -> ModelInput:
    """The digests of a request (``tools``: each tool's :func:`tool_digest`)."""
    return ModelInput(
        model=sha256_hex(model_identity),
        instructions=sha256_hex(goal),
        notices=digest_of(list(notices)),
        tools=dict(tools),
        view=view_digest(turn_digests),
        turns=len(turn_digests),
    )


def first_difference(recorded: ModelInput, current: ModelInput) -> str | None:
    """The first part of a request that differs, in words; None when none does.

    In the order a reader would look: the model, the instructions, a tool (added,
    removed, or its description or parameters changed), the notices, the view.
    """
    if recorded.model != current.model:
        return "the model"
    if recorded.instructions != current.instructions:
        return "the instructions (the goal)"
    for name in sorted(recorded.tools.keys() | current.tools.keys()):
        if name not in current.tools:
            return f"the tools: {name} is no longer offered"
        if name not in recorded.tools:
            return f"the tools: {name} is new"
        if recorded.tools[name] != current.tools[name]:
            return f"the tool {name}'s description or parameters"
    if recorded.notices != current.notices:
        return "the notices (budget, compaction)"
    if recorded.view != current.view:
        return f"the view ({recorded.turns} turn(s) recorded, {current.turns} now)"
    return None
