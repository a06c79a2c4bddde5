"""Fork: a new invocation that starts as a copy of another's committed steps, then goes on.

A fork of invocation S at step N is a new invocation whose history is S's committed
events of steps 1..N (decisions, batches, results, approvals, answers, compactions:
nothing is re-executed), after an ``InvocationStarted`` that records where it came
from (:class:`ForkOrigin`: S, N, S's head hash, who forked it and why, what changed).
It then goes on like any invocation, under the same agent or a changed one.

The writes S committed *after* step N are the point: the fork has its own effect
keys, so a fork that proposes the same payment again would make it again under a new
idempotency key. The origin lists those writes (:class:`SourceWrite`), and the turn
core decides what a fork's write that repeats one of them does (:class:`ForkWrites`):
wait for a person, be refused, reuse S's effect key and receipt, or run as new.

Everything here is pure: the shell reads S's events and its writes' ledger entries,
this module judges whether S can be forked there (:func:`plan_fork`) and builds the
fork (:func:`fork_invocation`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Literal

from pydantic import JsonValue

from aggregates.decisions import Budget, Frozen, TerminalReason, ToolEffect
from aggregates.digest import canonical_json, digest_of
from aggregates.effect import Effect
from aggregates.errors import IllegalTransitionError
from aggregates.fork_origin import ForkOrigin, ForkWrites, SourceWrite
from aggregates.invocation import Invocation, Phase
from aggregates.invocation_events import (
    BatchDispatched,
    DecisionProposed,
    DispatchedCall,
    InvocationEvent,
    InvocationStarted,
    LeaseAcquired,
    ResultsCommitted,
    SettingsChanged,
    Terminated,
    ToolSpec,
    VerificationFailed,
)
from aggregates.settings import RunSettings

__all__ = [
    "LAST_FAILED",
    "ForkCut",
    "ForkOrigin",
    "ForkPoint",
    "ForkRefusal",
    "ForkRefused",
    "ForkWrites",
    "SourceWrite",
    "fork_invocation",
    "last_failed_step",
    "plan_fork",
    "repeat_note",
    "repeated_writes",
    "reused_source_keys",
    "start_changes",
]

LAST_FAILED: Literal["last-failed"] = "last-failed"
"""``--at-step last-failed``: the step before the last one that failed."""

ForkPoint = int | Literal["last-failed"]
"""Where to fork: a step number (0: right after the start), or :data:`LAST_FAILED`."""


class ForkRefusal(StrEnum):
    """Why an invocation cannot be forked where asked (nothing is written)."""

    STEP_PAST_END = "step_past_end"
    """The source has fewer steps."""
    NO_FAILED_STEP = "no_failed_step"
    """``last-failed``, and nothing of the source failed."""
    OPEN_WRITE = "open_write"
    """A write of the source is dispatched but not settled, or of unknown outcome."""
    STEP_NOT_SETTLED = "step_not_settled"
    """The source's step N ended in the middle of a turn: a batch without results, a
    decision that stopped the run, a pause."""
    AGENT_REFUSES_HISTORY = "agent_refuses_history"
    """The fork's agent could not have taken the copied steps (a smaller budget)."""


@dataclass(frozen=True)
class ForkRefused:
    """A refused fork: why (typed), and what to do instead."""

    refusal: ForkRefusal
    message: str


@dataclass(frozen=True)
class ForkCut:
    """What a fork copies: the source's events of steps 1..``step``, and what came after."""

    step: int
    copied: list[InvocationEvent]
    source_version: int
    source_head_hash: str
    source_writes: list[SourceWrite]


_NOT_COPIED = (InvocationStarted, SettingsChanged, LeaseAcquired, Terminated)
"""Events a fork never copies: its own start, settings and leases replace the source's."""


def write_keys(events: Iterable[InvocationEvent]) -> list[str]:
    """The effect keys of every write the history dispatched, in order."""
    return [
        call.effect_key
        for event in events
        if isinstance(event, BatchDispatched)
        for call in event.calls
        if call.effect_key is not None
    ]


def last_failed_step(events: Sequence[InvocationEvent]) -> int | None:
    """The step before the last one that failed, or None when nothing failed.

    A step failed when its proposal was rejected, one of its calls returned an error,
    or its answer failed verification; the last step of a run that ended with
    another reason than ``completed`` failed too (the fork redoes it).
    """
    failing: int | None = None
    for event in events:
        match event:
            case DecisionProposed(rejection=rejection) if rejection is not None:
                failing = event.step
            case ResultsCommitted(results=results) if any(r.error is not None for r in results):
                failing = event.step
            case VerificationFailed():
                failing = event.step
            case Terminated(reason=reason, steps=steps) if reason is not TerminalReason.COMPLETED:
                failing = max(failing or 0, steps)
            case _:
                pass
    if failing is None or failing < 1:
        return None
    return failing - 1


def plan_fork(
    events: Sequence[InvocationEvent],
    effects: Mapping[str, Effect | None],
    at_step: ForkPoint,
) -> ForkCut | ForkRefused:
    """Judge whether the source (``events``) can be forked at ``at_step``, and what is copied.

    ``effects``: the ledger entries of the source's writes, by effect key (None: missing).
    Refused when the step is past the end, when ``last-failed`` finds nothing failed,
    or when any write of the source is not settled (a fork cannot know whether to repeat
    it); :func:`fork_invocation` refuses a step that ends in the middle of a turn.
    """
    source_id = events[0].originator_id if events else ""
    last_step = max((e.step for e in events if isinstance(e, DecisionProposed)), default=0)
    if at_step == LAST_FAILED:
        found = last_failed_step(events)
        if found is None:
            return ForkRefused(
                ForkRefusal.NO_FAILED_STEP,
                f"nothing of invocation {source_id} failed: give the step to fork at (--at-step N)",
            )
        step = found
    else:
        step = at_step
    if step < 0:
        return ForkRefused(ForkRefusal.STEP_PAST_END, f"a step is 0 or more, got {step}")
    if step > last_step:
        return ForkRefused(
            ForkRefusal.STEP_PAST_END,
            f"invocation {source_id} has {last_step} step(s): there is no step {step} to fork at",
        )
    open_writes = [
        (key, effect)
        for key in write_keys(events)
        if (effect := effects.get(key)) is None or effect.happened is None
    ]
    if open_writes:
        described = "; ".join(
            f"{key} ({effect.tool} at step {effect.step}: {effect.status.value})"
            if effect is not None
            else f"{key} (no ledger entry)"
            for key, effect in open_writes
        )
        return ForkRefused(
            ForkRefusal.OPEN_WRITE,
            f"invocation {source_id} has a write whose outcome is not settled: {described}. "
            "A fork could not tell whether it repeats it: settle it first (loop-actors "
            "reconcile --agent MODULE:ATTR asks its service; loop-actors effects resolve "
            "KEY --committed|--rejected --by NAME settles it by hand), then fork",
        )
    copied = [e for e in events if not isinstance(e, _NOT_COPIED) and getattr(e, "step", 0) <= step]
    head = events[-1]
    return ForkCut(
        step=step,
        copied=copied,
        source_version=head.originator_version,
        source_head_hash=head.chain_hash,
        source_writes=_writes_after(events, effects, step),
    )


_UNSETTLED: dict[Phase, str] = {
    Phase.DECIDED: "stopped, or paused, on its decision of step {step}",
    Phase.CALLS_PROPOSED: "did not dispatch its batch of step {step} (it stopped, or "
    "waits for approval)",
    Phase.DISPATCHED: "has no committed results for its batch of step {step}",
    Phase.AWAITING_RECONCILIATION: "has no committed results for its batch of step {step}",
    Phase.AWAITING_CHILD: "has no committed results for its batch of step {step}",
    Phase.AWAITING_APPROVAL: "waits for a person's approval at step {step}",
    Phase.AWAITING_CLARIFICATION: "waits for a person's answer at step {step}",
}
"""Why a fork cannot go on from the phase its copied steps leave it in (all but ready)."""


def _writes_after(
    events: Sequence[InvocationEvent], effects: Mapping[str, Effect | None], step: int
) -> list[SourceWrite]:
    writes: list[SourceWrite] = []
    for event in events:
        if not isinstance(event, BatchDispatched) or event.step <= step:
            continue
        for call in event.calls:
            effect = effects.get(call.effect_key) if call.effect_key is not None else None
            if effect is None or effect.happened is not True:
                continue
            writes.append(
                SourceWrite(
                    step=event.step,
                    call_id=call.call_id,
                    tool=call.name,
                    arguments_digest=effect.arguments_digest,
                    effect_key=effect.key,
                    status=effect.status,
                    receipt=effect.receipt,
                )
            )
    return writes


def start_changes(
    source: InvocationStarted,
    *,
    agent_name: str,
    agent_version: str,
    catalogue_digest: str,
    budget: Budget,
    settings: RunSettings | None,
) -> list[str]:
    """What a fork's start differs in from its source's, by name."""
    changed: list[str] = []
    if agent_name != source.agent_name:
        changed.append("agent_name")
    if agent_version != source.agent_version:
        changed.append("agent_version")
    if catalogue_digest != source.catalogue_digest:
        changed.append("catalogue")
    changed.extend(_field_changes("budget", source.budget, budget))
    if settings != source.settings:
        if settings is None or source.settings is None:
            changed.append("settings")
        else:
            changed.extend(_field_changes("settings", source.settings, settings))
    return changed


def _field_changes(prefix: str, before: Frozen, after: Frozen) -> list[str]:
    old, new = before.model_dump(mode="json"), after.model_dump(mode="json")
    return [f"{prefix}.{name}" for name in new if old.get(name) != new[name]]


def fork_invocation(
    cut: ForkCut,
    origin: ForkOrigin,
    *,
    fork_id: str,
    goal: str,
    agent_name: str,
    agent_version: str,
    catalogue_digest: str,
    tools: list[ToolSpec],
    budget: Budget,
    settings: RunSettings | None,
    task_class: str | None,
    actor: str | None,
    tenant: str | None,
    at: datetime,
) -> Invocation | ForkRefused:
    """The fork, its events pending: its start (with ``origin``), then the copied steps.

    The copies are new events of the fork (its id, its versions, its chain, the fork's
    time) with the source's content: the fork's history verifies on its own. Refused
    when the fork's budget refuses a copied step, or when the copied steps leave it
    anywhere but ready to ask the model (step N ended in the middle of a turn).

    Raises:
        IllegalTransitionError: ``fork_id`` is not a valid invocation id.
    """
    fork = Invocation.start(
        invocation_id=fork_id,
        goal=goal,
        agent_name=agent_name,
        agent_version=agent_version,
        catalogue_digest=catalogue_digest,
        tools=tools,
        budget=budget,
        settings=settings,
        task_class=task_class,
        actor=actor,
        tenant=tenant,
        forked_from=origin,
        at=at,
    )
    for event in cut.copied:
        fields = {
            name: getattr(event, name)
            for name in type(event).model_fields
            if name not in _OWN_FIELDS
        }
        try:
            fork.trigger_event(type(event), **fields, timestamp=at)
        except IllegalTransitionError as error:
            return ForkRefused(
                ForkRefusal.AGENT_REFUSES_HISTORY,
                f"the fork's agent could not have taken step {getattr(event, 'step', '?')} "
                f"of invocation {origin.source_id} as it was taken ({error}): give it a "
                "budget that holds the copied steps, or fork at an earlier step",
            )
    why = _UNSETTLED.get(fork.phase)
    if why is not None and cut.step > 0:
        return ForkRefused(
            ForkRefusal.STEP_NOT_SETTLED,
            f"invocation {origin.source_id} {why.format(step=cut.step)}: fork at step "
            f"{cut.step - 1} to have the model decide step {cut.step} again",
        )
    return fork


_OWN_FIELDS = frozenset(
    {"originator_id", "originator_version", "timestamp", "chain_hash", "audit_format"}
)
"""The fields of a copied event that are the fork's own, not the source's."""


# --------------------------------------------------------------------------- the fork's writes


def repeated_writes(
    origin: ForkOrigin,
    planned: Sequence[DispatchedCall],
    reused_keys: Iterable[str],
) -> dict[str, SourceWrite]:
    """The calls of a fork's batch that repeat a write its source committed after the fork point.

    A call repeats a source write when it is a write of the same tool with the same
    arguments (as dispatched: normalised, redacted). With ``dedupe`` each source write
    is reused once (``reused_keys``: those the fork reused already); otherwise every
    repeat names the first source write it repeats. By call id.
    """
    if not origin.source_writes:
        return {}
    reusing = origin.writes is ForkWrites.DEDUPE
    taken = set(reused_keys) if reusing else set()
    found: dict[str, SourceWrite] = {}
    for call in planned:
        if call.effect is not ToolEffect.WRITE or call.denied is not None:
            continue
        digest = digest_of(call.arguments)
        for write in origin.source_writes:
            if write.tool != call.name or write.arguments_digest != digest:
                continue
            if write.effect_key in taken:
                continue
            found[call.call_id] = write
            if reusing:
                taken.add(write.effect_key)
            break
    return found


def reused_source_keys(origin: ForkOrigin, dispatched_keys: Iterable[str | None]) -> list[str]:
    """Which of the source's effect keys the fork's batches reused already."""
    sources = {write.effect_key for write in origin.source_writes}
    return [key for key in dispatched_keys if key in sources]


def repeat_note(origin: ForkOrigin, write: SourceWrite) -> str:
    """How a repeated write is described to a person or the model."""
    receipt = "" if write.receipt is None else f", receipt {_short(write.receipt)}"
    return (
        f"it repeats the write {write.tool} that invocation {origin.source_id} (this fork's "
        f"source) committed at step {write.step} (effect key {write.effect_key}{receipt})"
    )


def _short(value: JsonValue, limit: int = 200) -> str:
    text = canonical_json(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"
