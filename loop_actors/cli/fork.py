"""The ``fork`` command: a new invocation from a past step of another, then live."""

from __future__ import annotations

import argparse
import json

from aggregates.fork import ForkWrites
from loop_actors._errors import UsageError
from loop_actors._terminal import terminal_safe
from loop_actors.agent.agent import Agent
from loop_actors.cli.agents import load_agent
from loop_actors.cli.common import outcome_json, outcome_lines, runtime_for, trio_run
from loop_actors.cli.exit_codes import ExitCode
from loop_actors.runtime.fork import Forked, check_fork_arguments, parse_fork_point
from loop_actors.runtime.runtime import Runtime


def forked_json(forked: Forked) -> str:
    """The fork as one JSON object (docs/reference/fork.md)."""
    document = forked.as_json()
    if forked.outcome is not None:
        document["outcome"] = json.loads(outcome_json(forked.outcome))
    return json.dumps(document, ensure_ascii=False)


def forked_lines(forked: Forked, events: int) -> list[str]:
    """The readable report: where the fork came from, then its outcome (if it ran)."""
    changed = ", ".join(forked.changed) if forked.changed else "nothing"
    writes = forked.source_writes
    lines = [
        f"forked {terminal_safe(forked.fork_id)} from {terminal_safe(forked.source_id)} at "
        f"step {forked.at_step} (writes={forked.writes.value}; changed: {changed}; "
        f"{writes} write{'' if writes == 1 else 's'} of the source after step {forked.at_step})"
    ]
    if forked.outcome is None:
        lines.append("queued: a worker serving its agent claims it (or resume it)")
    else:
        lines.extend(outcome_lines(forked.outcome, events))
    return lines


async def _fork(runtime: Runtime, agent: Agent | None, args: argparse.Namespace) -> ExitCode:
    async with runtime:
        if agent is None and not args.no_run:
            agent = await _submitted_agent(runtime, args.source_id)
        forked = await runtime.fork(
            args.source_id,
            at_step=parse_fork_point(args.at_step),
            agent=agent,
            fork_id=args.fork_id,
            writes=ForkWrites(args.writes),
            by=args.by,
            reason=args.reason,
            run=not args.no_run,
            take_over=args.take_over,
            agent_ref=args.agent,
        )
        events = len(await runtime.history(forked.fork_id))
    if args.json:
        print(forked_json(forked))
    else:
        print("\n".join(forked_lines(forked, events)))
    return ExitCode.OK if forked.outcome is None else ExitCode(forked.outcome.exit_code)


async def _submitted_agent(runtime: Runtime, source_id: str) -> Agent:
    """The agent the source was submitted with (its queue row's ``MODULE:ATTR``), if any."""
    leases = runtime.driver.leases
    row = await leases.call(leases.queue.row, source_id)
    if row is None or row.agent_ref is None:
        await runtime.load(source_id)  # an unknown id says so first
        raise UsageError(
            "give --agent MODULE:ATTR to run the fork (the source was not submitted with "
            "one), or --no-run to queue it for a worker"
        )
    return load_agent(row.agent_ref)


def run(args: argparse.Namespace) -> int:
    """``fork ID --at-step N|last-failed --by NAME --reason TEXT``."""
    check_fork_arguments(  # before the database is opened
        args.source_id,
        parse_fork_point(args.at_step),
        fork_id=args.fork_id,
        by=args.by,
        reason=args.reason,
        agent=None,
        run=False,
    )
    agent = load_agent(args.agent) if args.agent else None  # a bad agent opens nothing
    return trio_run(_fork, runtime_for(args, existing=True), agent, args)
