"""Metrics: counts and distributions by agent, task class and terminal reason.

Seed 003: report distributions by task class and terminal reason, not one
global average. The read model keeps one row per invocation (its totals, wall
time, repeated plans), one per failed-call class and one per effect; the
figures are computed from them at query time, so percentiles are exact.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Sequence
from datetime import datetime
from typing import Any, ClassVar, Literal

from eventsourcing.persistence import IntegrityError

from aggregates.decisions import Frozen
from aggregates.effect import EffectEvent, EffectPrepared, effect_status_after
from aggregates.events import DomainEvent
from aggregates.invocation import (
    ApprovalDenied,
    ApprovalGranted,
    BatchDispatched,
    ClarificationProvided,
    DecisionProposed,
    InvocationEvent,
    InvocationStarted,
    Paused,
    ResultsCommitted,
    Terminated,
    plan_fingerprint,
)
from projections.runner import Projection, ProjectionRunner
from projections.sql import ViewCursor, marks

GroupBy = Literal["agent", "task-class", "reason"]

_COLUMN = {"agent": "agent", "task-class": "task_class", "reason": "reason"}


class MetricsProjection(Projection):
    """Per-invocation totals, failed calls by error class, and effects by state.

    A batch at a time: the invocations' rows the batch touches are read once
    (or found in the runner's cache, ``cursor.cache``, up to ``CACHE_ROWS``),
    every event is folded into them in memory, in order, and each changed row
    is written once (one ``executemany`` per statement).
    """

    name = "metrics"
    version = 3

    CACHE_ROWS: ClassVar[int] = 50_000
    """How many invocations' rows the cache may hold (least recently touched dropped first)."""

    def create(self) -> list[str]:
        """The tables."""
        return [
            "CREATE TABLE IF NOT EXISTS metrics_invocations ("
            "invocation_id TEXT PRIMARY KEY, agent TEXT, task_class TEXT, reason TEXT, "
            "steps BIGINT, tool_calls BIGINT, input_tokens BIGINT, output_tokens BIGINT, "
            "cost DOUBLE PRECISION, started_at TEXT, wall_ms DOUBLE PRECISION, "
            "repeated_plans BIGINT, last_plan TEXT)",
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
        for event, _ in events:
            if isinstance(event, InvocationEvent):
                invocation_id = event.originator_id
                if isinstance(event, InvocationStarted):
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
            batch.fold(event)
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
)
_REASON, _STEPS, _TOOL_CALLS, _INPUT, _OUTPUT, _COST = 3, 4, 5, 6, 7, 8
_STARTED_AT, _WALL_MS, _REPEATED, _LAST_PLAN = 9, 10, 11, 12

_CHUNK = 250


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

    def fold(self, event: DomainEvent) -> None:
        """One event's change (to rows it does not hold, none, as an UPDATE would do)."""
        # The classes are disjoint: the commonest first (each case is an isinstance check).
        match event:
            case DecisionProposed():
                if (row := self._row(event.originator_id)) is not None:
                    row[_STEPS] = event.step
                    row[_INPUT] += event.usage.input_tokens
                    row[_OUTPUT] += event.usage.output_tokens
                    row[_COST] += event.usage.cost
            case InvocationStarted():
                invocation_id = event.originator_id
                if invocation_id in self.held:  # as the INSERT would: refuse a second start
                    raise IntegrityError(f"invocation {invocation_id} started twice")
                self.held[invocation_id] = [
                    invocation_id, event.agent_name, event.task_class or "", None,
                    0, 0, 0, 0, 0.0, event.timestamp.isoformat(), None, 0, None,
                ]  # fmt: skip
                self.new.add(invocation_id)
                self.touched[invocation_id] = None
            case Paused() | Terminated():
                if (row := self._row(event.originator_id)) is not None:
                    started = datetime.fromisoformat(row[_STARTED_AT])
                    row[_REASON] = event.reason.value
                    row[_WALL_MS] = (event.timestamp - started).total_seconds() * 1000.0
            case EffectEvent():
                self._fold_effect(event)
            case BatchDispatched():
                if (row := self._row(event.originator_id)) is not None:
                    plan = plan_fingerprint(event.calls)
                    row[_TOOL_CALLS] += len(event.calls)
                    row[_REPEATED] += 1 if row[_LAST_PLAN] == plan else 0
                    row[_LAST_PLAN] = plan
            case ResultsCommitted():
                row = self._row(event.originator_id)
                if row is not None and row[_REASON] == "reconciliation_required":
                    row[_REASON] = row[_WALL_MS] = None
                for result in event.results:
                    if result.error is not None:
                        key = (event.originator_id, result.error.error_class.value)
                        self.failed[key] = self.failed.get(key, 0) + 1
            case ApprovalGranted() | ApprovalDenied() | ClarificationProvided():
                if (row := self._row(event.originator_id)) is not None:
                    row[_REASON] = row[_WALL_MS] = None
            case _:
                pass  # no other event changes the totals

    def _fold_effect(self, event: DomainEvent) -> None:
        status = effect_status_after(event)
        if status is None:
            return
        key = event.originator_id
        if isinstance(event, EffectPrepared):
            if key in self.new_effects:
                raise IntegrityError(f"effect {key} prepared twice")
            self.new_effects[key] = [key, event.invocation_id, status]
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


def _percentile(values: Sequence[float], fraction: float) -> float | None:
    """Nearest-rank percentile."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(fraction * len(ordered)))
    return ordered[rank - 1]


def metrics(runner: ProjectionRunner, by: GroupBy = "reason") -> list[MetricsRow]:
    """The metrics grouped by agent, task class or terminal reason."""
    column = _COLUMN[by]  # a closed mapping: never user text in the SQL
    invocations = runner.query(
        f"SELECT invocation_id, COALESCE({column}, 'running') AS grp, reason, steps, tool_calls, "
        "input_tokens, output_tokens, cost, wall_ms, repeated_plans FROM metrics_invocations"
    )
    failed = runner.query(
        f"SELECT COALESCE(i.{column}, 'running') AS grp, f.error_class, "
        "CAST(SUM(f.calls) AS BIGINT) AS calls "
        "FROM metrics_failed_calls f JOIN metrics_invocations i USING (invocation_id) "
        "GROUP BY grp, f.error_class"
    )
    effects = runner.query(
        f"SELECT COALESCE(i.{column}, 'running') AS grp, e.status, COUNT(*) AS n "
        "FROM metrics_effects e JOIN metrics_invocations i USING (invocation_id) "
        "GROUP BY grp, e.status"
    )
    groups: dict[str, list[dict[str, Any]]] = {}
    for row in invocations:
        groups.setdefault(str(row["grp"]), []).append(row)
    rows = []
    for group in sorted(groups):
        members = groups[group]
        walls = [m["wall_ms"] for m in members if m["wall_ms"] is not None]
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
            )
        )
    return rows
