"""A schedule's row in ``loop_actors_schedules``: its columns, written and read back.

The rules of a schedule are :mod:`aggregates.schedules`; the statements that read and
write these rows are the work queue's (``WorkQueue`` in ``loop_actors.store.queue``).
The due times are whole seconds, stored as numbers; ``waiting`` and ``submitting``
are JSON lists (``[600, 660]``; ``[[600, 600.2]]``: a due time and when it was decided).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, NamedTuple

from aggregates.schedules import Every, Schedule, Timing

SCHEDULE_COLUMNS = (
    "name, agent_name, agent_ref, goal, every_s, cron, time_zone, overlap, catch_up, state, "
    "next_due, waiting, submitting, retry_at, last_due, runs, skipped, created_at, updated_at"
)
_COLUMN_NAMES = tuple(name.strip() for name in SCHEDULE_COLUMNS.split(","))
SCHEDULE_PROGRESS = (
    "state = ?, next_due = ?, waiting = ?, submitting = ?, retry_at = ?, last_due = ?, "
    "runs = ?, skipped = ?, updated_at = ?"
)
"""What a check, a pause or a resume changes (:func:`schedule_progress` gives the values)."""


UPCOMING_SCHEDULES = 5
"""How many of the next due schedules a check reports."""


class DueRuns(NamedTuple):
    """Runs of one schedule that a check decided: the worker that checked submits them."""

    schedule: Schedule
    """The schedule as the check left it."""
    dues: tuple[int, ...]
    """Their due times, oldest first (``schedule.invocation_id(due)`` names each)."""
    skipped: tuple[int, ...] = ()
    """Due times the check did not run: the previous run had not ended."""


class SchedulesChecked(NamedTuple):
    """What a check of the schedules found (``WorkQueue.check_schedules``)."""

    due: list[DueRuns]
    """The runs decided (and due times skipped), by schedule."""
    upcoming: list[tuple[str, int]]
    """The next due active schedules, soonest first: name and due time."""
    wait_s: float | None
    """Seconds until a schedule is due or a decided run is looked for again (None: never)."""


def schedule_values(row: Schedule) -> tuple[Any, ...]:
    """The row's values in ``SCHEDULE_COLUMNS`` order."""
    every, cron, zone = _timing_values(row.timing)
    return (row.name, row.agent_name, row.agent_ref, row.goal, every, cron, zone,
            row.overlap.value, row.catch_up.value, *schedule_progress(row)[:-1],
            row.created_at, row.updated_at)  # fmt: skip


def schedule_progress(row: Schedule) -> tuple[Any, ...]:
    """The row's values in ``SCHEDULE_PROGRESS`` order."""
    return (
        row.state.value,
        row.next_due,
        json.dumps(list(row.waiting)),
        json.dumps([[run.due, run.decided_at] for run in row.submitting]),
        row.retry_at,
        row.last_due,
        row.runs,
        row.skipped,
        row.updated_at,
    )


def _timing_values(timing: Timing) -> tuple[int | None, str | None, str | None]:
    if isinstance(timing, Every):
        return timing.seconds, None, None
    return None, timing.expression, timing.time_zone


def schedule_row(found: Sequence[Any]) -> Schedule:
    """A row read back (``SCHEDULE_COLUMNS``)."""
    record = dict(zip(_COLUMN_NAMES, found, strict=True))
    every, cron, zone = record.pop("every_s"), record.pop("cron"), record.pop("time_zone")
    del record["retry_at"]  # what ``Schedule.retry_at`` says, kept for the query
    record["timing"] = (
        {"kind": "every", "seconds": every}
        if every is not None
        else {"kind": "cron", "expression": cron, "time_zone": zone}
    )
    record["waiting"] = json.loads(record["waiting"])
    record["submitting"] = [
        {"due": due, "decided_at": at} for due, at in json.loads(record["submitting"])
    ]
    return Schedule.model_validate(record)
