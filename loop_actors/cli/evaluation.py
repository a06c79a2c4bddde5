"""The ``eval`` command: run cases as invocations and score their trajectories.

``eval FILE``, ``eval --builtin``, ``eval schema`` and ``eval compare A B``
(see docs/reference/eval.md).
"""

from __future__ import annotations

import argparse
import json
from functools import partial
from pathlib import Path

import trio

from loop_actors._errors import UsageError
from loop_actors.agent.adapters import model_from_name
from loop_actors.agent.agent import Agent
from loop_actors.cli.agents import load_agent
from loop_actors.cli.common import runtime_for
from loop_actors.cli.exit_codes import ExitCode
from loop_actors.eval import evaluate as evaluation
from loop_actors.eval.builtin import SUITE_NAME, Fault, builtin_jobs, crash_store_problem
from loop_actors.eval.html import compare_html, eval_html
from loop_actors.eval.progress import case_progress, progress_wanted
from loop_actors.store.url import resolve_db_url


def run(args: argparse.Namespace) -> int:
    """``eval FILE``, ``eval schema`` and ``eval compare A B`` (see docs/reference/eval.md)."""
    if args.file == "schema":
        if args.more:
            raise UsageError("eval schema takes no other argument")
        print(json.dumps(evaluation.schema(), indent=2))
        return ExitCode.OK
    if args.file == "compare":
        if len(args.more) != 2:
            raise UsageError("eval compare needs two reports: eval compare A.json B.json")
        for target in (args.json_report, args.html_report):
            if target:
                evaluation.check_writable(Path(target))
        first, second = (evaluation.load_report(Path(p)) for p in args.more)
        comparison = evaluation.compare(first, second)
        if args.json_report:
            evaluation.write_json(Path(args.json_report), comparison)
        if args.html_report:
            names = (Path(args.more[0]).name, Path(args.more[1]).name)
            page = compare_html(comparison, first, second, names=names)
            evaluation.write_text(Path(args.html_report), page)
        evaluation.print_table(evaluation.compare_table(comparison))
        return ExitCode.OK if comparison.broke == 0 else ExitCode.NOT_COMPLETED
    if args.more:
        raise UsageError(f"eval takes one cases file, got {len(args.more) + 1}")
    if args.file is None and not args.builtin:
        raise UsageError("eval needs a cases file, or --builtin")
    if args.builtin_faults and not args.builtin:
        raise UsageError("--builtin-fault goes with --builtin")
    if args.eval_agent and args.file is None:
        raise UsageError("--agent replaces a cases file's agent: give the file")
    jobs: list[evaluation.Job] = []
    name, agent = SUITE_NAME, None
    if args.file is not None:
        path = Path(args.file)
        suite = evaluation.load_suite(path)  # before the database: a bad file writes nothing
        name = evaluation.suite_name(suite, path)
        checks = evaluation.import_checks(suite, str(path))
        reference = args.eval_agent or suite.agent
        agent = (
            load_agent(reference)
            if reference
            else Agent("eval", model_from_name(suite.model or ""))
        )
        evaluation.check_fakes(suite, agent, str(path))
        jobs = evaluation.suite_jobs(agent, suite, name, checks)
    if args.builtin:
        problem = crash_store_problem(resolve_db_url(args.db))
        if problem is not None:
            raise UsageError(problem)
        builtin = builtin_jobs(Fault(fault) for fault in args.builtin_faults)
        clash = sorted({job.case.id for job in jobs} & {job.case.id for job in builtin})
        if clash:
            raise UsageError(
                f"case id(s) {', '.join(clash)} of {args.file} are built-in case ids: rename them"
            )
        jobs += builtin
        agent = agent or builtin[0].agent
    assert agent is not None  # a file or --builtin, checked above
    for target in (args.json_report, args.html_report):
        if target:
            evaluation.check_writable(Path(target))
    runtime = runtime_for(args)
    with case_progress(len(jobs), title=f"eval {name}", enabled=progress_wanted()) as advance:
        results = trio.run(
            partial(
                evaluation.run_jobs,
                runtime,
                jobs,
                concurrency=args.concurrency,
                rerun_failed=args.rerun_failed,
                on_result=advance,
            ),
            restrict_keyboard_interrupt_to_checkpoints=True,
        )
    document = evaluation.report(name, agent, results)
    if args.json_report:
        evaluation.write_json(Path(args.json_report), document)
    if args.html_report:
        evaluation.write_text(Path(args.html_report), eval_html(document))
    evaluation.print_table(evaluation.eval_table(document))
    return ExitCode(evaluation.exit_code(results))
