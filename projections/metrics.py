"""Metrics: counts and distributions by agent, task class and terminal reason.

Seed 003: report distributions by task class and terminal reason, not one
global average. The read model keeps one row per invocation (its totals, wall
time, repeated plans), one per failed-call class and one per effect; the
figures are computed from them at query time, so percentiles are exact.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import datetime
from typing import Any, Literal

from eventsourcing.sqlite import SQLiteCursor

from aggregates.decisions import Frozen
from aggregates.effect import EffectPrepared, effect_status_after
from aggregates.events import DomainEvent
from aggregates.invocation import (
    ApprovalDenied,
    ApprovalGranted,
    BatchDispatched,
    ClarificationProvided,
    DecisionProposed,
    InvocationStarted,
    Paused,
    ResultsCommitted,
    Terminated,
    plan_fingerprint,
)
from projections.runner import Projection, ProjectionRunner

GroupBy = Literal["agent", "task-class", "reason"]

_COLUMN = {"agent": "agent", "task-class": "task_class", "reason": "reason"}


class MetricsProjection(Projection):
    """Per-invocation totals, failed calls by error class, and effects by state."""

    name = "metrics"
    version = 3

    def create(self) -> list[str]:
        """The tables."""
        return [
            "CREATE TABLE IF NOT EXISTS metrics_invocations ("
            "invocation_id TEXT PRIMARY KEY, agent TEXT, task_class TEXT, reason TEXT, "
            "steps INTEGER, tool_calls INTEGER, input_tokens INTEGER, output_tokens INTEGER, "
            "cost REAL, started_at TEXT, wall_ms REAL, repeated_plans INTEGER, last_plan TEXT)",
            "CREATE TABLE IF NOT EXISTS metrics_failed_calls ("
            "invocation_id TEXT, error_class TEXT, calls INTEGER, "
            "PRIMARY KEY (invocation_id, error_class))",
            "CREATE TABLE IF NOT EXISTS metrics_effects ("
            "effect_key TEXT PRIMARY KEY, invocation_id TEXT, status TEXT)",
        ]

    def tables(self) -> list[str]:
        """The tables, for a rebuild."""
        return ["metrics_invocations", "metrics_failed_calls", "metrics_effects"]

    def apply(self, cursor: SQLiteCursor, event: DomainEvent, position: int) -> None:
        """Fold one event into the totals."""
        match event:
            case InvocationStarted():
                cursor.execute(
                    "INSERT INTO metrics_invocations VALUES "
                    "(?, ?, ?, NULL, 0, 0, 0, 0, 0.0, ?, NULL, 0, NULL)",
                    (
                        event.originator_id,
                        event.agent_name,
                        event.task_class or "",
                        event.timestamp.isoformat(),
                    ),
                )
            case DecisionProposed():
                cursor.execute(
                    "UPDATE metrics_invocations SET steps = ?, input_tokens = input_tokens + ?, "
                    "output_tokens = output_tokens + ?, cost = cost + ? WHERE invocation_id = ?",
                    (
                        event.step,
                        event.usage.input_tokens,
                        event.usage.output_tokens,
                        event.usage.cost,
                        event.originator_id,
                    ),
                )
            case BatchDispatched():
                plan = plan_fingerprint(event.calls)
                cursor.execute(
                    "UPDATE metrics_invocations SET tool_calls = tool_calls + ?, "
                    "repeated_plans = repeated_plans "
                    "+ (CASE WHEN last_plan = ? THEN 1 ELSE 0 END), "
                    "last_plan = ? WHERE invocation_id = ?",
                    (len(event.calls), plan, plan, event.originator_id),
                )
            case ResultsCommitted():
                cursor.execute(
                    "UPDATE metrics_invocations SET reason = NULL, wall_ms = NULL "
                    "WHERE invocation_id = ? AND reason = 'reconciliation_required'",
                    (event.originator_id,),
                )
                for result in event.results:
                    if result.error is None:
                        continue
                    cursor.execute(
                        "INSERT INTO metrics_failed_calls VALUES (?, ?, 1) "
                        "ON CONFLICT (invocation_id, error_class) DO UPDATE SET calls = calls + 1",
                        (event.originator_id, result.error.error_class.value),
                    )
            case ApprovalGranted() | ApprovalDenied() | ClarificationProvided():
                cursor.execute(
                    "UPDATE metrics_invocations SET reason = NULL, wall_ms = NULL "
                    "WHERE invocation_id = ?",
                    (event.originator_id,),
                )
            case Paused() | Terminated():
                cursor.execute(
                    "SELECT started_at FROM metrics_invocations WHERE invocation_id = ?",
                    (event.originator_id,),
                )
                row = cursor.fetchone()
                started = datetime.fromisoformat(row[0]) if row else event.timestamp
                wall_ms = (event.timestamp - started).total_seconds() * 1000.0
                cursor.execute(
                    "UPDATE metrics_invocations SET reason = ?, wall_ms = ? "
                    "WHERE invocation_id = ?",
                    (event.reason.value, wall_ms, event.originator_id),
                )
            case _:
                status = effect_status_after(event)
                if status is None:
                    return
                if isinstance(event, EffectPrepared):
                    cursor.execute(
                        "INSERT INTO metrics_effects VALUES (?, ?, ?)",
                        (event.originator_id, event.invocation_id, status),
                    )
                else:
                    cursor.execute(
                        "UPDATE metrics_effects SET status = ? WHERE effect_key = ?",
                        (status, event.originator_id),
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
        f"SELECT COALESCE(i.{column}, 'running') AS grp, f.error_class, SUM(f.calls) AS calls "
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
