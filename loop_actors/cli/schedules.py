"""The ``schedule`` commands: add, list, pause, resume and remove a store's schedules.

A schedule is a row of the store (``loop_actors_schedules``); the workers serving its
agent submit its runs (``loop_actors.workers``). Everything given to ``add`` is checked
(the timing, the name, the agent, the goal) before the store is opened: a bad one is
exit 2, nothing written.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from functools import partial
from typing import Any

import trio
from rich.table import Table

from aggregates.schedules import (
    Cron,
    Every,
    Schedule,
    ScheduleState,
    Timing,
    paused,
    resumed,
    time_zone,
)
from loop_actors._errors import ScheduleNotFoundError, UsageError
from loop_actors._render import ID, TEXT, WHOLE, console, print_table
from loop_actors._terminal import terminal_safe
from loop_actors.cli.agents import load_agent
from loop_actors.cli.exit_codes import ExitCode
from loop_actors.cli.queue import read_queue
from loop_actors.cli.reading import open_for_reading
from loop_actors.runtime.runtime import Runtime
from loop_actors.store.queue import WorkQueue
from loop_actors.store.store import EventStore
from loop_actors.store.url import StoreUrl, resolve_db_url


def run(args: argparse.Namespace) -> int:
    """``schedule add``, ``list``, ``pause``, ``resume`` or ``remove``."""
    match args.schedule_command:
        case "add":
            return _add(args)
        case "list":
            return _list(args)
        case "pause":
            return _change(args, lambda row, now: paused(row, now=now))
        case "resume":
            return _change(args, lambda row, now: resumed(row, now=now))
        case _:
            return _remove(args)


def _add(args: argparse.Namespace) -> int:
    """``schedule add``: through ``Runtime.add_schedule`` (its checks, then one write)."""
    agent = load_agent(args.schedule_agent)
    url = _writable_url(args.db)
    runtime = Runtime(url)
    try:
        row: Schedule = trio.run(
            partial(
                runtime.add_schedule, args.name, agent, args.goal, every=args.every,
                cron=args.cron, tz=args.tz, overlap=args.overlap, catch_up=args.catch_up,
                agent_ref=args.schedule_agent,
            )
        )  # fmt: skip
    finally:
        runtime.close()
    if args.json:
        print(json.dumps(schedule_record(row, time.time())))
        return ExitCode.OK
    print(
        f"schedule {terminal_safe(row.name)} added: {_when(row.timing)}, overlap "
        f"{row.overlap.value}, catch-up {row.catch_up.value}"
    )
    print(
        f"next due {_due_text(row)}; a worker serving {terminal_safe(row.agent_name)} submits "
        f"its runs (loop-actors worker --agent {terminal_safe(args.schedule_agent)})"
    )
    return ExitCode.OK


def _list(args: argparse.Namespace) -> int:
    store = open_for_reading(args.db)
    try:
        queue = read_queue(store)
        try:
            rows, now = queue.schedules()
        finally:
            queue.close()
    finally:
        store.close()
    if args.json:
        for row in rows:
            print(json.dumps(schedule_record(row, now)))
        return ExitCode.OK
    table = Table("schedule", "agent", "when", "overlap", "catch-up", "next due", "runs", box=None)
    for row in rows:
        table.add_row(
            terminal_safe(row.name),
            terminal_safe(row.agent_name),
            _when(row.timing),
            row.overlap.value,
            row.catch_up.value,
            _due_text(row),
            str(row.runs),
        )
    print_table(console(), table, table, (ID, TEXT, TEXT, TEXT, TEXT, TEXT, WHOLE))
    active = sum(row.state is ScheduleState.ACTIVE for row in rows)
    print(f"{len(rows)} schedule(s), {active} active")
    return ExitCode.OK


def _change(args: argparse.Namespace, change: Callable[[Schedule, float], Schedule]) -> int:
    before: list[Schedule] = []

    def noted(row: Schedule, now: float) -> Schedule:
        before.append(row)
        return change(row, now)

    with _open_queue(args.db) as queue:
        row = queue.change_schedule(args.name, noted)
        _, now = queue.schedules()
    if row is None:
        raise ScheduleNotFoundError(args.name)
    if args.json:
        print(json.dumps(schedule_record(row, now)))
        return ExitCode.OK
    verb = "paused" if args.schedule_command == "pause" else "resumed"
    name = terminal_safe(row.name)
    if before[0].state is row.state:
        print(f"schedule {name} is {row.state.value} already")
    elif row.state is ScheduleState.PAUSED:
        print(f"schedule {name} {verb}: its due times pass unrun until it is resumed")
    else:
        print(f"schedule {name} {verb}: next due {_due_text(row)}")
    return ExitCode.OK


def _remove(args: argparse.Namespace) -> int:
    with _open_queue(args.db) as queue:
        removed = queue.remove_schedule(args.name)
    if not removed:
        raise ScheduleNotFoundError(args.name)
    print(f"schedule {terminal_safe(args.name)} removed (its runs are left as they are)")
    return ExitCode.OK


def _writable_url(db: str | None) -> str:
    """The store's URL (``--db``, ``$LOOP_ACTORS_DB``...).

    Raises:
        UsageError: a ``memory://`` store (no worker would ever see the schedule).
    """
    url = resolve_db_url(db)
    if StoreUrl.parse(url).kind == "memory":
        raise UsageError(
            "a memory:// store ends with this process: no worker would run the schedule "
            "(use a SQLite file or PostgreSQL)"
        )
    return url


@contextlib.contextmanager
def _open_queue(db: str | None) -> Iterator[WorkQueue]:
    """The queue of the store, which must exist, for writing."""
    store = EventStore(_writable_url(db), create=False)
    try:
        queue = store.open_queue()
        try:
            yield queue
        finally:
            queue.close()
    finally:
        store.close()


def _iso(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).isoformat(timespec="seconds")


def _when(timing: Timing) -> str:
    if isinstance(timing, Every):
        return f"every {timing.text}"
    return f"cron {timing.expression} ({timing.time_zone})"


def _due_text(row: Schedule) -> str:
    """The next due time in UTC, and in the zone's wall time for a cron (paused: ``-``)."""
    if row.state is ScheduleState.PAUSED:
        return "- (paused)"
    text = _iso(row.next_due)
    if isinstance(row.timing, Cron) and row.timing.time_zone != "UTC":
        wall = datetime.fromtimestamp(row.next_due, time_zone(row.timing.time_zone))
        text += f" ({wall:%Y-%m-%d %H:%M %Z})"
    return text


def schedule_record(row: Schedule, now: float) -> dict[str, Any]:
    """A schedule as ``schedule list --json`` prints it."""
    timing = row.timing
    active = row.state is ScheduleState.ACTIVE
    return {
        "name": row.name,
        "agent": row.agent_name,
        "agent_ref": row.agent_ref,
        "goal": row.goal,
        "every": timing.text if isinstance(timing, Every) else None,
        "cron": timing.expression if isinstance(timing, Cron) else None,
        "time_zone": timing.time_zone if isinstance(timing, Cron) else None,
        "overlap": row.overlap.value,
        "catch_up": row.catch_up.value,
        "state": row.state.value,
        "next_due": _iso(row.next_due) if active else None,
        "next_due_in_s": round(row.next_due - now, 3) if active else None,
        "next_invocation_id": row.invocation_id(row.next_due) if active else None,
        "runs": row.runs,
        "skipped": row.skipped,
        "waiting": [_iso(due) for due in row.waiting],
        "submitting": [row.invocation_id(run.due) for run in row.submitting],
        "last_invocation_id": None if row.last_due is None else row.invocation_id(row.last_due),
        "created_at": _iso(row.created_at),
    }
