"""The shares of children a write's body starts (``ToolContext.run_agent``), in the pure core.

The core decides each child's share while the batch runs (``TurnCore.reserve_for_child``)
and counts what comes back (``TurnCore.return_from_child``); the aggregate checks each
``BudgetReserved`` / ``BudgetReturned`` against the batch.

Bad inputs tried: a call that is not a write of the batch, a child id that the call's key
and the body's key do not give, a key on a child tool's reservation, a second share for
the same child, a return of a share never set aside, shares asked past what is left (steps
and tool calls), a cancel request, a parent too deep, an old snapshot keyed by call id.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from aggregates import IllegalTransitionError, Invocation, ToolCall, ToolCalls, Usage
from aggregates.children import MAX_FAN_OUT, Allotment, Spent, child_id_of
from aggregates.decisions import Budget
from aggregates.invocation import (
    BudgetReserved,
    BudgetReturned,
    InvocationSnapshot,
    InvocationState,
    Phase,
)
from aggregates.turn import Moment, RunCalls
from tests.support.invocations import AT, child_dispatched, dispatch_write, new
from tests.support.replies import calls
from tests.support.turn_core import Shell, key_of


def _running(budget: Budget) -> tuple[Shell, str]:
    """A shell whose batch of one write (``send``, call ``c1``) runs; its effect key."""
    shell = Shell.over(budget=budget)
    shell.begin()
    action = shell.answer(calls(("c1", "send", {"to": "bob"})))
    assert isinstance(action, RunCalls)
    return shell, key_of(action, "c1")


def _reserve(shell: Shell, key: str, name: str, asked: Budget) -> Allotment | str:
    return shell.core.reserve_for_child("c1", child_id_of(key, name), name, asked, shell.now)


def test_a_child_from_code_asks_its_budget_capped_by_what_is_left_and_the_parent_keeps_a_step() -> (
    None
):
    shell, key = _running(Budget(max_steps=10, max_tool_calls=8))
    first = _reserve(shell, key, "a", Budget(max_steps=4, max_tool_calls=3))
    assert first == Allotment(steps=4, tool_calls=3)
    # 10 steps, 1 taken, 1 kept for the next decision, 4 held: 4 left; 8 calls, 1 made, 3 held.
    second = _reserve(shell, key, "b", Budget(max_steps=20, max_tool_calls=50))
    assert second == Allotment(steps=4, tool_calls=4)
    reserved = shell.core.take_events()
    assert [type(e) for e in reserved] == [BudgetReserved, BudgetReserved]
    assert all(isinstance(e, BudgetReserved) and e.from_code for e in reserved)
    assert shell.invocation.children_started == 2
    assert shell.invocation.reserved == Spent(steps=8, tool_calls=7)


def test_no_step_or_no_tool_call_left_refuses_the_child_and_records_nothing() -> None:
    shell, key = _running(Budget(max_steps=10, max_tool_calls=8))
    _reserve(shell, key, "a", Budget(max_steps=20, max_tool_calls=3))  # takes all 8 steps
    no_step = _reserve(shell, key, "b", Budget(max_steps=2, max_tool_calls=1))
    assert isinstance(no_step, str)
    assert no_step.startswith("not started: this invocation has no step left to give a child")
    shell2, key2 = _running(Budget(max_steps=10, max_tool_calls=4))
    _reserve(shell2, key2, "a", Budget(max_steps=2, max_tool_calls=50))  # takes the 3 calls left
    no_call = _reserve(shell2, key2, "b", Budget(max_steps=2, max_tool_calls=5))
    assert isinstance(no_call, str)
    assert "no tool call left to give a child (1 of 4 made, 3 held by its running children)" in (
        no_call
    )
    assert "budgets that fit together" in no_call
    assert [type(e) for e in shell2.core.take_events()] == [BudgetReserved]  # only the first
    # A child that asks for no tool call may start with none.
    assert _reserve(shell2, key2, "c", Budget(max_steps=2, max_tool_calls=0)) == Allotment(
        steps=2, tool_calls=0
    )


def test_a_share_that_comes_back_is_there_for_the_next_child() -> None:
    shell, key = _running(Budget(max_steps=10, max_tool_calls=8))
    _reserve(shell, key, "draft", Budget(max_steps=20, max_tool_calls=50))
    assert isinstance(_reserve(shell, key, "review", Budget()), str)  # nothing left meanwhile
    shell.core.return_from_child(child_id_of(key, "draft"), Spent(steps=2, tool_calls=1), shell.now)
    events = shell.core.take_events()
    returned = [e for e in events if isinstance(e, BudgetReturned)]
    assert [(e.spent, e.returned) for e in returned] == [
        (Spent(steps=2, tool_calls=1), Spent(steps=6, tool_calls=6))
    ]
    assert shell.invocation.phase is Phase.DISPATCHED
    assert shell.invocation.children_spent == Spent(steps=2, tool_calls=1)
    # 10 - 1 taken - 1 kept - 2 the draft used = 6 steps; 8 - 1 - 1 = 6 calls.
    assert _reserve(shell, key, "review", Budget()) == Allotment(steps=6, tool_calls=6)
    # A second return of the same child does nothing.
    shell.core.return_from_child(child_id_of(key, "draft"), Spent(), shell.now)
    assert [type(e) for e in shell.core.take_events()] == [BudgetReserved]


def test_the_same_child_asked_again_gets_its_share_and_nothing_new_is_recorded() -> None:
    shell, key = _running(Budget(max_steps=10))
    first = _reserve(shell, key, "a", Budget(max_steps=3))
    shell.core.take_events()
    assert _reserve(shell, key, "a", Budget(max_steps=9)) == first
    assert shell.core.take_events() == []
    assert shell.invocation.children_started == 1


def test_a_child_is_refused_for_a_call_that_is_not_a_write_of_the_batch_or_another_id() -> None:
    shell, key = _running(Budget())
    now = shell.now
    wrong_call = shell.core.reserve_for_child("c9", child_id_of(key, "a"), "a", Budget(), now)
    assert wrong_call == "not started: call c9 is not a write of the batch inv-1 runs"
    wrong_id = shell.core.reserve_for_child("c1", child_id_of(key, "b"), "a", Budget(), now)
    assert wrong_id == f"not started: call c1 does not start {child_id_of(key, 'b')}"
    assert shell.core.take_events() == []


def test_a_cancel_request_or_the_fan_out_limit_refuses_the_child() -> None:
    shell, key = _running(Budget(max_steps=200, max_tool_calls=200))
    cancelled = Moment(at=AT, elapsed_s=0.0, cancel_requested=True)
    asked = Budget(max_steps=1, max_tool_calls=1)
    refused = shell.core.reserve_for_child("c1", child_id_of(key, "a"), "a", asked, cancelled)
    assert refused == "not started: its parent inv-1 was cancelled"
    for n in range(MAX_FAN_OUT):
        assert isinstance(_reserve(shell, key, f"k{n}", asked), Allotment)
    too_many = _reserve(shell, key, "one more", asked)
    assert isinstance(too_many, str)
    assert f"one invocation starts at most {MAX_FAN_OUT}" in too_many


@given(
    asks=st.lists(
        st.tuples(st.integers(1, 30), st.integers(0, 30), st.booleans()), min_size=1, max_size=12
    ),
    steps=st.integers(2, 40),
    tool_calls=st.integers(1, 40),
)
def test_children_from_code_never_hold_more_than_the_parent_has(
    asks: list[tuple[int, int, bool]], steps: int, tool_calls: int
) -> None:
    """Siblings started one after another, some settling between: never past the budget."""
    shell, key = _running(Budget(max_steps=steps, max_tool_calls=tool_calls))
    inv = shell.invocation
    for n, (want_steps, want_calls, settles) in enumerate(asks):
        share = _reserve(
            shell, key, f"k{n}", Budget(max_steps=want_steps, max_tool_calls=want_calls)
        )
        if isinstance(share, Allotment):
            assert share.steps <= want_steps
            assert share.tool_calls <= want_calls
            if settles:
                used = Spent(steps=share.steps // 2, tool_calls=share.tool_calls // 2)
                shell.core.return_from_child(child_id_of(key, f"k{n}"), used, shell.now)
        held = inv.children_spent.plus(inv.reserved)
        assert inv.step + held.steps <= steps - 1  # one step kept for the next decision
        assert inv.tool_calls + held.tool_calls <= tool_calls
    shell.core.take_events()


# --------------------------------------------------------------------------- the aggregate


def _dispatched_write() -> tuple[Invocation, str]:
    inv = new()
    return inv, dispatch_write(inv)


def test_the_aggregate_takes_a_share_from_code_only_for_the_id_its_write_and_key_give() -> None:
    inv, key = _dispatched_write()
    share = Allotment(steps=1, tool_calls=0)
    with pytest.raises(IllegalTransitionError, match="does not start"):
        inv.reserve_budget("c1", "child-other", share, at=AT, from_code=True, key="a")
    with pytest.raises(IllegalTransitionError, match="only a child started from code has a key"):
        inv.reserve_budget("c1", child_id_of(key, "a"), share, at=AT, key="a")
    inv.reserve_budget("c1", child_id_of(key, "a"), share, at=AT, from_code=True, key="a")
    inv.reserve_budget("c1", child_id_of(key, None), share, at=AT, from_code=True)
    with pytest.raises(IllegalTransitionError, match="already has a reservation"):
        inv.reserve_budget("c1", child_id_of(key, "a"), share, at=AT, from_code=True, key="a")
    assert inv.children_started == 2
    # Returned while the batch runs; once.
    inv.return_budget("c1", child_id_of(key, "a"), Spent(steps=1), Spent(), at=AT)
    assert inv.phase is Phase.DISPATCHED
    with pytest.raises(IllegalTransitionError, match="no reservation to return"):
        inv.return_budget("c1", child_id_of(key, "a"), Spent(steps=1), Spent(), at=AT)


def test_a_child_tools_call_takes_no_share_from_code() -> None:
    inv = new()
    batch = ToolCalls(calls=[ToolCall(id="c1", name="delegate", arguments={"goal": "g"})])
    inv.propose(batch, usage=Usage(), at=AT)
    inv.dispatch(child_dispatched(batch), [["c1"]], at=AT)
    with pytest.raises(IllegalTransitionError, match="started by a write's body"):
        inv.reserve_budget(
            "c1",
            child_id_of("eff-c1", "a"),
            Allotment(steps=1, tool_calls=0),
            at=AT,
            from_code=True,
            key="a",
        )


def test_a_snapshot_that_keyed_shares_by_call_id_is_read_keyed_by_child_id() -> None:
    inv = new()
    batch = ToolCalls(calls=[ToolCall(id="c1", name="delegate", arguments={"goal": "g"})])
    inv.propose(batch, usage=Usage(), at=AT)
    inv.dispatch(child_dispatched(batch), [["c1"]], at=AT)
    inv.reserve_budget("c1", "child-1", Allotment(steps=3, tool_calls=2), at=AT)
    state = InvocationSnapshot.take(inv).state.model_dump(mode="json")
    assert list(state["reservations"]) == ["child-1"]
    state["reservations"] = {"c1": state["reservations"]["child-1"]}  # as older ones were
    read = InvocationState.model_validate(state)
    assert list(read.reservations) == ["child-1"]
    assert read.reservations["child-1"].call_id == "c1"
