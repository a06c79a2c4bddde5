"""Sub-agents: ``Agent.as_tool`` and ``ToolContext.run_agent`` run child invocations.

A child is an invocation of its own whose start is a write in its parent's ledger: its
id derives from the call's effect key and is recorded in the parent's
``BatchDispatched``; its share of the parent's budget is reserved (``BudgetReserved``)
and what it did not use comes back once (``BudgetReturned``); the tree's limits (depth,
fan-out, steps left) refuse a child with a result the model sees; a cancelled parent
cancels its children, and a child that would start after the cancel never runs.

Bad inputs tried: a tool name that is not an identifier, a budget that is not a
Budget, an unknown ``on_parent_end``; ``run_agent`` from a read tool, with something
that is not an Agent, with an empty goal or key, with a budget that is not a Budget,
past what the parent has left (steps, tool calls), on a store locked by another
connection; a body that fails while its child runs; and a child tool called as a plain
function outside a run.
"""

from __future__ import annotations

import json
import sqlite3
from collections import Counter
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import trio

from aggregates.children import MAX_DEPTH, MAX_FAN_OUT, ChildOutcome, Spent, child_id_of
from aggregates.invocation import BatchDispatched, BudgetReserved, BudgetReturned
from loop_actors import (
    Agent,
    Budget,
    InvocationNotFoundError,
    ModelReply,
    ModelRequest,
    Outcome,
    Reconciled,
    Resolution,
    Runtime,
    ScriptedModel,
    TerminalReason,
    Tool,
    ToolContext,
    ToolError,
    UsageError,
    tool,
)
from loop_actors.cli import main
from tests.support.children_app import ORCHESTRATOR, charges, fan_out

CHARGED: list[tuple[str, int]] = []


@tool(effect="write")
def charge(amount: int, context: ToolContext) -> dict[str, Any]:
    """Charge an amount."""
    assert context.effect_key is not None
    CHARGED.append((context.effect_key, amount))
    return {"charged": amount}


def _pays(request: ModelRequest) -> dict[str, Any]:
    if request.step == 1:
        amount = int(request.goal.split()[-1])
        return {
            "kind": "tool_calls",
            "calls": [{"id": "c1", "name": "charge", "arguments": {"amount": amount}}],
        }
    return {"kind": "final", "answer": f"paid {request.goal.split()[-1]}"}


PAYER = Agent("payer", ScriptedModel(_pays), [charge], budget=Budget(max_steps=4))


def calls(*goals: str, tool_name: str = "payer") -> dict[str, Any]:
    return {
        "kind": "tool_calls",
        "calls": [
            {"id": f"p{i}", "name": tool_name, "arguments": {"goal": goal}}
            for i, goal in enumerate(goals)
        ],
    }


def boss(
    first: dict[str, Any], *, budget: Budget | None = None, tools: list[Any] | None = None
) -> Agent:
    def decide(request: ModelRequest) -> dict[str, Any]:
        if request.step == 1:
            return first
        return {"kind": "final", "answer": "done"}

    return Agent(
        "boss",
        ScriptedModel(decide),
        tools if tools is not None else [PAYER.as_tool()],
        budget=budget or Budget(max_steps=10, max_tool_calls=10),
    )


async def history_of(runtime: Runtime, invocation_id: str) -> list[Any]:
    return list(await runtime.history(invocation_id))


async def run_then_cancel(
    runtime: Runtime, parent: Agent, reached: trio.Event, detail: str | None = None
) -> Outcome:
    """Run ``parent`` as ``root``; once ``reached`` is set, cancel it; its outcome."""
    done: list[Outcome] = []

    async def run() -> None:
        done.append(await runtime.run(parent, "go", invocation_id="root"))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(run)
        await reached.wait()
        assert runtime.cancel("root", detail=detail)
    return done[0]


@pytest.fixture
def db(tmp_path: Path) -> str:
    CHARGED.clear()
    return f"sqlite:///{tmp_path / 'events.db'}"


async def test_a_delegated_call_runs_the_child_as_an_invocation_of_its_own(db: str) -> None:
    with trio.fail_after(30):
        async with Runtime(db) as runtime:
            outcome = await runtime.run(
                boss(calls("pay 10", "pay 20")), "pay", invocation_id="root"
            )
            events = await history_of(runtime, "root")
            (batch,) = [e for e in events if isinstance(e, BatchDispatched)]
            children = {}
            for call in batch.calls:
                assert call.effect_key is not None
                assert call.child_id == child_id_of(call.effect_key)
                children[call.call_id] = await runtime.load(call.child_id)
    assert outcome.reason is TerminalReason.COMPLETED
    assert sorted(amount for _, amount in CHARGED) == [10, 20]
    for call_id, child in children.items():
        assert child.parent is not None
        assert (child.parent.parent_id, child.parent.root_id, child.parent.call_id) == (
            "root",
            "root",
            call_id,
        )
        assert child.parent.depth == 1
        assert child.goal in {"pay 10", "pay 20"}
        # Its own history: started, one charge, answered.
        assert child.step == 2
        assert child.tool_calls == 1
    # The parent's share for each: (10 steps - 1 taken - 1 kept) / 2, (10 - 2 calls) / 2.
    reserved = [e for e in events if isinstance(e, BudgetReserved)]
    assert [(e.allotment.steps, e.allotment.tool_calls) for e in reserved] == [(4, 4), (4, 4)]
    assert all(children[e.call_id].budget.max_steps == 4 for e in reserved)
    returned = [e for e in events if isinstance(e, BudgetReturned)]
    assert sorted(e.call_id for e in returned) == ["p0", "p1"]
    assert all((e.spent.steps, e.spent.tool_calls) == (2, 1) for e in returned)
    assert all((e.returned.steps, e.returned.tool_calls) == (2, 3) for e in returned)
    # The call's result is the child's outcome; the parent's totals keep the children apart.
    results = {r.call_id: ChildOutcome.read(r.output) for r in outcome_results(events)}
    assert {r.answer for r in results.values() if r} == {"paid 10", "paid 20"}
    assert (outcome.steps, outcome.tool_calls) == (2, 2)
    assert outcome.children is not None
    assert (outcome.children.steps, outcome.children.tool_calls) == (4, 2)


def outcome_results(events: list[Any]) -> list[Any]:
    return [
        result for e in events if type(e).__name__ == "ResultsCommitted" for result in e.results
    ]


async def test_parallel_children_cannot_spend_more_tool_calls_than_their_parent_has(
    db: str,
) -> None:
    """Three children that each try 6 calls under a parent with max_tool_calls=10."""

    @tool
    def look(n: int) -> int:
        """Look something up."""
        return n

    def greedy(request: ModelRequest) -> dict[str, Any]:
        if request.step <= 6:
            return {
                "kind": "tool_calls",
                "calls": [
                    {"id": f"l{request.step}", "name": "look", "arguments": {"n": request.step}}
                ],
            }
        return {"kind": "final", "answer": "looked"}

    looker = Agent("looker", ScriptedModel(greedy), [look], budget=Budget(max_steps=20))
    parent = boss(
        calls("a", "b", "c", tool_name="looker"),
        budget=Budget(max_steps=30, max_tool_calls=10),
        tools=[looker.as_tool()],
    )
    with trio.fail_after(30):
        async with Runtime(db) as runtime:
            outcome = await runtime.run(parent, "look around", invocation_id="root")
            events = await history_of(runtime, "root")
            kids = [await runtime.load(e.child_id) for e in events if isinstance(e, BudgetReserved)]
    assert len(kids) == 3
    assert all(kid.terminated is not None for kid in kids)
    assert {kid.terminated.reason for kid in kids if kid.terminated} == {
        TerminalReason.TOOL_BUDGET_EXHAUSTED
    }
    tree_calls = outcome.tool_calls + sum(kid.tool_calls for kid in kids)
    assert tree_calls <= 10
    returned = Counter(e.call_id for e in events if isinstance(e, BudgetReturned))
    assert returned == Counter({"p0": 1, "p1": 1, "p2": 1})  # each share comes back once
    assert outcome.children is not None
    assert outcome.children.tool_calls == sum(kid.tool_calls for kid in kids)


def _looker(budget: Budget) -> Agent:
    """A child that tries six lookups, one a step, then answers."""

    @tool
    def look(n: int) -> int:
        """Look something up."""
        return n

    def greedy(request: ModelRequest) -> dict[str, Any]:
        if request.step <= 6:
            call = {"id": f"l{request.step}", "name": "look", "arguments": {"n": request.step}}
            return {"kind": "tool_calls", "calls": [call]}
        return {"kind": "final", "answer": "looked"}

    return Agent("looker", ScriptedModel(greedy), [look], budget=budget)


def _fans_out(looker: Agent, names: tuple[str, ...]) -> Tool:
    @tool(effect="write")
    async def fan(context: ToolContext, goal: str) -> dict[str, str]:
        """Run the lookers at once; each outcome's reason, or why it did not start."""
        got: dict[str, str] = {}

        async def one(name: str) -> None:
            try:
                outcome = await context.run_agent(looker, f"look {name}", key=name)
            except ToolError as refused:
                got[name] = str(refused)
            else:
                got[name] = outcome.terminal_reason.value

        async with trio.open_nursery() as nursery:
            for name in names:
                nursery.start_soon(one, name)
        return got

    return fan


async def test_children_run_from_code_cannot_spend_more_tool_calls_than_their_parent_has(
    db: str,
) -> None:
    """Three children from code that each try 6 calls under a parent with max_tool_calls=10."""
    looker = _looker(Budget(max_steps=8, max_tool_calls=6))
    parent = boss(
        calls("x", tool_name="fan"),
        budget=Budget(max_steps=30, max_tool_calls=10),
        tools=[_fans_out(looker, ("a", "b", "c"))],
    )
    with trio.fail_after(30):
        async with Runtime(db) as runtime:
            outcome = await runtime.run(parent, "look around", invocation_id="root")
            events = await history_of(runtime, "root")
            reserved = [e for e in events if isinstance(e, BudgetReserved)]
            kids = [await runtime.load(e.child_id) for e in reserved]
    assert outcome.reason is TerminalReason.COMPLETED
    # The parent made its call: 9 left. The first child to start gets its 6, the next
    # the 3 left, the third none (refused, nothing recorded for it).
    assert sorted(e.allotment.tool_calls for e in reserved) == [3, 6]
    assert all(e.from_code for e in reserved)
    (result,) = outcome_results(events)
    got = result.output
    assert isinstance(got, dict)
    (refused,) = [text for text in got.values() if text.startswith("not started")]
    ran = sorted(text for text in got.values() if text != refused)
    assert ran == ["completed", "tool_budget_exhausted"]
    assert "no tool call left to give a child (1 of 10 made, 9 held" in refused
    tree_calls = outcome.tool_calls + sum(kid.tool_calls for kid in kids)
    assert tree_calls == 10
    returned = [e for e in events if isinstance(e, BudgetReturned)]
    assert Counter(e.child_id for e in returned) == Counter(kid.id for kid in kids)  # once each
    assert outcome.children is not None
    assert outcome.children.tool_calls == 9
    assert outcome.children.steps == sum(kid.step for kid in kids)
    assert result.child_ids is not None
    assert sorted(result.child_ids) == sorted(kid.id for kid in kids)


async def test_children_run_one_after_another_from_code_each_get_what_the_last_left(
    db: str,
) -> None:
    looker = _looker(Budget(max_steps=20, max_tool_calls=50))  # asks for more than there is

    @tool(effect="write")
    async def in_turn(context: ToolContext, goal: str) -> list[str]:
        """Run two lookers, one after the other."""
        first = await context.run_agent(looker, "look once", key="first")
        second = await context.run_agent(looker, "look again", key="second")
        return [first.terminal_reason.value, second.terminal_reason.value]

    parent = boss(
        calls("x", tool_name="in_turn"),
        budget=Budget(max_steps=30, max_tool_calls=20),
        tools=[in_turn],
    )
    with trio.fail_after(30):
        async with Runtime(db) as runtime:
            outcome = await runtime.run(parent, "look around", invocation_id="root")
            events = await history_of(runtime, "root")
    reserved = [e.allotment.tool_calls for e in events if isinstance(e, BudgetReserved)]
    # 19 left after the parent's call; the first used 6 of them, so the second gets 13.
    assert reserved == [19, 13]
    (result,) = outcome_results(events)
    assert result.output == ["completed", "completed"]
    assert outcome.children is not None
    assert outcome.children.tool_calls == 12


async def test_a_child_past_the_depth_limit_is_refused_with_a_result_the_model_sees(
    db: str,
) -> None:
    seen: dict[str, Any] = {}

    def leaf(request: ModelRequest) -> dict[str, Any]:
        return {"kind": "final", "answer": "leaf"}

    agent = Agent(f"level{MAX_DEPTH + 1}", ScriptedModel(leaf), [])
    for level in range(MAX_DEPTH, -1, -1):
        below = agent

        def delegate(
            request: ModelRequest, name: str = below.name, level: int = level
        ) -> dict[str, Any]:
            if request.step == 1:
                return calls("go down", tool_name=name)
            seen[f"level{level}"] = request.turns[-1].results[0]
            return {"kind": "final", "answer": f"level {level} done"}

        agent = Agent(f"level{level}", ScriptedModel(delegate), [below.as_tool()])
    with trio.fail_after(60):
        async with Runtime(db) as runtime:
            outcome = await runtime.run(agent, "dig", invocation_id="root")
    assert outcome.reason is TerminalReason.COMPLETED
    deepest = seen[f"level{MAX_DEPTH}"]  # at depth MAX_DEPTH: its child would be deeper
    assert deepest.error is not None
    assert deepest.error.error_class.value == "denied"
    assert f"past the limit of {MAX_DEPTH}" in deepest.error.message
    assert seen[f"level{MAX_DEPTH - 1}"].error is None


async def test_more_children_than_the_fan_out_limit_start_none(db: str) -> None:
    goals = [f"pay {n}" for n in range(MAX_FAN_OUT + 1)]
    parent = boss(calls(*goals), budget=Budget(max_steps=200, max_tool_calls=200))
    with trio.fail_after(30):
        async with Runtime(db) as runtime:
            outcome = await runtime.run(parent, "pay everyone", invocation_id="root")
            events = await history_of(runtime, "root")
    assert outcome.reason is TerminalReason.COMPLETED
    assert not CHARGED
    assert not [e for e in events if isinstance(e, BudgetReserved)]
    messages = {r.error.message for r in outcome_results(events) if r.error}
    assert messages == {
        f"not started: this invocation has started 0 children and one invocation starts "
        f"at most {MAX_FAN_OUT}"
    }


async def test_a_parent_with_no_step_to_spare_starts_no_child(db: str) -> None:
    parent = boss(calls("pay 5"), budget=Budget(max_steps=2, max_tool_calls=5))
    with trio.fail_after(30):
        async with Runtime(db) as runtime:
            outcome = await runtime.run(parent, "pay", invocation_id="root")
            events = await history_of(runtime, "root")
    assert outcome.reason is TerminalReason.COMPLETED
    assert not CHARGED
    (result,) = outcome_results(events)
    assert result.error is not None
    assert "no step left to give a child" in result.error.message


async def test_cancelling_the_parent_cancels_its_running_child_naming_the_parent(db: str) -> None:
    started = trio.Event()

    @tool(effect="write")
    async def wait_for_ever(context: ToolContext) -> str:
        """Wait."""
        started.set()
        await trio.sleep_forever()
        return "never"

    def waits(request: ModelRequest) -> dict[str, Any]:
        return {
            "kind": "tool_calls",
            "calls": [{"id": "w", "name": "wait_for_ever", "arguments": {}}],
        }

    waiter = Agent("waiter", ScriptedModel(waits), [wait_for_ever])
    parent = boss(calls("wait", tool_name="waiter"), tools=[waiter.as_tool()])
    with trio.fail_after(30):
        async with Runtime(db) as runtime:
            outcome = await run_then_cancel(runtime, parent, started, "ops said stop")
            events = await history_of(runtime, "root")
            (reserved,) = [e for e in events if isinstance(e, BudgetReserved)]
            child = await runtime.load(reserved.child_id)
    assert outcome.reason is TerminalReason.CANCELLED
    assert child.terminated is not None
    assert child.terminated.reason is TerminalReason.CANCELLED
    assert child.terminated.detail is not None
    assert "its parent root was cancelled (ops said stop)" in child.terminated.detail


async def test_a_child_that_would_start_after_the_parents_cancel_never_runs(db: str) -> None:
    """The late spawn: the tool's body starts its child after the cancel request."""
    asked: list[str] = []
    reached = trio.Event()

    def child_model(request: ModelRequest) -> dict[str, Any]:
        asked.append(request.goal)
        return {"kind": "final", "answer": "ran"}

    late = Agent("late", ScriptedModel(child_model), [])

    @tool(effect="write")
    async def orchestrate(context: ToolContext) -> str:
        """Start a child once the parent is cancelled."""
        reached.set()
        with trio.CancelScope(shield=True):
            await trio.sleep(0.1)  # the cancel request comes meanwhile
            outcome = await context.run_agent(late, "too late", key="late")
        return outcome.terminal_reason.value

    parent = boss(
        {"kind": "tool_calls", "calls": [{"id": "o", "name": "orchestrate", "arguments": {}}]},
        tools=[orchestrate],
    )
    with trio.fail_after(30):
        async with Runtime(db) as runtime:
            outcome = await run_then_cancel(runtime, parent, reached)
            events = await history_of(runtime, "root")
            (batch,) = [e for e in events if isinstance(e, BatchDispatched)]
            key = batch.calls[0].effect_key
            assert key is not None
            with pytest.raises(Exception, match="no invocation"):
                await runtime.load(child_id_of(key, "late"))
    assert outcome.reason is TerminalReason.CANCELLED
    assert not asked  # the child's model was never asked
    (result,) = outcome_results(events)
    assert result.error is not None
    assert "not started: its parent root was cancelled" in result.error.message


async def test_a_child_registered_after_the_parents_cancel_starts_cancelled(
    db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cancel arrives while the child's start is being recorded (forced here)."""
    asked: list[str] = []

    def child_model(request: ModelRequest) -> dict[str, Any]:
        asked.append(request.goal)
        return {"kind": "final", "answer": "ran"}

    racer = Agent("racer", ScriptedModel(child_model), [])
    parent = boss(calls("race", tool_name="racer"), tools=[racer.as_tool()])
    with trio.fail_after(30):
        async with Runtime(db) as runtime:
            driver = runtime.driver
            real_start = driver.start

            async def start_then_cancel(**kwargs: Any) -> Any:
                runtime.cancel("root", detail="raced")  # after the runner looked
                return await real_start(**kwargs)

            monkeypatch.setattr(driver, "start", start_then_cancel)
            outcome = await runtime.run(parent, "race", invocation_id="root")
            events = await history_of(runtime, "root")
            (reserved,) = [e for e in events if isinstance(e, BudgetReserved)]
            child = await runtime.load(reserved.child_id)
    assert outcome.reason is TerminalReason.CANCELLED
    assert not asked
    assert child.terminated is not None
    assert child.terminated.reason is TerminalReason.CANCELLED
    assert "its parent root was cancelled (raced)" in (child.terminated.detail or "")


@tool(effect="write", requires_approval=True)
def big_charge(amount: int, context: ToolContext) -> dict[str, Any]:
    """Charge a large amount (a person approves it first)."""
    assert context.effect_key is not None
    CHARGED.append((context.effect_key, amount))
    return {"charged": amount}


def _asks_approval(request: ModelRequest) -> dict[str, Any]:
    if request.step == 1:
        return {
            "kind": "tool_calls",
            "calls": [{"id": "b", "name": "big_charge", "arguments": {"amount": 900}}],
        }
    return {"kind": "final", "answer": "paid 900"}


APPROVER = Agent("approver", ScriptedModel(_asks_approval), [big_charge])


def _counting(agent: Agent, asked: Counter[str]) -> Agent:
    """``agent`` whose model counts the steps it is asked for, by step."""
    model = agent.model

    class Counting:
        async def decide(self, request: ModelRequest) -> Any:
            asked[f"{agent.name}:{request.step}"] += 1
            return await model.decide(request)

    return agent.with_model(Counting())


async def test_a_grandchilds_approval_surfaces_at_the_root_and_resumes_each_once(
    db: str,
) -> None:
    asked: Counter[str] = Counter()
    approver = _counting(APPROVER, asked)
    delegating = boss(calls("pay 900", tool_name="approver"), tools=[approver.as_tool()])
    middle = _counting(Agent("middle", delegating.model, [approver.as_tool()]), asked)
    root = _counting(
        boss(calls("get it paid", tool_name="middle"), tools=[middle.as_tool()]), asked
    )
    with trio.fail_after(30):
        async with Runtime(db) as runtime:
            paused = await runtime.run(root, "pay big", invocation_id="root")
            assert paused.reason is TerminalReason.APPROVAL_REQUIRED
            assert paused.path is not None
            assert paused.path[0] == "root"
            assert len(paused.path) == 3  # root -> middle -> approver
            waiting = await runtime.load(paused.path[-1])
            assert waiting.paused is not None
            assert paused.digest is not None
            assert paused.digest == waiting.paused.proposal_digest
            assert paused.pending_calls is not None
            assert [c["name"] for c in paused.pending_calls] == ["big_charge"]
            assert paused.pending_calls[0]["needs_approval"] is True
            assert not CHARGED
            # A resume before anyone decided drives nothing: the tree still waits.
            again = await runtime.resume("root", root)
            assert again.reason is TerminalReason.APPROVAL_REQUIRED
            # Approved by the root's id: the decision is the grandchild's.
            await runtime.approve("root", digest=paused.digest, by="ops")
            done = await runtime.resume("root", root)
            assert (await runtime.load(paused.path[1])).terminated is not None
    assert done.reason is TerminalReason.COMPLETED
    assert [amount for _, amount in CHARGED] == [900]
    # Each was asked for each of its steps exactly once: nothing ran twice.
    assert asked == Counter(
        {"boss:1": 1, "boss:2": 1, "middle:1": 1, "middle:2": 1, "approver:1": 1, "approver:2": 1}
    )


async def test_a_childs_approval_survives_a_new_runtime_and_a_json_round_trip(
    tmp_path: Path,
) -> None:
    """The pause read back in another runtime (as another process would) and approved there."""
    db = f"sqlite:///{tmp_path / 'events.db'}"
    parent = boss(calls("pay 900", tool_name="approver"), tools=[APPROVER.as_tool()])
    CHARGED.clear()
    with trio.fail_after(30):
        async with Runtime(db) as runtime:
            first = await runtime.run(parent, "pay big", invocation_id="root")
        carried = Outcome.model_validate_json(first.model_dump_json())
        assert carried == first
        assert carried.digest is not None
        async with Runtime(db) as runtime:
            await runtime.approve("root", digest=carried.digest, by="ops")
            with pytest.raises(Exception, match="does not wait for an approval"):
                await runtime.approve("root", digest=carried.digest, by="someone else")
            done = await runtime.resume("root", parent)
    assert done.reason is TerminalReason.COMPLETED
    assert [amount for _, amount in CHARGED] == [900]


async def test_a_child_that_waits_for_a_service_pauses_its_parent_for_reconciliation(
    db: str,
) -> None:
    def unreachable(effect_key: str) -> Any:
        raise ConnectionError("the service is down")

    @tool(effect="write", reconcile=unreachable)
    def flaky_charge(amount: int) -> dict[str, Any]:
        """Charge, but the reply never comes."""
        raise TimeoutError("no reply")

    def charges(request: ModelRequest) -> dict[str, Any]:
        if request.step == 1:
            return {
                "kind": "tool_calls",
                "calls": [{"id": "f", "name": "flaky_charge", "arguments": {"amount": 5}}],
            }
        return {"kind": "final", "answer": "done"}

    flaky = Agent("flaky", ScriptedModel(charges), [flaky_charge])
    parent = boss(calls("pay 5", tool_name="flaky"), tools=[flaky.as_tool()])
    with trio.fail_after(30):
        async with Runtime(db) as runtime:
            paused = await runtime.run(parent, "pay", invocation_id="root")
    assert paused.reason is TerminalReason.RECONCILIATION_REQUIRED
    assert paused.path is None
    assert paused.detail is not None
    assert "is paused (reconciliation_required" in paused.detail


async def test_children_run_from_code_in_a_nursery_each_once(
    db: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CHARGES_FILE", str(tmp_path / "charges.txt"))
    with trio.fail_after(30):
        async with Runtime(db) as runtime:
            outcome = await runtime.run(ORCHESTRATOR, "fan out", invocation_id="root")
            events = await history_of(runtime, "root")
            (batch,) = [e for e in events if isinstance(e, BatchDispatched)]
            key = batch.calls[0].effect_key
            assert key is not None
            kids = [await runtime.load(child_id_of(key, f"pay-{a}")) for a in (1, 2, 3)]
    assert outcome.reason is TerminalReason.COMPLETED
    (result,) = outcome_results(events)
    assert result.output == ["paid: pay 1", "paid: pay 2", "paid: pay 3"]
    assert sorted(amount for _, amount in charges()) == [1, 2, 3]
    assert all(kid.parent is not None and kid.parent.key for kid in kids)
    # The call's result names them, in the order they started (the nursery's order).
    assert result.child_ids is not None
    assert sorted(result.child_ids) == sorted(kid.id for kid in kids)


async def test_each_result_names_only_the_children_its_own_batch_ran(
    db: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same call id at two steps: the second step's result names its own three."""
    monkeypatch.setenv("CHARGES_FILE", str(tmp_path / "charges.txt"))

    def twice(request: ModelRequest) -> dict[str, Any]:
        if request.step <= 2:
            return {"kind": "tool_calls", "calls": [{"id": "f", "name": "fan_out"}]}
        return {"kind": "final", "answer": "fanned out twice"}

    again = Agent(
        "orchestrator", ScriptedModel(twice), [fan_out], budget=Budget(max_repeated_plan=3)
    )
    with trio.fail_after(30):
        async with Runtime(db) as runtime:
            outcome = await runtime.run(again, "fan out", invocation_id="root")
            events = await history_of(runtime, "root")
    assert outcome.reason is TerminalReason.COMPLETED
    first, second = outcome_results(events)
    assert first.child_ids is not None
    assert second.child_ids is not None
    assert (len(first.child_ids), len(second.child_ids)) == (3, 3)
    assert not set(first.child_ids) & set(second.child_ids)


def test_audit_verify_of_a_root_verifies_the_children_its_tools_ran_too(
    db: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("CHARGES_FILE", str(tmp_path / "charges.txt"))

    async def run() -> None:
        with trio.fail_after(30):
            async with Runtime(db) as runtime:
                await runtime.run(ORCHESTRATOR, "fan out", invocation_id="root")

    trio.run(run)
    capsys.readouterr()
    assert main(["audit", "verify", "root", "--no-state", "--json", "--db", db]) == 0
    reports = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    checked = [r["id"] for r in reports if r["kind"] == "invocation"]
    assert len(checked) == 4  # the root and its three children, each once
    assert checked[0] == "root"
    assert all(r["intact"] for r in reports)


@pytest.mark.parametrize(
    ("arguments", "problem"),
    [
        ({"name": "not an id"}, "identifier"),
        ({"budget": 5}, "must be a Budget"),
        ({"on_parent_end": "explode"}, "on_parent_end must be one of"),
    ],
)
def test_as_tool_refuses_malformed_arguments(arguments: dict[str, Any], problem: str) -> None:
    with pytest.raises(UsageError, match=problem):
        PAYER.as_tool(**arguments)


def test_an_agent_whose_name_is_no_identifier_needs_a_tool_name() -> None:
    agent = Agent("research-bot", ScriptedModel(_pays), [])
    with pytest.raises(UsageError, match="identifier"):
        agent.as_tool()
    assert agent.as_tool(name="research").name == "research"


@pytest.mark.parametrize(
    ("child", "goal", "key", "effect", "problem"),
    [
        ("payer", "pay 1", None, "read", "is for write tools"),
        ("not an agent", "pay 1", None, "write", "needs an Agent, got str"),
        ("payer", "  ", None, "write", "goal must be a non-empty string"),
        ("payer", "pay 1", "", "write", "key must be a non-empty string"),
        ("payer", "pay 1", "budget", "write", "budget must be a Budget, got dict"),
    ],
)
async def test_run_agent_refuses_what_cannot_start_a_child(  # noqa: PLR0917 - parametrized
    db: str, child: str, goal: str, key: str | None, effect: str, problem: str
) -> None:
    target: object = PAYER if child == "payer" else child

    async def body(context: ToolContext) -> str:
        if key == "budget":  # a budget as a dict, not a Budget
            wrong: Any = {"max_steps": 3}
            outcome = await context.run_agent(target, goal, key="k", budget=wrong)
        else:
            outcome = await context.run_agent(target, goal, key=key)
        return outcome.terminal_reason.value

    starter = Tool(body, name="starter", effect=effect)
    parent = boss(
        {"kind": "tool_calls", "calls": [{"id": "s", "name": "starter", "arguments": {}}]},
        tools=[starter],
    )
    with trio.fail_after(30):
        async with Runtime(db) as runtime:
            outcome = await runtime.run(parent, "start", invocation_id="root")
            events = await history_of(runtime, "root")
    assert outcome.reason is TerminalReason.COMPLETED
    (result,) = outcome_results(events)
    assert result.error is not None
    assert problem in result.error.message
    assert not CHARGED


async def test_a_child_tool_called_outside_a_run_says_so() -> None:
    child_tool = PAYER.as_tool()
    context = ToolContext(invocation_id="x", call_id="c", effect_key="eff-1", attempt=1)
    with pytest.raises(Exception, match="only inside a run of the runtime"):
        await child_tool.fn(goal="pay 1", context=context)


def test_audit_verify_of_a_root_verifies_its_children_too(
    db: str, capsys: pytest.CaptureFixture[str]
) -> None:
    async def run() -> list[str]:
        with trio.fail_after(30):
            async with Runtime(db) as runtime:
                await runtime.run(boss(calls("pay 10", "pay 20")), "pay", invocation_id="root")
                events = await history_of(runtime, "root")
        return [e.child_id for e in events if isinstance(e, BudgetReserved)]

    children = trio.run(run)
    capsys.readouterr()
    assert main(["audit", "verify", "root", "--no-state", "--json", "--db", db]) == 0
    reports = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    checked = {r["id"] for r in reports if r["kind"] == "invocation"}
    assert checked == {"root", *children}
    assert all(r["intact"] for r in reports)
    # The children's writes are checked with them.
    assert sum(1 for r in reports if r["kind"] == "effect") == 2 + 2  # 2 child calls, 2 charges


async def test_cancelling_a_paused_root_cancels_the_tree_below_it(db: str) -> None:
    delegating = boss(calls("pay 900", tool_name="approver"), tools=[APPROVER.as_tool()])
    middle = Agent("middle", delegating.model, [APPROVER.as_tool()])
    root = boss(calls("get it paid", tool_name="middle"), tools=[middle.as_tool()])
    with trio.fail_after(30):
        async with Runtime(db) as runtime:
            paused = await runtime.run(root, "pay big", invocation_id="root")
            assert paused.path is not None
            await runtime.request_cancel("root", by="ops", reason="not today")
            tree = [await runtime.load(invocation_id) for invocation_id in paused.path]
            # Nothing of it runs again: a resume gives the recorded end.
            again = await runtime.resume("root", root)
    assert [inv.terminated.reason if inv.terminated else None for inv in tree] == [
        TerminalReason.CANCELLED
    ] * 3
    details = [inv.terminated.detail or "" for inv in tree if inv.terminated]
    assert "not today" in details[0]
    assert "its parent root was cancelled" in details[1]
    assert f"its parent {paused.path[1]} was cancelled" in details[2]
    assert again.reason is TerminalReason.CANCELLED
    assert not CHARGED


async def test_a_share_that_cannot_be_committed_starts_no_child_and_stops_the_run(
    tmp_path: Path,
) -> None:
    """The store locked by another connection as the body starts its child."""
    path = tmp_path / "locked.db"
    url = f"sqlite:///{path}?lock_timeout=1&lock_retry=0"
    blocker: list[sqlite3.Connection] = []
    raised: list[str] = []
    leaf = Agent("leaf", ScriptedModel([{"kind": "final", "answer": "leafed"}]), [])

    @tool(effect="write", reconcile=lambda effect_key: Reconciled(status=Resolution.NOT_FOUND))
    async def start_one(context: ToolContext, goal: str) -> str | None:
        """Lock the store (the first time), then run a child."""
        if not blocker:
            connection = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
            connection.execute("BEGIN IMMEDIATE")
            blocker.append(connection)
        try:
            outcome = await context.run_agent(leaf, goal, key="one")
        except ToolError as refused:
            raised.append(str(refused))
            raise
        return outcome.answer

    parent = boss(calls("x", tool_name="start_one"), tools=[start_one])
    with trio.fail_after(30):
        async with Runtime(url) as runtime:
            stopped = await runtime.run(parent, "go", invocation_id="root")
        assert stopped.reason is TerminalReason.CHECKPOINT_FAILED
        assert stopped.detail is not None
        assert "locked" in stopped.detail
        (text,) = raised
        assert text.startswith("not started: its parent root could not record the child's share")
        blocker[0].rollback()
        async with Runtime(url) as runtime:
            events = await history_of(runtime, "root")
            assert isinstance(events[-1], BatchDispatched)  # what was committed is intact
            key = events[-1].calls[0].effect_key
            assert key is not None
            with pytest.raises(InvocationNotFoundError):
                await runtime.load(child_id_of(key, "one"))  # it never started
            # The lease could not be given back while the store was locked: take it over.
            resumed = await runtime.resume("root", parent, take_over=True)
            events = await history_of(runtime, "root")
    assert resumed.reason is TerminalReason.COMPLETED
    assert [type(e).__name__ for e in events].count("BudgetReserved") == 1
    (result,) = outcome_results(events)
    assert result.output == "leafed"


async def test_a_body_that_did_not_wait_for_its_child_gets_the_share_back_from_its_end(
    db: str,
) -> None:
    """The body fails while its child runs: the child is cancelled, its share comes back."""
    thinking = trio.Event()

    class Thinks:
        """A model that takes one step, then thinks until it is cancelled."""

        async def decide(self, request: ModelRequest) -> ModelReply:
            if request.step == 1:
                call = {"id": "l1", "name": "look", "arguments": {"n": 1}}
                return ModelReply(proposal={"kind": "tool_calls", "calls": [call]})
            thinking.set()
            await trio.sleep_forever()
            return ModelReply(proposal={"kind": "final", "answer": "never reached"})

    @tool
    def look(n: int) -> int:
        """Look something up."""
        return n

    slow = Agent("slow", Thinks(), [look], budget=Budget(max_steps=5, max_tool_calls=3))

    @tool(effect="write")
    async def gives_up(context: ToolContext, goal: str) -> str:
        """Start a child, then fail before it ends."""

        async def fail_once_it_thinks() -> None:
            await thinking.wait()
            raise ValueError("gave up")

        async with trio.open_nursery() as nursery:
            nursery.start_soon(partial(context.run_agent, slow, goal, key="slow"))
            nursery.start_soon(fail_once_it_thinks)
        return "never"

    parent = boss(calls("x", tool_name="gives_up"), tools=[gives_up])
    with trio.fail_after(30):
        async with Runtime(db) as runtime:
            outcome = await runtime.run(parent, "go", invocation_id="root")
            events = await history_of(runtime, "root")
            (reserved,) = [e for e in events if isinstance(e, BudgetReserved)]
            child = await runtime.load(reserved.child_id)
    assert child.terminated is not None
    assert child.terminated.reason is TerminalReason.CANCELLED
    (returned,) = [e for e in events if isinstance(e, BudgetReturned)]
    assert returned.spent == Spent(steps=child.step, tool_calls=1)
    assert returned.returned == reserved.allotment.reserved.minus(returned.spent)
    # The write's outcome is unknown (its body failed) and it has no reconcile: the
    # parent waits for a person, its child's share already back.
    assert outcome.reason is TerminalReason.RECONCILIATION_REQUIRED
    assert outcome.children is not None
    assert outcome.children.tool_calls == 1
