"""Audit: verify every aggregate's hash chain as stored, and what the chains do not cover.

``verify_all`` reads every stored row: each aggregate with a row (invocations,
effects, cancel requests, whether or not their first event is still there),
every snapshot, and checks that the aggregates still refer to one another
(:mod:`aggregates.audit_coverage`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic import computed_field

from aggregates.audit import StoredForm, verify_chain
from aggregates.audit_coverage import (
    EFFECT,
    INVOCATION,
    PROVENANCE_FINDINGS,
    Provenance,
    dispatched_effect_keys,
    fork_provenance,
    kind_of,
    kind_problem,
    snapshot_problems,
    transition_problem,
)
from aggregates.decisions import Frozen
from aggregates.effect import EffectPrepared
from aggregates.events import DomainEvent
from aggregates.invocation import BatchDispatched, InvocationStarted, ResultsCommitted
from aggregates.requests import CancelRequested
from loop_actors._errors import InvocationNotFoundError
from loop_actors.store.store import EventStore

Entries = list[tuple[int, DomainEvent | Exception]]


class ChainReport(Frozen):
    """The verdict on one aggregate's chain (or on one snapshot)."""

    id: str
    kind: str
    """``invocation``, ``effect``, ``cancel_request`` or ``snapshot`` (of invocation ``id``)."""
    events: int
    """Events checked (up to the first break); for a snapshot, its version."""
    head_hash: str | None
    """The last hash of a whole chain: anchor it elsewhere to detect a full rewrite."""
    broken_at: int | None = None
    """The first broken position (for a snapshot, its version); None when none is."""
    problem: str | None = None
    """Why it is broken, or what it refers to that is missing; None when intact."""
    forked_from: str | None = None
    """For a fork whose own chain is whole: the source it records."""
    provenance: Provenance | None = None
    """For a fork whose own chain is whole: what was found of its source's head at the
    fork point (a mismatch, or a source cut before it, is its ``problem``)."""
    provenance_detail: str | None = None
    """The provenance in words."""

    @computed_field  # type: ignore[prop-decorator]
    @property
    def intact(self) -> bool:
        """True when the chain is whole and nothing it refers to is missing."""
        return self.problem is None


class Coverage(Frozen):
    """What a whole-store audit read: every stored row, and how many of each kind."""

    kind: str = "coverage"
    rows: int
    """Event rows read and checked (all the store holds)."""
    snapshots: int
    """Snapshot rows read and checked (all the store holds)."""
    invocations: int
    effects: int
    cancel_requests: int
    store_rows: int
    """The event and snapshot rows the store holds, counted apart: equal to rows + snapshots."""


def _chain_report(
    aggregate_id: str, entries: Entries, forms: dict[int, StoredForm] | None = None
) -> ChainReport:
    kind = kind_of(aggregate_id)
    if not entries:
        # Referenced (by a dispatched batch) yet absent: its rows were deleted.
        return ChainReport(
            id=aggregate_id,
            kind=kind.name,
            events=0,
            head_hash=None,
            broken_at=1,
            problem="no stored events: its rows are missing",
        )
    checked, head, broken = verify_chain(entries, forms)
    if broken is not None:
        return ChainReport(
            id=aggregate_id,
            kind=kind.name,
            events=checked,
            head_hash=None,
            broken_at=broken.position,
            problem=broken.problem,
        )
    for position, event in entries:
        problem = kind_problem(kind, position, event)
        if problem is not None:
            return ChainReport(
                id=aggregate_id,
                kind=kind.name,
                events=position - 1,
                head_hash=None,
                broken_at=position,
                problem=problem,
            )
    # A whole chain of the right kind can still hold an event its aggregate refuses
    # (appended after Terminated, with its hash recomputed): reading it would fail.
    refused = transition_problem(kind, entries)
    if refused is not None:
        position, problem = refused
        return ChainReport(
            id=aggregate_id,
            kind=kind.name,
            events=position - 1,
            head_hash=None,
            broken_at=position,
            problem=problem,
        )
    return ChainReport(id=aggregate_id, kind=kind.name, events=checked, head_hash=head)


def _with_provenance(
    report: ChainReport,
    entries: Entries,
    source: Entries,
    source_report: ChainReport | None,
) -> ChainReport:
    """A whole fork's report with what its source (``source``, as stored) says of its origin."""
    first = entries[0][1] if entries else None
    if not report.intact or not isinstance(first, InvocationStarted):
        return report
    origin = first.forked_from
    if origin is None:
        return report
    broken_at = None if source_report is None else source_report.broken_at
    verdict, detail = fork_provenance(origin, source, broken_at)
    update: dict[str, Any] = {
        "forked_from": origin.source_id,
        "provenance": verdict,
        "provenance_detail": detail,
    }
    if verdict in PROVENANCE_FINDINGS:
        update["problem"] = f"{verdict.value}: {detail}"
    return report.model_copy(update=update)


def _source_id(entries: Entries) -> str | None:
    first = entries[0][1] if entries else None
    if isinstance(first, InvocationStarted) and first.forked_from is not None:
        return first.forked_from.source_id
    return None


def verify_aggregate(store: EventStore, aggregate_id: str) -> ChainReport:
    """Check one aggregate's chain as stored (blocking); its kind follows from its id."""
    forms: dict[int, StoredForm] = {}
    return _chain_report(aggregate_id, store.stored_entries(aggregate_id, forms=forms), forms)


def _referral_problem(
    report: ChainReport, entries: Entries, invocations: dict[str, Entries]
) -> str | None:
    """What an intact effect or cancel request refers to that the store no longer has."""
    first = entries[0][1]
    if isinstance(first, EffectPrepared):
        owner = invocations.get(first.invocation_id)
        if owner is None:
            return f"its invocation {first.invocation_id} has no stored events (deleted)"
        if report.id not in dispatched_effect_keys(
            e for _, e in owner if isinstance(e, DomainEvent)
        ):
            return (
                f"no dispatched batch of its invocation {first.invocation_id} names it "
                "(the invocation's history was cut)"
            )
    if isinstance(first, CancelRequested) and first.invocation_id not in invocations:
        return f"its invocation {first.invocation_id} has no stored events (deleted)"
    return None


def _snapshot_reports(
    invocation_id: str, entries: Entries, snapshots: Sequence[tuple[int, Any]]
) -> list[ChainReport]:
    if not snapshots:
        return []  # nothing to check (and its chain is reported on its own)
    events = [event for _, event in entries if isinstance(event, DomainEvent)]
    whole = bool(entries) and _chain_report(invocation_id, entries).intact
    reports: list[ChainReport] = []
    problems = dict(snapshot_problems(events, snapshots)) if whole else {}
    for version, _ in snapshots:
        if not entries:
            problem: str | None = "its invocation has no stored events"
        elif not whole:
            problem = "it cannot be checked: the invocation's chain is broken"
        elif kind_of(invocation_id) is not INVOCATION:
            problem = "only invocations are snapshotted"
        else:
            problem = problems.get(version)
        reports.append(
            ChainReport(
                id=invocation_id,
                kind="snapshot",
                events=version,
                head_hash=None,
                broken_at=version if problem else None,
                problem=problem,
            )
        )
    return reports


def verify_invocation(store: EventStore, invocation_id: str) -> list[ChainReport]:
    """Check an invocation's chain, its snapshots and the chains of its effects (blocking).

    Its effects are the ones its batches name and the ones the ledger holds for it.

    Raises:
        InvocationNotFoundError: no such invocation.
    """
    forms: dict[int, StoredForm] = {}
    entries = store.stored_entries(invocation_id, forms=forms)
    if not entries:
        raise InvocationNotFoundError(invocation_id)
    report = _chain_report(invocation_id, entries, forms)
    source_id = _source_id(entries)
    if source_id is not None:
        source_forms: dict[int, StoredForm] = {}
        source = store.stored_entries(source_id, forms=source_forms)
        source_report = _chain_report(source_id, source, source_forms) if source else None
        report = _with_provenance(report, entries, source, source_report)
    reports = [report]
    snapshots = store.stored_snapshots().get(invocation_id, [])
    reports.extend(_snapshot_reports(invocation_id, entries, snapshots))
    named = _named_keys(entries)
    held = store.effect_keys_of_many([invocation_id])[invocation_id]
    invocations = {invocation_id: entries}
    for key in dict.fromkeys([*named, *held]):
        effect_forms: dict[int, StoredForm] = {}
        effect_entries = store.stored_entries(key, forms=effect_forms)
        report = _chain_report(key, effect_entries, effect_forms)
        if report.intact:
            first = effect_entries[0][1]
            owner = first.invocation_id if isinstance(first, EffectPrepared) else invocation_id
            if owner not in invocations:  # a fork's write that reused its source's (dedupe)
                invocations[owner] = store.stored_entries(owner)
            problem = _referral_problem(report, effect_entries, invocations)
            if problem is not None:
                report = report.model_copy(update={"problem": problem})
        reports.append(report)
    return reports


def verify_tree(store: EventStore, root_id: str) -> list[ChainReport]:
    """Check an invocation as :func:`verify_invocation` does, and every child below it.

    The children are the ones its dispatched batches name (``DispatchedCall.child_id``,
    the calls of ``Agent.as_tool``) and its results name (``ToolResult.child_ids``, the
    children a tool's body ran with ``run_agent``), theirs, and so on. A child named
    that was never started (its parent died before it) is not there to check.

    Raises:
        InvocationNotFoundError: no invocation ``root_id``.
    """
    reports: list[ChainReport] = []
    seen: set[str] = set()
    waiting = [root_id]
    while waiting:
        invocation_id = waiting.pop(0)
        if invocation_id in seen:
            continue
        seen.add(invocation_id)
        try:
            reports.extend(verify_invocation(store, invocation_id))
        except InvocationNotFoundError:
            if invocation_id == root_id:
                raise
            continue
        waiting.extend(_named_children(store.stored_entries(invocation_id)))
    return reports


def _named_children(entries: Entries) -> list[str]:
    """The children an invocation's history names, each once, in the order named.

    Its batches' (``as_tool``), and those its calls' bodies ran (``ToolResult.child_ids``).
    """
    named: dict[str, None] = {}
    for _, event in entries:
        if isinstance(event, BatchDispatched):
            named.update((call.child_id, None) for call in event.calls if call.child_id)
        elif isinstance(event, ResultsCommitted):
            for result in event.results:
                named.update((child_id, None) for child_id in result.child_ids or ())
    return list(named)


def _named_keys(entries: Entries) -> list[str]:
    keys: list[str] = []
    for _, event in entries:
        if isinstance(event, DomainEvent):
            keys.extend(sorted(dispatched_effect_keys([event])))
    return keys


def verify_all(store: EventStore) -> tuple[list[ChainReport], Coverage]:
    """Check every aggregate and every snapshot the store holds (blocking).

    Every stored row is read: aggregates are found from their rows, not from
    their first events, so one whose first event was deleted is reported too.
    Effects named by a batch but without any row are reported as missing.
    """
    forms: dict[str, dict[int, StoredForm]] = {}
    stored = {
        aggregate_id: store.stored_entries(aggregate_id, forms=forms.setdefault(aggregate_id, {}))
        for aggregate_id in store.audit_aggregate_ids()
    }
    invocations = {i: e for i, e in stored.items() if kind_of(i) is INVOCATION}
    reports: list[ChainReport] = []
    snapshots = store.stored_snapshots()
    chains = {i: _chain_report(i, entries, forms[i]) for i, entries in stored.items()}
    for aggregate_id, entries in stored.items():
        report = chains[aggregate_id]
        if report.intact and report.kind != INVOCATION.name:
            problem = _referral_problem(report, entries, invocations)
            if problem is not None:
                report = report.model_copy(update={"problem": problem})
        source_id = _source_id(entries) if aggregate_id in invocations else None
        if source_id is not None:
            source = invocations.get(source_id, [])
            report = _with_provenance(report, entries, source, chains.get(source_id))
        reports.append(report)
        if aggregate_id in invocations:
            reports.extend(
                _snapshot_reports(aggregate_id, entries, snapshots.get(aggregate_id, []))
            )
            for key in _named_keys(entries):
                if key not in stored:
                    reports.append(_chain_report(key, []))
    for aggregate_id, rows in snapshots.items():
        if aggregate_id not in invocations:
            reports.extend(_snapshot_reports(aggregate_id, stored.get(aggregate_id, []), rows))
    event_rows, snapshot_rows = store.audit_row_counts()
    coverage = Coverage(
        rows=sum(len(entries) for entries in stored.values()),
        snapshots=sum(len(rows) for rows in snapshots.values()),
        invocations=len(invocations),
        effects=sum(1 for i in stored if kind_of(i) is EFFECT),
        cancel_requests=sum(1 for i in stored if kind_of(i).name == "cancel_request"),
        store_rows=event_rows + snapshot_rows,
    )
    return reports, coverage
