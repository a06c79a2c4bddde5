"""``loop-actors eval``: run a suite of cases as invocations and score their committed events.

A cases file (JSON or YAML) names an agent (``MODULE:ATTR``) or a model spec and its
cases (:class:`Suite`). Each case and epoch is an ordinary invocation with a
deterministic id (:func:`case_invocation_id`), so ``show``, ``history`` and the
audit work on it, and running the same suite again reuses every run that has
stopped (``Runtime.run`` of a stopped id returns its recorded outcome) and
resumes one that was interrupted; ``--rerun-failed`` runs a failed case again as a new
attempt (:func:`attempt_id`). A case is a :class:`Job` with a driver: the built-in cases
(``_eval_builtin``) bring drivers of their own. Scoring is pure (``projections.evaluation``).
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import re
import sys
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio
import yaml
from pydantic import Field, JsonValue, ValidationError, field_validator, model_validator
from rich import box
from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

from aggregates.decisions import Frozen
from loop_actors._errors import (
    InvocationExistsError,
    InvocationNotFoundError,
    LoopActorsError,
    UsageError,
)
from loop_actors._render import ID, TEXT, WHOLE, Fit
from loop_actors._render import print_table as print_fitted
from loop_actors._terminal import terminal_safe
from loop_actors.agent.agent import Agent
from loop_actors.agent.model import ScriptedModel
from loop_actors.eval.fakes import ToolFake, unknown_fakes, with_fakes
from loop_actors.eval.problems import EvalInputError, parse_json, problems_of, read_text
from loop_actors.eval.report import (
    REPORT_FORMAT,
    Comparison,
    EvalReport,
    compare,
    document_json,
    load_report,
    mcnemar_exact,
)
from loop_actors.runtime.outcome import Outcome
from loop_actors.runtime.runtime import Runtime
from projections.evaluation import (
    AnswerCheck,
    CaseResult,
    CaseStatus,
    Expectations,
    score_events,
)

CASE_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$"


class Case(Frozen):
    """One case: a goal, its task class, optional scripted model turns, and expectations."""

    id: str = Field(pattern=CASE_ID_PATTERN)
    goal: str = Field(min_length=1)
    task_class: str = Field(min_length=1)
    model: list[dict[str, JsonValue]] | None = None
    """Scripted model turns (the ``ScriptedModel`` JSON shape, e.g.
    ``{"kind": "final", "answer": "hi"}``): they replace the agent's model."""
    fakes: dict[str, ToolFake] = {}
    """Tools of the agent answered by the file (``{"output": ...}`` or ``{"error": ...}``),
    not run; the agent's other tools are its real ones."""
    epochs: int = Field(default=1, ge=1, le=1000)
    expect: Expectations = Expectations()
    proves: str | None = None
    """What passing this case proves (shown in the report)."""

    @field_validator("goal")
    @classmethod
    def _not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("the goal must not be blank")
        return value

    @field_validator("model")
    @classmethod
    def _turns(cls, value: list[dict[str, JsonValue]] | None) -> list[dict[str, JsonValue]] | None:
        if value is not None:
            if not value:
                raise ValueError("give at least one scripted turn")
            for index, turn in enumerate(value):
                if not isinstance(turn.get("kind"), str):
                    # pydantic turns a ValueError (not a TypeError) into a located problem
                    raise ValueError(  # noqa: TRY004
                        f"turn {index} has no 'kind' (e.g. final, tool_calls)"
                    )
        return value


class Suite(Frozen):
    """A cases file: the agent (``MODULE:ATTR``) or a model spec, and the cases."""

    name: str | None = Field(default=None, pattern=CASE_ID_PATTERN)
    """Part of every run's id; default: the file's name without its extension."""
    agent: str | None = None
    """``MODULE:ATTR`` of a ``loop_actors.Agent``."""
    model: str | None = None
    """A model spec (``openai:gpt-4.1``): runs a tool-less agent named ``eval`` on it."""
    cases: list[Case] = Field(min_length=1)

    @model_validator(mode="after")
    def _one_agent(self) -> Suite:
        if (self.agent is None) == (self.model is None):
            raise ValueError("give exactly one of agent (MODULE:ATTR) and model")
        seen: set[str] = set()
        for index, case in enumerate(self.cases):
            if case.id in seen:
                raise ValueError(f"cases[{index}].id: {case.id!r} is used twice")
            seen.add(case.id)
        return self


def schema() -> dict[str, Any]:
    """The cases file's JSON Schema (``loop-actors eval schema``)."""
    return Suite.model_json_schema()


def _parse_yaml(source: str, text: str) -> object:
    try:
        return yaml.safe_load(text)
    except yaml.MarkedYAMLError as error:
        mark = error.problem_mark or error.context_mark
        where = f"line {mark.line + 1} column {mark.column + 1}: " if mark else ""
        raise EvalInputError(
            source, [f"{where}not YAML: {error.problem or error.context}"]
        ) from None
    except yaml.YAMLError as error:
        raise EvalInputError(source, [f"not YAML: {error}"]) from None


def load_suite(path: Path) -> Suite:
    """Read and check a cases file: JSON, or YAML for a ``.yaml`` or ``.yml`` file.

    Raises:
        EvalInputError: the file cannot be read, is not JSON (YAML), or breaks the schema
            (one problem per line, each with its location: ``cases[1].expect.reason: ...``).
    """
    source = str(path)
    text = read_text(path)
    if path.suffix.lower() in (".yaml", ".yml"):
        data = _parse_yaml(source, text)
    else:
        data = parse_json(source, text)
    try:
        return Suite.model_validate(data)
    except ValidationError as error:
        raise EvalInputError(source, problems_of(error)) from None


def _import_check(reference: str) -> AnswerCheck:
    """Import an answer check's ``MODULE:ATTR`` (the current directory on the import path).

    Raises:
        ValueError: the module cannot be imported, lacks the attribute, or it is not callable.
    """
    module_name, _, attribute = reference.partition(":")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        value: Any = importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        raise ValueError(f"cannot import module {module_name!r}: {error}") from None
    except Exception as error:  # the user's module failed to import: one located line
        raise ValueError(
            f"importing {module_name!r} failed: {type(error).__name__}: {error}"
        ) from None
    for part in attribute.split("."):
        try:
            value = getattr(value, part)
        except AttributeError:
            raise ValueError(f"module {module_name!r} has no attribute {attribute!r}") from None
    if not callable(value):
        # a ValueError, like the others: the caller turns it into a located problem
        raise ValueError(  # noqa: TRY004
            f"{reference} is a {type(value).__name__}, not a callable"
        )
    check: AnswerCheck = value
    return check


def import_checks(suite: Suite, source: str) -> dict[str, AnswerCheck]:
    """Import every case's ``expect.answer.check`` (before anything runs).

    Raises:
        EvalInputError: one located problem per check that cannot be imported.
    """
    checks: dict[str, AnswerCheck] = {}
    problems: list[str] = []
    for index, case in enumerate(suite.cases):
        for reference in case.expect.checks():
            if reference in checks:
                continue
            try:
                checks[reference] = _import_check(reference)
            except ValueError as error:
                problems.append(f"cases[{index}].expect.answer.check: {error}")
    if problems:
        raise EvalInputError(source, problems)
    return checks


def suite_name(suite: Suite, path: Path) -> str:
    """The suite's name: its ``name``, else the file's stem.

    Raises:
        EvalInputError: no ``name`` and the file's stem cannot be part of an id.
    """
    name = suite.name or path.stem
    if re.fullmatch(CASE_ID_PATTERN, name) is None:
        raise EvalInputError(
            str(path), [f"name: the file's name {name!r} cannot name the suite: give a name"]
        )
    return name


def case_invocation_id(suite: str, case: Case, epoch: int, agent: Agent) -> str:
    """The run's invocation id: the same suite, case, epoch and agent give the same id.

    The digest covers the agent's name and version and what the run is given (the
    goal, the task class, the scripted turns and the tool fakes), not the expectations:
    editing an expectation re-scores the recorded run; editing the goal makes a new run.
    """
    given: list[Any] = [
        suite, case.id, epoch, agent.name, agent.version, case.goal, case.task_class, case.model
    ]  # fmt: skip
    if case.fakes:  # only then: the ids of cases without fakes stay as they were
        given.append({name: fake.model_dump(mode="json") for name, fake in case.fakes.items()})
    inputs = json.dumps(given, sort_keys=True, separators=(",", ":"))
    digest = hashlib.sha256(inputs.encode()).hexdigest()[:16]
    return f"eval-{suite}-{case.id}-e{epoch}-{digest}"


def attempt_id(invocation_id: str, attempt: int) -> str:
    """The invocation id of an attempt: the first is the case's id, a later one ends ``-aN``."""
    return invocation_id if attempt == 1 else f"{invocation_id}-a{attempt}"


def _agent_for(agent: Agent, case: Case) -> Agent:
    agent = with_fakes(agent, case.fakes)
    if case.model is None:
        return agent
    return agent.with_model(ScriptedModel(list(case.model)))


def check_fakes(suite: Suite, agent: Agent, source: str) -> None:
    """Refuse fakes of tools the agent does not have (before anything runs).

    Raises:
        EvalInputError: one located problem per unknown tool.
    """
    problems = [
        f"cases[{index}].fakes.{name}: the agent {agent.name} has no tool {name!r}"
        for index, case in enumerate(suite.cases)
        for name in unknown_fakes(agent, case.fakes)
    ]
    if problems:
        raise EvalInputError(source, problems)


Driver = Callable[[Runtime, Agent, Case, str], Awaitable[None]]
"""``drive(runtime, agent, case, invocation_id)``: bring the case's run to a stop (an end
or a pause). It starts the invocation, or continues it when it exists and has not stopped;
the run is scored from its events afterwards."""


async def drive_run(runtime: Runtime, agent: Agent, case: Case, invocation_id: str) -> None:
    """The ordinary driver: run the case's goal; resume the run if it was interrupted.

    Cancellation: as :meth:`Runtime.run`.
    """
    runner = _agent_for(agent, case)
    try:
        await runtime.run(
            runner, case.goal, invocation_id=invocation_id, task_class=case.task_class
        )
    except InvocationExistsError:
        # Interrupted earlier (killed midway): continue it from its events.
        await runtime.resume(invocation_id, runner)


@dataclass(frozen=True)
class Job:
    """One case and epoch to run: the suite's name (part of the id), the agent, the driver."""

    suite: str
    case: Case
    epoch: int
    agent: Agent
    drive: Driver = drive_run
    checks: Mapping[str, AnswerCheck] = field(default_factory=dict)
    """The answer checks of the suite (:func:`import_checks`), by ``MODULE:ATTR``."""


def suite_jobs(
    agent: Agent, suite: Suite, name: str, checks: Mapping[str, AnswerCheck] | None = None
) -> list[Job]:
    """Every case and epoch of a suite, in file order, run by ``agent``."""
    return [
        Job(suite=name, case=case, epoch=epoch, agent=agent, checks=checks or {})
        for case in suite.cases
        for epoch in range(1, case.epochs + 1)
    ]


async def _latest_attempt(runtime: Runtime, first_id: str) -> tuple[int, bool]:
    """The latest attempt of a case that exists (0: none), and whether it has stopped."""
    attempt, stopped = 0, False
    while True:
        try:
            invocation = await runtime.load(attempt_id(first_id, attempt + 1))
        except InvocationNotFoundError:
            return attempt, stopped
        attempt += 1
        try:
            Outcome.of(invocation)
        except ValueError:
            stopped = False
        else:
            stopped = True


def _scored(job: Job, invocation_id: str, events: Sequence[Any]) -> CaseResult:
    score = score_events(events, job.case.expect, job.checks)
    measures = score.measures
    return CaseResult(
        case_id=job.case.id,
        epoch=job.epoch,
        invocation_id=invocation_id,
        task_class=job.case.task_class,
        proves=job.case.proves,
        status=CaseStatus.PASSED if score.passed else CaseStatus.FAILED,
        failures=score.failures,
        reason=measures.reason,
        answer=measures.answer,
        steps=measures.steps,
        tool_calls=measures.tool_calls,
        tokens=measures.tokens,
        cost=measures.cost,
        latency_ms=measures.latency_ms,
        effects_dispatched_twice=measures.effects_dispatched_twice,
        effects_left_open=measures.effects_left_open,
        approvals=score.approvals,
        trajectory=score.trajectory,
    )


async def _run_case(
    runtime: Runtime, job: Job, *, limiter: trio.CapacityLimiter, rerun_failed: bool
) -> CaseResult:
    first_id = case_invocation_id(job.suite, job.case, job.epoch, job.agent)
    invocation_id = first_id
    attempt = 1
    async with limiter:
        try:
            latest, stopped = await _latest_attempt(runtime, first_id)
            attempt = max(latest, 1)
            invocation_id = attempt_id(first_id, attempt)
            if rerun_failed and stopped:
                earlier = _scored(job, invocation_id, await runtime.history(invocation_id))
                if earlier.status is not CaseStatus.PASSED:
                    attempt += 1  # a new invocation: a stopped one cannot run again
                    invocation_id = attempt_id(first_id, attempt)
            await job.drive(runtime, job.agent, job.case, invocation_id)
            result = _scored(job, invocation_id, await runtime.history(invocation_id))
        except (LoopActorsError, ValueError) as error:
            return CaseResult(
                case_id=job.case.id,
                epoch=job.epoch,
                invocation_id=invocation_id,
                task_class=job.case.task_class,
                proves=job.case.proves,
                attempts=attempt,
                status=CaseStatus.ERROR,
                error=f"{type(error).__name__}: {error}",
            )
    return result.model_copy(update={"attempts": attempt})


async def run_jobs(
    runtime: Runtime,
    jobs: Sequence[Job],
    *,
    concurrency: int,
    rerun_failed: bool = False,
    on_result: Callable[[CaseResult], None] | None = None,
) -> list[CaseResult]:
    """Run every job (at most ``concurrency`` at once) in one open ``runtime``; results in order.

    The runs share the runtime's Journal, so their commits share transactions (group
    commit). Each job's latest attempt is reused when it has stopped and continued when
    it has not; with ``rerun_failed`` one whose latest attempt stopped and did not pass
    runs again as a new attempt (``attempts`` in its result).

    ``checks`` are the suite's answer checks (:func:`import_checks`); ``on_result`` is
    called with each result as it is scored (the progress bar).

    Cancellation: a checkpoint; the runs in flight are recorded ``cancelled`` by the
    runtime (they have stopped: running the suite again reports them as they ended).
    """
    limiter = trio.CapacityLimiter(concurrency)
    results: list[CaseResult | None] = [None] * len(jobs)

    async def one(index: int, job: Job) -> None:
        result = await _run_case(runtime, job, limiter=limiter, rerun_failed=rerun_failed)
        results[index] = result
        if on_result is not None:
            on_result(result)

    async with runtime, trio.open_nursery() as nursery:
        for index, job in enumerate(jobs):
            nursery.start_soon(one, index, job)
    return [result for result in results if result is not None]


async def run_suite(
    runtime: Runtime,
    agent: Agent,
    suite: Suite,
    name: str,
    *,
    concurrency: int,
    rerun_failed: bool = False,
    checks: Mapping[str, AnswerCheck] | None = None,
    on_result: Callable[[CaseResult], None] | None = None,
) -> list[CaseResult]:
    """Run every case and epoch of ``suite`` with ``agent`` (see :func:`run_jobs`).

    Cancellation: as :func:`run_jobs`.
    """
    return await run_jobs(
        runtime,
        suite_jobs(agent, suite, name, checks),
        concurrency=concurrency,
        rerun_failed=rerun_failed,
        on_result=on_result,
    )


def report(name: str, agent: Agent, results: Sequence[CaseResult]) -> EvalReport:
    """The versioned JSON report (``format: loop-actors-eval/1``)."""
    return EvalReport.of(name, agent.name, agent.version, results)


def check_writable(path: Path) -> None:
    """Refuse a report path whose folder does not exist (before anything runs).

    Raises:
        UsageError: the folder is missing, or the path is a folder.
    """
    if path.is_dir():
        raise UsageError(f"cannot write the report to {path}: it is a folder")
    if not path.parent.is_dir():
        raise UsageError(f"cannot write the report to {path}: there is no folder {path.parent}")


def write_json(path: Path, document: EvalReport | Comparison) -> None:
    """Write a report or a comparison as indented JSON.

    Raises:
        UsageError: the file cannot be written (the runs stay recorded: run again).
    """
    write_text(path, document_json(document))


def write_text(path: Path, text: str) -> None:
    """Write a report (JSON or HTML) as UTF-8.

    Raises:
        UsageError: the file cannot be written (the runs stay recorded: run again).
    """
    try:
        path.write_text(text, encoding="utf-8")
    except OSError as error:
        raise UsageError(f"cannot write the report to {path}: {error}") from None


def exit_code(results: Sequence[CaseResult]) -> int:
    """0 when every case and epoch passed, else 4."""
    return 0 if all(r.status is CaseStatus.PASSED for r in results) else 4


# --------------------------------------------------------------------------- terminal tables

_SHORT = {"passed": "pass", "failed": "fail", "error": "error"}


def _change(old: str, new: str) -> str:
    return old if old == new else f"{old}→{new}"


_STATUS_STYLE = {"passed": "green", "failed": "red", "error": "bold red"}


@dataclass(frozen=True)
class Report:
    """A table, what follows it, and how its columns give way on a narrow terminal."""

    table: Table
    fits: tuple[Fit, ...]
    after: tuple[RenderableType, ...] = ()


def print_table(report: Report) -> None:
    """Print a report's table fitted to the terminal (natural widths on a pipe), then the rest.

    Its numbers and case ids are never cut; no line has trailing blanks.
    """
    print_fitted(Console(), Group(report.table, *report.after), report.table, report.fits)


def _table(
    names: list[str], words: list[str], numbers: list[str], *, title: str
) -> tuple[Table, tuple[Fit, ...]]:
    """A table of case ids, words and numbers, and how its columns give way."""
    table = Table(title=title, box=box.SIMPLE_HEAD)
    for name in [*names, *words]:
        table.add_column(name, no_wrap=True)
    for name in numbers:
        # A latency varies from run to run; a width of its own keeps the table's shape.
        table.add_column(name, justify="right", min_width=9 if name.endswith("ms") else None)
    return table, (*(ID for _ in names), *(TEXT for _ in words), *(WHOLE for _ in numbers))


def eval_table(document: EvalReport) -> Report:
    """The report on the terminal: one row per case and epoch, the totals, then each failure."""
    table, fits = _table(
        ["case"],
        ["class", "result", "reason"],
        ["steps", "calls", "tokens", "cost", "ms"],
        title=f"eval {terminal_safe(document.suite)}",
    )
    failures: list[Text] = []
    for case in document.cases:
        name = terminal_safe(f"{case.case_id}#{case.epoch}")
        status = case.status.value
        table.add_row(
            name if case.attempts == 1 else f"{name} (attempt {case.attempts})",
            terminal_safe(case.task_class),
            Text(status, style=_STATUS_STYLE[status]),
            case.reason.value if case.reason else "-",
            str(case.steps),
            str(case.tool_calls),
            str(case.tokens),
            f"{case.cost:.4f}",
            f"{case.latency_ms:.1f}",
        )
        whys = [f"{f.expectation}: {f.why}" for f in case.failures]
        whys += [case.error] if case.error else []
        failures += [Text(terminal_safe(f"{status} {name} {why}")) for why in whys]
        if whys and case.proves:
            failures.append(Text(terminal_safe(f"  {name} proves: {case.proves}")))
    totals = document.totals
    table.caption = (
        f"{totals.passed}/{totals.cases} passed, {totals.failed} failed, "
        f"{totals.errored} errored, {totals.false_success} false success "
        f"(pass rate {totals.pass_rate:.0%})"
    )
    unsafe = [
        f"{count} {words}"
        for count, words in (
            (totals.effects_dispatched_twice, "effect key(s) dispatched twice"),
            (totals.effects_left_open, "write(s) left open"),
        )
        if count
    ]
    if unsafe:
        failures.insert(0, Text(f"effect safety: {', '.join(unsafe)}", style="bold red"))
    return Report(table, fits, tuple(failures))


def compare_table(comparison: Comparison) -> Report:
    """A comparison on the terminal: flips first, then per-case deltas (B minus A)."""
    table, fits = _table(
        ["case"],
        ["flip", "A→B", "reason"],
        ["Δsteps", "Δcalls", "Δtokens", "Δcost", "Δms"],
        title="eval compare",
    )
    for row in comparison.cases:
        flip = row.flip.value if row.flip else ""
        old, new = (reason.value if reason else "-" for reason in row.reason)
        table.add_row(
            terminal_safe(f"{row.case_id}#{row.epoch}"),
            Text(flip, style="red" if flip == "broke" else "green"),
            "→".join(_SHORT[status.value] for status in row.status),
            _change(old, new),
            f"{row.steps:+d}",
            f"{row.tool_calls:+d}",
            f"{row.tokens:+d}",
            f"{row.cost:+.4f}",
            f"{row.latency_ms:+.1f}",
        )
    rate = comparison.pass_rate
    table.caption = (
        f"{comparison.paired} paired; pass rate {rate.a:.0%} → {rate.b:.0%}; "
        f"{comparison.broke} broke, {comparison.fixed} fixed; "
        f"McNemar exact p = {comparison.mcnemar_p:.4g}"
    )
    intervals = [
        Text(
            f"mean Δ{measure} {interval.mean_delta:+.4g}, 95% bootstrap interval "
            f"{interval.low:+.4g} to {interval.high:+.4g} ({interval.pairs} pairs)"
        )
        for measure, interval in comparison.bootstrap.items()
        if interval is not None and measure in ("cost", "latency_ms")
    ]
    return Report(table, fits, tuple(intervals))


__all__ = [
    "CASE_ID_PATTERN",
    "REPORT_FORMAT",
    "Case",
    "Driver",
    "EvalInputError",
    "Job",
    "Suite",
    "attempt_id",
    "case_invocation_id",
    "check_fakes",
    "check_writable",
    "compare",
    "compare_table",
    "drive_run",
    "eval_table",
    "exit_code",
    "import_checks",
    "load_report",
    "load_suite",
    "mcnemar_exact",
    "print_table",
    "report",
    "run_jobs",
    "run_suite",
    "schema",
    "suite_jobs",
    "suite_name",
    "write_json",
    "write_text",
]
