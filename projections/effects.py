"""Open effects: writes dispatched or of unknown outcome, oldest first.

The reconciler's backlog and an operator's worry list.
"""

from __future__ import annotations

from typing import Any

from eventsourcing.sqlite import SQLiteCursor

from aggregates.decisions import EffectStatus
from aggregates.effect import EffectPrepared, effect_status_after
from aggregates.events import DomainEvent
from projections.runner import Projection, ProjectionRunner

OPEN = (EffectStatus.DISPATCHED.value, EffectStatus.OUTCOME_UNKNOWN.value)


class OpenEffectsProjection(Projection):
    """Every effect not yet settled, with its status, attempt and age."""

    name = "open_effects"
    version = 1

    def create(self) -> list[str]:
        """The table."""
        return [
            "CREATE TABLE IF NOT EXISTS open_effects ("
            "effect_key TEXT PRIMARY KEY, invocation_id TEXT, step INTEGER, call_id TEXT, "
            "tool TEXT, status TEXT, attempt INTEGER, prepared_at TEXT, updated_at TEXT, "
            "prepared_position INTEGER)",
        ]

    def tables(self) -> list[str]:
        """The table, for a rebuild."""
        return ["open_effects"]

    def apply(self, cursor: SQLiteCursor, event: DomainEvent, position: int) -> None:
        """Track each effect's status; forget it once it is settled."""
        status = effect_status_after(event)
        if status is None:
            return
        key = event.originator_id
        if isinstance(event, EffectPrepared):
            cursor.execute(
                "INSERT INTO open_effects VALUES (?, ?, ?, ?, ?, ?, 0, ?, ?, ?)",
                (
                    key,
                    event.invocation_id,
                    event.step,
                    event.call_id,
                    event.tool,
                    status,
                    event.timestamp.isoformat(),
                    event.timestamp.isoformat(),
                    position,
                ),
            )
            return
        if status in (
            EffectStatus.COMMITTED.value,
            EffectStatus.REJECTED.value,
            EffectStatus.RECONCILED.value,
        ):
            cursor.execute("DELETE FROM open_effects WHERE effect_key = ?", (key,))
            return
        attempt_change = 1 if status == EffectStatus.DISPATCHED.value else 0
        cursor.execute(
            "UPDATE open_effects SET status = ?, attempt = attempt + ?, updated_at = ? "
            "WHERE effect_key = ?",
            (status, attempt_change, event.timestamp.isoformat(), key),
        )


def list_open_effects(runner: ProjectionRunner) -> list[dict[str, Any]]:
    """Effects dispatched or of unknown outcome, oldest first."""
    return runner.query(
        "SELECT effect_key, invocation_id, step, call_id, tool, status, attempt, prepared_at, "
        "updated_at FROM open_effects WHERE status IN (?, ?) ORDER BY prepared_position",
        list(OPEN),
    )
