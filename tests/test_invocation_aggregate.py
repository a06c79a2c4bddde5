"""The Invocation aggregate refuses every illegal transition, and nothing happens when it does."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from eventsourcing.domain import OriginatorVersionError
from hypothesis import given, settings
from hypothesis import strategies as st

from aggregates import (
    Budget,
    DispatchedCall,
    Effect,
    ErrorClass,
    ErrorInfo,
    Final,
    IllegalTransitionError,
    Invocation,
    Phase,
    TerminalReason,
    ToolCall,
    ToolCalls,
    ToolResult,
    Usage,
)
from aggregates.invocation import replay

AT = datetime(2026, 1, 1, tzinfo=UTC)


def new(budget: Budget | None = None) -> Invocation:
    return Invocation.start(
        invocation_id="inv",
        goal="g",
        agent_name="a",
        agent_version="1",
        catalogue_digest="d",
        tools=[],
        budget=budget or Budget(max_steps=6, max_tool_calls=6, max_repeated_plan=2),
        at=AT,
    )


def batch(*ids: str, key: str = "k") -> ToolCalls:
    return ToolCalls(calls=[ToolCall(id=i, name="lookup", arguments={"key": key}) for i in ids])


def dispatched(decision: ToolCalls) -> list[DispatchedCall]:
    return [
        DispatchedCall(call_id=c.id, name=c.name, arguments=c.arguments, effect=Effect.READ)
        for c in decision.calls
    ]


def ok(call_id: str) -> ToolResult:
    return ToolResult(call_id=call_id, name="lookup", output={"v": 1})


# --------------------------------------------------------------------------- examples


def test_a_decision_is_refused_while_a_batch_is_dispatched() -> None:
    inv = new()
    decision = batch("c1")
    inv.propose(decision, usage=Usage(), at=AT)
    inv.dispatch(dispatched(decision), [["c1"]], at=AT)
    with pytest.raises(IllegalTransitionError):
        inv.propose(Final(answer="x"), usage=Usage(), at=AT)
    assert inv.phase is Phase.DISPATCHED
    assert inv.version == 3


def test_results_must_cover_every_dispatched_call_exactly_once_in_order() -> None:
    inv = new()
    decision = batch("c1", "c2")
    inv.propose(decision, usage=Usage(), at=AT)
    inv.dispatch(dispatched(decision), [["c1", "c2"]], at=AT)
    for wrong in ([ok("c1")], [ok("c2"), ok("c1")], [ok("c1"), ok("c1")], [ok("c1"), ok("x")]):
        with pytest.raises(IllegalTransitionError):
            inv.commit_results(wrong, at=AT)
    inv.commit_results([ok("c1"), ok("c2")], at=AT)
    assert inv.phase is Phase.READY


def test_nothing_is_accepted_after_terminated() -> None:
    inv = new()
    inv.propose(Final(answer="x"), usage=Usage(), at=AT)
    inv.terminate(TerminalReason.COMPLETED, answer="x", at=AT)
    with pytest.raises(IllegalTransitionError):
        inv.propose(Final(answer="y"), usage=Usage(), at=AT)
    with pytest.raises(IllegalTransitionError):
        inv.terminate(TerminalReason.CANCELLED, at=AT)


def test_completed_needs_the_committed_final_answer() -> None:
    inv = new()
    with pytest.raises(IllegalTransitionError):
        inv.terminate(TerminalReason.COMPLETED, answer="made up", at=AT)
    inv.propose(Final(answer="real"), usage=Usage(), at=AT)
    with pytest.raises(IllegalTransitionError):
        inv.terminate(TerminalReason.COMPLETED, answer="other", at=AT)


def test_duplicate_call_ids_and_empty_batches_are_not_decisions() -> None:
    inv = new()
    with pytest.raises(IllegalTransitionError):
        inv.propose(batch("c1", "c1"), usage=Usage(), at=AT)
    with pytest.raises(IllegalTransitionError):
        inv.propose(ToolCalls(calls=[]), usage=Usage(), at=AT)
    assert inv.version == 1


def test_dispatch_refuses_to_exceed_the_tool_budget_or_repeat_a_plan() -> None:
    inv = new(Budget(max_tool_calls=1, max_repeated_plan=1))
    decision = batch("c1", "c2")
    inv.propose(decision, usage=Usage(), at=AT)
    with pytest.raises(IllegalTransitionError):
        inv.dispatch(dispatched(decision), [["c1", "c2"]], at=AT)

    inv = new(Budget(max_repeated_plan=1))
    for step in range(2):
        decision = batch(f"c{step}")
        inv.propose(decision, usage=Usage(), at=AT)
        if step == 0:
            inv.dispatch(dispatched(decision), [[f"c{step}"]], at=AT)
            inv.commit_results([ok("c0")], at=AT)
    with pytest.raises(IllegalTransitionError):
        inv.dispatch(dispatched(decision), [["c1"]], at=AT)


def test_a_pausing_reason_cannot_terminate_and_a_final_one_cannot_pause() -> None:
    inv = new()
    inv.propose(Final(answer="x"), usage=Usage(), at=AT)
    with pytest.raises(IllegalTransitionError):
        inv.terminate(TerminalReason.APPROVAL_REQUIRED, at=AT)
    with pytest.raises(IllegalTransitionError):
        inv.pause(TerminalReason.CANCELLED, at=AT)


# --------------------------------------------------------------------------- properties

COMMANDS = ["propose_calls", "propose_final", "dispatch", "results", "terminate", "pause"]


def apply(inv: Invocation, command: str, n: int) -> None:
    """Apply one command, built as plausibly as possible from the current state."""
    decision = inv.last_decision
    match command:
        case "propose_calls":
            inv.propose(batch(f"c{n}", key=str(n % 3)), usage=Usage(), at=AT)
        case "propose_final":
            inv.propose(Final(answer=f"a{n}"), usage=Usage(), at=AT)
        case "dispatch":
            calls = decision.calls if isinstance(decision, ToolCalls) else batch(f"c{n}").calls
            inv.dispatch(dispatched(ToolCalls(calls=calls)), [[c.id for c in calls]], at=AT)
        case "results":
            pending = inv.pending_batch
            ids = [c.call_id for c in pending.calls] if pending else [f"c{n}"]
            inv.commit_results(
                [
                    ToolResult(
                        call_id=i,
                        name="lookup",
                        error=ErrorInfo(
                            error_class=ErrorClass.TIMEOUT, retryable=True, message="slow"
                        ),
                    )
                    for i in ids
                ],
                at=AT,
            )
        case "terminate":
            reasons = [TerminalReason.COMPLETED, TerminalReason.CANCELLED, TerminalReason.MAX_STEPS]
            reason = reasons[n % 3]
            answer = decision.answer if isinstance(decision, Final) else None
            inv.terminate(reason, answer=answer, at=AT)
        case "pause":
            inv.pause(TerminalReason.CLARIFICATION_REQUIRED, question="?", at=AT)


def snapshot(inv: Invocation) -> Any:
    return (
        inv.version,
        inv.phase,
        inv.step,
        inv.tool_calls,
        len(inv.turns),
        inv.pending_batch,
        inv.terminated,
        inv.repeat_streak,
        len(inv.pending_events),
    )


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(COMMANDS), st.integers(0, 5)), max_size=25))
def test_random_command_orders_either_apply_or_change_nothing(
    commands: list[tuple[str, int]],
) -> None:
    inv = new()
    for command, n in commands:
        before = snapshot(inv)
        try:
            apply(inv, command, n)
        except IllegalTransitionError:
            assert snapshot(inv) == before
        else:
            assert inv.version == before[0] + 1
        # Invariants that hold after every accepted or refused command.
        assert inv.tool_calls <= inv.budget.max_tool_calls
        assert inv.step <= inv.budget.max_steps
        assert (inv.phase is Phase.DISPATCHED) == (inv.pending_batch is not None)
        assert [t.step for t in inv.turns] == list(range(1, inv.step + 1))
    # Replaying what was accepted rebuilds the same state.
    events = inv.take_events()
    rebuilt = replay(None, events)
    assert rebuilt is not None
    assert snapshot(rebuilt)[:-1] == snapshot(inv)[:-1]


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_a_shuffled_or_trimmed_history_is_refused_on_replay(data: st.DataObject) -> None:
    inv = new()
    for n in range(3):
        decision = batch(f"c{n}", key=str(n))
        inv.propose(decision, usage=Usage(), at=AT)
        inv.dispatch(dispatched(decision), [[f"c{n}"]], at=AT)
        inv.commit_results([ok(f"c{n}")], at=AT)
    inv.propose(Final(answer="done"), usage=Usage(), at=AT)
    inv.terminate(TerminalReason.COMPLETED, answer="done", at=AT)
    events = inv.take_events()
    order = data.draw(st.permutations(range(len(events))))
    if list(order) == sorted(order):
        return
    reordered = [events[i] for i in order]
    # Our transition check, eventsourcing's version check, or its "created first" assert.
    with pytest.raises((IllegalTransitionError, OriginatorVersionError, AssertionError)):
        replay(None, reordered)
