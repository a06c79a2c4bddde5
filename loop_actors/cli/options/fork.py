"""The options of ``fork``."""

from __future__ import annotations

import argparse

from loop_actors.cli.parser import AddArguments, checkpoint_options, db_option

WRITES = ("approve", "deny", "live", "dedupe")
"""``--writes``: ``aggregates.fork_origin.ForkWrites``'s values (a test checks they agree)."""


def _add_fork(fork: argparse.ArgumentParser) -> None:
    fork.add_argument("source_id", metavar="ID", help="the invocation to fork")
    fork.add_argument(
        "--at-step",
        required=True,
        metavar="N|last-failed",
        help="copy the source's steps 1..N (0: none), or up to the step before the last "
        "one that failed (last-failed)",
    )
    fork.add_argument(
        "--agent",
        metavar="MODULE:ATTR",
        help="the agent the fork goes on with (the same or a changed one; default: the "
        "source's, as it was submitted)",
    )
    fork.add_argument("--id", dest="fork_id", metavar="NEW", help="choose the fork's id")
    fork.add_argument(
        "--writes",
        choices=WRITES,
        default="approve",
        help="a write that repeats one the source committed after step N: waits for "
        "approval (approve, the default), is refused (deny), runs as new (live), or reuses "
        "the source's effect key and receipt (dedupe)",
    )
    fork.add_argument("--by", required=True, metavar="NAME", help="who forks (recorded)")
    fork.add_argument("--reason", required=True, metavar="TEXT", help="why (recorded)")
    fork.add_argument(
        "--no-run",
        action="store_true",
        help="record the fork and queue it for a worker (or a resume) instead of running it",
    )
    fork.add_argument(
        "--take-over",
        action="store_true",
        help="fork even while a live process drives the source (what it committed so far "
        "is copied; the source is untouched)",
    )
    fork.add_argument("--json", action="store_true", help="print the fork as one JSON object")
    db_option(fork)
    checkpoint_options(fork)


ARGUMENTS: dict[str, AddArguments] = {"fork": _add_fork}
