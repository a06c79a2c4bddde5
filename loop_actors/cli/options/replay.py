"""The options of ``replay``."""

from __future__ import annotations

import argparse

from loop_actors.cli.parser import AddArguments, db_option


def _add_replay(replay: argparse.ArgumentParser) -> None:
    replay.add_argument("invocation_ids", metavar="ID", nargs="*", help="invocations to replay")
    replay.add_argument(
        "--agent", required=True, metavar="MODULE:ATTR", help="the agent to replay them with"
    )
    replay.add_argument("--all", action="store_true", help="every invocation of the store")
    replay.add_argument(
        "--where",
        metavar="COND",
        help="only those with reason=R, agent=A, task_class=C (comma-separated)",
    )
    replay.add_argument(
        "--match",
        choices=("strict", "lenient"),
        default="strict",
        help="find recorded results by step and call id, stopping at the first departure "
        "(strict, the default), or by step, tool and order, reporting every departure",
    )
    replay.add_argument(
        "--assume-approved",
        action="store_true",
        help="approve a batch that waits only in the replay, to show what comes after",
    )
    replay.add_argument(
        "--check",
        action="store_true",
        help="the agent is the unchanged one: also report a changed catalogue or settings (for CI)",
    )
    replay.add_argument(
        "--into",
        metavar="URL",
        default="memory://",
        help="write the replays to this (empty) store (default: memory://, kept nowhere)",
    )
    replay.add_argument("--json", action="store_true", help="the report as one JSON object")
    db_option(replay)


ARGUMENTS: dict[str, AddArguments] = {"replay": _add_replay}
