"""The queue's commands: ``worker``, ``workers``, and ``list --status``'s statuses.

``submit`` is :mod:`loop_actors.cli.submit` (it imports no trio).
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import trio
from rich.table import Table

from aggregates.lease import (
    HolderRow,
    QueueRow,
    QueueStatus,
    effective_status,
    lease_is_live,
)
from aggregates.rate_limits import QuotaRow, RateLimit, parse_rate_limit
from aggregates.schedules import Schedule, ScheduleState
from loop_actors._errors import UsageError
from loop_actors._render import ID, TEXT, console, print_table
from loop_actors._terminal import terminal_safe
from loop_actors.agent.agent import Agent
from loop_actors.audit.checkpoint import load_signing_key
from loop_actors.cli.agents import load_agent
from loop_actors.cli.exit_codes import ExitCode
from loop_actors.cli.reading import open_for_reading
from loop_actors.runtime.leases import is_gone
from loop_actors.store.queue import WorkQueue
from loop_actors.store.store import EventStore
from loop_actors.store.url import redacted_url
from loop_actors.workers.worker import Worker, WorkerReport


def run(args: argparse.Namespace) -> int:
    """``worker`` or ``workers``."""
    match args.command:
        case "worker":
            worker = make_worker(args, [load_agent(reference) for reference in args.agents])
            checkpoints = worker.runtime.checkpoints
            if checkpoints is not None and checkpoints.key_file is not None:
                load_signing_key(checkpoints.key_file)  # before anything runs
            exit_code: int = trio.run(worker_command, worker, args)
            return exit_code
        case _:
            store = open_for_reading(args.db)
            try:
                return workers_command(store, args)
            finally:
                store.close()


def make_worker(args: argparse.Namespace, agents: Sequence[Agent]) -> Worker:
    """The worker the ``worker`` command runs."""
    return Worker(
        agents,
        args.db,
        concurrency=args.concurrency,
        lease_s=args.lease_s,
        grace_s=args.grace_s,
        checkpoint_dir=getattr(args, "checkpoint_dir", None),
        checkpoint_key=getattr(args, "checkpoint_key", None),
        checkpoint_every=getattr(args, "checkpoint_every", None),
        rate_limits=rate_limits_of(args.rate_limits or []),
    )


def rate_limits_of(texts: list[str]) -> list[RateLimit]:
    """``--rate-limit provider:model:rpm:tpm`` values as limits.

    Raises:
        UsageError: one is malformed.
    """
    limits = []
    for text in texts:
        try:
            limits.append(parse_rate_limit(text))
        except ValueError as error:
            raise UsageError(f"--rate-limit {text!r}: {error}") from None
    return limits


async def worker_command(worker: Worker, args: argparse.Namespace) -> ExitCode:
    """``worker``: run until SIGTERM or SIGINT (a second one stops at once); exit 0."""
    reports: list[WorkerReport] = []
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with trio.open_nursery() as nursery:

            async def on_signals() -> None:
                count = 0
                async for number in signals:
                    count += 1
                    name = signal.Signals(number).name
                    if count == 1:
                        _note(f"{name}: stopping; runs stop at their next commit")
                        worker.stop()
                    else:
                        _note(f"{name} again: stopping at once")
                        worker.stop_now()

            async def work(*, task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED) -> None:
                reports.append(await worker.run(task_status=task_status))
                nursery.cancel_scope.cancel()  # the signal watcher ends with the worker

            nursery.start_soon(on_signals)
            started = await nursery.start(work)
            _note(
                f"worker {started} serving {', '.join(worker.agents)} "
                f"(concurrency {worker.concurrency}, lease {worker.runtime.lease_s:g} s) "
                f"on {redacted_url(worker.runtime.db_url)}"
            )
    (report,) = reports
    if args.json:
        print(report.model_dump_json())
    else:
        outcomes = " ".join(f"{k}={v}" for k, v in sorted(report.outcomes.items())) or "none"
        print(
            f"worker {report.worker_id} stopped: claimed={report.claimed} "
            f"drained={report.drained} abandoned={report.abandoned} failed={report.failed} "
            f"outcomes: {outcomes}"
        )
    return ExitCode.OK


def _note(text: str) -> None:
    print(f"loop-actors: {redacted_url(terminal_safe(text))}", file=sys.stderr, flush=True)


def read_queue(store: EventStore) -> WorkQueue:
    """The work queue of a store opened for reading (its SQLite queue read-only, as it)."""
    if store.url.kind == "memory":
        raise UsageError("a memory:// store has no queue another process can read")
    return store.open_queue()


def queue_statuses(store: EventStore) -> tuple[dict[str, QueueRow], float]:
    """Every queue row by invocation id, and the queue's time."""
    queue = read_queue(store)
    try:
        rows, now = queue.rows(limit=None)  # `list` walks every invocation: every row
    finally:
        queue.close()
    return {row.invocation_id: row for row in rows}, now


def status_of(row: QueueRow | None, trajectory_status: str, now: float) -> str | None:
    """An invocation's queue status: its row's, else what its history says (no row)."""
    if row is not None:
        return effective_status(row, now).value
    if trajectory_status == "terminated":
        return QueueStatus.ENDED.value
    if trajectory_status == "paused":
        return QueueStatus.PAUSED.value
    return None  # started, never queued, and not driven by anyone: no worker takes it


def _iso(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).isoformat(timespec="seconds")


def workers_command(store: EventStore, args: argparse.Namespace) -> ExitCode:
    """``workers``: the registered holders, live or not, with their leases; what waits.

    After the holders: the next due active schedules, the runs that wait to be due
    (asleep, waiting for quota, or retried later), and the rate limits that make
    requests wait.
    """
    queue = read_queue(store)
    try:
        holders, now = queue.holders()
        rows, _ = queue.rows()
        schedules, _ = queue.schedules()
        limits, _ = queue.quota_rows()
    finally:
        queue.close()
    waits = _waits(rows, schedules, limits, now)
    leases: dict[str, list[QueueRow]] = {}
    expired: dict[str, list[QueueRow]] = {}
    for row in rows:
        if row.holder is not None and row.status is QueueStatus.CLAIMED:
            bucket = leases if lease_is_live(row, now) else expired
            bucket.setdefault(row.holder, []).append(row)
    records = [
        _holder_record(holder, leases.get(holder.holder, []), expired.get(holder.holder, []), now)
        for holder in holders
    ]
    if args.json:
        for record in [*records, *waits]:
            print(json.dumps(record))
        return ExitCode.OK
    table = Table("holder", "kind", "alive", "heartbeat", "agents", "leases", box=None)
    for record in records:
        held = ", ".join(
            [
                f"{lease['invocation_id']} (epoch {lease['epoch']}, {lease['expires_in_s']:.0f} s)"
                for lease in record["leases"]
            ]
            + [
                f"{lease['invocation_id']} (epoch {lease['epoch']}, ran out)"
                for lease in record["expired_leases"]
            ]
        )
        table.add_row(
            terminal_safe(record["holder"]),
            record["kind"],
            "yes" if record["alive"] else "no",
            f"{record['heartbeat_age_s']:.1f} s ago",
            terminal_safe(", ".join(record["agents"])),
            terminal_safe(held or "-"),
        )
    print_table(console(), table, table, (ID, TEXT, TEXT, TEXT, TEXT, TEXT))
    live = sum(1 for record in records if record["alive"])
    ran_out = sum(len(v) for v in expired.values())
    print(
        f"{live} live holder(s), {sum(len(v) for v in leases.values())} lease(s) held"
        + (f", {ran_out} run out (to be taken over)" if ran_out else "")
    )
    for line in _wait_lines(waits):
        print(terminal_safe(line))
    return ExitCode.OK


SHOWN_WAITS = 5
"""How many of each kind of wait the text of ``workers`` names (``--json``: every one)."""


def _waits(
    rows: list[QueueRow],
    schedules: list[Schedule],
    limits: list[tuple[str, str, QuotaRow]],
    now: float,
) -> list[dict[str, Any]]:
    """What waits for a time, soonest first within each kind: schedules, runs, rate limits."""
    found: list[dict[str, Any]] = [
        {
            "kind": "schedule",
            "schedule": row.name,
            "agent": row.agent_name,
            "next_due": _iso(row.next_due),
            "due_in_s": round(row.next_due - now, 3),
            "next_invocation_id": row.invocation_id(row.next_due),
        }
        for row in sorted(schedules, key=lambda row: (row.next_due, row.name))
        if row.state is ScheduleState.ACTIVE
    ]
    found += [
        {
            "kind": "waiting",
            "invocation_id": row.invocation_id,
            "agent": row.agent_name,
            "due_at": _iso(row.due_at),
            "due_in_s": round(row.due_at - now, 3),
            "note": row.note,
        }
        for row in sorted(rows, key=lambda row: (row.due_at, row.invocation_id))
        if row.status is QueueStatus.RUNNABLE and row.due_at > now
    ]
    for provider, model, quota in limits:
        next_request = max(quota.request_due, quota.token_due, quota.blocked_until)
        if next_request > now:
            found.append(
                {
                    "kind": "rate_limit",
                    "provider": provider,
                    "model": model,
                    "next_request_at": _iso(next_request),
                    "wait_s": round(next_request - now, 3),
                    "blocked_until": _iso(quota.blocked_until)
                    if quota.blocked_until > now
                    else None,
                }
            )
    return found


WAIT_TITLES = (
    ("schedule", "next due schedule(s)"),
    ("waiting", "run(s) waiting to be due (asleep, for quota, or retried)"),
    ("rate_limit", "rate limit(s) making requests wait"),
)


def _wait_lines(waits: list[dict[str, Any]]) -> list[str]:
    """The text of ``workers``' last lines: a line for each kind of wait there is."""
    lines = []
    for kind, title in WAIT_TITLES:
        of_kind = [wait for wait in waits if wait["kind"] == kind]
        if of_kind:
            shown = ", ".join(_wait_text(wait) for wait in of_kind[:SHOWN_WAITS])
            more = f", {len(of_kind) - SHOWN_WAITS} more" if len(of_kind) > SHOWN_WAITS else ""
            lines.append(f"{len(of_kind)} {title}: {shown}{more}")
    return lines


def _wait_text(wait: dict[str, Any]) -> str:
    match wait["kind"]:
        case "schedule":
            return f"{wait['schedule']} {_due_in(wait['due_in_s'])}"
        case "waiting":
            return f"{wait['invocation_id']} {_due_in(wait['due_in_s'])}"
        case _:
            return f"{wait['provider']}:{wait['model']} for {_duration(wait['wait_s'])}"


def _due_in(seconds: float) -> str:
    """``in 5 s``, ``in 3 h``; ``overdue by 2 min`` (no worker of its agent checked it)."""
    return f"overdue by {_duration(-seconds)}" if seconds < 0 else f"in {_duration(seconds)}"


def _duration(seconds: float) -> str:
    for size, unit, more_than in ((86400, "days", 2), (3600, "h", 2), (60, "min", 2)):
        if seconds >= more_than * size:
            return f"{seconds / size:.0f} {unit}"
    return f"{seconds:.0f} s"


def _lease_record(row: QueueRow, now: float) -> dict[str, Any]:
    return {
        "invocation_id": row.invocation_id,
        "epoch": row.epoch,
        "expires_at": _iso(row.due_at),
        "expires_in_s": round(row.due_at - now, 3),
    }


def _holder_record(
    holder: HolderRow, leases: list[QueueRow], expired: list[QueueRow], now: float
) -> dict[str, Any]:
    """A holder as ``workers`` shows it, with its live leases and those that ran out.

    Alive while its last heartbeat is within its lease and, on this machine, its
    process still exists (a killed worker is not alive, whatever its heartbeat says).
    """
    return {
        "holder": holder.holder,
        "kind": holder.kind.value,
        "host": holder.host,
        "pid": holder.pid,
        "started_at": _iso(holder.started_at),
        "last_heartbeat": _iso(holder.heartbeat_at),
        "heartbeat_age_s": round(now - holder.heartbeat_at, 3),
        "alive": holder.heartbeat_at + holder.lease_s > now and not is_gone(holder, now),
        "lease_s": holder.lease_s,
        "agents": holder.agents,
        "concurrency": holder.concurrency,
        "leases": [_lease_record(row, now) for row in leases],
        "expired_leases": [_lease_record(row, now) for row in expired],
    }
