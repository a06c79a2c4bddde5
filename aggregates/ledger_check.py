"""Does an invocation's history still hold every write its effect ledger recorded?

A write's ``BatchDispatched`` is committed before its effect is prepared
(``EffectPrepared``), so every effect of an invocation is named, by its key, in
one of the invocation's ``BatchDispatched`` events. An effect that no batch of
the invocation names means that the invocation's history was cut (its tail, or
the batch, deleted from the store): resuming it would ask the model again for
steps it already took, and a write the ledger holds as done could run a second
time under another effect key. The runtime refuses such a resume.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from aggregates.audit_coverage import dispatched_effect_keys
from aggregates.effect import Effect
from aggregates.invocation import InvocationEvent


def orphaned_effects(events: Sequence[InvocationEvent], effects: Iterable[Effect]) -> list[Effect]:
    """The effects of the invocation that none of its dispatched batches names.

    ``events`` are the invocation's stored events, ``effects`` the ledger entries
    recorded for it (``Effect.invocation_id``). Empty when the two agree.
    """
    named = dispatched_effect_keys(events)
    return [effect for effect in effects if effect.key not in named]


def cut_history_problem(
    invocation_id: str, events: Sequence[InvocationEvent], effects: Iterable[Effect]
) -> str | None:
    """Why the invocation's history disagrees with its effect ledger, or None when it agrees."""
    orphans = orphaned_effects(events, effects)
    if not orphans:
        return None
    first = orphans[0]
    last_position = events[-1].originator_version if events else 0
    more = f" and {len(orphans) - 1} more" if len(orphans) > 1 else ""
    return (
        f"invocation {invocation_id}'s history was cut: the effect ledger holds "
        f"{first.key} (step {first.step}, call {first.call_id}, tool {first.tool}){more}, "
        f"which no dispatched batch of its {last_position} stored events names; "
        "nothing was run (check the store with: loop-actors audit verify)"
    )
