"""Handoffs: an agent ends its turn by handing the conversation to another agent.

The model of an agent given ``handoffs`` may answer with a ``Handoff`` decision naming
one of them. Its invocation ends ``handed_off``; the target starts as a new invocation
(one agent per aggregate: its audit chain and budget are its own) whose first event says
where it came from (``InvocationStarted.handed_off_from``) and what it is told of the
source's work, by the handoff's history policy: the source's steps (``full``), the
source model's summary (``summary``) or nothing (``none``). The target's id derives from
the source's, so a handoff followed again after a crash finds the target it started.

The values and rules only: the runtime starts the target and follows the chain.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from enum import StrEnum
from typing import Annotated

from pydantic import Field

from aggregates.decisions import Frozen
from aggregates.digest import digest_of
from aggregates.turns import Turn

MAX_HANDOFFS = 8
"""How many handoffs one chain may make (a ninth is refused: the model is told)."""

MAX_SEED_CHARS = 20_000
"""The most characters of the source's steps a ``full`` handoff passes on (the latest kept)."""


class HandoffHistory(StrEnum):
    """What the target of a handoff is told of the source's work."""

    FULL = "full"
    """The source's steps: its decisions and their results, as stored (redacted)."""
    SUMMARY = "summary"
    """The summary the source's model wrote in its ``Handoff`` decision."""
    NONE = "none"
    """Nothing: the goal only."""


class HandoffOrigin(Frozen):
    """Recorded in a handoff target's ``InvocationStarted`` (``handed_off_from``)."""

    source_id: str
    source_agent: str
    reason: str
    """Why the source's model handed off."""
    history: HandoffHistory
    seed: str | None = None
    """What the target's model is told of the source's work (None: nothing)."""
    hops: Annotated[int, Field(ge=1)] = 1
    """How many handoffs led here (1: the first of the chain)."""
    chain_root: str
    """The invocation the chain started with."""


def handoff_id_of(source_id: str) -> str:
    """The id of the invocation ``source_id`` hands off to (the same every time)."""
    return "handoff-" + digest_of(["handoff", source_id])[:32]


def seed_of(history: HandoffHistory, turns: Sequence[Turn], summary: str | None) -> str | None:
    """What the target is told, by ``history``: the source's steps, its summary, or nothing."""
    match history:
        case HandoffHistory.NONE:
            return None
        case HandoffHistory.SUMMARY:
            return summary or None
        case HandoffHistory.FULL:
            lines = [_step_line(turn) for turn in turns]
            text = "\n".join(lines)
            if len(text) > MAX_SEED_CHARS:
                text = "[earlier steps left out]\n" + text[-MAX_SEED_CHARS:]
            return text or None


def _step_line(turn: Turn) -> str:
    record: dict[str, object] = {"step": turn.step}
    if turn.decision is not None:
        record["decision"] = turn.decision.model_dump(mode="json", exclude={"schema_version"})
    if turn.results:
        record["results"] = [
            {"call_id": r.call_id, "tool": r.name, "output": r.output}
            if r.error is None
            else {"call_id": r.call_id, "tool": r.name, "error": r.error.message}
            for r in turn.results
        ]
    return json.dumps(record, sort_keys=True, ensure_ascii=False)


def handoff_problem(to: str, routes: Sequence[str], hops: int) -> str | None:
    """Why a handoff to ``to`` is refused (the model is told), or None when it may go."""
    if to not in routes:
        known = ", ".join(repr(r) for r in routes) or "none"
        return f"no handoff to {to!r}: this agent may hand off to {known}"
    if hops >= MAX_HANDOFFS:
        return f"no handoff: this chain made {hops} handoffs, the most one chain makes"
    return None
