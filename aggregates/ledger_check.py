"""Does an invocation's history still hold every write its effect ledger recorded?

A write's ``BatchDispatched`` is committed before its effect is prepared
(``EffectPrepared``), so every effect of an invocation is named, by its key, in
one of the invocation's ``BatchDispatched`` events. An effect that no batch of
the invocation names means that the invocation's history was cut (its tail, or
the batch, deleted from the store): resuming it would ask the model again for
steps it already took, and a write the ledger holds as done could run a second
time under another effect key. The runtime refuses such a resume.

A history can also be cut right after a decision: a run commits a decision together
with what follows it (the batch's dispatch, a pause, the end), or, when a verifier
checks an answer, with what the verifier said; none of those commits leaves the
decision alone at the end. A history that ends so was cut by hand (its ``Terminated``
deleted, say), and no run can go on from it: that resume is refused too.

The other way round, a write of a batch that waits for its results has its ledger entry
(prepared and dispatched in the batch's commit): one that is missing was deleted by hand,
and whether the write ran is unknown; that resume is refused as well.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from aggregates.audit_coverage import dispatched_effect_keys
from aggregates.decisions import Final
from aggregates.effect import Effect, effect_key
from aggregates.invocation import BatchDispatched, Invocation, InvocationEvent, Phase


def orphaned_effects(events: Sequence[InvocationEvent], effects: Iterable[Effect]) -> list[Effect]:
    """The effects of the invocation that none of its dispatched batches names.

    ``events`` are the invocation's stored events, ``effects`` the ledger entries
    recorded for it (``Effect.invocation_id``). Empty when the two agree.
    """
    named = dispatched_effect_keys(events)
    return [effect for effect in effects if effect.key not in named]


def orphaned_effects_after_snapshot(
    invocation: Invocation, tail: Sequence[InvocationEvent], effects: Iterable[Effect]
) -> list[Effect]:
    """:func:`orphaned_effects`, for an invocation loaded from a snapshot its store vouches for.

    ``invocation`` is the invocation as loaded (its snapshot, then ``tail``, its events
    after the snapshot's version). The store vouches for the snapshot when it is the one
    written after the stored event at its version, and no event before it is missing
    (``StoreReader.history_problem``): the batches before it are then the ones the
    snapshot's turns were made of, and each names the writes of its calls by their keys.

    An effect of a step whose batch is in ``tail`` must be named by that batch, as in
    :func:`orphaned_effects`. Another one must be a write of a batch the invocation
    shows dispatched: its key is the key of its step and call (:func:`effect_key`, how
    every write's key is made), its step's turn holds a result of that call (or its
    step's batch, still waiting for its results, holds the call under that key). What
    this reads is the tail and the turns of the steps that have writes, not the
    history before the snapshot.
    """
    named = dispatched_effect_keys(tail)
    tail_steps = {event.step for event in tail if isinstance(event, BatchDispatched)}
    return [
        effect
        for effect in effects
        if effect.key not in named
        and (effect.step in tail_steps or not _dispatched_before(invocation, effect))
    ]


def _dispatched_before(invocation: Invocation, effect: Effect) -> bool:
    """Whether the invocation shows ``effect``'s call dispatched, under ``effect``'s key."""
    step = effect.step
    if not 1 <= step <= invocation.step:
        return False
    try:
        key = effect_key(invocation.id, step, effect.call_id)
    except ValueError:
        return False
    if key != effect.key:
        return False
    batch = invocation.pending_batch
    if batch is not None and batch.step == step:
        return any(
            call.call_id == effect.call_id and call.effect_key == key for call in batch.calls
        )
    turns = invocation.turns
    if len(turns) < step:
        return False
    turn = turns[step - 1]
    return turn.step == step and any(result.call_id == effect.call_id for result in turn.results)


def cut_history_problem(
    invocation_id: str, events: Sequence[InvocationEvent], effects: Iterable[Effect]
) -> str | None:
    """Why the invocation's history disagrees with its effect ledger, or None when it agrees."""
    last_position = events[-1].originator_version if events else 0
    return orphans_problem(invocation_id, orphaned_effects(events, effects), last_position)


def orphans_problem(
    invocation_id: str, orphans: Sequence[Effect], last_position: int
) -> str | None:
    """What :func:`cut_history_problem` says of these orphaned effects (None: there are none)."""
    if not orphans:
        return None
    first = orphans[0]
    more = f" and {len(orphans) - 1} more" if len(orphans) > 1 else ""
    return (
        f"invocation {invocation_id}'s history was cut: the effect ledger holds "
        f"{first.key} (step {first.step}, call {first.call_id}, tool {first.tool}){more}, "
        f"which no dispatched batch of its {last_position} stored events names; "
        "nothing was run (check the store with: loop-actors audit verify)"
    )


def cut_decision_problem(invocation: Invocation) -> str | None:
    """Why no run can go on from the invocation's committed state, or None when one can.

    Its last event is a decision that is always committed with what follows it (a tool
    batch not dispatched, paused or refused; a final answer, a question, an approval
    request or a stop not followed by the end, a pause or a failed verification): its
    history was cut after it. A final answer of a run with a critic is the exception: it
    is committed before the critic is asked (:func:`answer_awaits_critic`).
    """
    waiting = invocation.phase is Phase.DECIDED or (
        invocation.phase is Phase.CALLS_PROPOSED and invocation.approval is None
    )
    if not waiting or answer_awaits_critic(invocation):
        return None
    return (
        f"invocation {invocation.id}'s history was cut: its last stored event (position "
        f"{invocation.version}) is a decision that is always stored with what follows it "
        "(the batch's dispatch, a pause or the end), and nothing follows it; nothing was "
        "run (check the store with: loop-actors audit verify)"
    )


def missing_effects_problem(
    invocation: Invocation, effects: Mapping[str, Effect | None]
) -> str | None:
    """Why the ledger lacks a write of the batch that waits for its results, or None.

    ``effects`` are the ledger entries read for the pending batch's effect keys (None
    for a key the ledger does not hold). A write a fork reuses from its source
    (``--writes dedupe``) has its source's entry, read by the same key.
    """
    batch = invocation.pending_batch
    if batch is None:
        return None
    for call in batch.calls:
        if call.effect_key is not None and effects.get(call.effect_key) is None:
            return (
                f"invocation {invocation.id}'s history was cut: the write {call.effect_key} "
                f"(step {batch.step}, call {call.call_id}, tool {call.name}) of its dispatched "
                "batch has no entry in the effect ledger, so whether it ran is unknown; "
                "nothing was run (check the store with: loop-actors audit verify)"
            )
    return None


def answer_awaits_critic(invocation: Invocation) -> bool:
    """True when the committed state is a final answer that the run's critic is to review.

    Reflection commits the answer before its critic is asked (``aggregates.critic``): a
    run that stopped there asks the critic again when it goes on.
    """
    settings = invocation.settings
    return (
        invocation.phase is Phase.DECIDED
        and settings is not None
        and settings.critic is not None
        and isinstance(invocation.last_decision, Final)
    )
