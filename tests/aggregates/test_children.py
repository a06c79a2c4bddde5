"""The pure rules of child invocations: ids, shares of the budget, returns, limits.

Bad inputs tried: a second return of one reservation, a return that is not the share
less what was spent, a reservation for a call that starts no child, and a child past
the depth or fan-out limit.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from aggregates import IllegalTransitionError, Invocation, ToolCall, ToolCalls, ToolResult, Usage
from aggregates.children import (
    MAX_DEPTH,
    MAX_FAN_OUT,
    Allotment,
    ChildOutcome,
    Left,
    Spent,
    allot,
    child_id_of,
    depth_problem,
    fan_out_problem,
    unspent_share,
)
from aggregates.decisions import Budget, TerminalReason
from tests.support.invocations import AT, child_dispatched, new


def test_a_child_id_is_the_same_for_the_same_write_and_key_and_differs_otherwise() -> None:
    assert child_id_of("eff-1") == child_id_of("eff-1")
    assert child_id_of("eff-1") != child_id_of("eff-2")
    assert child_id_of("eff-1", "a") != child_id_of("eff-1", "b") != child_id_of("eff-1")
    assert child_id_of("eff-1").startswith("child-")


@given(
    steps=st.integers(0, 200),
    calls=st.integers(0, 200),
    tokens=st.none() | st.integers(0, 10**6),
    children=st.integers(1, 40),
)
def test_equal_shares_never_add_up_to_more_than_is_left(
    steps: int, calls: int, tokens: int | None, children: int
) -> None:
    left = Left(steps=steps, tool_calls=calls, tokens=tokens)
    shares = allot(left, [None] * children)
    given_out = [share for share in shares if share is not None]
    assert sum(share.steps for share in given_out) <= steps
    assert sum(share.tool_calls for share in given_out) <= calls
    if tokens is not None:
        assert sum(share.tokens or 0 for share in given_out) <= tokens
    # A child gets at least one step, or nothing.
    assert all(share.steps >= 1 for share in given_out)
    assert (len(given_out) == children) == (steps // children >= 1)


def test_a_budget_the_tool_gives_is_capped_by_what_is_left() -> None:
    shares = allot(Left(steps=10, tool_calls=5), [Budget(max_steps=8, max_tool_calls=4)] * 2)
    assert [(s.steps, s.tool_calls) for s in shares if s] == [(8, 4), (2, 1)]


def test_a_share_bounds_the_childs_own_budget_and_deadline() -> None:
    share = Allotment(steps=3, tool_calls=2, tokens=500, cost=0.5, deadline_s=10.0)
    bound = share.bound(Budget(max_steps=20, max_tool_calls=50, deadline_s=60.0, max_tokens=900))
    assert (bound.max_steps, bound.max_tool_calls, bound.deadline_s) == (3, 2, 10.0)
    assert (bound.max_tokens, bound.max_cost) == (500, 0.5)


def test_what_comes_back_is_the_share_less_what_was_spent_and_all_of_it_for_an_unread_outcome() -> (
    None
):
    share = Allotment(steps=4, tool_calls=4)
    outcome = ChildOutcome(
        child_id="c",
        terminal_reason=TerminalReason.COMPLETED,
        spent=Spent(steps=2, tool_calls=5),
    )
    assert unspent_share(share, outcome) == (Spent(steps=2, tool_calls=5), Spent(steps=2))
    assert unspent_share(share, None) == (share.reserved, Spent())
    assert ChildOutcome.read({"not": "an outcome"}) is None
    assert ChildOutcome.read(outcome.model_dump(mode="json")) == outcome


def test_the_limits_of_a_tree() -> None:
    assert depth_problem(MAX_DEPTH - 1) is None
    assert depth_problem(MAX_DEPTH) is not None
    assert fan_out_problem(0, MAX_FAN_OUT) is None
    assert fan_out_problem(1, MAX_FAN_OUT) is not None


def _with_reservation() -> Invocation:
    inv = new()
    child = ToolCalls(calls=[ToolCall(id="c1", name="delegate", arguments={"goal": "g"})])
    inv.propose(child, usage=Usage(), at=AT)
    inv.dispatch(child_dispatched(child), [["c1"]], at=AT)
    inv.reserve_budget("c1", "child-1", Allotment(steps=3, tool_calls=2), at=AT)
    inv.commit_results([ToolResult(call_id="c1", name="delegate", output={})], at=AT)
    return inv


def test_a_share_comes_back_once_and_only_as_the_share_less_what_was_spent() -> None:
    inv = _with_reservation()
    assert inv.reserved == Spent(steps=3, tool_calls=2)
    with pytest.raises(IllegalTransitionError, match="allotment less what was used"):
        inv.return_budget("c1", "child-1", Spent(steps=1), Spent(steps=5), at=AT)
    inv.return_budget("c1", "child-1", Spent(steps=1), Spent(steps=2, tool_calls=2), at=AT)
    assert inv.reserved == Spent()
    assert inv.children_spent == Spent(steps=1)
    with pytest.raises(IllegalTransitionError, match="no reservation to return"):
        inv.return_budget("c1", "child-1", Spent(), Spent(), at=AT)


def test_a_reservation_is_for_a_child_call_of_the_dispatched_batch() -> None:
    inv = new()
    child = ToolCalls(calls=[ToolCall(id="c1", name="delegate", arguments={"goal": "g"})])
    inv.propose(child, usage=Usage(), at=AT)
    inv.dispatch(child_dispatched(child), [["c1"]], at=AT)
    with pytest.raises(IllegalTransitionError, match="does not start"):
        inv.reserve_budget("c1", "child-other", Allotment(steps=1, tool_calls=0), at=AT)
    inv.reserve_budget("c1", "child-1", Allotment(steps=1, tool_calls=0), at=AT)
    with pytest.raises(IllegalTransitionError, match="already has a reservation"):
        inv.reserve_budget("c1", "child-1", Allotment(steps=1, tool_calls=0), at=AT)
