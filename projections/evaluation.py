"""Scoring a trajectory against a case's expectations: a pure read of committed events.

:func:`score_events` takes an invocation's committed events (what
``Runtime.history`` returns) and a case's :class:`Expectations`, and returns one
:class:`Verdict` per expectation, plus the run's measures (steps, tool calls,
tokens, cost, latency). It reads the events, not spans or messages: the order of
steps is the order of their commits, and a batch is the set of calls one
``BatchDispatched`` holds, so parallel calls that finish out of order score the
same every time. :func:`summarise` turns scored cases into the totals and the
groups of the report (``loop-actors eval``).
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from enum import StrEnum
from typing import Annotated, Any

from pydantic import BeforeValidator, Field, WithJsonSchema, field_validator, model_validator

from aggregates.decisions import EffectStatus, Frozen, TerminalReason
from aggregates.events import DomainEvent
from aggregates.invocation import BatchDispatched
from projections.trajectory import Trajectory, build_trajectory

# --------------------------------------------------------------------------- expectations


class AnswerExpectation(Frozen):
    """Checks of the final answer; every one given must hold."""

    equals: str | None = None
    contains: str | None = None
    regex: str | None = None
    """A Python regular expression searched for in the answer (``re.search``)."""

    @field_validator("regex")
    @classmethod
    def _compiles(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                re.compile(value)
            except re.error as error:
                raise ValueError(f"not a valid regular expression: {error}") from None
        return value

    @model_validator(mode="after")
    def _some_check(self) -> AnswerExpectation:
        if self.equals is None and self.contains is None and self.regex is None:
            raise ValueError("give at least one of equals, contains, regex")
        return self


_STEP_SCHEMA: dict[str, Any] = {
    "anyOf": [
        {"type": "string"},
        {"type": "array", "items": {"type": "string"}, "minItems": 1},
    ]
}

SequenceStep = Annotated[
    list[str],
    BeforeValidator(lambda value: [value] if isinstance(value, str) else value),
    Field(min_length=1),
    WithJsonSchema(_STEP_SCHEMA),
]
"""One step of an expected sequence: a tool name, or a batch (compared as a set); a name
is kept as a batch of one, so a bad step gets one error."""


class SequenceMode(StrEnum):
    """How an expected sequence of tool steps is matched against the run's."""

    EXACT = "exact"
    IN_ORDER = "in_order"
    ANY_ORDER = "any_order"


class SequenceExpectation(Frozen):
    """The run's tool steps, each one batch's set of tool names, against expected steps."""

    steps: list[SequenceStep] = Field(min_length=1)
    mode: SequenceMode = SequenceMode.EXACT


class ToolsExpectation(Frozen):
    """Which tools the run called."""

    required: list[str] = []
    """Each called at least once."""
    forbidden: list[str] = []
    """None called (a denied call counts: it was proposed and dispatched)."""
    sequence: SequenceExpectation | None = None

    @model_validator(mode="after")
    def _consistent(self) -> ToolsExpectation:
        both = sorted(set(self.required) & set(self.forbidden))
        if both:
            raise ValueError(f"both required and forbidden: {', '.join(both)}")
        return self


class LimitsExpectation(Frozen):
    """Upper bounds on what the run used (inclusive)."""

    max_steps: int | None = Field(default=None, ge=0)
    max_tool_calls: int | None = Field(default=None, ge=0)
    max_tokens: int | None = Field(default=None, ge=0)
    """Input plus output tokens, over every step."""
    max_cost: float | None = Field(default=None, ge=0, allow_inf_nan=False)


class EffectsExpectation(Frozen):
    """Effect safety of the run's writes (both checks are on unless turned off)."""

    no_duplicate_dispatch: bool = True
    """No effect key is in two ``BatchDispatched`` events."""
    no_outcome_unknown: bool = True
    """No write is left ``outcome_unknown`` (or dispatched with no result) at the end."""


def _one_or_many(value: object) -> object:
    return [value] if isinstance(value, str) else value


_REASON: dict[str, Any] = {"type": "string", "enum": [reason.value for reason in TerminalReason]}
_REASON_SCHEMA: dict[str, Any] = {
    "anyOf": [_REASON, {"type": "array", "items": _REASON, "minItems": 1}]
}

Reasons = Annotated[
    list[TerminalReason],
    BeforeValidator(_one_or_many),
    Field(min_length=1),
    WithJsonSchema(_REASON_SCHEMA),
]
"""One terminal reason or a list of them; stored as a list (errors name ``reason[i]``)."""


class Expectations(Frozen):
    """What a case expects of its run; an absent part is not checked."""

    reason: Reasons | None = None
    """The terminal reason, or a set of acceptable ones (one string is a set of one)."""
    answer: AnswerExpectation | None = None
    tools: ToolsExpectation | None = None
    limits: LimitsExpectation | None = None
    effects: EffectsExpectation | None = None


# --------------------------------------------------------------------------- verdicts


class Verdict(Frozen):
    """One expectation checked: its name (``answer.equals``...), whether it held, and why not."""

    expectation: str
    passed: bool
    why: str | None = None


class Measures(Frozen):
    """What the run used, from its events."""

    reason: TerminalReason | None
    answer: str | None
    steps: int
    tool_calls: int
    tokens: int
    cost: float
    latency_ms: float
    """From the first committed event to the last."""


class Score(Frozen):
    """A run scored: its verdicts and its measures; it passes when every verdict does."""

    verdicts: list[Verdict]
    measures: Measures

    @property
    def passed(self) -> bool:
        """True when every expectation held."""
        return all(verdict.passed for verdict in self.verdicts)

    @property
    def failures(self) -> list[Verdict]:
        """The expectations that did not hold."""
        return [verdict for verdict in self.verdicts if not verdict.passed]


def score_events(events: Sequence[DomainEvent], expect: Expectations) -> Score:
    """Score an invocation's committed events against ``expect``. Pure.

    Raises:
        ValueError: the events do not start with ``InvocationStarted``.
    """
    trajectory = build_trajectory(events)
    measures = _measures(trajectory, events)
    verdicts: list[Verdict] = []
    if expect.reason is not None:
        verdicts.append(_reason(trajectory, expect.reason))
    if expect.answer is not None:
        verdicts.extend(_answer(trajectory.answer, expect.answer))
    if expect.tools is not None:
        verdicts.extend(_tools(trajectory, expect.tools))
    if expect.limits is not None:
        verdicts.extend(_limits(measures, expect.limits))
    if expect.effects is not None:
        verdicts.extend(_effects(trajectory, events, expect.effects))
    return Score(verdicts=verdicts, measures=measures)


def _measures(trajectory: Trajectory, events: Sequence[DomainEvent]) -> Measures:
    latency = (events[-1].timestamp - events[0].timestamp).total_seconds() * 1000
    return Measures(
        reason=trajectory.reason,
        answer=trajectory.answer,
        steps=trajectory.steps[-1].step if trajectory.steps else 0,
        tool_calls=trajectory.tool_calls,
        tokens=trajectory.input_tokens + trajectory.output_tokens,
        cost=trajectory.cost,
        latency_ms=round(latency, 3),
    )


def _reason(trajectory: Trajectory, allowed: list[TerminalReason]) -> Verdict:
    got = trajectory.reason
    if got in allowed:
        return Verdict(expectation="reason", passed=True)
    expected = " or ".join(reason.value for reason in allowed)
    return Verdict(
        expectation="reason",
        passed=False,
        why=f"expected {expected}, got {got.value if got else 'no reason (still running)'}",
    )


def _answer(answer: str | None, wanted: AnswerExpectation) -> list[Verdict]:
    checks: list[tuple[str, str, bool]] = []
    if wanted.equals is not None:
        checks.append(("equals", f"expected {wanted.equals!r}", answer == wanted.equals))
    if wanted.contains is not None:
        checks.append(
            ("contains", f"does not contain {wanted.contains!r}", wanted.contains in (answer or ""))
        )
    if wanted.regex is not None:
        found = answer is not None and re.search(wanted.regex, answer) is not None
        checks.append(("regex", f"does not match {wanted.regex!r}", found))
    verdicts = []
    for name, why, held in checks:
        if held and answer is not None:  # no answer fails every check, even contains ""
            verdicts.append(Verdict(expectation=f"answer.{name}", passed=True))
        else:
            got = "no answer" if answer is None else f"got {_short(answer)!r}"
            verdicts.append(
                Verdict(expectation=f"answer.{name}", passed=False, why=f"{why}: {got}")
            )
    return verdicts


def _short(text: str, limit: int = 120) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def tool_steps(trajectory: Trajectory) -> list[frozenset[str]]:
    """The run's tool steps in commit order, each the set of tool names of one batch."""
    return [frozenset(call.name for call in step.calls) for step in trajectory.steps if step.calls]


def _tools(trajectory: Trajectory, wanted: ToolsExpectation) -> list[Verdict]:
    called = Counter(call.name for step in trajectory.steps for call in step.calls)
    verdicts = []
    for name in wanted.required:
        verdicts.append(
            Verdict(expectation=f"tools.required[{name}]", passed=True)
            if called[name]
            else Verdict(
                expectation=f"tools.required[{name}]", passed=False, why=f"{name} was never called"
            )
        )
    for name in wanted.forbidden:
        verdicts.append(
            Verdict(
                expectation=f"tools.forbidden[{name}]",
                passed=False,
                why=f"{name} was called {called[name]} time(s)",
            )
            if called[name]
            else Verdict(expectation=f"tools.forbidden[{name}]", passed=True)
        )
    if wanted.sequence is not None:
        verdicts.append(_sequence(tool_steps(trajectory), wanted.sequence))
    return verdicts


def _as_set(step: list[str]) -> frozenset[str]:
    return frozenset(step)


def _show(steps: Iterable[frozenset[str]]) -> str:
    return "[" + ", ".join("{" + ", ".join(sorted(s)) + "}" for s in steps) + "]"


def sequence_matches(
    actual: Sequence[frozenset[str]], expected: Sequence[frozenset[str]], mode: SequenceMode
) -> bool:
    """Whether the run's tool steps match the expected ones (each step a set of tool names).

    ``exact``: the same steps in the same order, nothing else. ``in_order``: the
    expected steps appear in this order, other steps may come between.
    ``any_order``: each expected step matches a different step of the run, in any order.
    """
    match mode:
        case SequenceMode.EXACT:
            return list(actual) == list(expected)
        case SequenceMode.IN_ORDER:
            remaining = iter(actual)
            return all(any(step == wanted for step in remaining) for wanted in expected)
        case SequenceMode.ANY_ORDER:
            return not (Counter(expected) - Counter(actual))


def _sequence(actual: list[frozenset[str]], wanted: SequenceExpectation) -> Verdict:
    expected = [_as_set(step) for step in wanted.steps]
    name = f"tools.sequence({wanted.mode.value})"
    if sequence_matches(actual, expected, wanted.mode):
        return Verdict(expectation=name, passed=True)
    return Verdict(
        expectation=name,
        passed=False,
        why=f"expected {_show(expected)}, the run's tool steps were {_show(actual)}",
    )


def _limits(measures: Measures, wanted: LimitsExpectation) -> list[Verdict]:
    verdicts = []
    for name, limit, used in (
        ("max_steps", wanted.max_steps, measures.steps),
        ("max_tool_calls", wanted.max_tool_calls, measures.tool_calls),
        ("max_tokens", wanted.max_tokens, measures.tokens),
        ("max_cost", wanted.max_cost, measures.cost),
    ):
        if limit is None:
            continue
        if used <= limit:
            verdicts.append(Verdict(expectation=f"limits.{name}", passed=True))
        else:
            verdicts.append(
                Verdict(
                    expectation=f"limits.{name}", passed=False, why=f"used {used}, limit {limit}"
                )
            )
    return verdicts


_OPEN = {EffectStatus.DISPATCHED.value, EffectStatus.OUTCOME_UNKNOWN.value}


def _effects(
    trajectory: Trajectory, events: Sequence[DomainEvent], wanted: EffectsExpectation
) -> list[Verdict]:
    verdicts = []
    if wanted.no_duplicate_dispatch:
        keys = Counter(
            call.effect_key
            for event in events
            if isinstance(event, BatchDispatched)
            for call in event.calls
            if call.effect_key
        )
        twice = sorted(key for key, count in keys.items() if count > 1)
        verdicts.append(
            Verdict(
                expectation="effects.no_duplicate_dispatch",
                passed=not twice,
                why=f"dispatched more than once: {', '.join(twice)}" if twice else None,
            )
        )
    if wanted.no_outcome_unknown:
        open_keys = sorted(
            f"{call.effect_key} ({call.effect_status})"
            for step in trajectory.steps
            for call in step.calls
            if call.effect_key and call.effect_status in _OPEN
        )
        verdicts.append(
            Verdict(
                expectation="effects.no_outcome_unknown",
                passed=not open_keys,
                why=f"left open: {', '.join(open_keys)}" if open_keys else None,
            )
        )
    return verdicts


# --------------------------------------------------------------------------- the report


class CaseStatus(StrEnum):
    """How one case and epoch ended in the report."""

    PASSED = "passed"
    FAILED = "failed"
    ERROR = "error"
    """The run could not be driven or scored (counted in every rate, as a failure)."""


class CaseResult(Frozen):
    """One case and epoch of a report."""

    case_id: str
    epoch: int
    invocation_id: str
    task_class: str
    status: CaseStatus
    proves: str | None = None
    """What passing the case proves (from the case)."""
    attempts: int = 1
    """How many times the case was run (``--rerun-failed`` runs a failed one again)."""
    failures: list[Verdict] = []
    error: str | None = None
    reason: TerminalReason | None = None
    answer: str | None = None
    steps: int = 0
    tool_calls: int = 0
    tokens: int = 0
    cost: float = 0.0
    latency_ms: float = 0.0

    @property
    def false_success(self) -> bool:
        """Completed, but an expectation failed: the run claimed a success it did not have."""
        return self.status is CaseStatus.FAILED and self.reason is TerminalReason.COMPLETED


class Distribution(Frozen):
    """Median and 95th percentile (nearest rank) of a measure over a group's scored runs."""

    p50: float
    p95: float


class Group(Frozen):
    """Counts and distributions of a set of case results."""

    cases: int
    passed: int
    failed: int
    errored: int
    pass_rate: float
    """passed / cases: errored cases count in the denominator."""
    false_success: int
    steps: Distribution | None
    tool_calls: Distribution | None
    tokens: Distribution | None
    cost: Distribution | None
    latency_ms: Distribution | None


class Summary(Frozen):
    """The report's totals and groups."""

    totals: Group
    by_task_class: dict[str, Group]
    by_reason: dict[str, Group]
    """Keyed by terminal reason; errored runs with no reason under ``error``."""


def _percentile(values: Sequence[float], fraction: float) -> float:
    ordered = sorted(values)
    rank = max(1, math.ceil(fraction * len(ordered)))
    return ordered[rank - 1]


def _distribution(values: Sequence[float]) -> Distribution | None:
    if not values:
        return None
    return Distribution(p50=_percentile(values, 0.5), p95=_percentile(values, 0.95))


def group(results: Sequence[CaseResult]) -> Group:
    """The counts and distributions of ``results`` (distributions over the runs not errored)."""
    scored = [r for r in results if r.status is not CaseStatus.ERROR]
    passed = sum(r.status is CaseStatus.PASSED for r in results)
    errored = len(results) - len(scored)
    return Group(
        cases=len(results),
        passed=passed,
        failed=len(results) - passed - errored,
        errored=errored,
        pass_rate=round(passed / len(results), 4) if results else 0.0,
        false_success=sum(r.false_success for r in results),
        steps=_distribution([r.steps for r in scored]),
        tool_calls=_distribution([r.tool_calls for r in scored]),
        tokens=_distribution([r.tokens for r in scored]),
        cost=_distribution([r.cost for r in scored]),
        latency_ms=_distribution([r.latency_ms for r in scored]),
    )


def summarise(results: Sequence[CaseResult]) -> Summary:
    """Totals, and groups by task class and by terminal reason, of a report's results."""
    by_class: dict[str, list[CaseResult]] = {}
    by_reason: dict[str, list[CaseResult]] = {}
    for result in results:
        by_class.setdefault(result.task_class, []).append(result)
        key = result.reason.value if result.reason else "error"
        by_reason.setdefault(key, []).append(result)
    return Summary(
        totals=group(results),
        by_task_class={k: group(v) for k, v in sorted(by_class.items())},
        by_reason={k: group(v) for k, v in sorted(by_reason.items())},
    )
