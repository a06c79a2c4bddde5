"""The commands that read the read models: show, list, metrics, projections (and effects).

What only ``effects --agent`` and ``list --status`` need (an agent and the runtime's view
of its tools; the work queue) is imported when they ask for it, not by ``list``.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from aggregates.decisions import TerminalReason
from aggregates.handoffs import handoff_id_of
from aggregates.lease import QueueRow
from loop_actors._errors import InvocationNotFoundError, UnreadableEventError, UsageError
from loop_actors._render import (
    EFFECTS_FITS,
    INVOCATIONS_FITS,
    METRICS_FITS,
    console,
    effects_table,
    invocations_table,
    metrics_table,
    print_table,
    render_tree,
)
from loop_actors._terminal import terminal_safe
from loop_actors.cli.exit_codes import ExitCode
from loop_actors.cli.reading import note, open_for_reading
from loop_actors.store.read_models import open_read_runner, open_writable_runner
from projections import (
    ProjectionRunner,
    list_invocations,
    list_open_effects,
    load_trajectory,
    metrics,
)
from projections.runner import DEFAULT_BATCH_SIZE, ProjectionStatus, SkippedRow
from projections.trajectory import Trajectory

SHOWN_SKIPPED = 10
"""``list`` names at most this many skipped rows (``projections status`` names them all)."""


def run(args: argparse.Namespace) -> int:
    """The commands that read the read models (after catching them up)."""
    batch_size = getattr(args, "batch_size", DEFAULT_BATCH_SIZE)
    if batch_size < 1:
        raise UsageError("--batch-size must be at least 1")
    store = open_for_reading(args.db)
    try:
        if args.command == "projections":
            runner = open_writable_runner(store, args.views, batch_size=batch_size)
        else:
            runner = open_read_runner(store, args.views, batch_size=batch_size, note=note)
        queue = None
        if args.command == "list" and args.status is not None:
            from loop_actors.cli.queue import queue_statuses  # noqa: PLC0415 - see the docstring

            queue = queue_statuses(store)
        try:
            return _read_model_command(runner, args, queue)
        finally:
            runner.close()
    finally:
        store.close()


def _read_model_command(
    runner: ProjectionRunner,
    args: argparse.Namespace,
    queue: tuple[dict[str, QueueRow], float] | None = None,
) -> int:
    out = console()
    if args.command == "projections":
        action = args.projections_command
        if action == "rebuild":
            reports = runner.rebuild(args.name)
        elif action == "catch-up":
            reports = runner.catch_up(args.name)
        else:
            _print_status(runner.status(args.name), as_json=args.json)
            return ExitCode.OK
        for report in reports:
            if args.json:
                print(report.model_dump_json())
            else:
                rate = report.events / report.seconds if report.seconds else 0.0
                went_past = f" skipped={report.skipped}" if report.skipped else ""
                print(
                    f"{report.name:<14} applied={report.events} position={report.position}"
                    f"{went_past} ({rate:,.0f} events/s)"
                )
        return ExitCode.OK
    runner.catch_up()
    skipped = _by_row(runner.skipped())
    match args.command:
        case "show":
            trajectory = load_trajectory(runner, args.invocation_id)
            mine = _skipped_of(args.invocation_id, trajectory, skipped)
            if trajectory is None:
                if mine:  # its first event is one of them
                    first = mine[0]
                    raise UnreadableEventError(
                        first.originator_id, first.originator_version, first.topic, first.problem
                    )
                raise InvocationNotFoundError(args.invocation_id)
            if args.json:
                print(trajectory.model_dump_json())
            else:
                out.print(render_tree(trajectory, width=out.width))
                for line in _lineage(runner, trajectory):
                    out.print(line, markup=False, highlight=False)
            if mine:
                for unread in mine:
                    note(f"{_described(unread)}: this trajectory lacks it and what follows it")
                note(
                    "the store was changed by hand or damaged: check it with "
                    "loop-actors audit verify"
                )
                return ExitCode.TAMPERED
        case "list":
            if queue is None:
                rows = list_invocations(runner, limit=args.limit, **_list_filters(args))
            else:
                rows = _with_status(runner, args, *queue)
            if args.json:
                for row in rows:
                    print(json.dumps(row))
            else:
                table = invocations_table(rows)
                print_table(out, table, table, INVOCATIONS_FITS)
        case "metrics":
            groups = metrics(runner, args.by)
            if args.json:
                for group in groups:
                    print(group.model_dump_json())
            else:
                table = metrics_table(groups, args.by)
                print_table(out, table, table, METRICS_FITS)
        case "effects":
            effects = list_open_effects(runner)
            if args.effects_agent is not None:
                _who_settles_with(args.effects_agent, effects)
            if args.json:
                for effect in effects:
                    print(json.dumps(effect))
            else:
                table = effects_table(effects)
                print_table(out, table, table, EFFECTS_FITS)
    if skipped and args.command != "show":
        _note_skipped(list(skipped.values()), every=args.command == "list")
    return ExitCode.OK


def _print_status(statuses: list[ProjectionStatus], *, as_json: bool) -> None:
    """``projections status``: a line per read model, then the rows they skipped, once each."""
    for status in statuses:
        if as_json:
            print(json.dumps({**status.model_dump(), "lag": status.lag}))
        else:
            skipped = f" skipped={len(status.skipped)}" if status.skipped else ""
            print(
                f"{status.name:<14} position={status.position} head={status.head} "
                f"lag={status.lag}{skipped}"
            )
    rows = _by_row([row for status in statuses for row in status.skipped])
    if as_json or not rows:
        return
    print("skipped rows (not decodable; `projections rebuild` decodes them again):")
    names: dict[int, list[str]] = {}
    for status in statuses:
        for row in status.skipped:
            names.setdefault(row.notification_id, []).append(status.name)
    for notification_id, row in rows.items():
        print(f"  {_described(row)} (by {', '.join(names[notification_id])})")


def _by_row(rows: list[SkippedRow]) -> dict[int, SkippedRow]:
    """The skipped rows once each (every read model skips the same ones), in log order."""
    found: dict[int, SkippedRow] = {}
    for row in rows:
        found.setdefault(row.notification_id, row)
    return dict(sorted(found.items()))


def _described(row: SkippedRow) -> str:
    """One skipped row, by notification id and its place in its aggregate."""
    return terminal_safe(
        f"stored row {row.notification_id} ({row.originator_id} at position "
        f"{row.originator_version}, topic {row.topic!r}) cannot be read: {row.problem}"
    )


def _skipped_of(
    invocation_id: str, trajectory: Trajectory | None, skipped: dict[int, SkippedRow]
) -> list[SkippedRow]:
    """The skipped rows of an invocation: its own, and its writes' ledger rows."""
    keys = {invocation_id}
    if trajectory is not None:
        keys.update(c.effect_key for step in trajectory.steps for c in step.calls if c.effect_key)
    return [row for row in skipped.values() if row.originator_id in keys]


def _note_skipped(rows: list[SkippedRow], *, every: bool) -> None:
    """Say on stderr that the read models went past rows they could not read.

    ``every``: name them (``list``, up to :data:`SHOWN_SKIPPED`); else count them.
    """
    if every:
        for row in rows[:SHOWN_SKIPPED]:
            note(f"{_described(row)}; the read models went past it")
        if len(rows) > SHOWN_SKIPPED:
            note(f"and {len(rows) - SHOWN_SKIPPED} more (loop-actors projections status)")
    else:
        note(
            f"{len(rows)} stored row(s) cannot be read: the read models went past them, and "
            "this answer leaves them out (loop-actors projections status lists them)"
        )
    note("the store was changed by hand or damaged: check it with loop-actors audit verify")


def _lineage(runner: ProjectionRunner, trajectory: Trajectory) -> list[str]:
    """``show``: where the invocation comes from, and the tree of its children below it."""
    lines = []
    if trajectory.parent_id is not None:
        lines.append(f"parent: {trajectory.parent_id}")
    if trajectory.forked_from is not None:
        lines.append(f"forked from: {trajectory.forked_from}")
    if trajectory.handed_off_from is not None:
        lines.append(f"handed off from: {trajectory.handed_off_from}")
    if trajectory.reason is TerminalReason.HANDED_OFF:
        target_id = handoff_id_of(trajectory.invocation_id)
        target = load_trajectory(runner, target_id)
        if target is None:
            lines.append(f"handed off to: {target_id} (not started yet)")
        else:
            outcome = target.reason.value if target.reason is not None else target.status.value
            lines.append(f"handed off to: {target_id} {target.agent_name} {outcome}")
    tree: list[str] = []

    def below(invocation_id: str, indent: str) -> None:
        # Oldest first (the order they started in); the last child of each is drawn └─.
        rows = list(reversed(list_invocations(runner, parent_id=invocation_id, limit=2**62)))
        for n, row in enumerate(rows):
            last = n == len(rows) - 1
            outcome = row["reason"] or row["status"]
            tree.append(
                f"{indent}{'└─' if last else '├─'} {row['invocation_id']} {row['agent']} "
                f"{outcome} steps={row['steps']} tool_calls={row['tool_calls']}: "
                f"{terminal_safe(row['goal'])}"
            )
            below(row["invocation_id"], indent + ("   " if last else "│  "))

    below(trajectory.invocation_id, "")
    if tree:
        lines.extend(["children:", *tree])
    return lines


def _list_filters(args: argparse.Namespace) -> dict[str, Any]:
    """``list``'s filters, as ``list_invocations`` takes them."""
    return {
        "reason": args.reason,
        "agent": args.agent,
        "roots_only": args.root,
        "parent_id": args.parent,
        "forked_from": args.forked_from,
        "originals_only": args.originals,
    }


def _with_status(
    runner: ProjectionRunner, args: argparse.Namespace, rows: dict[str, QueueRow], now: float
) -> list[dict[str, Any]]:
    """``list --status``: the invocations in that queue state, newest first, with it."""
    from loop_actors.cli.queue import status_of  # noqa: PLC0415 - see the module's docstring

    found: list[dict[str, Any]] = []
    for row in list_invocations(runner, limit=2**62, **_list_filters(args)):
        status = status_of(rows.get(row["invocation_id"]), row["status"], now)
        if status == args.status:
            found.append({**row, "queue_status": status})
            if len(found) == args.limit:
                break
    return found


def _who_settles_with(reference: str, effects: list[dict[str, Any]]) -> None:
    """Say who settles each open effect of the invocations of the agent at ``reference``.

    Looking at its tools: whether the owning service can be asked.
    """
    # Imported here: see the module's docstring.
    from aggregates.effect import who_settles  # noqa: PLC0415
    from loop_actors.cli.agents import load_agent  # noqa: PLC0415
    from loop_actors.runtime.reconcile_sweep import unaskable_reason  # noqa: PLC0415

    agent = load_agent(reference)
    for row in effects:
        if row["agent"] != agent.name:
            continue  # another agent's tools decide for its effects
        row["needs"] = who_settles(
            invocation_ended=row["invocation_ended"],
            service_can_be_asked=unaskable_reason(agent, row["tool"]) is None,
        ).value
