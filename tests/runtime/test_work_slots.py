"""Work slots: at most N runs do the runtime's part of a turn at once, a begun turn first."""

from __future__ import annotations

from functools import partial
from typing import Any

import pytest
import trio
import trio.testing

from loop_actors import Agent, Budget, ModelRequest, Runtime, ScriptedModel, UsageError, tool
from loop_actors.runtime.slots import Slot, WorkSlots


async def test_a_free_slot_is_taken_without_waiting_and_given_back() -> None:
    slots = WorkSlots(2)
    first, second = Slot(slots), Slot(slots)
    with trio.fail_after(1):
        await first.take(mid_turn=False)
        await second.take(mid_turn=False)
    assert (first.held, second.held, slots.waiting) == (True, True, 0)
    first.give_back()
    first.give_back()  # giving back twice frees one slot once
    third = Slot(slots)
    await third.take(mid_turn=False)
    fourth = Slot(slots)
    with trio.move_on_after(0.05) as waited:
        await fourth.take(mid_turn=False)
    assert waited.cancelled_caught  # both slots held: it waits
    assert not fourth.held


async def test_a_run_in_the_middle_of_a_turn_is_served_before_one_beginning_a_turn() -> None:
    slots = WorkSlots(1)
    holder = Slot(slots)
    await holder.take(mid_turn=False)
    served: list[str] = []

    async def wait(name: str, *, mid_turn: bool) -> None:
        slot = Slot(slots)
        await slot.take(mid_turn=mid_turn)
        served.append(name)
        await trio.lowlevel.checkpoint()
        slot.give_back()

    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            for name, mid_turn in (("new-1", False), ("new-2", False), ("mid-1", True)):
                nursery.start_soon(partial(wait, name, mid_turn=mid_turn))
                await trio.testing.wait_all_tasks_blocked()
            nursery.start_soon(partial(wait, "mid-2", mid_turn=True))
            await trio.testing.wait_all_tasks_blocked()
            assert slots.waiting == 4
            holder.give_back()
    # The two back from their tools first, in order; then the two back from their model.
    assert served == ["mid-1", "mid-2", "new-1", "new-2"]


async def test_a_waiter_cancelled_holds_no_slot_and_the_next_one_gets_it() -> None:
    slots = WorkSlots(1)
    holder = Slot(slots)
    await holder.take(mid_turn=False)
    cancelled, later = Slot(slots), Slot(slots)
    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            scope = trio.CancelScope()

            async def cancelled_wait() -> None:
                with scope:
                    await cancelled.take(mid_turn=True)

            nursery.start_soon(cancelled_wait)
            await trio.testing.wait_all_tasks_blocked()
            nursery.start_soon(partial(later.take, mid_turn=False))
            await trio.testing.wait_all_tasks_blocked()
            scope.cancel()
            await trio.testing.wait_all_tasks_blocked()
            assert not cancelled.held
            assert slots.waiting == 1
            holder.give_back()
    assert later.held
    assert not cancelled.held
    later.give_back()
    # Every slot is free again: two takes in a row do not wait.
    again = Slot(slots)
    await again.take(mid_turn=False)
    assert again.held


@pytest.mark.parametrize("bad", [0, -1, 1.5, "8", True])
def test_work_slots_must_be_a_whole_number_of_at_least_one(bad: Any) -> None:
    """Bad input: zero, negative, a float, a string, a bool: UsageError, nothing opened."""
    with pytest.raises(UsageError, match="work_slots"):
        Runtime("memory://", work_slots=bad)


@tool
async def look(n: int) -> int:
    """Look a number up."""
    await trio.sleep(0.01)
    return n


def _agent(turns: int, look_tool: Any = look) -> Agent:
    def decide(request: ModelRequest) -> dict[str, Any]:
        if request.step <= turns:
            calls = [
                {"id": f"c{i}", "name": "look", "arguments": {"n": request.step * 10 + i}}
                for i in range(3)
            ]
            return {"kind": "tool_calls", "calls": calls}
        return {"kind": "final", "answer": f"done {request.invocation_id}"}

    return Agent(
        "slots", ScriptedModel(decide, delay_s=0.05), [look_tool], Budget(max_steps=turns + 1)
    )


@pytest.mark.parametrize("work_slots", [1, 3, None])
async def test_many_runs_share_few_slots_and_each_completes_its_own_turns(
    tmp_path: Any, work_slots: int | None
) -> None:
    held_while_working: list[int] = []

    @tool
    async def look(n: int) -> int:
        """Record how many slots are held, seen from a tool (whose run holds none)."""
        slots = runtime.work_slots
        if slots is not None:
            held_while_working.append(slots.total - slots.free)
        await trio.sleep(0.01)
        return n

    agent = _agent(turns=3, look_tool=look)
    async with Runtime(f"sqlite:///{tmp_path / 's.db'}", work_slots=work_slots) as runtime:
        outcomes: dict[str, Any] = {}

        async def one(i: int) -> None:
            outcomes[f"r{i}"] = await runtime.run(agent, "count", invocation_id=f"r{i}")

        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                for i in range(20):
                    nursery.start_soon(one, i)
        if runtime.work_slots is not None:
            assert runtime.work_slots.waiting == 0
            assert runtime.work_slots.free == work_slots  # every slot given back
            assert max(held_while_working) <= work_slots
        for invocation_id, outcome in outcomes.items():
            assert (outcome.reason, outcome.answer) == ("completed", f"done {invocation_id}")
            assert outcome.steps == 4
        history = await runtime.history("r7")
        assert [type(e).__name__ for e in history].count("ResultsCommitted") == 3


async def test_a_run_waiting_for_its_tools_holds_no_slot(tmp_path: Any) -> None:
    """One slot; the first run's tool blocks until the second run has completed."""
    gate = trio.Event()

    @tool
    async def block() -> str:
        """Wait for the gate."""
        await gate.wait()
        return "open"

    def decide(request: ModelRequest) -> dict[str, Any]:
        if request.step == 1 and request.goal == "blocked":
            return {"kind": "tool_calls", "calls": [{"id": "b", "name": "block", "arguments": {}}]}
        return {"kind": "final", "answer": request.goal}

    agent = Agent("gated", ScriptedModel(decide), [block])
    async with Runtime(f"sqlite:///{tmp_path / 'g.db'}", work_slots=1) as runtime:
        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(partial(runtime.run, agent, "blocked", invocation_id="first"))
                await trio.testing.wait_all_tasks_blocked()
                second = await runtime.run(agent, "free", invocation_id="second")
                assert (second.reason, second.answer) == ("completed", "free")
                gate.set()
        first = await runtime.history("first")
        assert type(first[-1]).__name__ == "Terminated"


async def test_a_run_cancelled_while_it_waits_for_a_slot_is_recorded_cancelled(
    tmp_path: Any,
) -> None:
    agent = _agent(turns=1)
    async with Runtime(f"sqlite:///{tmp_path / 'c.db'}", work_slots=1) as runtime:
        assert runtime.work_slots is not None
        taken = Slot(runtime.work_slots)
        await taken.take(mid_turn=False)  # the only slot: the run waits for it
        with trio.fail_after(30):
            with trio.move_on_after(0.2) as scope:
                await runtime.run(agent, "count", invocation_id="waits")
            assert scope.cancelled_caught
            assert runtime.work_slots.waiting == 0  # the cancelled run left the queue
            taken.give_back()
            history = await runtime.history("waits")
        assert type(history[-1]).__name__ == "Terminated"
        assert history[-1].reason == "cancelled"  # type: ignore[attr-defined]
        # The slot it never got is free: the next run goes straight through.
        with trio.fail_after(30):
            outcome = await runtime.run(agent, "count", invocation_id="next")
        assert outcome.reason == "completed"


async def test_a_run_waiting_for_its_policy_holds_no_slot(tmp_path: Any) -> None:
    """One slot; the first run's (async) policy answers only once the second run has
    completed: were the slot held while the policy decides, both would wait forever."""
    gate = trio.Event()

    async def policy(request: Any) -> bool:
        if request.arguments.get("n") == 10:  # the first run's call
            await gate.wait()
        return True

    def decide(request: ModelRequest) -> dict[str, Any]:
        if request.step == 1 and request.goal == "gated":
            return {
                "kind": "tool_calls",
                "calls": [{"id": "c", "name": "look", "arguments": {"n": 10}}],
            }
        return {"kind": "final", "answer": request.goal}

    agent = Agent("policed", ScriptedModel(decide), [look], policy=policy)
    async with Runtime(f"sqlite:///{tmp_path / 'p.db'}", work_slots=1) as runtime:
        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(partial(runtime.run, agent, "gated", invocation_id="first"))
                await trio.testing.wait_all_tasks_blocked()
                second = await runtime.run(agent, "free", invocation_id="second")
                assert (second.reason, second.answer) == ("completed", "free")
                gate.set()
        first = await runtime.history("first")
        assert type(first[-1]).__name__ == "Terminated"
