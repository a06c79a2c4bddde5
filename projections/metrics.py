"""Metrics: counts and distributions by agent, task class and terminal reason.

Seed 003: report distributions by task class and terminal reason, not one
global average. The read model keeps one row per invocation (its totals, wall
time, repeated plans), one per failed-call class and one per effect; the
figures are computed from them at query time, so percentiles are exact.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any, ClassVar, Literal, cast

from eventsourcing.persistence import IntegrityError

from aggregates.decisions import Frozen, TerminalReason
from aggregates.effect import EffectEvent, EffectPrepared, effect_status_after
from aggregates.events import ByClass, DomainEvent, isoformat
from aggregates.invocation import (
    ApprovalDenied,
    ApprovalGranted,
    BatchDispatched,
    ClarificationProvided,
    CritiqueReturned,
    DecisionProposed,
    InvocationEvent,
    InvocationStarted,
    Paused,
    ResultsCommitted,
    SleepEnded,
    Terminated,
    plan_fingerprint,
)
from projections.runner import ReadModel, ReadModelRunner
from projections.sql import ViewCursor, marks

GroupBy = Literal["agent", "task-class", "reason", "tree"]

_COLUMN = {
    "agent": "agent",
    "task-class": "task_class",
    "reason": "reason",
    "tree": "COALESCE(root_id, invocation_id)",
}


class MetricsProjection(ReadModel):
    """Per-invocation totals, failed calls by error class, and effects by state.

    A batch at a time: the invocations' rows the batch touches are read once
    (or found in the runner's cache, ``cursor.cache``, up to ``CACHE_ROWS``),
    every event is folded into them in memory, in order, and each changed row
    is written once (one ``executemany`` per statement).
    """

    name = "metrics"
    version = 5

    CACHE_ROWS: ClassVar[int] = 50_000
    """How many invocations' rows the cache may hold (least recently touched dropped first)."""

    def create(self) -> list[str]:
        """The tables."""
        return [
            "CREATE TABLE IF NOT EXISTS metrics_invocations ("
            "invocation_id TEXT PRIMARY KEY, agent TEXT, task_class TEXT, reason TEXT, "
            "steps BIGINT, tool_calls BIGINT, input_tokens BIGINT, output_tokens BIGINT, "
            "cost DOUBLE PRECISION, started_at TEXT, wall_ms DOUBLE PRECISION, "
            "repeated_plans BIGINT, last_plan TEXT, critique_rounds BIGINT, "
            "critic_input_tokens BIGINT, critic_output_tokens BIGINT, "
            "critic_cost DOUBLE PRECISION, root_id TEXT)",
            "CREATE INDEX IF NOT EXISTS metrics_invocations_root ON metrics_invocations (root_id)",
            "CREATE TABLE IF NOT EXISTS metrics_failed_calls ("
            "invocation_id TEXT, error_class TEXT, calls BIGINT, "
            "PRIMARY KEY (invocation_id, error_class))",
            "CREATE TABLE IF NOT EXISTS metrics_effects ("
            "effect_key TEXT PRIMARY KEY, invocation_id TEXT, status TEXT)",
        ]

    def tables(self) -> list[str]:
        """The tables, for a rebuild."""
        return ["metrics_invocations", "metrics_failed_calls", "metrics_effects"]

    def apply(self, cursor: ViewCursor, event: DomainEvent, position: int) -> None:
        """Fold one event into the totals (a batch of one)."""
        self.apply_batch(cursor, [(event, position)])

    def apply_batch(self, cursor: ViewCursor, events: Sequence[tuple[DomainEvent, int]]) -> None:
        """Fold a batch of events into the totals: each touched row read and written once."""
        held = cursor.cache.get("invocations")
        if not isinstance(held, OrderedDict):  # least recently touched first (see the cache)
            held = cursor.cache["invocations"] = OrderedDict()
        starts: set[str] = set()
        missing: set[str] = set()
        folds = _FOLDS
        for event, _ in events:
            fold = folds[type(event)]
            if fold is None or fold is _Batch.on_effect:
                continue
            invocation_id = event.originator_id
            if fold is _Batch.on_start:
                starts.add(invocation_id)
            elif invocation_id not in held:
                missing.add(invocation_id)
        missing -= starts
        for chunk in _chunks(sorted(missing)):
            for row in cursor.query(
                f"SELECT * FROM metrics_invocations WHERE invocation_id IN ({marks(len(chunk))})",
                chunk,
            ):
                held[row["invocation_id"]] = [row[c] for c in _COLUMNS]
        batch = _Batch(held)
        for event, _ in events:
            fold = folds[type(event)]
            if fold is not None:
                fold(batch, event)
        batch.write(cursor)
        for invocation_id in batch.touched:  # the most recently touched last
            held.move_to_end(invocation_id)
        while len(held) > self.CACHE_ROWS:
            held.popitem(last=False)  # not del of a plain dict's first: each looks past the holes


_COLUMNS = (
    "invocation_id",
    "agent",
    "task_class",
    "reason",
    "steps",
    "tool_calls",
    "input_tokens",
    "output_tokens",
    "cost",
    "started_at",
    "wall_ms",
    "repeated_plans",
    "last_plan",
    "critique_rounds",
    "critic_input_tokens",
    "critic_output_tokens",
    "critic_cost",
    "root_id",
)
_REASON, _STEPS, _TOOL_CALLS, _INPUT, _OUTPUT, _COST = 3, 4, 5, 6, 7, 8
_STARTED_AT, _WALL_MS, _REPEATED, _LAST_PLAN = 9, 10, 11, 12
_CRITIQUES, _CRITIC_INPUT, _CRITIC_OUTPUT, _CRITIC_COST = 13, 14, 15, 16

_CHUNK = 250

_REASONS = {reason: reason.value for reason in TerminalReason}
"""Each reason's value (a dict lookup: an enum's ``value`` is a Python property)."""


def _root_of(started: dict[str, Any]) -> str | None:
    """The root of the tree an invocation belongs to (None: it is a root).

    A child's root is its parent link's; a handoff target's is its chain's first
    invocation.
    """
    parent = started.get("parent")
    if parent is not None:
        return str(parent.root_id)
    came = started.get("handed_off_from")
    if came is not None:
        return str(came.chain_root)
    return None


def _chunks(items: Sequence[str]) -> list[Sequence[str]]:
    return [items[i : i + _CHUNK] for i in range(0, len(items), _CHUNK)]


class _Batch:
    """One batch's changes, folded in memory in the events' order."""

    def __init__(self, held: dict[str, list[Any]]) -> None:
        self.held = held
        self.new: set[str] = set()
        self.touched: dict[str, None] = {}
        self.failed: dict[tuple[str, str], int] = {}
        self.new_effects: dict[str, list[str]] = {}
        self.effect_statuses: dict[str, str] = {}

    def _row(self, invocation_id: str) -> list[Any] | None:
        row = self.held.get(invocation_id)
        if row is not None:
            self.touched[invocation_id] = None
        return row

    def on_decision(self, event: DecisionProposed) -> None:
        """A step's usage."""
        e = event.__dict__  # its fields from its __dict__ (see the trajectory's _head_row)
        if (row := self._row(e["originator_id"])) is not None:
            usage = e["usage"].__dict__
            row[_STEPS] = e["step"]
            row[_INPUT] += usage["input_tokens"]
            row[_OUTPUT] += usage["output_tokens"]
            row[_COST] += usage["cost"]

    def on_critique(self, event: CritiqueReturned) -> None:
        """A critic's round and its usage (apart from the agent's)."""
        e = event.__dict__
        if (row := self._row(e["originator_id"])) is not None:
            usage = e["usage"].__dict__
            # NULL until its first round: an invocation without a critic has none.
            row[_CRITIQUES] = (row[_CRITIQUES] or 0) + 1
            row[_CRITIC_INPUT] = (row[_CRITIC_INPUT] or 0) + usage["input_tokens"]
            row[_CRITIC_OUTPUT] = (row[_CRITIC_OUTPUT] or 0) + usage["output_tokens"]
            row[_CRITIC_COST] = (row[_CRITIC_COST] or 0.0) + usage["cost"]

    def on_start(self, event: InvocationStarted) -> None:
        """A new row (a second start fails the batch, as the INSERT would)."""
        e = event.__dict__
        invocation_id = e["originator_id"]
        if invocation_id in self.held:
            raise IntegrityError(f"invocation {invocation_id} started twice")
        self.held[invocation_id] = [
            invocation_id, e["agent_name"], e["task_class"] or "", None,
            0, 0, 0, 0, 0.0, isoformat(e["timestamp"]), None, 0, None, None, None, None, None,
            _root_of(e),
        ]  # fmt: skip
        self.new.add(invocation_id)
        self.touched[invocation_id] = None

    def on_end(self, event: Paused | Terminated) -> None:
        """How it ended (or paused), and its wall time."""
        e = event.__dict__
        if (row := self._row(e["originator_id"])) is not None:
            started = datetime.fromisoformat(row[_STARTED_AT])
            row[_REASON] = _REASONS[e["reason"]]
            row[_WALL_MS] = (e["timestamp"] - started).total_seconds() * 1000.0

    def on_dispatch(self, event: BatchDispatched) -> None:
        """Its calls, and whether it repeats the last plan."""
        e = event.__dict__
        if (row := self._row(e["originator_id"])) is not None:
            calls = e["calls"]
            plan = plan_fingerprint(calls)
            row[_TOOL_CALLS] += len(calls)
            row[_REPEATED] += 1 if row[_LAST_PLAN] == plan else 0
            row[_LAST_PLAN] = plan

    def on_results(self, event: ResultsCommitted) -> None:
        """The failed calls; a reconciliation pause is over (the only change to the row)."""
        row = self.held.get(event.originator_id)
        if row is not None and row[_REASON] == "reconciliation_required":
            self._running(event.originator_id, row)
        for result in event.results:
            if result.error is not None:
                key = (event.originator_id, result.error.error_class.value)
                self.failed[key] = self.failed.get(key, 0) + 1

    def on_resume(self, event: InvocationEvent) -> None:
        """Running again: no reason, no wall time."""
        row = self.held.get(event.originator_id)
        if row is not None and (row[_REASON] is not None or row[_WALL_MS] is not None):
            self._running(event.originator_id, row)

    def _running(self, invocation_id: str, row: list[Any]) -> None:
        """No reason, no wall time: a row is written (touched) only when the event changes it."""
        row[_REASON] = row[_WALL_MS] = None
        self.touched[invocation_id] = None

    def on_effect(self, event: DomainEvent) -> None:
        """An effect's status."""
        status = effect_status_after(event)
        if status is None:
            return
        key = event.originator_id
        if _PREPARES[type(event)]:
            if key in self.new_effects:
                raise IntegrityError(f"effect {key} prepared twice")
            invocation_id = cast("EffectPrepared", event).invocation_id
            self.new_effects[key] = [key, invocation_id, status]
        elif key in self.new_effects:
            self.new_effects[key][2] = status
        else:
            self.effect_statuses[key] = status

    def write(self, cursor: ViewCursor) -> None:
        """Each changed row once: new ones inserted (a second start fails the batch)."""
        cursor.insert_rows(
            "metrics_invocations", _COLUMNS, [self.held[i] for i in self.touched if i in self.new]
        )
        cursor.update_rows(
            "metrics_invocations",
            _COLUMNS[1:],
            ("invocation_id",),
            [(*self.held[i][1:], i) for i in self.touched if i not in self.new],
        )
        cursor.insert_rows(
            "metrics_failed_calls",
            ("invocation_id", "error_class", "calls"),
            [(i, error_class, n) for (i, error_class), n in self.failed.items()],
            key=("invocation_id", "error_class"),
            update="calls = metrics_failed_calls.calls + excluded.calls",
        )
        cursor.insert_rows(
            "metrics_effects",
            ("effect_key", "invocation_id", "status"),
            list(self.new_effects.values()),
        )
        cursor.update_rows(
            "metrics_effects",
            ("status",),
            ("effect_key",),
            [(status, key) for key, status in self.effect_statuses.items()],
        )


_CASES: tuple[tuple[type, Callable[[_Batch, Any], None]], ...] = (
    # The classes are disjoint; the order is the one a match over them would have.
    (DecisionProposed, _Batch.on_decision),
    (InvocationStarted, _Batch.on_start),
    (Paused, _Batch.on_end),
    (Terminated, _Batch.on_end),
    (EffectEvent, _Batch.on_effect),
    (BatchDispatched, _Batch.on_dispatch),
    (ResultsCommitted, _Batch.on_results),
    (ApprovalGranted, _Batch.on_resume),
    (ApprovalDenied, _Batch.on_resume),
    (ClarificationProvided, _Batch.on_resume),
    (SleepEnded, _Batch.on_resume),
    (CritiqueReturned, _Batch.on_critique),
)


def _fold_of(cls: type) -> Callable[[_Batch, Any], None] | None:
    """How an event of ``cls`` changes the totals (None: it does not)."""
    return next((fold for case, fold in _CASES if issubclass(cls, case)), None)


_FOLDS: ByClass[Callable[[_Batch, Any], None] | None] = ByClass(_fold_of)
_PREPARES: ByClass[bool] = ByClass(lambda cls: issubclass(cls, EffectPrepared))


class MetricsRow(Frozen):
    """The figures for one group."""

    group: str
    invocations: int
    running: int
    """Started and not yet paused or ended."""
    steps_mean: float
    tool_calls: int
    input_tokens: int
    output_tokens: int
    cost: float
    wall_ms_p50: float | None
    wall_ms_p95: float | None
    wall_ms_max: float | None
    repeated_plans: int
    failed_calls: dict[str, int]
    """By error class."""
    effects: dict[str, int]
    """By ledger status."""
    critique_rounds: int = 0
    """The critics' rounds (reflection), in all the group's invocations."""
    critic_input_tokens: int = 0
    """The critics' tokens and cost: apart from ``input_tokens`` and the like (the agents')."""
    critic_output_tokens: int = 0
    critic_cost: float = 0.0


def _percentile(values: Sequence[float], fraction: float) -> float | None:
    """Nearest-rank percentile."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(fraction * len(ordered)))
    return ordered[rank - 1]


def metrics(runner: ReadModelRunner, by: GroupBy = "reason") -> list[MetricsRow]:
    """The metrics grouped by agent, task class, terminal reason or tree.

    By tree, a group is a root and every invocation below it (children, handoff
    targets, theirs), named by the root's id; its wall times are the root's.
    """
    column = _COLUMN[by]  # a closed mapping: never user text in the SQL
    invocations = runner.query(
        f"SELECT invocation_id, COALESCE({column}, 'running') AS grp, reason, steps, tool_calls, "
        "input_tokens, output_tokens, cost, wall_ms, repeated_plans, critique_rounds, "
        "critic_input_tokens, critic_output_tokens, critic_cost FROM metrics_invocations"
    )
    # Each invocation's group, for the tables that name only the invocation.
    grouped = (
        f"(SELECT invocation_id, COALESCE({column}, 'running') AS grp FROM metrics_invocations) i"
    )
    failed = runner.query(
        "SELECT i.grp, f.error_class, CAST(SUM(f.calls) AS BIGINT) AS calls "
        f"FROM metrics_failed_calls f JOIN {grouped} USING (invocation_id) "
        "GROUP BY i.grp, f.error_class"
    )
    effects = runner.query(
        "SELECT i.grp, e.status, COUNT(*) AS n "
        f"FROM metrics_effects e JOIN {grouped} USING (invocation_id) "
        "GROUP BY i.grp, e.status"
    )
    groups: dict[str, list[dict[str, Any]]] = {}
    for row in invocations:
        groups.setdefault(str(row["grp"]), []).append(row)
    rows = []
    for group in sorted(groups):
        members = groups[group]
        walls = [
            m["wall_ms"]
            for m in members
            if m["wall_ms"] is not None and (by != "tree" or m["invocation_id"] == group)
        ]
        rows.append(
            MetricsRow(
                group=group or "(none)",
                invocations=len(members),
                running=sum(1 for m in members if m["reason"] is None),
                steps_mean=sum(m["steps"] for m in members) / len(members),
                tool_calls=sum(m["tool_calls"] for m in members),
                input_tokens=sum(m["input_tokens"] for m in members),
                output_tokens=sum(m["output_tokens"] for m in members),
                cost=sum(m["cost"] for m in members),
                wall_ms_p50=_percentile(walls, 0.50),
                wall_ms_p95=_percentile(walls, 0.95),
                wall_ms_max=max(walls) if walls else None,
                repeated_plans=sum(m["repeated_plans"] for m in members),
                failed_calls={f["error_class"]: f["calls"] for f in failed if f["grp"] == group},
                effects={e["status"]: e["n"] for e in effects if e["grp"] == group},
                critique_rounds=sum(m["critique_rounds"] or 0 for m in members),
                critic_input_tokens=sum(m["critic_input_tokens"] or 0 for m in members),
                critic_output_tokens=sum(m["critic_output_tokens"] or 0 for m in members),
                critic_cost=sum(m["critic_cost"] or 0.0 for m in members),
            )
        )
    return rows
