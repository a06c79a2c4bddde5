"""Open effects: writes dispatched or of unknown outcome, oldest first.

The reconciler's backlog and an operator's worry list. Each row says who can
settle it (``needs``): ``sweeper`` while its invocation can still be resumed,
``reconcile_or_person`` once the invocation ended (cancelled, say): no run of it will
settle the effect, a sweep can if its tool has a ``reconcile`` (which the read model
does not know), else a person (see ``aggregates.effect.who_settles``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

from eventsourcing.persistence import IntegrityError

from aggregates.decisions import EffectStatus
from aggregates.effect import EffectEvent, EffectPrepared, effect_status_after, who_settles
from aggregates.events import ByClass, DomainEvent, isoformat
from aggregates.invocation import InvocationStarted, Terminated
from projections.runner import ReadModel, ReadModelRunner
from projections.sql import ViewCursor, marks

OPEN = (EffectStatus.DISPATCHED.value, EffectStatus.OUTCOME_UNKNOWN.value)


class OpenEffectsProjection(ReadModel):
    """Every effect not yet settled, with its status, attempt and age."""

    name = "open_effects"
    version = 2

    def create(self) -> list[str]:
        """The table."""
        return [
            "CREATE TABLE IF NOT EXISTS open_effects ("
            "effect_key TEXT PRIMARY KEY, invocation_id TEXT, step BIGINT, call_id TEXT, "
            "tool TEXT, status TEXT, attempt BIGINT, prepared_at TEXT, updated_at TEXT, "
            "prepared_position BIGINT)",
            # Whose invocation an effect is, and whether it ended (who can settle it).
            "CREATE TABLE IF NOT EXISTS open_effects_invocations ("
            "invocation_id TEXT PRIMARY KEY, agent TEXT, ended BIGINT NOT NULL DEFAULT 0)",
        ]

    def tables(self) -> list[str]:
        """The tables, for a rebuild."""
        return ["open_effects", "open_effects_invocations"]

    def apply(self, cursor: ViewCursor, event: DomainEvent, position: int) -> None:
        """Track each effect's status; forget it once it is settled (a batch of one)."""
        self.apply_batch(cursor, [(event, position)])

    def apply_batch(self, cursor: ViewCursor, events: Sequence[tuple[DomainEvent, int]]) -> None:
        """Fold a batch's events per effect in memory, then write each changed row once."""
        invocations: dict[str, list[Any]] = {}  # started in the batch: (id, agent, ended)
        ended: list[tuple[str]] = []  # started before the batch, terminated in it
        new: dict[str, list[Any]] = {}  # prepared in the batch and still open
        changed: dict[str, list[Any]] = {}  # open before the batch: [status, attempts, at]
        settled: set[str] = set()  # open before the batch, settled in it
        kinds = _KINDS
        for event, position in events:
            kind = kinds[type(event)]
            if kind is _STARTS:
                invocations[event.originator_id] = [
                    event.originator_id,
                    cast("InvocationStarted", event).agent_name,
                    0,
                ]
                continue
            if kind is _ENDS:
                if event.originator_id in invocations:
                    invocations[event.originator_id][2] = 1
                else:
                    ended.append((event.originator_id,))
                continue
            if kind is _OTHER:
                continue
            status = effect_status_after(event)
            if status is None:
                continue
            key = event.originator_id
            at = isoformat(event.timestamp)
            if kind is _PREPARED:
                event = cast("EffectPrepared", event)
                if key in new:
                    raise IntegrityError(f"effect {key} prepared twice")
                new[key] = [
                    key, event.invocation_id, event.step, event.call_id, event.tool,
                    status, 0, at, at, position,
                ]  # fmt: skip
            elif status in _SETTLED:
                if new.pop(key, None) is None:
                    settled.add(key)
                    changed.pop(key, None)
            else:
                attempt = 1 if status == _DISPATCHED else 0
                if key in new:
                    row = new[key]
                    row[5], row[6], row[8] = status, row[6] + attempt, at
                elif key not in settled:  # a settled effect's row is gone
                    was = changed.get(key)
                    changed[key] = [status, attempt + (was[1] if was else 0), at]
        cursor.insert_rows(
            "open_effects_invocations",
            ("invocation_id", "agent", "ended"),
            list(invocations.values()),
            key=("invocation_id",),
        )
        cursor.executemany(
            "UPDATE open_effects_invocations SET ended = 1 WHERE invocation_id = ?", ended
        )
        gone = sorted(settled)
        for start in range(0, len(gone), 500):
            chunk = gone[start : start + 500]
            cursor.execute(
                f"DELETE FROM open_effects WHERE effect_key IN ({marks(len(chunk))})", chunk
            )
        cursor.executemany(
            "UPDATE open_effects SET status = ?, attempt = attempt + ?, updated_at = ? "
            "WHERE effect_key = ?",
            [(*change, key) for key, change in changed.items()],
        )
        cursor.insert_rows("open_effects", _COLUMNS, list(new.values()))


_OTHER, _STARTS, _ENDS, _PREPARED, _EFFECT = "other", "start", "end", "prepared", "effect"


def _kind_of(cls: type) -> str:
    """What an event of ``cls`` is to this read model."""
    if issubclass(cls, InvocationStarted):
        return _STARTS
    if issubclass(cls, Terminated):
        return _ENDS
    if issubclass(cls, EffectPrepared):
        return _PREPARED
    return _EFFECT if issubclass(cls, EffectEvent) else _OTHER


_KINDS: ByClass[str] = ByClass(_kind_of)


_COLUMNS = (
    "effect_key", "invocation_id", "step", "call_id", "tool", "status", "attempt",
    "prepared_at", "updated_at", "prepared_position",
)  # fmt: skip
_DISPATCHED = EffectStatus.DISPATCHED.value
_SETTLED = frozenset(
    {EffectStatus.COMMITTED.value, EffectStatus.REJECTED.value, EffectStatus.RECONCILED.value}
)


def list_open_effects(runner: ReadModelRunner) -> list[dict[str, Any]]:
    """Effects dispatched or of unknown outcome, oldest first.

    Each row also has ``agent`` (its invocation's), ``invocation_ended`` (bool)
    and ``needs``: ``reconcile_or_person`` when its invocation ended, else ``sweeper``
    (the read model does not know the tools; ``loop-actors effects --agent`` and
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
