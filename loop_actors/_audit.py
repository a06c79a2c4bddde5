"""Audit: verify the hash chains of invocations (and their effects) as stored."""

from __future__ import annotations

from aggregates.audit import verify_chain
from aggregates.decisions import Frozen
from aggregates.invocation import BatchDispatched
from loop_actors._errors import InvocationNotFoundError
from loop_actors._store import EventStore


class ChainReport(Frozen):
    """The verdict on one aggregate's chain."""

    id: str
    kind: str
    """``invocation`` or ``effect``."""
    events: int
    """Events checked (up to the first break)."""
    head_hash: str | None
    """The last hash of a whole chain: anchor it elsewhere to detect a full rewrite."""
    broken_at: int | None = None
    problem: str | None = None

    @property
    def intact(self) -> bool:
        """True when the chain is whole."""
        return self.broken_at is None


def verify_aggregate(store: EventStore, aggregate_id: str, kind: str) -> ChainReport:
    """Check one aggregate's chain as stored (blocking)."""
    entries = store.stored_entries(aggregate_id)
    if not entries:
        # Referenced (by a dispatched batch) yet absent: its rows were deleted.
        return ChainReport(
            id=aggregate_id,
            kind=kind,
            events=0,
            head_hash=None,
            broken_at=1,
            problem="no stored events: its rows are missing",
        )
    checked, head, broken = verify_chain(entries)
    return ChainReport(
        id=aggregate_id,
        kind=kind,
        events=checked,
        head_hash=head,
        broken_at=broken.position if broken else None,
        problem=broken.problem if broken else None,
    )


def verify_invocation(store: EventStore, invocation_id: str) -> list[ChainReport]:
    """Check an invocation's chain and the chains of the effects it dispatched (blocking).

    Raises:
        InvocationNotFoundError: no such invocation.
    """
    entries = store.stored_entries(invocation_id)
    if not entries:
        raise InvocationNotFoundError(invocation_id)
    reports = [verify_aggregate(store, invocation_id, "invocation")]
    keys: list[str] = []
    for _, event in entries:
        if isinstance(event, BatchDispatched):
            keys.extend(call.effect_key for call in event.calls if call.effect_key)
    reports.extend(verify_aggregate(store, key, "effect") for key in keys)
    return reports


def verify_all(store: EventStore) -> list[ChainReport]:
    """Check every invocation of the store, with its effects (blocking)."""
    reports: list[ChainReport] = []
    for invocation_id in store.invocation_ids():
        reports.extend(verify_invocation(store, invocation_id))
    return reports
