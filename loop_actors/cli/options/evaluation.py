"""The options of ``eval``."""

from __future__ import annotations

import argparse

from loop_actors.cli.parser import AddArguments, checkpoint_options, db_option, positive_int

BUILTIN_FAULTS = [
    "needless_tool_call",
    "wrong_tool",
    "reads_run_in_sequence",
    "lenient_arguments",
    "whole_batch_retried",
    "approval_rule_removed",
    "repeated_plan_limit_too_high",
    "cancel_ignored",
    "write_without_reconciliation",
    "write_ignores_effect_key",
    "verifier_accepts_everything",
]
"""The values of ``loop_actors.eval.builtin.Fault`` (a test checks that they agree)."""


def _add_eval(evaluate: argparse.ArgumentParser) -> None:
    evaluate.add_argument(
        "file",
        metavar="FILE",
        nargs="?",
        help="a cases file (JSON or YAML), or 'schema', or 'compare' (optional with --builtin)",
    )
    evaluate.add_argument("more", metavar="REPORT", nargs="*", help="compare: the two reports")
    evaluate.add_argument(
        "--concurrency", type=positive_int, default=8, help="cases run at once (default 8)"
    )
    evaluate.add_argument("--json", dest="json_report", metavar="REPORT", help="write the report")
    evaluate.add_argument(
        "--html",
        dest="html_report",
        metavar="REPORT",
        help="write the report as one self-contained HTML page (charts, trajectories)",
    )
    evaluate.add_argument(
        "--builtin",
        action="store_true",
        help="also run the built-in cases (seed 000's branches: a self-test of the runtime)",
    )
    evaluate.add_argument(
        "--rerun-failed",
        action="store_true",
        help="run the cases whose last attempt failed again, as new attempts",
    )
    evaluate.add_argument(  # checking the checks: break what one built-in case guards
        "--builtin-fault",
        dest="builtin_faults",
        action="append",
        default=[],
        choices=BUILTIN_FAULTS,
        help=argparse.SUPPRESS,
    )
    evaluate.add_argument(
        "--agent",
        dest="eval_agent",
        metavar="MODULE:ATTR",
        help="run this agent instead of the file's (change one thing, re-measure)",
    )
    db_option(evaluate)
    checkpoint_options(evaluate)


ARGUMENTS: dict[str, AddArguments] = {"eval": _add_eval}
