"""Compaction of the model's view: what it sees of a long history.

Pure: the view is built from committed turns, and compaction only decides
which whole turns to leave out. A turn holds a decision and the results of its
calls, so leaving out whole turns never separates a call from its result.
"""

from __future__ import annotations

import json
from typing import Any

from aggregates.decisions import EffectStatus, Frozen
from aggregates.invocation import Turn

_UNSETTLED = {EffectStatus.OUTCOME_UNKNOWN, EffectStatus.DISPATCHED}


class Compaction(Frozen):
    """What a compaction left out, and a note for the model."""

    dropped_steps: list[int]
    kept_steps: list[int]
    size_before: int
    size_after: int
    note: str


def view_size(turns: list[Turn]) -> int:
    """The size of turns as the model is given them (JSON characters).

    A turn's ``critique`` and a result's ``child_ids`` count only when there are some:
    the fields came later, and a size measured without them must stay the same (a
    recorded compaction replays as it was).
    """
    return len(
        json.dumps(
            [turn.model_dump(mode="json", exclude=_later_fields_unset(turn)) for turn in turns],
            separators=(",", ":"),
        )
    )


def _later_fields_unset(turn: Turn) -> dict[str, Any] | None:
    """What of ``turn`` to leave out of its size: the later fields it does not use."""
    unset: dict[str, Any] = {}
    if turn.critique is None:
        unset["critique"] = True
    without = {n: {"child_ids"} for n, r in enumerate(turn.results) if r.child_ids is None}
    if without:
        unset["results"] = without
    return unset or None


def _must_keep(turn: Turn) -> bool:
    """A turn whose writes are not settled stays in view: the model must know about them."""
    return any(result.effect_status in _UNSETTLED for result in turn.results)


def compact(
    turns: list[Turn], *, limit: int, keep_recent: int
) -> tuple[list[Turn], Compaction | None]:
    """Leave out older turns until the view fits ``limit`` (or nothing more can go).

    Always kept: the first turn (the plan), the last ``keep_recent`` turns, and
    every turn with a write whose outcome is not settled. Dropped turns go
    oldest first. Returns the kept turns and what was done (None if nothing).
    """
    sizes = [view_size([turn]) - 2 for turn in turns]  # each turn without the brackets
    size = sum(sizes) + max(0, len(turns) - 1) + 2
    if size <= limit or len(turns) <= keep_recent + 1:
        return turns, None
    protected = {0} | set(range(max(1, len(turns) - keep_recent), len(turns)))
    protected |= {index for index, turn in enumerate(turns) if _must_keep(turn)}
    dropped: set[int] = set()
    current = size
    for index in range(len(turns)):
        if current <= limit:
            break
        if index not in protected:
            dropped.add(index)
            current -= sizes[index] + 1
    if not dropped:
        return turns, None
    kept = [turn for index, turn in enumerate(turns) if index not in dropped]
    dropped_turns = [turns[index] for index in sorted(dropped)]
    calls = sum(len(turn.results) for turn in dropped_turns)
    failed = sum(1 for turn in dropped_turns for result in turn.results if result.error is not None)
    steps = [turn.step for turn in dropped_turns]
    note = (
        f"{len(steps)} earlier step(s) left out to fit the context (steps "
        f"{_ranges(steps)}): {calls} call(s), {failed} of them failed."
    )
    return kept, Compaction(
        dropped_steps=steps,
        kept_steps=[turn.step for turn in kept],
        size_before=size,
        size_after=view_size(kept),
        note=note,
    )


def _ranges(steps: list[int]) -> str:
    parts: list[str] = []
    start = previous = steps[0]
    for step in steps[1:]:
        if step != previous + 1:
            parts.append(f"{start}-{previous}" if start != previous else str(start))
            start = step
        previous = step
    parts.append(f"{start}-{previous}" if start != previous else str(start))
    return ", ".join(parts)
