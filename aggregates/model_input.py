"""What a model was asked, as digests: recorded with each decision, compared by replay.

A model request is the agent's model, the goal (the run's instructions), the notices
trusted code adds (budget wind-down, compaction), the tool schemas as the model sees
them (name, description, parameters) and the view: the turns shown, after compaction,
as stored (redacted values stay redacted: no digest is taken of a secret). Each part
has its own digest, so a replay that is asked something else can say which part
changed first. Each digest is the first 64 bits of a SHA-256 (``digest_of``: over
canonical JSON), in hex: enough to tell a change, not a commitment.

A decision records what changed since the request before it in the same run of the
loop (:func:`recorded_form`): the view and its length always, the other parts when they
changed, and all of them for the first request a process makes for an invocation (its
start, or a resume). The full digests of any request are what the history's records
say, carried forward (:func:`carried`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from aggregates.decisions import Frozen
from aggregates.digest import digest_of, sha256_hex
from aggregates.pydantic_slots import built

DIGEST_CHARS = 16
"""Hex characters kept of each SHA-256: 64 bits."""


class ModelInput(Frozen):
    """The digests of one model request (``DecisionProposed.model_input``).

    As recorded, a part left out (None) is the one of the request before; carried
    forward (:func:`carried`), every part is set.
    """

    model: str | None = None
    """The digest of the model's identity (its class, and its model name when it has one)."""
    instructions: str | None = None
    """The digest of the goal."""
    notices: str | None = None
    """The digest of the notices the request carried."""
    tools: dict[str, str] | None = None
    """Each tool's digest (its name, description and parameters), by name."""
    view: str
    """The digest of the turns shown, in order (``view_digest``)."""
    turns: int
    """How many turns the view showed."""


def _short(digest: str) -> str:
    return digest[:DIGEST_CHARS]


def tool_digest(name: str, description: str, parameters: Mapping[str, Any]) -> str:
    """The digest of a tool as a model sees it."""
    return _short(digest_of({"name": name, "description": description, "parameters": parameters}))


def turn_digest_of(shown: str) -> str:
    """The digest of a turn's JSON text as the model is shown it."""
    return _short(sha256_hex(shown))


def view_digest(turn_digests: Sequence[str]) -> str:
    """The digest of a view from the digests of its turns, in order."""
    return _short(sha256_hex(",".join(turn_digests)))


def text_digest(text: str) -> str:
    """The digest of a text (the model's identity, the goal)."""
    return _short(sha256_hex(text))


def notices_digest(notices: Sequence[str]) -> str:
    """The digest of a request's notices, in order."""
    return _short(digest_of(list(notices)))


def model_input(
    *,
    model: str,
    instructions: str,
    notices: str,
    tools: dict[str, str],
    turn_digests: Sequence[str],
) -> ModelInput:
    """The full digests of a request from its parts' digests (``tools``: :func:`tool_digest`).

    Built without validation: every value is a digest made here.
    """
    return built(
        ModelInput,
        {
            "model": model,
            "instructions": instructions,
            "notices": notices,
            "tools": tools,
            "view": view_digest(turn_digests),
            "turns": len(turn_digests),
        },
    )


def recorded_form(previous: ModelInput | None, current: ModelInput) -> ModelInput:
    """What a decision records of ``current``: the parts that differ from ``previous``.

    ``previous`` is the full digests of the request before it in the same process (None
    for the first): then every part is recorded.
    """
    if previous is None:
        return current
    return built(
        ModelInput,
        {
            "model": None if current.model == previous.model else current.model,
            "instructions": (
                None if current.instructions == previous.instructions else current.instructions
            ),
            "notices": None if current.notices == previous.notices else current.notices,
            "tools": None if current.tools == previous.tools else current.tools,
            "view": current.view,
            "turns": current.turns,
        },
    )


def carried(previous: ModelInput | None, recorded: ModelInput) -> ModelInput:
    """The full digests of a request from its record and the full ones of the request before."""
    if previous is None:
        return recorded
    return ModelInput(
        model=recorded.model if recorded.model is not None else previous.model,
        instructions=(
            recorded.instructions if recorded.instructions is not None else previous.instructions
        ),
        notices=recorded.notices if recorded.notices is not None else previous.notices,
        tools=recorded.tools if recorded.tools is not None else previous.tools,
        view=recorded.view,
        turns=recorded.turns,
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
    was, now = recorded.tools or {}, current.tools or {}
    for name in sorted(was.keys() | now.keys()):
        if name not in now:
            return f"the tools: {name} is no longer offered"
        if name not in was:
            return f"the tools: {name} is new"
        if was[name] != now[name]:
            return f"the tool {name}'s description or parameters"
    if recorded.notices != current.notices:
        return "the notices (budget, compaction)"
    if recorded.view != current.view:
        return f"the view ({recorded.turns} turn(s) recorded, {current.turns} now)"
    return None
