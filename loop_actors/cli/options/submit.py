"""The options of ``submit``: one ``--goal``, or ``--goals FILE`` (standard library only)."""

from __future__ import annotations

import argparse

from loop_actors.cli.parser import AddArguments, db_option


def _add_submit(submit: argparse.ArgumentParser) -> None:
    submit.add_argument("agent", metavar="MODULE:ATTR", help="the agent a worker will run it with")
    what = submit.add_mutually_exclusive_group(required=True)
    what.add_argument("--goal", help="what the agent should achieve")
    what.add_argument(
        "--goals",
        metavar="FILE",
        help="many goals: one a line, or JSON lines with goal, id, task_class, actor, tenant "
        "('-': standard input); each chunk of goals is one transaction, a goal with an id is "
        "never submitted twice",
    )
    submit.add_argument(
        "--id", dest="invocation_id", metavar="ID", help="choose the invocation id (--goal only)"
    )
    submit.add_argument(
        "--task-class", help="recorded with the invocation, for metrics (--goals: a default)"
    )
    submit.add_argument(
        "--actor", help="who the invocation acts for, for the agent's policy (--goals: a default)"
    )
    submit.add_argument(
        "--tenant", help="whose data it acts on, for the agent's policy (--goals: a default)"
    )
    submit.add_argument(
        "--json",
        action="store_true",
        help='print {"invocation_id": ...}; with --goals, one object a goal, with its line '
        "and status",
    )
    db_option(submit, shared=True)


ARGUMENTS: dict[str, AddArguments] = {"submit": _add_submit}
