"""The turn protocol, driven through the public API (seed 000's deterministic control tests and more)."""

from __future__ import annotations

from typing import Annotated, Any

import pytest
import trio
import trio.testing
from pydantic import Field

from aggregates.invocation import (
    BatchDispatched,
    DecisionProposed,
    InvocationStarted,
    ResultsCommitted,
    Terminated,
)
from loop_actors import (
    Agent,
    Budget,
    ErrorClass,
    Final,
    ModelRequest,
    RejectionClass,
    Runtime,
    ScriptedModel,
    TerminalReason,
    ToolCall,
    ToolCalls,
    ToolError,
    tool,
)
from tests.support.replies import calls, final

MEMORY = "memory://"


class Counter:
    """A fake tool that counts its executions (seed 000's countingTool)."""

    def __init__(self) -> None:
        self.executions = 0

    def tool(self) -> Any:
        counter = self

        @tool
        async def count(key: str) -> dict[str, bool]:
            """Count one execution."""
            counter.executions += 1
            return {"ok": True}

        return count


@tool
async def lookup(key: str) -> dict[str, str]:
    """Look up a value; the profile answers last."""
    values = {"profile": "active", "policy": "refund-under-100"}
    if key == "profile":
        await trio.sleep(0.01)
    if key not in values:
        raise KeyError(key)
    return {"key": key, "value": values[key]}


async def run(agent: Agent, goal: str = "test", url: str = MEMORY) -> Any:
    async with Runtime(url) as runtime:
        outcome = await runtime.run(agent, goal)
        events = await runtime.history(outcome.invocation_id)
    return outcome, events


def of_type(events: list[Any], kind: type) -> list[Any]:
    return [e for e in events if isinstance(e, kind)]


# --------------------------------------------------------------------------- happy paths


async def test_direct_final_answer_completes_in_one_step() -> None:
    agent = Agent("a", ScriptedModel([final("42")]))
    outcome, events = await run(agent)
    assert outcome.reason is TerminalReason.COMPLETED
    assert outcome.answer == "42"
    assert (outcome.steps, outcome.tool_calls) == (1, 0)
    assert [type(e) for e in events] == [InvocationStarted, DecisionProposed, Terminated]


async def test_parallel_results_keep_call_order_and_ids_when_calls_finish_out_of_order(
    clock: trio.testing.MockClock,
) -> None:
    model = ScriptedModel(
        [
            calls(
                ("call-profile", "lookup", {"key": "profile"}),
                ("call-policy", "lookup", {"key": "policy"}),
            ),
            final("done"),
        ]
    )
    outcome, events = await run(Agent("a", model, [lookup]))
    assert outcome.reason is TerminalReason.COMPLETED
    (committed,) = of_type(events, ResultsCommitted)
    assert [r.call_id for r in committed.results] == ["call-profile", "call-policy"]
    assert committed.results[0].output == {"key": "profile", "value": "active"}
    assert committed.results[1].output == {"key": "policy", "value": "refund-under-100"}
    # The profile really did finish last.
    assert committed.results[0].duration_ms > committed.results[1].duration_ms


async def test_batch_is_committed_before_any_call_starts() -> None:
    seen_positions: list[int] = []
    runtime = Runtime(MEMORY)

    @tool
    async def probe(key: str) -> str:
        """Look at what is committed while running."""
        history = await runtime.history(current_id[0])
        seen_positions.append(len(history))
        assert isinstance(history[-1], BatchDispatched)
        return key

    current_id: list[str] = []

    def decide(request: ModelRequest) -> dict[str, Any]:
        current_id[:] = [request.invocation_id]
        if request.step == 1:
            return calls(("c1", "probe", {"key": "x"}))
        return final("ok")

    async with runtime:
        outcome = await runtime.run(Agent("a", ScriptedModel(decide), [probe]), "g")
    assert outcome.reason is TerminalReason.COMPLETED
    assert seen_positions == [3]


async def test_partial_failure_keeps_the_other_results_and_the_model_sees_all_of_them() -> None:
    @tool
    async def fragile(key: str) -> str:
        """Fail for one key."""
        if key == "bad":
            raise ToolError(
                "deadline exceeded upstream", error_class=ErrorClass.UNAVAILABLE, retryable=True
            )
        if key == "boom":
            raise RuntimeError("exploded")
        return key.upper()

    seen: list[list[Any]] = []

    def decide(request: ModelRequest) -> dict[str, Any]:
        if request.step == 1:
            return calls(
                ("a", "fragile", {"key": "ok"}),
                ("b", "fragile", {"key": "bad"}),
                ("c", "fragile", {"key": "boom"}),
            )
        seen.append(request.results)
        return final("handled")

    outcome, _ = await run(Agent("a", ScriptedModel(decide), [fragile]))
    assert outcome.reason is TerminalReason.COMPLETED
    (results,) = seen
    assert [r.call_id for r in results] == ["a", "b", "c"]
    assert results[0].output == "OK"
    assert results[1].error is not None
    assert results[1].error.error_class is ErrorClass.UNAVAILABLE
    assert results[1].error.retryable is True
    assert results[2].error is not None
    assert results[2].error.error_class is ErrorClass.TOOL_FAILED
    assert "exploded" in results[2].error.message


async def test_plain_function_tools_run_and_their_outputs_are_recorded() -> None:
    def add(a: int, b: int = 1) -> int:
        return a + b

    model = ScriptedModel([calls(("c1", "add", {"a": 2})), final("3")])
    outcome, events = await run(Agent("a", model, [add]))
    assert outcome.reason is TerminalReason.COMPLETED
    assert of_type(events, ResultsCommitted)[0].results[0].output == 3


async def test_decision_models_and_json_text_arguments_are_accepted() -> None:
    model = ScriptedModel(
        [
            ToolCalls(calls=[ToolCall(id="c1", name="lookup", arguments='{"key": "policy"}')]),
            Final(answer="fine"),
        ]
    )
    outcome, events = await run(Agent("a", model, [lookup]))
    assert outcome.reason is TerminalReason.COMPLETED
    assert of_type(events, BatchDispatched)[0].calls[0].arguments == {"key": "policy"}


# --------------------------------------------------------------------------- invalid decisions


@pytest.mark.parametrize(
    ("proposal", "rejection_class"),
    [
        (calls(("c1", "nope", {})), RejectionClass.UNKNOWN_TOOL),
        (
            calls(("c1", "lookup", {"key": "a"}), ("c1", "lookup", {"key": "b"})),
            RejectionClass.DUPLICATE_CALL_ID,
        ),
        (calls(("c1", "lookup", {"key": 5})), RejectionClass.INVALID_ARGUMENTS),
        (calls(("c1", "lookup", {"wrong": "x"})), RejectionClass.INVALID_ARGUMENTS),
        ({"kind": "tool_calls", "calls": []}, RejectionClass.EMPTY_BATCH),
        (final("   "), RejectionClass.EMPTY_ANSWER),
        ({"kind": "dance"}, RejectionClass.SCHEMA_INVALID),
        ({"kind": "final"}, RejectionClass.SCHEMA_INVALID),
        (
            {
                "kind": "tool_calls",
                "calls": [{"id": "c1", "name": "lookup", "arguments": "{not json"}],
            },
            RejectionClass.SCHEMA_INVALID,
        ),
        ({"kind": "final", "answer": "x", "schema_version": 2}, RejectionClass.SCHEMA_INVALID),
    ],
    ids=[
        "unknown-tool",
        "duplicate-call-id",
        "wrong-argument-type",
        "unexpected-argument",
        "empty-batch",
        "empty-final-answer",
        "unknown-kind",
        "missing-answer",
        "arguments-not-json",
        "unsupported-version",
    ],
)
async def test_invalid_proposal_ends_in_invalid_decision_with_the_rejection_recorded(
    proposal: dict[str, Any], rejection_class: RejectionClass
) -> None:
    """With ``max_invalid_proposals=0`` the first invalid proposal ends the run."""
    counter = Counter()
    agent = Agent("a", ScriptedModel([proposal]), [lookup, counter.tool()], max_invalid_proposals=0)
    outcome, events = await run(agent)
    assert outcome.reason is TerminalReason.INVALID_DECISION
    (decided,) = of_type(events, DecisionProposed)
    assert decided.decision is None
    assert decided.rejection is not None
    assert decided.rejection.rejection_class is rejection_class
    assert decided.rejection.raw == proposal
    assert of_type(events, BatchDispatched) == []
    assert counter.executions == 0


async def test_an_invalid_proposal_goes_back_to_the_model_which_corrects_it() -> None:
    """Bad input: a string where the tool takes an int (as real models slip)."""
    counter = Counter()
    seen: list[list[str]] = []

    def decide(request: ModelRequest) -> dict[str, Any]:
        if request.step == 1:
            return calls(("c1", "count", {"key": 7}))
        if request.step == 2:
            rejection = request.turns[-1].rejection
            assert rejection is not None
            seen.append(rejection.problems)
            return calls(("c2", "count", {"key": "seven"}))
        return {"kind": "final", "answer": "counted"}

    outcome, events = await run(Agent("a", ScriptedModel(decide), [lookup, counter.tool()]))
    assert outcome.reason is TerminalReason.COMPLETED
    assert outcome.steps == 3  # the rejected proposal is a step: budgets still count
    assert "key" in seen[0][0]
    first, second, _ = of_type(events, DecisionProposed)
    assert first.rejection is not None
    assert second.decision is not None
    assert counter.executions == 1


async def test_invalid_proposals_in_a_row_past_the_limit_end_invalid_decision() -> None:
    """Bad input: an unknown tool, then invalid arguments, then an empty batch, in a row."""
    proposals = [
        calls(("c1", "nope", {})),
        calls(("c2", "count", {"key": 1})),
        {"kind": "tool_calls", "calls": []},
    ]
    outcome, events = await run(Agent("a", ScriptedModel(proposals), [lookup, Counter().tool()]))
    assert outcome.reason is TerminalReason.INVALID_DECISION  # the default: 2 go back
    assert outcome.detail == "the tool batch is empty"
    assert [e.rejection is not None for e in of_type(events, DecisionProposed)] == [True] * 3


async def test_a_valid_proposal_resets_the_count_of_invalid_ones() -> None:
    bad = calls(("c1", "nope", {}))
    script = [
        bad,
        bad,
        calls(("c2", "lookup", {"key": "k"})),
        bad,
        bad,
        {"kind": "final", "answer": "ok"},
    ]
    agent = Agent("a", ScriptedModel(script), [lookup, Counter().tool()])
    outcome, _ = await run(agent)
    assert outcome.reason is TerminalReason.COMPLETED


async def test_rejected_proposals_count_against_max_steps() -> None:
    bad = calls(("c1", "nope", {}))
    agent = Agent("a", ScriptedModel([bad] * 5), [lookup], Budget(max_steps=2))
    outcome, _ = await run(agent)
    assert outcome.reason is TerminalReason.MAX_STEPS


# --------------------------------------------------------------------------- budgets and progress


async def test_repeated_plan_stops_before_its_second_execution() -> None:
    counter = Counter()

    def same(request: ModelRequest) -> dict[str, Any]:
        return calls(("same-call", "count", {"key": "same"}))

    agent = Agent(
        "a",
        ScriptedModel(same),
        [counter.tool()],
        Budget(max_steps=4, max_tool_calls=4, max_repeated_plan=1),
    )
    outcome, events = await run(agent)
    assert outcome.reason is TerminalReason.NO_PROGRESS
    assert counter.executions == 1
    assert len(of_type(events, BatchDispatched)) == 1


async def test_a_different_plan_in_between_resets_the_repeat_count() -> None:
    counter = Counter()
    plans = ["a", "b", "a", "b"]
    script = [calls((f"c{i}", "count", {"key": k})) for i, k in enumerate(plans)] + [final("ok")]
    agent = Agent("a", ScriptedModel(script), [counter.tool()], Budget(max_repeated_plan=1))
    outcome, _ = await run(agent)
    assert outcome.reason is TerminalReason.COMPLETED
    assert counter.executions == 4


async def test_max_steps_stops_the_loop() -> None:
    counter = Counter()

    def new_key(request: ModelRequest) -> dict[str, Any]:
        return calls((f"c{request.step}", "count", {"key": str(request.step)}))

    agent = Agent("a", ScriptedModel(new_key), [counter.tool()], Budget(max_steps=3))
    outcome, _ = await run(agent)
    assert outcome.reason is TerminalReason.MAX_STEPS
    assert (outcome.steps, counter.executions) == (3, 3)


async def test_tool_budget_is_checked_before_anything_runs() -> None:
    counter = Counter()
    batch = calls(*[(f"c{i}", "count", {"key": str(i)}) for i in range(3)])
    agent = Agent("a", ScriptedModel([batch]), [counter.tool()], Budget(max_tool_calls=2))
    outcome, events = await run(agent)
    assert outcome.reason is TerminalReason.TOOL_BUDGET_EXHAUSTED
    assert counter.executions == 0
    assert outcome.tool_calls == 0
    assert of_type(events, BatchDispatched) == []
    assert of_type(events, DecisionProposed)[0].decision is not None


async def test_deadline_passing_while_a_tool_runs_ends_in_deadline_exceeded(
    clock: trio.testing.MockClock,
) -> None:
    @tool
    async def slow(key: str) -> str:
        """Take a long time."""
        await trio.sleep(100)
        return key

    model = ScriptedModel(
        [calls(("c1", "slow", {"key": "x"}), ("c2", "lookup", {"key": "policy"}))]
    )
    agent = Agent("a", model, [slow, lookup], Budget(deadline_s=5), tool_timeout_s=1000)
    outcome, events = await run(agent)
    assert outcome.reason is TerminalReason.DEADLINE_EXCEEDED
    (committed,) = of_type(events, ResultsCommitted)
    assert committed.results[0].error is not None
    assert committed.results[0].error.error_class is ErrorClass.DEADLINE_EXCEEDED
    assert committed.results[1].ok


async def test_deadline_passing_while_the_model_thinks_ends_in_deadline_exceeded(
    clock: trio.testing.MockClock,
) -> None:
    agent = Agent("a", ScriptedModel([final("late")], delay_s=60), budget=Budget(deadline_s=5))
    outcome, events = await run(agent)
    assert outcome.reason is TerminalReason.DEADLINE_EXCEEDED
    assert of_type(events, DecisionProposed) == []


async def test_a_call_that_times_out_gets_a_timeout_result_and_the_loop_goes_on(
    clock: trio.testing.MockClock,
) -> None:
    @tool(timeout_s=2)
    async def hang(key: str) -> str:
        """Never answer."""
        await trio.sleep_forever()
        return key

    seen: list[Any] = []

    def decide(request: ModelRequest) -> dict[str, Any]:
        if request.step == 1:
            return calls(("c1", "hang", {"key": "x"}))
        seen.extend(request.results)
        return final("gave up on it")

    outcome, _ = await run(Agent("a", ScriptedModel(decide), [hang]))
    assert outcome.reason is TerminalReason.COMPLETED
    assert seen[0].error.error_class is ErrorClass.TIMEOUT
    assert seen[0].error.retryable is True


# --------------------------------------------------------------------------- model failures


async def test_a_model_that_raises_ends_in_model_error() -> None:
    def broken(request: ModelRequest) -> dict[str, Any]:
        raise ConnectionError("provider unreachable")

    outcome, events = await run(Agent("a", ScriptedModel(broken)))
    assert outcome.reason is TerminalReason.MODEL_ERROR
    assert outcome.detail is not None
    assert "provider unreachable" in outcome.detail
    assert of_type(events, Terminated)[0].reason is TerminalReason.MODEL_ERROR


async def test_an_exhausted_script_ends_in_model_error() -> None:
    model = ScriptedModel([calls(("c1", "lookup", {"key": "policy"}))])
    outcome, _ = await run(Agent("a", model, [lookup]))
    assert outcome.reason is TerminalReason.MODEL_ERROR
    assert outcome.detail is not None
    assert "ScriptExhaustedError" in outcome.detail


# --------------------------------------------------------------------------- other decisions


async def test_clarification_pauses_with_the_question() -> None:
    model = ScriptedModel([{"kind": "clarification", "question": "Which account?"}])
    outcome, _ = await run(Agent("a", model))
    assert outcome.reason is TerminalReason.CLARIFICATION_REQUIRED
    assert outcome.paused
    assert outcome.exit_code == 3
    assert outcome.detail == "Which account?"


async def test_cannot_continue_ends_with_its_reason() -> None:
    model = ScriptedModel([{"kind": "cannot_continue", "reason": "no access to billing"}])
    outcome, _ = await run(Agent("a", model))
    assert outcome.reason is TerminalReason.CANNOT_CONTINUE
    assert outcome.detail == "no access to billing"
    assert outcome.exit_code == 4


async def test_request_approval_pauses_with_the_digest() -> None:
    model = ScriptedModel([{"kind": "request_approval", "proposal_digest": "abc123"}])
    outcome, _ = await run(Agent("a", model))
    assert outcome.reason is TerminalReason.APPROVAL_REQUIRED
    assert outcome.detail == "abc123"


def test_budget_takes_its_limits_positionally_as_in_the_seed() -> None:
    budget = Budget(4, 4, 1)
    assert (budget.max_steps, budget.max_tool_calls, budget.max_repeated_plan) == (4, 4, 1)
    assert budget.deadline_s is None


@pytest.mark.parametrize(
    "limits",
    [{"max_steps": 0}, {"max_tool_calls": -1}, {"max_repeated_plan": 0}, {"deadline_s": 0}],
)
def test_budget_refuses_limits_out_of_range(limits: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="validation error"):
        Budget(**limits)


async def test_annotated_constraints_are_in_the_schema_and_enforced_before_the_call() -> None:
    counter = Counter()

    @tool
    async def take(n: Annotated[int, Field(ge=1)]) -> int:
        """Take a positive number."""
        counter.executions += 1
        return n

    assert take.schema["properties"]["n"]["minimum"] == 1
    agent = Agent(
        "a", ScriptedModel([calls(("c1", "take", {"n": 0}))]), [take], max_invalid_proposals=0
    )
    outcome, _ = await run(agent)
    assert outcome.reason is TerminalReason.INVALID_DECISION
    assert counter.executions == 0
