"""What the audit checks beyond each chain's hashes: kinds, topics, snapshots, references.

The hash chain (:mod:`aggregates.audit`) covers an event's fields, its class name,
its aggregate id and its position. It does not cover the stored topic, nor the
``originator_topic`` of a first event (the aggregate's class), nor the snapshots
that reading an invocation starts from, nor whether the aggregates of a store
still refer to one another. These rules cover them:

- **kinds**: an aggregate's id says what it is (``eff-…`` an effect, ``cancel:…``
  a cancel request, anything else an invocation). Each of its events must be an
  event of that kind, its first event (and only the first) the kind's creating
  event, and that event's ``originator_topic`` the kind's aggregate class. With
  the class name in the hash and no two event classes of one name (a test checks
  it), a stored topic that names another class breaks the chain, one that names
  no event class is reported unreadable, and a forged ``originator_topic`` is
  reported here;
- **transitions**: the events of a whole chain must be a history its aggregate
  accepts, replayed through the aggregate as reading it does: its transition table
  (``TRANSITIONS`` of an invocation, ``LEDGER_TRANSITIONS`` of an effect) refuses an
  event outside its phase's row, then the event's own checks (steps, call ids,
  attempts) refuse one that does not fit its history. An event appended after
  ``Terminated`` with a valid hash is reported here: resume would fail on it;
- **snapshots** must equal the snapshot taken from a replay of the events up to
  their version (a snapshot is a pure function of the events: no clock read);
- **references**: an effect belongs to an invocation that is stored and whose
  dispatched batches name it; a cancel request to an invocation that is stored;
- **provenance**: a fork's first event records its source's head hash at the fork
  point (``ForkOrigin.source_head_hash``, the hash of the source's event at
  ``source_version``); when the source is in the store, its whole chain must have that
  hash there (:func:`fork_provenance`). The two chains are each whole on their own: only
  this check ties them, so a source rewritten before the fork point with its chain
  recomputed, or a fork whose record of its source was rewritten with its own chain
  recomputed, is reported here.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from eventsourcing.utils import get_topic

from aggregates.audit import split_stored, stored_link
from aggregates.effect import Effect, EffectEvent, EffectPrepared
from aggregates.errors import IllegalTransitionError
from aggregates.events import DomainEvent, fold
from aggregates.fork_origin import ForkOrigin
from aggregates.ids import CANCEL_REQUEST_PREFIX, EFFECT_KEY_PREFIX
from aggregates.invocation import (
    BatchDispatched,
    Invocation,
    InvocationEvent,
    InvocationSnapshot,
    InvocationStarted,
)
from aggregates.requests import CancelRequest, CancelRequested


@dataclass(frozen=True)
class AggregateKind:
    """One kind of aggregate a store holds."""

    name: str
    """As reported: ``invocation``, ``effect`` or ``cancel_request``."""
    aggregate: type
    event_base: type[DomainEvent]
    created: type[DomainEvent]


INVOCATION = AggregateKind("invocation", Invocation, InvocationEvent, InvocationStarted)
EFFECT = AggregateKind("effect", Effect, EffectEvent, EffectPrepared)
CANCEL_REQUEST = AggregateKind("cancel_request", CancelRequest, CancelRequested, CancelRequested)
KINDS = (INVOCATION, EFFECT, CANCEL_REQUEST)


def kind_of(aggregate_id: str) -> AggregateKind:
    """The kind of aggregate an id names (invocation ids may not take the other prefixes)."""
    if aggregate_id.startswith(EFFECT_KEY_PREFIX):
        return EFFECT
    if aggregate_id.startswith(CANCEL_REQUEST_PREFIX):
        return CANCEL_REQUEST
    return INVOCATION


def event_classes() -> list[type[DomainEvent]]:
    """Every concrete event class of the three kinds (the topics a store may hold)."""
    found: list[type[DomainEvent]] = []
    pending: list[type[DomainEvent]] = [kind.event_base for kind in KINDS]
    while pending:
        cls = pending.pop()
        if cls not in found:
            found.append(cls)
            pending.extend(cls.__subclasses__())
    return [cls for cls in found if cls not in (InvocationEvent, EffectEvent)]


def kind_problem(kind: AggregateKind, position: int, event: Any) -> str | None:
    """Why an event cannot be at this position of an aggregate of this kind, or None."""
    name = type(event).__name__
    if not isinstance(event, kind.event_base):
        return f"a {name} event in the stream of {kind.name} (its stored topic was changed)"
    if position == 1:
        if not isinstance(event, kind.created):
            return f"the first event is {name}, not {kind.created.__name__}"
        expected = get_topic(kind.aggregate)
        if getattr(event, "originator_topic", expected) != expected:
            return (
                f"its originator_topic is {event.originator_topic!r}, not {expected!r} "  # type: ignore[attr-defined]
                "(the aggregate class was changed)"
            )
    elif isinstance(event, kind.created):
        return f"a second {name} at position {position}"
    return None


def transition_problem(
    kind: AggregateKind, events: Iterable[tuple[int, Any]]
) -> tuple[int, str] | None:
    """The first event of an aggregate that does not follow the ones before it, and why.

    ``events`` are the aggregate's (position, event) pairs of a whole chain, every one
    of the aggregate's kind, the first its creating event (``kind_problem``). They are
    replayed through the aggregate, as reading it does: its transition table refuses an
    event outside its phase's row before anything changes, then the event's own checks
    refuse one that does not fit the history. None when the aggregate accepts them all.
    """
    name = kind.name.replace("_", " ")
    aggregate: Any = None
    for position, event in events:
        try:
            aggregate = event.mutate(aggregate)
        except IllegalTransitionError as error:
            return position, f"the {name}'s transitions refuse it: {error}"
        except Exception as error:  # a tampered history is reported, not raised
            return position, f"the {name} cannot take it: {type(error).__name__}: {error}"
    return None


def sequence_problem(kind: AggregateKind, events: Sequence[DomainEvent]) -> tuple[int, str] | None:
    """Why an aggregate's stored events are not a history it can be read from, or None.

    The first position that is wrong and why: a position missing (rows deleted from the
    middle, or its first), an event of another kind or a second creating event
    (:func:`kind_problem`), or an event its transitions refuse (:func:`transition_problem`).
    The hashes are not checked here (``audit verify`` checks them).
    """
    expected = 1
    for event in events:
        position = event.originator_version
        if position != expected:
            return expected, (
                f"position {expected} is missing (the next stored is {position})"
                if position > expected
                else f"position {position} comes after {expected - 1}"
            )
        problem = kind_problem(kind, position, event)
        if problem is not None:
            return position, problem
        expected += 1
    return transition_problem(kind, [(event.originator_version, event) for event in events])


def snapshot_problems(
    events: Sequence[DomainEvent], snapshots: Iterable[tuple[int, Any]]
) -> list[tuple[int, str]]:
    """The snapshots of an invocation that its events do not give, as (version, why).

    ``events`` are the invocation's events in order (a whole chain), ``snapshots``
    its stored snapshots as (version, snapshot or the exception that decoding raised).
    """
    problems: list[tuple[int, str]] = []
    # One replay, in order: each snapshot is compared with the state at its version.
    aggregate: Any = None
    replayed_to = 0
    unreplayable: Exception | None = None
    for version, snapshot in sorted(snapshots, key=lambda pair: pair[0]):
        if isinstance(snapshot, Exception):
            problems.append((version, f"the stored snapshot cannot be read: {snapshot}"))
            continue
        if not isinstance(snapshot, InvocationSnapshot):
            problems.append((version, f"a {type(snapshot).__name__} is not an invocation snapshot"))
            continue
        if version < 1:  # before the first event: nothing to replay it against
            problems.append((version, f"it is of version {version}, before the first event"))
            continue
        if version > len(events):
            problems.append(
                (version, f"it is of version {version}, past the {len(events)} stored events")
            )
            continue
        if unreplayable is None:
            try:
                aggregate = fold(aggregate, events[replayed_to:version])
                replayed_to = version
                replayed = InvocationSnapshot.of(aggregate)
            except Exception as error:  # a tampered history is reported, not raised
                unreplayable = error
        if unreplayable is not None:
            problems.append(
                (version, f"the events up to its version cannot be replayed: {unreplayable}")
            )
            continue
        if not replayed.same_state(snapshot):
            problems.append(
                (version, "it differs from the replay of the events up to its version (forged)")
            )
    return problems


def snapshot_seal_holds(
    originator_id: str, version: int, topic: str, plain_state: bytes, event_hash: str | None
) -> bool:
    """Whether a stored snapshot is, byte for byte, the one sealed after the event at its version.

    ``plain_state`` is the snapshot row's state as the audit reads a row (decrypted,
    decompressed): its seal first, then its body (``InvocationSnapshot``);
    ``event_hash`` the chain hash the stored event at ``version`` carries (None when
    there is none). False for a snapshot written before seals, one whose body or seal
    was changed, and one that follows another event than the stored one.
    """
    split = split_stored(plain_state)
    if split is None or event_hash is None:
        return False
    sealed, body = split
    return stored_link(event_hash, originator_id, version, topic, body) == sealed


def dispatched_effect_keys(events: Iterable[DomainEvent]) -> set[str]:
    """The effect keys an invocation's dispatched batches name."""
    return {
        call.effect_key
        for event in events
        if isinstance(event, BatchDispatched)
        for call in event.calls
        if call.effect_key
    }


class Provenance(StrEnum):
    """What the audit found of a fork's claim about its source (``ForkOrigin``)."""

    VERIFIED = "verified"
    """The source is in the store, its chain whole up to the fork point, and its event there
    has the hash the fork recorded."""
    SOURCE_NOT_IN_STORE = "source_not_in_store"
    """The source has no stored events here (deleted, or the fork was copied to another
    store): the claim cannot be checked. Not a finding: the fork's chain is checked alone."""
    SOURCE_BROKEN = "source_broken"
    """The source's own chain is broken at or before the fork point (reported on the
    source): the claim cannot be checked against it."""
    SOURCE_HEAD_MISMATCH = "source_head_mismatch"
    """A finding: the source's event at the fork point has another hash than the fork
    recorded. The source's history up to the fork point was rewritten (its chain
    recomputed), or the fork's record of it was (its own chain recomputed)."""
    SOURCE_TRUNCATED = "source_truncated"
    """A finding: the source has no event at the fork point: its tail was cut."""


PROVENANCE_FINDINGS = frozenset({Provenance.SOURCE_HEAD_MISMATCH, Provenance.SOURCE_TRUNCATED})
"""The verdicts that make a fork's report broken."""


def fork_provenance(
    origin: ForkOrigin, source: Sequence[tuple[int, Any]], source_broken_at: int | None
) -> tuple[Provenance, str]:
    """Whether a fork's source, as stored, has the head the fork recorded; and in words.

    ``source`` is the source's stored entries (``(position, event)``, an event possibly
    an exception for a row that does not decode), empty when it has none;
    ``source_broken_at`` the first position at which its own audit found it broken.
    """
    at, recorded = origin.source_version, origin.source_head_hash
    where = f"forked from {origin.source_id} at its version {at}"
    if not source:
        return Provenance.SOURCE_NOT_IN_STORE, f"{where}: the source is not in this store"
    if source_broken_at is not None and source_broken_at <= at:
        return (
            Provenance.SOURCE_BROKEN,
            f"{where}: the source's chain is broken at position {source_broken_at}, "
            "so the fork's record of it cannot be checked",
        )
    event = next((e for position, e in source if position == at), None)
    if event is None:
        return (
            Provenance.SOURCE_TRUNCATED,
            f"{where}: the source has {len(source)} events, none at version {at} "
            "(its tail was cut)",
        )
    if getattr(event, "chain_hash", None) != recorded:
        return (
            Provenance.SOURCE_HEAD_MISMATCH,
            f"{where}: the fork recorded its head hash {recorded}, the source's event there "
            f"has {getattr(event, 'chain_hash', None)} (the source before the fork point, or "
            "the fork's record of it, was rewritten)",
        )
    return Provenance.VERIFIED, f"{where}: its head hash there is the one the fork recorded"
