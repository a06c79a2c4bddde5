"""The ``submit`` command: one goal (``--goal``) or many (``--goals FILE``), for workers to run.

It writes the store in this process's one thread, without a runtime and without trio
(:func:`loop_actors.runtime.submission.submit_to_store`): the same plan as
``Runtime.submit`` and ``Runtime.submit_many``, the same checks, the same chunks.
Everything is checked (the options, every line of the file, the agent, every id
given) before anything is written.

Output: the id of each goal, one a line, in the file's order; a goal whose id names
an invocation of the same goal and agent is not submitted again, and its id is
printed all the same. ``--json``: ``{"invocation_id": ...}`` for ``--goal``; with
``--goals`` an object a goal, ``{"line": N, "invocation_id": ..., "status":
"submitted" | "already_submitted"}``. With ``--goals``, a count of each on standard
error at the end, and, when standard error is a terminal, a progress bar there.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime

from loop_actors._errors import UsageError
from loop_actors.cli.agents import load_agent
from loop_actors.cli.exit_codes import ExitCode
from loop_actors.cli.goals_file import GoalsFile, read_goals
from loop_actors.runtime.arguments import check_invocation_id
from loop_actors.runtime.submission import (
    ChunkDone,
    Submission,
    Submitted,
    SubmittedStatus,
    submission_requests,
    submit_to_store,
)
from loop_actors.store.url import resolve_db_url


def _utc_now() -> datetime:
    return datetime.now(UTC)


def run(args: argparse.Namespace) -> int:
    """``submit``: check everything, then record the goals; print their ids."""
    goals = _goals(args)  # the file is read before the agent is imported
    agent = load_agent(args.agent)  # before the database: a bad agent writes nothing
    requests = submission_requests(
        agent, goals.goals, agent_ref=args.agent, where=goals.where, caller="submit"
    )
    done: list[Submitted] = []
    try:
        with _progress(len(requests), enabled=args.goals is not None) as advance:

            def on_chunk(chunk: ChunkDone) -> None:
                done.extend(chunk.submitted)
                if advance is not None:
                    advance(len(chunk.submitted))

            submit_to_store(
                resolve_db_url(args.db),
                requests,
                now=_utc_now,
                where=goals.where,
                on_chunk=on_chunk,
            )
    finally:
        _print(done, goals, args)  # what was submitted, also when a later chunk failed
    return ExitCode.OK


def _goals(args: argparse.Namespace) -> GoalsFile:
    """The goals the options name: ``--goal`` (with ``--id``), or the lines of ``--goals``.

    Raises:
        UsageError: an empty ``--goal``, a malformed ``--id``, ``--id`` with ``--goals``.
        SubmissionError: the file cannot be read, or a line is wrong.
    """
    if args.goals is None:
        if not args.goal.strip():
            raise UsageError("--goal must not be empty")
        if args.invocation_id is not None:
            check_invocation_id(args.invocation_id)
        goal = Submission(
            args.goal,
            invocation_id=args.invocation_id,
            task_class=args.task_class,
            actor=args.actor,
            tenant=args.tenant,
        )
        return GoalsFile("--id" if args.invocation_id is not None else "--goal", [goal], [0])
    if args.invocation_id is not None:
        raise UsageError(
            "--id names one invocation: with --goals, give a line its id "
            '(a JSON line: {"goal": ..., "id": ...})'
        )
    return read_goals(args.goals, task_class=args.task_class, actor=args.actor, tenant=args.tenant)


def _print(done: list[Submitted], goals: GoalsFile, args: argparse.Namespace) -> None:
    """Print each goal's id (or JSON object); with ``--goals``, the counts on stderr."""
    if args.goals is None:
        for goal in done:
            print(
                json.dumps({"invocation_id": goal.invocation_id})
                if args.json
                else goal.invocation_id
            )
        return
    for goal in done:
        if args.json:
            record = {
                "line": goals.lines[goal.position],
                "invocation_id": goal.invocation_id,
                "status": goal.status.value,
            }
            print(json.dumps(record))
        else:
            print(goal.invocation_id)
    if not done:
        return  # stopped before anything was submitted: the error says why
    already = sum(goal.status is SubmittedStatus.ALREADY_SUBMITTED for goal in done)
    total = len(goals.goals)
    noun = "goal" if total == 1 else "goals"
    counted = f"{total} {noun}" if len(done) == total else f"{len(done)} of {total} {noun} done"
    print(
        f"loop-actors: {goals.name}: {counted}: {len(done) - already} submitted, "
        f"{already} already submitted (their ids name invocations of the same goal)",
        file=sys.stderr,
    )


@contextmanager
def _progress(total: int, *, enabled: bool) -> Iterator[Callable[[int], None] | None]:
    """A bar over ``total`` goals on standard error, when it is a terminal (rich is imported then).

    Yields the callback that advances it, or None when there is no bar.
    """
    if not enabled or not sys.stderr.isatty():
        yield None
        return
    from rich.console import Console  # noqa: PLC0415 - only for a terminal: see the docstring
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn  # noqa: PLC0415

    progress = Progress(
        TextColumn("submitting"),
        BarColumn(),
        MofNCompleteColumn(),
        console=Console(stderr=True),
        transient=True,
    )
    task = progress.add_task("submit", total=total)
    with progress:
        yield lambda count: progress.update(task, advance=count)
