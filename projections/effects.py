"""Open effects: writes dispatched or of unknown outcome, oldest first.

The reconciler's backlog and an operator's worry list. Each row says who can
settle it (``needs``): ``sweeper`` while its invocation can still be resumed,
``person`` once the invocation ended (cancelled, say): no run of it will settle
the effect (see ``aggregates.effect.who_settles``).
"""

from __future__ import annotations

from typing import Any

from eventsourcing.sqlite import SQLiteCursor

from aggregates.decisions import EffectStatus
from aggregates.effect import EffectPrepared, effect_status_after, who_settles
from aggregates.events import DomainEvent
from aggregates.invocation import InvocationStarted, Terminated
from projections.runner import Projection, ProjectionRunner

OPEN = (EffectStatus.DISPATCHED.value, EffectStatus.OUTCOME_UNKNOWN.value)


class OpenEffectsProjection(Projection):
    """Every effect not yet settled, with its status, attempt and age."""

    name = "open_effects"
    version = 2

    def create(self) -> list[str]:
        """The table."""
        return [
            "CREATE TABLE IF NOT EXISTS open_effects ("
            "effect_key TEXT PRIMARY KEY, invocation_id TEXT, step INTEGER, call_id TEXT, "
            "tool TEXT, status TEXT, attempt INTEGER, prepared_at TEXT, updated_at TEXT, "
            "prepared_position INTEGER)",
            # Whose invocation an effect is, and whether it ended (who can settle it).
            "CREATE TABLE IF NOT EXISTS open_effects_invocations ("
            "invocation_id TEXT PRIMARY KEY, agent TEXT, ended INTEGER NOT NULL DEFAULT 0)",
        ]

    def tables(self) -> list[str]:
        """The tables, for a rebuild."""
        return ["open_effects", "open_effects_invocations"]

    def apply(self, cursor: SQLiteCursor, event: DomainEvent, position: int) -> None:
        """Track each effect's status; forget it once it is settled."""
        if isinstance(event, InvocationStarted):
            cursor.execute(
                "INSERT OR REPLACE INTO open_effects_invocations VALUES (?, ?, 0)",
                (event.originator_id, event.agent_name),
            )
            return
        if isinstance(event, Terminated):
            cursor.execute(
                "UPDATE open_effects_invocations SET ended = 1 WHERE invocation_id = ?",
                (event.originator_id,),
            )
            return
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
    """Effects dispatched or of unknown outcome, oldest first.

    Each row also has ``agent`` (its invocation's), ``invocation_ended`` (bool)
    and ``needs``: ``person`` when its invocation ended, else ``sweeper`` (the
    read model does not know the tools; ``loop-actors effects --agent`` and
    ``loop-actors reconcile`` look at them).
    """
    rows = runner.query(
        "SELECT e.effect_key, e.invocation_id, e.step, e.call_id, e.tool, e.status, e.attempt, "
        "e.prepared_at, e.updated_at, i.agent, COALESCE(i.ended, 0) AS invocation_ended "
        "FROM open_effects e LEFT JOIN open_effects_invocations i USING (invocation_id) "
        "WHERE e.status IN (?, ?) ORDER BY e.prepared_position",
        list(OPEN),
    )
    for row in rows:
        row["invocation_ended"] = bool(row["invocation_ended"])
        row["needs"] = who_settles(
            invocation_ended=row["invocation_ended"], service_can_be_asked=None
        ).value
    return rows
