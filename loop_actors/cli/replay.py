"""The ``replay`` command: re-drive recorded invocations under an agent, calling nothing."""

from __future__ import annotations

import argparse
import json

import trio
from rich.table import Table

from aggregates.invocation import InvocationEvent
from loop_actors._errors import UsageError
from loop_actors._render import console
from loop_actors._terminal import terminal_safe
from loop_actors.agent.agent import Agent
from loop_actors.cli.agents import load_agent
from loop_actors.cli.common import trio_run
from loop_actors.cli.exit_codes import ExitCode
from loop_actors.cli.reading import open_for_reading
from loop_actors.runtime.gc_policy import GcPolicy
from loop_actors.runtime.replay import (
    ReplayClock,
    ReplayFilter,
    ReplayMatch,
    ReplayReport,
    replay_all,
)
from loop_actors.runtime.runtime import Runtime
from loop_actors.store.url import StoreUrl


def report_json(report: ReplayReport) -> str:
    """The report as one JSON object (docs/reference/replay.md)."""
    document = report.model_dump(mode="json")
    document["identical"] = report.identical
    document["diverged"] = report.diverged
    document["endings"] = [
        {"recorded": old, "replayed": new, "count": n} for old, new, n in report.endings()
    ]
    return json.dumps(document, ensure_ascii=False)


def print_report(report: ReplayReport) -> None:
    """The report as a table of replays, then how many end differently."""
    table = Table(title=f"replayed with {terminal_safe(report.agent)} ({report.match.value})")
    table.add_column("invocation", no_wrap=True, overflow="fold")
    table.add_column("recorded → replayed", no_wrap=True)
    table.add_column("step", justify="right", no_wrap=True)
    table.add_column("first departure")
    for result in report.results:
        first = result.first
        replayed = (
            "past the recording"
            if result.past_recording
            else (result.replayed.value if result.replayed else "running")
        )
        recorded = result.recorded.value if result.recorded else "running"
        table.add_row(
            terminal_safe(result.invocation_id),
            f"{recorded} → {replayed}",
            "" if first is None or first.step is None else str(first.step),
            "identical" if first is None else terminal_safe(f"{first.kind.value}: {first.detail}"),
        )
    out = console()
    out.print(table)
    for result in report.results:
        for note in result.notes:
            out.print(terminal_safe(f"{result.invocation_id}: {note}"), markup=False)
    total = len(report.results)
    out.print(
        f"{total} replayed: {total - report.diverged} identical, {report.diverged} diverge",
        markup=False,
    )
    for old, new, count in report.endings():
        out.print(f"  {old} → {new}: {count}", markup=False)


async def _replay(agent: Agent, args: argparse.Namespace) -> ExitCode:
    where = ReplayFilter.parse(args.where) if args.where else None
    source = open_for_reading(args.db)  # only read: nothing is written to it
    try:
        ids = source.invocation_ids() if args.all else list(args.invocation_ids)

        async def read_events(invocation_id: str) -> list[InvocationEvent]:
            return await trio.to_thread.run_sync(source.events, invocation_id)

        clock = ReplayClock()
        async with Runtime(args.into, now=clock, gc_policy=GcPolicy.UNCHANGED) as target:
            report = await replay_all(
                read_events,
                ids,
                agent,
                target,
                where=where,
                match=ReplayMatch(args.match),
                assume_approved=args.assume_approved,
                check=args.check,
                fresh_target=args.into == "memory://",
                clock=clock,
            )
    finally:
        source.close()
    if args.json:
        print(report_json(report))
    else:
        print_report(report)
    return ExitCode.OK if report.identical else ExitCode.DIVERGED


def run(args: argparse.Namespace) -> int:
    """``replay [ID ...] --agent MODULE:ATTR``."""
    if args.all and args.invocation_ids:
        raise UsageError("give invocation ids or --all, not both")
    if not args.all and not args.invocation_ids:
        raise UsageError("name the invocations to replay, or give --all")
    StoreUrl.parse(args.into)
    if args.where:
        ReplayFilter.parse(args.where)  # before the database is opened
    agent = load_agent(args.agent)  # before the database: a bad agent opens nothing
    return trio_run(_replay, agent, args)
