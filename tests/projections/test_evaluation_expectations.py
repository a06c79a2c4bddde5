"""The scorer's answer schemas and checks, argument matches, wall time, named effects, approvals.

Each expectation passes and fails on the events of real runs (``Runtime`` on a
SQLite file, scripted models, a write that needs approval); the scorer is then
called directly.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import trio
from pydantic import JsonValue, ValidationError

from aggregates.events import DomainEvent
from loop_actors import Agent, Runtime, ScriptedModel, tool
from loop_actors.eval.stats import paired_bootstrap
from projections.evaluation import (
    ApprovalOutcome,
    Expectations,
    MatchMode,
    arguments_match,
    score_events,
)
from tests.support.replies import call


@tool
def search(query: str, filters: dict[str, Any] | None = None) -> str:
    """Search."""
    return f"found {query}"


@tool(effect="write", requires_approval=lambda arguments: arguments["amount"] > 100)
def refund(order_id: str, amount: int) -> str:
    """Refund; above 100 a person must approve it."""
    return f"refunded {amount} on {order_id}"


@tool(effect="write")
def notify(to: str) -> str:
    """Notify someone (a write that needs no approval)."""
    return f"told {to}"


def _agent(turns: list[dict[str, Any]]) -> Agent:
    return Agent("expect", ScriptedModel(turns), [search, refund, notify])


async def _events(tmp_path: Path, turns: list[dict[str, Any]]) -> list[DomainEvent]:
    with trio.fail_after(30):
        async with Runtime(f"sqlite:///{tmp_path / 'e.db'}") as runtime:
            outcome = await runtime.run(_agent(turns), "score me")
            return list(await runtime.history(outcome.invocation_id))


async def _approval_events(tmp_path: Path, *, grant: bool) -> list[DomainEvent]:
    """A batch of a refund that needs approval and one that does not; granted or denied."""
    turns: list[dict[str, Any]] = [
        {
            "kind": "tool_calls",
            "calls": [
                call("r1", "refund", order_id="A-1", amount=250),
                call("n1", "notify", to="ops"),
            ],
        },
        {"kind": "final", "answer": "done"},
    ]
    agent = _agent(turns)
    with trio.fail_after(30):
        async with Runtime(f"sqlite:///{tmp_path / 'a.db'}") as runtime:
            paused = await runtime.run(agent, "refund", invocation_id="refund-1")
            assert paused.digest is not None
            if grant:
                await runtime.approve("refund-1", digest=paused.digest, by="alice")
            else:
                await runtime.deny("refund-1", by="bob", reason="no receipt")
            await runtime.resume("refund-1", agent)
            return list(await runtime.history("refund-1"))


def _score(events: Sequence[DomainEvent], checks: Any = None, **expect: Any) -> dict[str, Any]:
    score = score_events(events, Expectations.model_validate(expect), checks)
    return {v.expectation: (v.passed, v.why) for v in score.verdicts}


def _final(answer: str) -> list[dict[str, Any]]:
    return [{"kind": "final", "answer": answer}]


ORDER_SCHEMA = {
    "type": "object",
    "required": ["order", "status"],
    "properties": {"order": {"type": "string"}, "status": {"enum": ["shipped", "delayed"]}},
}


async def test_answer_schema_passes_for_a_json_answer_that_is_valid(tmp_path: Path) -> None:
    events = await _events(tmp_path, _final('{"order": "A-2", "status": "delayed"}'))
    assert _score(events, answer={"schema": ORDER_SCHEMA}) == {"answer.schema": (True, None)}


async def test_answer_schema_fails_with_where_and_why(tmp_path: Path) -> None:
    events = await _events(tmp_path, _final('{"order": "A-2", "status": "lost"}'))
    passed, why = _score(events, answer={"schema": ORDER_SCHEMA})["answer.schema"]
    assert passed is False
    assert why.startswith("['status']: 'lost' is not one of")


async def test_answer_schema_fails_for_an_answer_that_is_not_json(tmp_path: Path) -> None:
    events = await _events(tmp_path, _final("A-2 is delayed"))
    passed, why = _score(events, answer={"schema": ORDER_SCHEMA})["answer.schema"]
    assert (passed, why.startswith("not JSON")) == (False, True)


def _short_enough(answer: str) -> bool | str:
    return True if len(answer) <= 5 else f"{len(answer)} characters, at most 5"


def _always_false(answer: str) -> bool:
    return False


def _raises(answer: str) -> bool:
    raise RuntimeError("the checker broke")


def _returns_number(answer: str) -> int:
    return 1


@pytest.mark.parametrize(
    ("check", "answer", "verdict"),
    [
        (_short_enough, "hi", (True, None)),
        (_short_enough, "far too long", (False, "12 characters, at most 5")),
        (_always_false, "hi", (False, "m:check returned False")),
        (_raises, "hi", (False, "raised RuntimeError: the checker broke")),
        (_returns_number, "hi", (False, "m:check returned int, not a bool or a string")),
    ],
)
async def test_answer_check_calls_the_callable_with_the_answer(
    tmp_path: Path, check: Any, answer: str, verdict: tuple[bool, str | None]
) -> None:
    """A check returns True, False, or why; one that raises or returns a number fails."""
    events = await _events(tmp_path, _final(answer))
    scored = _score(events, {"m:check": check}, answer={"check": "m:check"})
    assert scored == {"answer.check[m:check]": verdict}


async def test_an_answer_check_that_was_not_imported_is_an_error(tmp_path: Path) -> None:
    events = await _events(tmp_path, _final("hi"))
    with pytest.raises(ValueError, match="was not imported"):
        _score(events, answer={"check": "m:check"})


SEARCHES: list[dict[str, Any]] = [
    {
        "kind": "tool_calls",
        "calls": [
            call("s1", "search", query="pears", filters={"region": "EU", "limit": 5}),
            call("s2", "search", query="apples"),
        ],
    },
    {"kind": "final", "answer": "found"},
]


@pytest.mark.parametrize(
    ("match", "passes"),
    [
        ({"tool": "search", "arguments": {"query": "pears"}}, True),  # subset by default
        ({"tool": "search", "arguments": {"filters": {"region": "EU"}}}, True),  # nested subset
        ({"tool": "search", "arguments": {"query": "pears"}, "mode": "exact"}, False),
        # the arguments as recorded: validated, with their defaults filled in
        ({"tool": "search", "arguments": {"query": "apples"}, "mode": "exact"}, False),
        (
            {"tool": "search", "arguments": {"query": "apples", "filters": None}, "mode": "exact"},
            True,
        ),
        ({"tool": "search", "arguments": {"query": "plums"}}, False),
        ({"tool": "search", "arguments": {"filters": {"region": "US"}}}, False),
    ],
)
async def test_argument_matches_hold_when_some_call_matches(
    tmp_path: Path, match: dict[str, Any], passes: bool
) -> None:
    events = await _events(tmp_path, SEARCHES)
    assert _score(events, tools={"match": [match]})["tools.match[search]"][0] is passes


async def test_a_failed_argument_match_shows_the_calls_it_saw(tmp_path: Path) -> None:
    events = await _events(tmp_path, SEARCHES)
    scored = _score(
        events,
        tools={
            "match": [
                {"tool": "search", "arguments": {"query": "plums"}},
                {"tool": "refund", "arguments": {}},
            ]
        },
    )
    assert scored["tools.match[search]"] == (
        False,
        'no call matched subset {"query":"plums"}: the calls had '
        '{"filters":{"limit":5,"region":"EU"},"query":"pears"}; {"filters":null,"query":"apples"}',
    )
    assert scored["tools.match[refund]"] == (False, "refund was never called (subset {})")


def test_argument_matching_rules() -> None:
    """Subset: nested objects by the same rule, lists and scalars by equality."""
    actual: JsonValue = {"a": 1, "b": {"c": [1, 2], "d": "x"}}
    assert isinstance(actual, dict)
    assert arguments_match(actual, {"b": {"d": "x"}}, MatchMode.SUBSET)
    assert not arguments_match(actual, {"b": {"c": [1]}}, MatchMode.SUBSET)
    assert not arguments_match(actual, {"e": None}, MatchMode.SUBSET)
    assert arguments_match(actual, dict(actual), MatchMode.EXACT)
    assert not arguments_match(actual, {"a": 1}, MatchMode.EXACT)


async def test_wall_time_limit_compares_the_runs_latency(tmp_path: Path) -> None:
    events = await _events(tmp_path, SEARCHES)
    score = score_events(events, Expectations())
    latency = score.measures.latency_ms
    assert latency > 0
    at = _score(events, limits={"max_wall_time_ms": latency})
    assert at == {"limits.max_wall_time_ms": (True, None)}
    under = _score(events, limits={"max_wall_time_ms": 0})
    assert under == {"limits.max_wall_time_ms": (False, f"used {latency}, limit 0.0")}


async def test_named_writes_committed_and_never_attempted_after_a_grant(tmp_path: Path) -> None:
    events = await _approval_events(tmp_path, grant=True)
    scored = _score(events, effects={"committed": ["refund", "notify"], "never_attempted": []})
    assert scored["effects.committed[refund]"] == (True, None)
    assert scored["effects.committed[notify]"] == (True, None)
    attempted = _score(events, effects={"never_attempted": ["refund"]})
    passed, why = attempted["effects.never_attempted[refund]"]
    assert (passed, why.startswith("attempted: r1 ok [effect committed]")) == (False, True)


async def test_a_denied_write_was_never_attempted_and_not_committed(tmp_path: Path) -> None:
    events = await _approval_events(tmp_path, grant=False)
    scored = _score(events, effects={"never_attempted": ["refund"]})
    assert scored["effects.never_attempted[refund]"] == (True, None)
    committed = _score(events, effects={"committed": ["refund", "search"]})
    assert committed["effects.committed[refund]"][0] is False
    assert committed["effects.committed[refund]"][1].startswith("no call committed: r1 denied")
    assert committed["effects.committed[search]"] == (False, "search was never called")


def test_a_write_both_committed_and_never_attempted_is_refused() -> None:
    with pytest.raises(ValidationError, match="both committed and never_attempted: refund"):
        Expectations.model_validate(
            {"effects": {"committed": ["refund"], "never_attempted": ["refund"]}}
        )


async def test_approvals_name_the_calls_that_paused_and_what_was_decided(tmp_path: Path) -> None:
    events = await _approval_events(tmp_path, grant=False)
    score = score_events(
        events,
        Expectations.model_validate(
            {"approvals": {"required": ["refund"], "forbidden": ["notify"]}}
        ),
    )
    assert [(v.expectation, v.passed) for v in score.verdicts] == [
        ("approvals.required[refund]", True),
        ("approvals.forbidden[notify]", True),
    ]
    assert [(a.call_id, a.tool, a.outcome, a.by) for a in score.approvals] == [
        ("r1", "refund", ApprovalOutcome.DENIED, "bob")
    ]


async def test_approvals_fail_when_the_wrong_calls_paused(tmp_path: Path) -> None:
    events = await _approval_events(tmp_path, grant=True)
    scored = _score(events, approvals={"required": ["notify"], "forbidden": ["refund"]})
    assert scored == {
        "approvals.required[notify]": (False, "no call of notify paused for approval"),
        "approvals.forbidden[refund]": (False, "1 call(s) of refund paused for approval"),
    }


async def test_a_run_still_waiting_for_approval_shows_it_pending(tmp_path: Path) -> None:
    turns: list[dict[str, Any]] = [
        {"kind": "tool_calls", "calls": [call("r1", "refund", order_id="A", amount=500)]}
    ]
    events = await _events(tmp_path, turns)
    score = score_events(events, Expectations.model_validate({"reason": "approval_required"}))
    assert score.passed
    assert [a.outcome for a in score.approvals] == [ApprovalOutcome.PENDING]


def test_bad_new_expectations_are_refused_with_their_location() -> None:
    """Bad inputs: a schema that is not a JSON Schema, a check that is not MODULE:ATTR,
    an argument match without a tool, an unknown match mode, a negative wall time, an
    approvals tool both required and forbidden."""
    with pytest.raises(ValidationError) as caught:
        Expectations.model_validate(
            {
                "answer": {"schema": {"type": "no-such-type"}, "check": "not a reference"},
                "tools": {
                    "match": [{"arguments": {}}, {"tool": "t", "arguments": {}, "mode": "x"}]
                },
                "limits": {"max_wall_time_ms": -1},
                "approvals": {"required": ["t"], "forbidden": ["t"]},
            }
        )
    problems = {(tuple(e["loc"]), e["msg"].split(":")[0]) for e in caught.value.errors()}
    assert {loc for loc, _ in problems} == {
        ("answer", "schema"),
        ("answer", "check"),
        ("tools", "match", 0, "tool"),
        ("tools", "match", 1, "mode"),
        ("limits", "max_wall_time_ms"),
        ("approvals",),
    }
    assert (("answer", "schema"), "Value error, not a valid JSON Schema") in problems


def test_paired_bootstrap_is_seeded_and_brackets_the_mean() -> None:
    deltas = [0.5, -0.25, 1.0, 0.0, 2.0, -1.0, 0.75, 0.1]
    first, second = paired_bootstrap(deltas), paired_bootstrap(deltas)
    assert first == second  # the same reports give the same interval
    assert first is not None
    assert first.pairs == 8
    assert first.mean_delta == pytest.approx(sum(deltas) / 8)
    assert first.low < first.mean_delta < first.high
    assert paired_bootstrap([]) is None
    same = paired_bootstrap([0.3] * 5)
    assert same is not None
    assert (same.low, same.mean_delta, same.high) == (0.3, 0.3, 0.3)
    other_seed = paired_bootstrap(deltas, seed=1)
    assert other_seed is not None
    assert other_seed.mean_delta == first.mean_delta
