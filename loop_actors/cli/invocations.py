"""The commands that run and steer invocations.

``run``, ``resume``, ``approve``, ``deny``, ``clarify``, ``cancel``, ``wake`` and ``reconcile``.
"""

from __future__ import annotations

import argparse
import json

from aggregates.decisions import TerminalReason
from loop_actors._errors import UsageError
from loop_actors._terminal import terminal_safe
from loop_actors.agent.adapters import model_from_name
from loop_actors.agent.agent import Agent
from loop_actors.cli.agents import load_agent
from loop_actors.cli.common import (
    report,
    runtime_for,
    stored_events,
    trio_run,
)
from loop_actors.cli.exit_codes import ExitCode
from loop_actors.runtime.runtime import Runtime, check_invocation_id


async def _run_agent(runtime: Runtime, agent: Agent, args: argparse.Namespace) -> ExitCode:
    async with runtime:  # one store for the run and its history (memory:// included)
        outcome = await runtime.run(
            agent,
            args.goal,
            invocation_id=args.invocation_id,
            task_class=args.task_class,
            actor=args.actor,
            tenant=args.tenant,
        )
        events = await stored_events(runtime, outcome)
    return report(outcome, events, as_json=args.json)


async def _resume(runtime: Runtime, agent: Agent, args: argparse.Namespace) -> ExitCode:
    async with runtime:
        outcome = await runtime.resume(
            args.invocation_id,
            agent,
            allow_catalogue_change=args.allow_catalogue_change,
            allow_settings_change=args.allow_settings_change,
            take_over=args.take_over,
        )
        events = await stored_events(runtime, outcome)
    return report(outcome, events, as_json=args.json)


async def _reconcile(runtime: Runtime, agent: Agent, args: argparse.Namespace) -> ExitCode:
    reconciled = await runtime.reconcile(agent)
    if args.json:
        print(reconciled.model_dump_json())
    else:
        for outcome in reconciled.resumed:
            print(f"resumed {terminal_safe(outcome.invocation_id)}: {outcome.reason.value}")
        for invocation_id in reconciled.left_running:
            print(
                f"left alone {terminal_safe(invocation_id)}: not paused (it may be running); "
                "resume it"
            )
        for stuck in reconciled.needs_person:
            print(
                f"needs a person {stuck.effect_key} "
                f"(invocation {terminal_safe(stuck.invocation_id)}): "
                f"{terminal_safe(stuck.why)}; loop-actors effects resolve {stuck.effect_key} "
                "--committed [--receipt JSON] | --rejected --reason TEXT --by NAME"
            )
        print(
            f"effects settled={reconciled.effects_settled} open={reconciled.effects_open} "
            f"invocations waiting={reconciled.invocations_waiting}"
        )
    if reconciled.needs_person:
        return ExitCode.NEEDS_PERSON
    # An invocation still paused for reconciliation is counted in invocations_waiting.
    paused_again = any(
        o.paused and o.reason is not TerminalReason.RECONCILIATION_REQUIRED
        for o in reconciled.resumed
    )
    if reconciled.effects_waiting > 0 or reconciled.invocations_waiting > 0 or paused_again:
        return ExitCode.PAUSED
    return ExitCode.OK


async def _decide(runtime: Runtime, agent: Agent | None, args: argparse.Namespace) -> ExitCode:
    """Approve / deny / clarify: record the person's decision, then resume if asked."""
    async with runtime:
        match args.command:
            case "approve":
                await runtime.approve(
                    args.invocation_id, digest=args.digest, by=args.by, note=args.note
                )
            case "deny":
                await runtime.deny(args.invocation_id, by=args.by, reason=args.reason)
            case _:
                await runtime.clarify(args.invocation_id, answer=args.answer, by=args.by)
        if agent is None:
            print(
                f"recorded {args.command} for {terminal_safe(args.invocation_id)}; "
                "resume it to continue"
            )
            return ExitCode.OK
        outcome = await runtime.resume(args.invocation_id, agent)
        events = await stored_events(runtime, outcome)
    return report(outcome, events, as_json=args.json)


async def _cancel(runtime: Runtime, args: argparse.Namespace) -> ExitCode:
    result = await runtime.request_cancel(args.invocation_id, by=args.by, reason=args.reason)
    if args.json:
        print(json.dumps({"invocation_id": args.invocation_id, "result": result.value}))
    else:
        print(f"{terminal_safe(args.invocation_id)}: {result.value}")
    return ExitCode.OK


async def _wake(runtime: Runtime, agent: Agent | None, args: argparse.Namespace) -> ExitCode:
    """Record the wake of a sleeping invocation, then resume it if asked."""
    async with runtime:
        early = await runtime.wake(args.invocation_id, by=args.by)
        if agent is None:
            if args.json:
                print(json.dumps({"invocation_id": args.invocation_id, "early": early}))
            else:
                print(
                    f"woke {terminal_safe(args.invocation_id)}"
                    + (" early" if early else "")
                    + "; a worker drives it on (or resume it)"
                )
            return ExitCode.OK
        outcome = await runtime.resume(args.invocation_id, agent)
        events = await stored_events(runtime, outcome)
    return report(outcome, events, as_json=args.json)


def run(args: argparse.Namespace) -> int:
    """Run one of this group's commands."""
    match args.command:
        case "run":
            if not args.goal.strip():
                raise UsageError("--goal must not be empty")
            if args.invocation_id is not None:
                check_invocation_id(args.invocation_id)  # before the database is opened
            agent = load_agent(args.agent)  # before the database: a bad agent writes nothing
            if args.model:
                model = model_from_name(
                    args.model,
                    base_url=args.base_url,
                    send_key_to_loopback=args.send_key_to_loopback,
                )
                agent = agent.with_model(model)
            elif args.base_url or args.send_key_to_loopback:
                raise UsageError("--base-url and --send-key-to-loopback go with --model")
            return trio_run(_run_agent, runtime_for(args), agent, args)
        case "resume":
            agent = load_agent(args.agent)
            return trio_run(_resume, runtime_for(args, existing=True), agent, args)
        case "cancel":
            return trio_run(_cancel, runtime_for(args, existing=True), args)
        case "wake":
            waker = load_agent(args.agent) if args.agent else None
            return trio_run(_wake, runtime_for(args, existing=True), waker, args)
        case "approve" | "deny" | "clarify":
            decider = load_agent(args.agent) if args.agent else None
            return trio_run(_decide, runtime_for(args, existing=True), decider, args)
        case _:
            agent = load_agent(args.agent)
            return trio_run(_reconcile, runtime_for(args, existing=True), agent, args)
