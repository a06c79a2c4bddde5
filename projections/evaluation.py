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

import json
import math
import re
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from enum import StrEnum
from typing import Annotated, Any

import jsonschema
from pydantic import (
    BeforeValidator,
    Field,
    JsonValue,
    WithJsonSchema,
    field_validator,
    model_validator,
)

from aggregates.decisions import EffectStatus, Frozen, TerminalReason
from aggregates.events import DomainEvent
from aggregates.invocation import (
    ApprovalDenied,
    ApprovalGranted,
    BatchDispatched,
    Paused,
)
from projections.trajectory import CallView, Trajectory, build_trajectory

CHECK_PATTERN = r"^[A-Za-z_][A-Za-z0-9_.]*:[A-Za-z_][A-Za-z0-9_.]*$"
"""``MODULE:ATTR`` of an answer check."""

AnswerCheck = Callable[[str], object]
"""An answer check (``expect.answer.check``): called with the final answer; ``True``
holds, ``False`` or a string (why) fails; an exception fails with its message."""

# --------------------------------------------------------------------------- expectations


class AnswerExpectation(Frozen):
    """Checks of the final answer; every one given must hold."""

    equals: str | None = None
    contains: str | None = None
    regex: str | None = None
    """A Python regular expression searched for in the answer (``re.search``)."""
    schema_: dict[str, JsonValue] | None = Field(default=None, alias="schema")
    """A JSON Schema (draft 2020-12 unless ``$schema`` says otherwise) the answer, parsed
    as JSON, must be valid against."""
    check: str | None = Field(default=None, pattern=CHECK_PATTERN)
    """``MODULE:ATTR`` of a callable given the answer: ``True`` holds, ``False`` or a
    string (why) fails (the return convention of a verifier)."""

    @field_validator("schema_")
    @classmethod
    def _valid_schema(cls, value: dict[str, JsonValue] | None) -> dict[str, JsonValue] | None:
        if value is not None:
            try:
                jsonschema.validators.validator_for(value).check_schema(value)
            except jsonschema.SchemaError as error:
                raise ValueError(f"not a valid JSON Schema: {error.message}") from None
        return value

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
        checks = (self.equals, self.contains, self.regex, self.schema_, self.check)
        if all(check is None for check in checks):
            raise ValueError("give at least one of equals, contains, regex, schema, check")
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


class MatchMode(StrEnum):
    """How a call's arguments are compared with the expected ones."""

    EXACT = "exact"
    SUBSET = "subset"


class ArgumentMatch(Frozen):
    """Some call of ``tool`` was made with these arguments."""

    tool: str = Field(min_length=1)
    arguments: dict[str, JsonValue]
    mode: MatchMode = MatchMode.SUBSET
    """``subset``: each expected key is there with a matching value (a nested object
    matches by the same rule, any other value by equality); ``exact``: equal."""


class ToolsExpectation(Frozen):
    """Which tools the run called."""

    required: list[str] = []
    """Each called at least once."""
    forbidden: list[str] = []
    """None called (a denied call counts: it was proposed and dispatched)."""
    sequence: SequenceExpectation | None = None
    match: list[ArgumentMatch] = []
    """Each held by at least one call."""

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
    max_wall_time_ms: float | None = Field(default=None, ge=0, allow_inf_nan=False)
    """From the run's first committed event to its last (``latency_ms``)."""


class EffectsExpectation(Frozen):
    """Effect safety of the run's writes (both checks are on unless turned off)."""

    no_duplicate_dispatch: bool = True
    """No effect key is in two ``BatchDispatched`` events."""
    no_outcome_unknown: bool = True
    """No write is left ``outcome_unknown`` (or dispatched with no result) at the end."""
    committed: list[str] = []
    """Write tools each with a call whose effect committed (or was reconciled as committed)."""
    never_attempted: list[str] = []
    """Write tools none of whose calls reached the service (denied or never proposed)."""

    @model_validator(mode="after")
    def _consistent(self) -> EffectsExpectation:
        both = sorted(set(self.committed) & set(self.never_attempted))
        if both:
            raise ValueError(f"both committed and never_attempted: {', '.join(both)}")
        return self


class ApprovalsExpectation(Frozen):
    """Which calls paused the run for approval (by tool name)."""

    required: list[str] = []
    """Each tool had a call that paused for approval."""
    forbidden: list[str] = []
    """No call of these tools paused for approval."""

    @model_validator(mode="after")
    def _consistent(self) -> ApprovalsExpectation:
        both = sorted(set(self.required) & set(self.forbidden))
        if both:
            raise ValueError(f"both required and forbidden: {', '.join(both)}")
        return self


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
    approvals: ApprovalsExpectation | None = None

    def checks(self) -> list[str]:
        """The ``MODULE:ATTR`` of the answer check, if any (to import before running)."""
        return [self.answer.check] if self.answer and self.answer.check else []


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
    effects_dispatched_twice: int = 0
    """Effect keys in more than one ``BatchDispatched`` (a write that may have run twice)."""
    effects_left_open: int = 0
    """Writes left ``outcome_unknown``, or dispatched with no result, at the end."""


class ApprovalOutcome(StrEnum):
    """What became of a call that paused the run for approval."""

    GRANTED = "granted"
    DENIED = "denied"
    PENDING = "pending"
    """Still waiting when the run was scored."""


class ApprovalView(Frozen):
    """One call that paused the run for approval, and what a person decided."""

    step: int
    call_id: str
    tool: str
    outcome: ApprovalOutcome
    by: str | None = None


class Score(Frozen):
    """A run scored: its verdicts and its measures; it passes when every verdict does."""

    verdicts: list[Verdict]
    measures: Measures
    trajectory: Trajectory
    approvals: list[ApprovalView] = []

    @property
    def passed(self) -> bool:
        """True when every expectation held."""
        return all(verdict.passed for verdict in self.verdicts)

    @property
    def failures(self) -> list[Verdict]:
        """The expectations that did not hold."""
        return [verdict for verdict in self.verdicts if not verdict.passed]


def score_events(
    events: Sequence[DomainEvent],
    expect: Expectations,
    checks: Mapping[str, AnswerCheck] | None = None,
) -> Score:
    """Score an invocation's committed events against ``expect``. Pure but for ``checks``.

    ``checks`` maps each ``answer.check`` reference (``MODULE:ATTR``) to its callable,
    imported by the caller; the scorer calls it with the answer.

    Raises:
        ValueError: the events do not start with ``InvocationStarted``, or an
            ``answer.check`` is not in ``checks``.
    """
    trajectory = build_trajectory(events)
    measures = _measures(trajectory, events)
    approvals = approvals_of(events)
    verdicts: list[Verdict] = []
    if expect.reason is not None:
        verdicts.append(_reason(trajectory, expect.reason))
    if expect.answer is not None:
        verdicts.extend(_answer(trajectory.answer, expect.answer, checks or {}))
    if expect.tools is not None:
        verdicts.extend(_tools(trajectory, expect.tools))
    if expect.limits is not None:
        verdicts.extend(_limits(measures, expect.limits))
    if expect.effects is not None:
        verdicts.extend(_effects(trajectory, events, expect.effects))
    if expect.approvals is not None:
        verdicts.extend(_approvals(approvals, expect.approvals))
    return Score(verdicts=verdicts, measures=measures, trajectory=trajectory, approvals=approvals)


def approvals_of(events: Sequence[DomainEvent]) -> list[ApprovalView]:
    """The calls that paused the run for approval, in order, with what was decided."""
    views: list[ApprovalView] = []
    waiting: dict[int, list[int]] = {}  # step -> indexes in views still pending
    for event in events:
        if isinstance(event, Paused) and event.reason is TerminalReason.APPROVAL_REQUIRED:
            names = {call.call_id: call.name for call in event.calls or []}
            waiting[event.step] = []
            for call_id in event.needs_approval or []:
                waiting[event.step].append(len(views))
                views.append(
                    ApprovalView(
                        step=event.step,
                        call_id=call_id,
                        tool=names.get(call_id, "?"),
                        outcome=ApprovalOutcome.PENDING,
                    )
                )
        elif isinstance(event, ApprovalGranted | ApprovalDenied):
            outcome = (
                ApprovalOutcome.GRANTED
                if isinstance(event, ApprovalGranted)
                else ApprovalOutcome.DENIED
            )
            for index in waiting.pop(event.step, []):
                views[index] = views[index].model_copy(update={"outcome": outcome, "by": event.by})
    return views


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
        effects_dispatched_twice=len(dispatched_twice(events)),
        effects_left_open=len(left_open(trajectory)),
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


def _answer(
    answer: str | None, wanted: AnswerExpectation, callables: Mapping[str, AnswerCheck]
) -> list[Verdict]:
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
    if wanted.schema_ is not None:
        verdicts.append(_answer_schema(answer, wanted.schema_))
    if wanted.check is not None:
        if wanted.check not in callables:
            raise ValueError(f"the answer check {wanted.check} was not imported")
        verdicts.append(_answer_check(answer, wanted.check, callables[wanted.check]))
    return verdicts


def _answer_schema(answer: str | None, schema: dict[str, JsonValue]) -> Verdict:
    name = "answer.schema"
    if answer is None:
        return Verdict(expectation=name, passed=False, why="no answer")
    try:
        document = json.loads(answer)
    except json.JSONDecodeError as error:
        return Verdict(
            expectation=name, passed=False, why=f"not JSON ({error.msg}): got {_short(answer)!r}"
        )
    validator = jsonschema.validators.validator_for(schema)(schema)
    problems = sorted(validator.iter_errors(document), key=lambda e: list(e.absolute_path))
    if not problems:
        return Verdict(expectation=name, passed=True)
    first = problems[0]
    where = "".join(f"[{p!r}]" for p in first.absolute_path) or "the answer"
    more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
    return Verdict(expectation=name, passed=False, why=f"{where}: {first.message}{more}")


def _answer_check(answer: str | None, reference: str, check: AnswerCheck) -> Verdict:
    name = f"answer.check[{reference}]"
    if answer is None:
        return Verdict(expectation=name, passed=False, why="no answer")
    try:
        held = check(answer)
    except Exception as error:  # the user's check failed: a failed expectation, said why
        return Verdict(
            expectation=name, passed=False, why=f"raised {type(error).__name__}: {error}"
        )
    if held is True:
        return Verdict(expectation=name, passed=True)
    if held is False:
        return Verdict(expectation=name, passed=False, why=f"{reference} returned False")
    if isinstance(held, str):
        return Verdict(expectation=name, passed=False, why=held)
    return Verdict(
        expectation=name,
        passed=False,
        why=f"{reference} returned {type(held).__name__}, not a bool or a string",
    )


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
    calls = [call for step in trajectory.steps for call in step.calls]
    verdicts.extend(_match(calls, match) for match in wanted.match)
    return verdicts


def arguments_match(actual: JsonValue, expected: JsonValue, mode: MatchMode) -> bool:
    """Whether a call's arguments match the expected ones (see :class:`ArgumentMatch`)."""
    if mode is MatchMode.EXACT or not isinstance(expected, dict):
        return actual == expected
    if not isinstance(actual, dict):
        return False
    return all(
        key in actual and arguments_match(actual[key], value, mode)
        for key, value in expected.items()
    )


def _compact(value: JsonValue) -> str:
    return _short(json.dumps(value, sort_keys=True, separators=(",", ":")), 200)


def _match(calls: Sequence[CallView], wanted: ArgumentMatch) -> Verdict:
    name = f"tools.match[{wanted.tool}]"
    same_tool = [call for call in calls if call.name == wanted.tool]
    if any(arguments_match(call.arguments, wanted.arguments, wanted.mode) for call in same_tool):
        return Verdict(expectation=name, passed=True)
    expected = f"{wanted.mode.value} {_compact(wanted.arguments)}"
    if not same_tool:
        return Verdict(
            expectation=name, passed=False, why=f"{wanted.tool} was never called ({expected})"
        )
    seen = "; ".join(_compact(call.arguments) for call in same_tool[:3])
    more = f" and {len(same_tool) - 3} more" if len(same_tool) > 3 else ""
    return Verdict(
        expectation=name,
        passed=False,
        why=f"no call matched {expected}: the calls had {seen}{more}",
    )


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
        ("max_wall_time_ms", wanted.max_wall_time_ms, measures.latency_ms),
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


def dispatched_twice(events: Sequence[DomainEvent]) -> list[str]:
    """The effect keys held by more than one ``BatchDispatched``, sorted."""
    keys = Counter(
        call.effect_key
        for event in events
        if isinstance(event, BatchDispatched)
        for call in event.calls
        if call.effect_key
    )
    return sorted(key for key, count in keys.items() if count > 1)


def left_open(trajectory: Trajectory) -> list[str]:
    """The writes left open at the end (``KEY (STATUS)``), sorted."""
    return sorted(
        f"{call.effect_key} ({call.effect_status})"
        for step in trajectory.steps
        for call in step.calls
        if call.effect_key and call.effect_status in _OPEN
    )


def _effects(
    trajectory: Trajectory, events: Sequence[DomainEvent], wanted: EffectsExpectation
) -> list[Verdict]:
    verdicts = []
    if wanted.no_duplicate_dispatch:
        twice = dispatched_twice(events)
        verdicts.append(
            Verdict(
                expectation="effects.no_duplicate_dispatch",
                passed=not twice,
                why=f"dispatched more than once: {', '.join(twice)}" if twice else None,
            )
        )
    if wanted.no_outcome_unknown:
        open_keys = left_open(trajectory)
        verdicts.append(
            Verdict(
                expectation="effects.no_outcome_unknown",
                passed=not open_keys,
                why=f"left open: {', '.join(open_keys)}" if open_keys else None,
            )
        )
    calls = [call for step in trajectory.steps for call in step.calls]
    for tool in wanted.committed:
        verdicts.append(_committed(calls, tool))
    for tool in wanted.never_attempted:
        verdicts.append(_never_attempted(calls, tool))
    return verdicts


def _is_committed(call: CallView) -> bool:
    if call.effect_status == EffectStatus.COMMITTED.value:
        return True
    return call.effect_status == EffectStatus.RECONCILED.value and call.status == "ok"


_NOT_ATTEMPTED = {"denied", "invalid_arguments"}
"""Call statuses of a write the service never saw: refused before it ran."""


def _attempted(call: CallView) -> bool:
    return call.status not in _NOT_ATTEMPTED


def _describe(call: CallView) -> str:
    return f"{call.call_id} {call.status}" + (
        f" [effect {call.effect_status}]" if call.effect_status else ""
    )


def _committed(calls: Sequence[CallView], tool: str) -> Verdict:
    name = f"effects.committed[{tool}]"
    mine = [call for call in calls if call.name == tool]
    if any(_is_committed(call) for call in mine):
        return Verdict(expectation=name, passed=True)
    if not mine:
        return Verdict(expectation=name, passed=False, why=f"{tool} was never called")
    return Verdict(
        expectation=name,
        passed=False,
        why="no call committed: " + ", ".join(_describe(call) for call in mine),
    )


def _never_attempted(calls: Sequence[CallView], tool: str) -> Verdict:
    name = f"effects.never_attempted[{tool}]"
    attempted = [call for call in calls if call.name == tool and _attempted(call)]
    if not attempted:
        return Verdict(expectation=name, passed=True)
    return Verdict(
        expectation=name,
        passed=False,
        why="attempted: " + ", ".join(_describe(call) for call in attempted),
    )


def _approvals(approvals: Sequence[ApprovalView], wanted: ApprovalsExpectation) -> list[Verdict]:
    paused = Counter(view.tool for view in approvals)
    verdicts = []
    for tool in wanted.required:
        verdicts.append(
            Verdict(expectation=f"approvals.required[{tool}]", passed=True)
            if paused[tool]
            else Verdict(
                expectation=f"approvals.required[{tool}]",
                passed=False,
                why=f"no call of {tool} paused for approval",
            )
        )
    for tool in wanted.forbidden:
        verdicts.append(
            Verdict(
                expectation=f"approvals.forbidden[{tool}]",
                passed=False,
                why=f"{paused[tool]} call(s) of {tool} paused for approval",
            )
            if paused[tool]
            else Verdict(expectation=f"approvals.forbidden[{tool}]", passed=True)
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
    effects_dispatched_twice: int = 0
    effects_left_open: int = 0
    approvals: list[ApprovalView] = []
    """The calls that paused the run for approval."""
    trajectory: Trajectory | None = None
    """The run's steps, calls, results and effects (None for a run that could not be read)."""

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
    effects_dispatched_twice: int = 0
    """Over the group's runs: effect keys dispatched more than once (each may have run twice)."""
    effects_left_open: int = 0
    """Over the group's runs: writes left ``outcome_unknown`` or with no result."""
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
        effects_dispatched_twice=sum(r.effects_dispatched_twice for r in results),
        effects_left_open=sum(r.effects_left_open for r in results),
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
