"""The JSON documents of ``loop-actors eval``: the report and the comparison, as typed models.

``eval FILE --json`` writes an :class:`EvalReport` (``format: loop-actors-eval/1``);
``eval compare A B`` reads two of them back through the same model and writes a
:class:`Comparison` (``loop-actors-eval-compare/1``). The fields are the format
(docs/reference/eval.md), in the order they are written: building the report through
the model is what writes it, and reading a report validates it, so a hand-edited file
that lacks a key, holds a value of the wrong type or a key the format does not have is
refused with each problem located (:class:`ReportFileError`, exit 2), never a
``KeyError``.

Keys added to ``loop-actors-eval/1`` after its first release (``proves``,
``attempts``, the effect counts, ``approvals``, ``trajectory``) have their defaults,
so a report written before them still reads. A case's ``trajectory`` is shown by
``compare --html`` and never compared: it is read as any JSON object, and the page
reads it defensively (a hand-edited trajectory still renders).
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Sequence
from enum import StrEnum
from pathlib import Path
from typing import Any, Final, Literal

from pydantic import JsonValue, ValidationError, field_validator, model_validator

from aggregates.decisions import Frozen, TerminalReason
from loop_actors.eval.problems import EvalInputError, parse_json, problems_of, read_text
from loop_actors.eval.stats import BootstrapInterval, paired_bootstrap
from projections.evaluation import (
    ApprovalView,
    CaseResult,
    CaseStatus,
    Group,
    Verdict,
    summarise,
)

REPORT_FORMAT: Final = "loop-actors-eval/1"
"""The ``format`` of the JSON report; a change that breaks readers bumps the number."""

COMPARE_FORMAT: Final = "loop-actors-eval-compare/1"
"""The ``format`` of ``eval compare --json``."""


class ReportFileError(EvalInputError):
    """Raised when a file is not a ``loop-actors-eval/1`` report: one line per problem, located."""


# --------------------------------------------------------------------------- the report


class ReportAgent(Frozen):
    """The agent that ran the suite."""

    name: str
    version: str


_CASE_EXCLUDES: Any = {"trajectory": {"steps": {"__all__": {"decision"}}}}
"""A step's decision repeats its summary and calls: the report keeps those."""


class ReportCase(Frozen):
    """One case and epoch of a report: a :class:`CaseResult` as the report writes it."""

    case_id: str
    epoch: int
    invocation_id: str
    """The run (for ``show``, ``history``): the latest attempt's."""
    task_class: str
    status: CaseStatus
    proves: str | None = None
    """What passing the case proves (from the case)."""
    attempts: int = 1
    """Which attempt this is: 1, or more after ``--rerun-failed`` ran the case again."""
    failures: list[Verdict]
    error: str | None
    reason: TerminalReason | None
    answer: str | None
    steps: int
    tool_calls: int
    tokens: int
    cost: float
    latency_ms: float
    effects_dispatched_twice: int = 0
    effects_left_open: int = 0
    approvals: list[ApprovalView] = []
    """The calls that paused the run for approval."""
    trajectory: dict[str, JsonValue] | None = None
    """The run's trajectory without its steps' decisions (None: the run could not be read)."""

    @classmethod
    def of(cls, result: CaseResult) -> ReportCase:
        """The report's entry of a scored case."""
        return cls.model_validate(result.model_dump(mode="json", exclude=_CASE_EXCLUDES))


class EvalReport(Frozen):
    """The report of ``loop-actors eval --json`` (``format: loop-actors-eval/1``)."""

    format: Literal["loop-actors-eval/1"]
    suite: str
    agent: ReportAgent
    cases: list[ReportCase]
    """One entry per case and epoch, in file order."""
    totals: Group
    by_task_class: dict[str, Group]
    by_reason: dict[str, Group]
    """Keyed by terminal reason; errored entries with no reason under ``error``."""

    @model_validator(mode="before")
    @classmethod
    def _this_format(cls, data: object) -> object:
        """A file of another format is not read further: that is its one problem."""
        if isinstance(data, dict) and "format" in data and data["format"] != REPORT_FORMAT:
            raise ValueError(f"format: expected {REPORT_FORMAT!r}, got {data['format']!r}")
        return data

    @field_validator("cases")
    @classmethod
    def _each_entry_once(cls, cases: list[ReportCase]) -> list[ReportCase]:
        counts = Counter((case.case_id, case.epoch) for case in cases)
        twice = sorted(f"{key[0]} epoch {key[1]}" for key, count in counts.items() if count > 1)
        if twice:
            raise ValueError(f"listed twice: {', '.join(twice)}")
        return cases

    @classmethod
    def of(
        cls, suite: str, agent_name: str, agent_version: str, results: Sequence[CaseResult]
    ) -> EvalReport:
        """The report of a suite's scored cases: each entry, the totals and the groups."""
        summary = summarise(results)
        return cls(
            format=REPORT_FORMAT,
            suite=suite,
            agent=ReportAgent(name=agent_name, version=agent_version),
            cases=[ReportCase.of(result) for result in results],
            totals=summary.totals,
            by_task_class=summary.by_task_class,
            by_reason=summary.by_reason,
        )


def load_report(path: Path) -> EvalReport:
    """Read and check a JSON report written by ``loop-actors eval --json``.

    Raises:
        ReportFileError: unreadable, not JSON, not a ``loop-actors-eval/1`` report (a key
            missing, a value of the wrong type, a key the format does not have: each
            located, ``cases[0].status: ...``), or a (case, epoch) listed twice.
    """
    source = str(path)
    try:
        data = parse_json(source, read_text(path))
        return EvalReport.model_validate(data)
    except EvalInputError as error:
        raise ReportFileError(source, error.problems) from None
    except ValidationError as error:
        raise ReportFileError(source, problems_of(error)) from None


def document_json(document: EvalReport | Comparison) -> str:
    """A report or a comparison as the indented JSON text ``--json`` writes."""
    return json.dumps(document.model_dump(mode="json"), indent=2) + "\n"


# --------------------------------------------------------------------------- compare


class Flip(StrEnum):
    """How a paired entry's result changed from A to B."""

    BROKE = "broke"
    """Passed in A, not in B."""
    FIXED = "fixed"
    """Not passed in A, passed in B."""


class PassRates(Frozen):
    """The pass rates of both reports over the paired entries."""

    a: float
    b: float


class ComparedCase(Frozen):
    """One paired entry: its flip, both statuses and reasons, and B minus A of each measure."""

    case_id: str
    epoch: int
    flip: Flip | None
    status: tuple[CaseStatus, CaseStatus]
    reason: tuple[TerminalReason | None, TerminalReason | None]
    steps: int
    tool_calls: int
    tokens: int
    cost: float
    latency_ms: float


class Comparison(Frozen):
    """``eval compare A B`` (``format: loop-actors-eval-compare/1``)."""

    format: Literal["loop-actors-eval-compare/1"]
    paired: int
    only_in_a: list[str]
    """``CASE#EPOCH`` of the entries of A only."""
    only_in_b: list[str]
    pass_rate: PassRates
    broke: int
    fixed: int
    mcnemar_p: float
    bootstrap: dict[str, BootstrapInterval | None]
    """For cost, latency_ms, tokens and steps: the mean paired change and its interval."""
    cases: list[ComparedCase]
    """Flips first, then the others; each by case id and epoch."""


def mcnemar_exact(b: int, c: int) -> float:
    """Two-sided exact McNemar p-value: b and c are the discordant pairs (pass→fail, fail→pass).

    Under the null each discordant pair flips either way with probability 1/2, so
    the p-value is twice the binomial tail of the smaller count, capped at 1.
    """
    n = b + c
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(min(b, c) + 1)) / float(2**n)
    return min(1.0, 2 * tail)


_BOOTSTRAPPED = ("cost", "latency_ms", "tokens", "steps")
"""Measures given a paired bootstrap interval of their mean change."""


def _paired(old: ReportCase, new: ReportCase) -> ComparedCase:
    was, now = old.status is CaseStatus.PASSED, new.status is CaseStatus.PASSED
    return ComparedCase(
        case_id=old.case_id,
        epoch=old.epoch,
        flip=None if was == now else (Flip.FIXED if now else Flip.BROKE),
        status=(old.status, new.status),
        reason=(old.reason, new.reason),
        steps=new.steps - old.steps,
        tool_calls=new.tool_calls - old.tool_calls,
        tokens=new.tokens - old.tokens,
        cost=round(new.cost - old.cost, 6),
        latency_ms=round(new.latency_ms - old.latency_ms, 6),
    )


def compare(a: EvalReport, b: EvalReport) -> Comparison:
    """Pair two reports on (case id, epoch): flips first, then the other paired cases' deltas."""
    before = {(c.case_id, c.epoch): c for c in a.cases}
    after = {(c.case_id, c.epoch): c for c in b.cases}
    paired = [key for key in before if key in after]
    rows = sorted(
        (_paired(before[key], after[key]) for key in paired),
        key=lambda row: (row.flip is None, row.case_id, row.epoch),
    )
    broke = sum(row.flip is Flip.BROKE for row in rows)
    fixed = sum(row.flip is Flip.FIXED for row in rows)
    rate_a = (
        sum(before[k].status is CaseStatus.PASSED for k in paired) / len(paired) if paired else 0.0
    )
    rate_b = (
        sum(after[k].status is CaseStatus.PASSED for k in paired) / len(paired) if paired else 0.0
    )
    scored = [
        key for key in paired if CaseStatus.ERROR not in (before[key].status, after[key].status)
    ]
    bootstrap = {
        measure: paired_bootstrap(
            [getattr(after[k], measure) - getattr(before[k], measure) for k in scored]
        )
        for measure in _BOOTSTRAPPED
    }
    return Comparison(
        format=COMPARE_FORMAT,
        paired=len(paired),
        only_in_a=sorted(f"{k[0]}#{k[1]}" for k in before if k not in after),
        only_in_b=sorted(f"{k[0]}#{k[1]}" for k in after if k not in before),
        pass_rate=PassRates(a=round(rate_a, 4), b=round(rate_b, 4)),
        broke=broke,
        fixed=fixed,
        mcnemar_p=round(mcnemar_exact(broke, fixed), 6),
        bootstrap=bootstrap,
        cases=rows,
    )
