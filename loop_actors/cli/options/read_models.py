"""The options of ``show``, ``list``, ``metrics`` and ``projections``.

The literals below are the runtime's values (a test checks that they agree): written
here so that these options import nothing heavy.
"""

from __future__ import annotations

import argparse

from loop_actors.cli.options.queue import QUEUE_STATUSES
from loop_actors.cli.parser import AddArguments, CliParser, positive_int, views_option

TERMINAL_REASONS = [
    "completed",
    "approval_required",
    "clarification_required",
    "cannot_continue",
    "cancelled",
    "deadline_exceeded",
    "max_steps",
    "tool_budget_exhausted",
    "token_budget_exhausted",
    "cost_budget_exhausted",
    "no_progress",
    "repeated_failure",
    "invalid_decision",
    "model_error",
    "tool_unavailable",
    "verification_failed",
    "checkpoint_failed",
    "lease_lost",
    "reconciliation_required",
    "handed_off",
    "sleeping",
    "rate_limited",
    "plan_approval_required",
]
"""The values of ``aggregates.decisions.TerminalReason``, in its order (``list --reason``)."""

READ_MODELS = ["trajectory", "metrics", "open_effects"]
"""The names of the read models loop-actors keeps (``projections.default_projections()``)."""

DEFAULT_BATCH_SIZE = 5_000
"""``projections.runner.DEFAULT_BATCH_SIZE``: events per transaction of a catch-up."""


def _add_show(show: argparse.ArgumentParser) -> None:
    show.add_argument("invocation_id", metavar="ID")
    show.add_argument("--json", action="store_true", help="the trajectory as JSON")
    views_option(show)


def _add_list(listing: argparse.ArgumentParser) -> None:
    listing.add_argument(
        "--reason",
        choices=TERMINAL_REASONS,
        metavar="REASON",
        help="only this terminal reason (e.g. completed)",
    )
    listing.add_argument("--agent", help="only this agent")
    listing.add_argument(
        "--status",
        choices=QUEUE_STATUSES,
        help="only invocations in this state of the work queue (runnable, claimed, paused, ended)",
    )
    listing.add_argument(
        "--root", action="store_true", help="only top-level invocations (no child invocation)"
    )
    listing.add_argument("--parent", metavar="ID", help="only the child invocations of ID")
    listing.add_argument("--forked-from", metavar="ID", help="only the forks of ID")
    listing.add_argument("--originals", action="store_true", help="only invocations not forked")
    listing.add_argument(
        "--limit", type=positive_int, default=50, help="at most this many (default 50)"
    )
    listing.add_argument("--json", action="store_true", help="one JSON object a line")
    views_option(listing)


def _add_metrics(metrics_cmd: argparse.ArgumentParser) -> None:
    metrics_cmd.add_argument(
        "--by",
        choices=["agent", "task-class", "reason", "tree"],
        default="reason",
        help="the grouping (tree: a root and every invocation below it, by the root's id)",
    )
    metrics_cmd.add_argument("--json", action="store_true", help="one JSON object a line")
    views_option(metrics_cmd)


def _add_projections(projections_cmd: argparse.ArgumentParser) -> None:
    projection_actions = projections_cmd.add_subparsers(
        dest="projections_command", required=True, parser_class=CliParser
    )
    for action, text in (
        ("status", "position, head and lag of each read model"),
        ("catch-up", "apply every event not yet applied"),
        ("rebuild", "drop a read model and replay it from position 0"),
    ):
        sub_parser = projection_actions.add_parser(action, help=text)
        sub_parser.add_argument("name", nargs="?", choices=READ_MODELS)
        sub_parser.add_argument("--json", action="store_true", help="one JSON object a line")
        sub_parser.add_argument(
            "--batch-size",
            type=int,
            default=DEFAULT_BATCH_SIZE,
            help=f"events per transaction (default {DEFAULT_BATCH_SIZE})",
        )
        views_option(sub_parser)


ARGUMENTS: dict[str, AddArguments] = {
    "show": _add_show,
    "list": _add_list,
    "metrics": _add_metrics,
    "projections": _add_projections,
}
