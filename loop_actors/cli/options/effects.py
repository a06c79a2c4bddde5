"""The options of ``effects [list]`` and ``effects resolve``."""

from __future__ import annotations

import argparse
from typing import Any

from loop_actors.cli.parser import (
    DB_HELP,
    AddArguments,
    CliParser,
    checkpoint_options,
    views_option,
)


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


ARGUMENTS: dict[str, AddArguments] = {"effects": _add_effects}
