"""The ``effects`` commands: list the open effects, or settle one by hand (``resolve``)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, NoReturn

import trio

from aggregates.values import check_json_depth
from loop_actors._errors import EffectResolutionError
from loop_actors.agent.agent import Agent
from loop_actors.cli import read_models
from loop_actors.cli.agents import load_agent
from loop_actors.cli.common import report, runtime_for, stored_events
from loop_actors.cli.exit_codes import ExitCode
from loop_actors.runtime.runtime import Runtime


def parse_receipt(text: str | None) -> Any:
    """The ``--receipt`` JSON (None when not given).

    Raises:
        EffectResolutionError: not JSON, or NaN / Infinity (not stored faithfully).
    """
    if text is None:
        return None

    def refuse(constant: str) -> NoReturn:
        raise EffectResolutionError(
            f"--receipt: {constant} is not JSON and cannot be stored faithfully"
        )

    problem = check_json_depth(text)  # before parsing: no RecursionError on deep nesting
    if problem is not None:
        raise EffectResolutionError(f"--receipt cannot be stored as JSON: {problem}")
    try:
        return json.loads(text, parse_constant=refuse)
    except json.JSONDecodeError as error:
        raise EffectResolutionError(f"--receipt is not JSON: {error}") from None


async def _resolve_effect(
    runtime: Runtime, agent: Agent | None, args: argparse.Namespace
) -> ExitCode:
    """Record a person's resolution; with the agent, resume the invocation if it waits for it."""
    receipt = parse_receipt(args.receipt)
    async with runtime:
        resolved = await runtime.resolve_effect(
            args.effect_key,
            committed=args.committed,
            rejected=args.rejected,
            receipt=receipt,
            reason=args.reason,
            by=args.by,
            agent=agent,
        )
        if agent is None and args.receipt is not None:
            print(
                "loop-actors: note: without --agent the receipt is stored as given "
                "(the tool's sensitive_output is not applied)",
                file=sys.stderr,
            )
        line = (
            f"resolved {resolved.effect_key} {resolved.resolution.value} by {resolved.by} "
            f"(invocation {resolved.invocation_id}, tool {resolved.tool})"
        )
        if agent is not None and resolved.resumable:
            outcome = await runtime.resume(resolved.invocation_id, agent)
            events = await stored_events(runtime, outcome)
            if not args.json:
                print(line)
            return report(outcome, events, as_json=args.json)
    if args.json:
        print(resolved.model_dump_json())
        return ExitCode.OK
    print(line)
    if resolved.resumable:
        print(
            f"resume it to continue: loop-actors resume {resolved.invocation_id} "
            "--agent MODULE:ATTR"
        )
    else:
        print("its invocation has ended: nothing to resume")
    return ExitCode.OK


def run(args: argparse.Namespace) -> int:
    """``effects [list]`` (a read model) or ``effects resolve KEY``."""
    if args.effects_command != "resolve":
        return read_models.run(args)
    agent_ref = getattr(args, "effects_agent", None)
    resolver = load_agent(agent_ref) if agent_ref else None
    parse_receipt(args.receipt)  # before the database: a bad receipt opens nothing
    exit_code: int = trio.run(_resolve_effect, runtime_for(args, existing=True), resolver, args)
    return exit_code
