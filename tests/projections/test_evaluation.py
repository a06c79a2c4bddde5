"""The pure scorer (projections.evaluation): each expectation kind passes and fails on real events.

The events come from real runs (``Runtime`` on a SQLite file, scripted models);
the scorer is then called directly with the expectations under test.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import trio
from pydantic import ValidationError

from aggregates.events import DomainEvent
from aggregates.invocation import BatchDispatched
from loop_actors import Agent, Budget, Runtime, ScriptedModel, Usage, tool
from loop_actors.eval.evaluate import mcnemar_exact
from projections.evaluation import (
    CaseResult,
    CaseStatus,
    Expectations,
    SequenceMode,
    score_events,
    sequence_matches,
    summarise,
)
from tests.support.eval import send
from tests.support.replies import call


@tool
def alpha(key: str) -> str:
    """Read alpha."""
    return f"a-{key}"


@tool
def beta(key: str) -> str:
    """Read beta."""
    return f"b-{key}"


@tool
def gamma(key: str) -> str:
    """Read gamma."""
    return f"c-{key}"


@tool(effect="write")
def flaky_send(to: str) -> str:
    """A write that fails unexpectedly mid-call: its outcome is unknown."""
    raise RuntimeError(f"connection reset while sending to {to}")


def _agent(turns: list[dict[str, Any]], budget: Budget | None = None) -> Agent:
    return Agent(
        "scored", ScriptedModel(turns), [alpha, beta, gamma, send, flaky_send], budget=budget
    )


async def _events(
    tmp_path: Path, turns: list[dict[str, Any]], budget: Budget | None = None
) -> list[Any]:
    with trio.fail_after(30):
        async with Runtime(f"sqlite:///{tmp_path / 'scored.db'}") as runtime:
            outcome = await runtime.run(_agent(turns, budget), "score me")
            return list(await runtime.history(outcome.invocation_id))


PARALLEL_THEN_ONE: list[dict[str, Any]] = [
    {"kind": "tool_calls", "calls": [call("c1", "alpha", key="x"), call("c2", "beta", key="y")]},
    {"kind": "tool_calls", "calls": [call("c3", "gamma", key="z")]},
    {"kind": "final", "answer": "the answer is 42"},
]


def _score(events: Sequence[DomainEvent], **expect: Any) -> dict[str, tuple[bool, str | None]]:
    score = score_events(events, Expectations.model_validate(expect))
    return {v.expectation: (v.passed, v.why) for v in score.verdicts}


async def test_reason_passes_when_the_run_ended_with_it_or_one_of_a_set(tmp_path: Path) -> None:
    events = await _events(tmp_path, PARALLEL_THEN_ONE)
    assert _score(events, reason="completed") == {"reason": (True, None)}
    assert _score(events, reason=["max_steps", "completed"])["reason"][0]


async def test_reason_fails_with_what_was_expected_and_what_happened(tmp_path: Path) -> None:
    events = await _events(tmp_path, PARALLEL_THEN_ONE)
    assert _score(events, reason=["max_steps", "no_progress"]) == {
        "reason": (False, "expected max_steps or no_progress, got completed")
    }


async def test_answer_checks_pass_on_the_final_answer(tmp_path: Path) -> None:
    events = await _events(tmp_path, PARALLEL_THEN_ONE)
    verdicts = _score(
        events, answer={"equals": "the answer is 42", "contains": "42", "regex": r"\d+$"}
    )
    assert verdicts == {
        "answer.equals": (True, None),
        "answer.contains": (True, None),
        "answer.regex": (True, None),
    }


async def test_answer_checks_fail_each_with_the_answer_it_got(tmp_path: Path) -> None:
    events = await _events(tmp_path, PARALLEL_THEN_ONE)
    verdicts = _score(events, answer={"equals": "42", "contains": "43", "regex": r"^\d+$"})
    assert verdicts["answer.equals"] == (False, "expected '42': got 'the answer is 42'")
    assert verdicts["answer.contains"] == (False, "does not contain '43': got 'the answer is 42'")
    assert verdicts["answer.regex"][0] is False


async def test_answer_check_fails_when_the_run_gave_no_answer(tmp_path: Path) -> None:
    events = await _events(tmp_path, [{"kind": "clarification", "question": "which one?"}])
    assert _score(events, answer={"contains": ""}) == {
        "answer.contains": (False, "does not contain '': no answer")
    }


async def test_required_and_forbidden_tools_pass_and_fail(tmp_path: Path) -> None:
    events = await _events(tmp_path, PARALLEL_THEN_ONE)
    verdicts = _score(
        events, tools={"required": ["alpha", "send"], "forbidden": ["beta", "flaky_send"]}
    )
    assert verdicts == {
        "tools.required[alpha]": (True, None),
        "tools.required[send]": (False, "send was never called"),
        "tools.forbidden[beta]": (False, "beta was called 1 time(s)"),
        "tools.forbidden[flaky_send]": (True, None),
    }


@pytest.mark.parametrize(
    ("mode", "steps", "passes"),
    [
        ("exact", [["beta", "alpha"], "gamma"], True),  # a batch is a set: call order is free
        ("exact", [["alpha"], "gamma"], False),  # but it must be the whole batch
        ("exact", ["gamma", ["alpha", "beta"]], False),  # steps are ordered
        ("in_order", ["gamma"], True),
        ("in_order", [["alpha", "beta"], "gamma"], True),
        ("in_order", ["gamma", ["alpha", "beta"]], False),
        ("any_order", ["gamma", ["alpha", "beta"]], True),
        ("any_order", ["gamma", "gamma"], False),  # each expected step needs its own step
        ("any_order", ["alpha"], False),  # alpha ran in a batch with beta, not alone
    ],
)
async def test_sequence_compares_batches_as_sets_and_steps_in_order(
    tmp_path: Path, mode: str, steps: list[Any], passes: bool
) -> None:
    events = await _events(tmp_path, PARALLEL_THEN_ONE)
    verdict = _score(events, tools={"sequence": {"mode": mode, "steps": steps}})
    assert verdict[f"tools.sequence({mode})"][0] is passes


async def test_a_failed_sequence_says_what_the_run_did(tmp_path: Path) -> None:
    events = await _events(tmp_path, PARALLEL_THEN_ONE)
    verdict = _score(events, tools={"sequence": {"steps": ["gamma"]}})
    assert verdict["tools.sequence(exact)"] == (
        False,
        "expected [{gamma}], the run's tool steps were [{alpha, beta}, {gamma}]",
    )


def test_sequence_matching_rules_on_sets() -> None:
    """The matcher alone: exact, in_order (gaps allowed) and any_order (a multiset)."""
    a, b, ab = frozenset({"a"}), frozenset({"b"}), frozenset({"a", "b"})
    assert sequence_matches([ab, a], [ab, a], SequenceMode.EXACT)
    assert not sequence_matches([ab, a, b], [ab, a], SequenceMode.EXACT)
    assert sequence_matches([a, ab, b], [a, b], SequenceMode.IN_ORDER)
    assert not sequence_matches([b, a], [a, b], SequenceMode.IN_ORDER)
    assert sequence_matches([b, a], [a, b], SequenceMode.ANY_ORDER)
    assert not sequence_matches([a], [a, a], SequenceMode.ANY_ORDER)


async def test_limits_pass_at_the_limit_and_fail_above_it(tmp_path: Path) -> None:
    events = await _events(tmp_path, PARALLEL_THEN_ONE)
    at = _score(events, limits={"max_steps": 3, "max_tool_calls": 3, "max_tokens": 0})
    assert all(passed for passed, _ in at.values())
    above = _score(events, limits={"max_steps": 2, "max_tool_calls": 1, "max_cost": 0})
    assert above == {
        "limits.max_steps": (False, "used 3, limit 2"),
        "limits.max_tool_calls": (False, "used 3, limit 1"),
        "limits.max_cost": (True, None),
    }


async def test_tokens_and_cost_limits_fail_on_reported_usage(tmp_path: Path) -> None:
    """The model reports usage on every answer: the limits read it from DecisionProposed."""
    model = ScriptedModel(
        [{"kind": "final", "answer": "ok"}],
        usage=Usage(input_tokens=100, output_tokens=20, cost=0.5),
    )
    with trio.fail_after(30):
        async with Runtime(f"sqlite:///{tmp_path / 'usage.db'}") as runtime:
            outcome = await runtime.run(Agent("priced", model), "spend")
            events = await runtime.history(outcome.invocation_id)
    assert _score(events, limits={"max_tokens": 119, "max_cost": 0.25}) == {
        "limits.max_tokens": (False, "used 120, limit 119"),
        "limits.max_cost": (False, "used 0.5, limit 0.25"),
    }


async def test_effects_pass_for_a_committed_write(tmp_path: Path) -> None:
    events = await _events(
        tmp_path,
        [
            {"kind": "tool_calls", "calls": [call("w1", "send", to="ops")]},
            {"kind": "final", "answer": "sent"},
        ],
    )
    assert _score(events, effects={}) == {
        "effects.no_duplicate_dispatch": (True, None),
        "effects.no_outcome_unknown": (True, None),
    }


async def test_effects_fail_for_a_write_left_outcome_unknown(tmp_path: Path) -> None:
    """The write fails mid-call: the run pauses for reconciliation with the write still open."""
    events = await _events(
        tmp_path,
        [
            {"kind": "tool_calls", "calls": [call("w1", "flaky_send", to="ops")]},
            {"kind": "final", "answer": "I sent it"},
        ],
    )
    passed, why = _score(events, effects={"no_duplicate_dispatch": False})[
        "effects.no_outcome_unknown"
    ]
    dispatched = next(e for e in events if isinstance(e, BatchDispatched))
    assert (passed, why) == (False, f"left open: {dispatched.calls[0].effect_key} (dispatched)")


async def test_effects_fail_when_an_effect_key_is_dispatched_twice(tmp_path: Path) -> None:
    """A log where one write's BatchDispatched appears twice (as a runtime bug would leave it)."""
    events = await _events(
        tmp_path,
        [
            {"kind": "tool_calls", "calls": [call("w1", "send", to="ops")]},
            {"kind": "final", "answer": "sent"},
        ],
    )
    dispatched = next(e for e in events if isinstance(e, BatchDispatched))
    key = dispatched.calls[0].effect_key
    doubled = [*events[:-1], dispatched, events[-1]]
    passed, why = _score(doubled, effects={"no_outcome_unknown": False})[
        "effects.no_duplicate_dispatch"
    ]
    assert (passed, why) == (False, f"dispatched more than once: {key}")


def test_bad_expectations_are_refused_with_their_location() -> None:
    """Bad inputs: an unknown reason, an empty reason list, a regex that does not compile,
    an answer check with no check, a tool both required and forbidden, a negative limit,
    a sequence step that is neither a name nor a list of names, an empty batch."""
    with pytest.raises(ValidationError) as caught:
        Expectations.model_validate(
            {
                "reason": ["completed", "finished"],
                "answer": {"regex": "("},
                "tools": {"required": ["a"], "forbidden": ["a"]},
                "limits": {"max_steps": -1},
            }
        )
    locations = {tuple(e["loc"]) for e in caught.value.errors()}
    assert locations == {
        ("reason", 1),
        ("answer", "regex"),
        ("tools",),
        ("limits", "max_steps"),
    }
    bad: dict[str, Any]
    with pytest.raises(ValidationError) as caught:
        Expectations.model_validate({"tools": {"sequence": {"steps": ["a", 3, []]}}})
    assert [tuple(e["loc"]) for e in caught.value.errors()] == [
        ("tools", "sequence", "steps", 1),  # one error per bad step, not one per union member
        ("tools", "sequence", "steps", 2),
    ]
    for bad in ({"reason": []}, {"answer": {}}):
        with pytest.raises(ValidationError):
            Expectations.model_validate(bad)


def _result(status: CaseStatus, reason: str | None, task_class: str = "t") -> CaseResult:
    return CaseResult.model_validate(
        {
            "case_id": f"c-{status}-{reason}",
            "epoch": 1,
            "invocation_id": "i",
            "task_class": task_class,
            "status": status,
            "reason": reason,
            "steps": 2,
        }
    )


def test_totals_count_errored_cases_in_the_rates() -> None:
    results = [
        _result(CaseStatus.PASSED, "completed", "chat"),
        _result(CaseStatus.FAILED, "completed", "chat"),  # a false success
        _result(CaseStatus.FAILED, "max_steps", "lookup"),
        _result(CaseStatus.ERROR, None, "lookup"),
    ]
    summary = summarise(results)
    totals = summary.totals
    assert (totals.cases, totals.passed, totals.failed, totals.errored) == (4, 1, 2, 1)
    assert totals.pass_rate == 0.25
    assert totals.false_success == 1
    assert summary.by_task_class["lookup"].pass_rate == 0.0
    assert set(summary.by_reason) == {"completed", "max_steps", "error"}
    assert summary.by_reason["error"].steps is None  # no scored run to measure


@pytest.mark.parametrize(
    ("b", "c", "p"),
    [(0, 0, 1.0), (1, 1, 1.0), (0, 5, 0.0625), (2, 8, 0.109375), (0, 10, 2 / 1024)],
)
def test_mcnemar_exact_two_sided_p_values(b: int, c: int, p: float) -> None:
    assert mcnemar_exact(b, c) == pytest.approx(p)
    assert mcnemar_exact(c, b) == pytest.approx(p)
