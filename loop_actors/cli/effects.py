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
from loop_actors.cli.common import checkpoint_options, load_agent, report, runtime_for
from loop_actors.cli.exit_codes import ExitCode
from loop_actors.cli.parser import DB_HELP, AddArguments, CliParser, views_option
from loop_actors.runtime.runtime import Runtime


def _add_effects(effects_cmd: argparse.ArgumentParser) -> None:
    _effects_list_options(effects_cmd, default=None)
    effect_actions = effects_cmd.add_subparsers(
        dest="effects_command", required=False, parser_class=CliParser
    )
    effects_list = effect_actions.add_parser(
        "list", help="open effects, oldest first, and who can settle each (the default)"
    )
    # SUPPRESS: options given before `list` are not reset by the sub-command's defaults.
    _effects_list_options(effects_list, default=argparse.SUPPRESS)
    resolve = effect_actions.add_parser(
        "resolve",
        help="settle an open effect by hand: the write happened (--committed) or not "
        "(--rejected); who and why are recorded",
    )
    resolve.add_argument("effect_key", metavar="KEY", help="the effect key (eff-...)")
    happened = resolve.add_mutually_exclusive_group(required=True)
    happened.add_argument(
        "--committed", action="store_true", help="the write happened (give its --receipt)"
    )
    happened.add_argument(
        "--rejected", action="store_true", help="the write did not happen (give a --reason)"
    )
    resolve.add_argument(
        "--receipt", metavar="JSON", help="with --committed: the service's receipt, as JSON"
    )
    resolve.add_argument(
        "--reason",
        metavar="TEXT",
        help="why (audited); required with --rejected (the model sees it)",
    )
    resolve.add_argument("--by", required=True, metavar="NAME", help="who settles it (audited)")
    resolve.add_argument(
        "--agent",
        dest="effects_agent",
        metavar="MODULE:ATTR",
        default=argparse.SUPPRESS,
        help="the invocation's agent: the receipt is redacted as its tool says "
        "(sensitive_output), and a paused invocation is resumed right away; without it "
        "the receipt is stored as given",
    )
    resolve.add_argument(
        "--json", action="store_true", default=argparse.SUPPRESS, help="print what was recorded"
    )
    resolve.add_argument("--db", metavar="URL", default=argparse.SUPPRESS, help=DB_HELP)
    checkpoint_options(resolve)


def _effects_list_options(sub: argparse.ArgumentParser, *, default: Any) -> None:
    """The options of ``effects`` and ``effects list`` (``default``: SUPPRESS on the latter)."""
    sub.add_argument(
        "--agent",
        dest="effects_agent",
        metavar="MODULE:ATTR",
        help="look at this agent's tools: a write whose tool has no reconcile needs a person",
        **({} if default is None else {"default": default}),
    )
    if default is None:
        sub.add_argument("--json", action="store_true", help="one JSON object a line")
        views_option(sub)
        return
    sub.add_argument("--json", action="store_true", default=default, help="one JSON object a line")
    sub.add_argument("--db", metavar="URL", default=default, help=DB_HELP)
    sub.add_argument(
        "--views",
        metavar="FILE",
        default=default,
        help="the read models' SQLite file (default: X.views.db)",
    )


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
            events = await runtime.history(outcome.invocation_id)
            if not args.json:
                print(line)
            return report(outcome, len(events), as_json=args.json)
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


ARGUMENTS: dict[str, AddArguments] = {"effects": _add_effects}


def run(args: argparse.Namespace) -> int:
    """``effects [list]`` (a read model) or ``effects resolve KEY``."""
    if args.effects_command != "resolve":
        return read_models.run(args)
    agent_ref = getattr(args, "effects_agent", None)
    resolver = load_agent(agent_ref) if agent_ref else None
    parse_receipt(args.receipt)  # before the database: a bad receipt opens nothing
    exit_code: int = trio.run(_resolve_effect, runtime_for(args, existing=True), resolver, args)
    return exit_code
