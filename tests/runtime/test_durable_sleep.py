"""Durable sleep through the Runtime: a wait decision, a tool's ``ctx.sleep_until``, waking.

The runtime's ``now`` is a :class:`ManualClock` the test moves (hours pass at once);
where this process itself waits for the wake (``resume_when_due``), virtual time (the
``clock`` fixture, trio's MockClock with autojump) and a ``now`` that follows it.

Bad inputs tried: a naive datetime and a string given to ``ctx.sleep_until``, a wait
in the past, a wake of an invocation that does not sleep (and a second wake), a resume
before the wake time, two holders waking one invocation at once, a clock that jumps
back before the wake time, and a cancel while it sleeps.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from aggregates.invocation import Paused, ResultsCommitted, SleepEnded
from loop_actors import (
    Agent,
    ModelRequest,
    NotWaitingError,
    Runtime,
    ScriptedModel,
    TerminalReason,
    ToolContext,
    tool,
)
from loop_actors.runtime.driver import Driver

BASE = datetime(2026, 3, 1, 8, 0, tzinfo=UTC)
HOUR = timedelta(hours=1)
LIMIT_S = 60


class ManualClock:
    """A ``now`` for the runtime that moves only when the test says."""

    def __init__(self) -> None:
        self.at = BASE

    def __call__(self) -> datetime:
        return self.at


def virtual_now() -> datetime:
    """The runtime's clock: the trio clock (virtual in the ``clock`` tests) from BASE."""
    return BASE + timedelta(seconds=trio.current_time())


RAN: list[str] = []


@tool(effect="write")
async def remind(ctx: ToolContext, who: str, seconds: float) -> dict[str, Any]:
    """Remind someone, ``seconds`` after BASE."""
    RAN.append(f"start {ctx.attempt}")
    await ctx.sleep_until(BASE + timedelta(seconds=seconds))
    RAN.append(f"after {ctx.effect_key} woke_at={ctx.woke_at is not None}")
    return {"reminded": who}


@tool
async def naive(ctx: ToolContext, when: str) -> str:
    """Sleep until a time given without a zone."""
    await ctx.sleep_until(datetime.fromisoformat(when))
    return "slept"


def reminding(request: ModelRequest) -> dict[str, Any]:
    if request.step == 1:
        return {
            "kind": "tool_calls",
            "calls": [{"id": "r", "name": "remind", "arguments": {"who": "bob", "seconds": 10}}],
        }
    return {"kind": "final", "answer": f"done: {request.turns[-1].results[0].output}"}


def waiting(until: datetime) -> Agent:
    def decide(request: ModelRequest) -> dict[str, Any]:
        if request.step == 1:
            return {"kind": "wait", "reason": "the shop opens", "until": until.isoformat()}
        return {"kind": "final", "answer": f"after: {request.turns[-1].reply}"}

    return Agent("waiter", ScriptedModel(decide), [])


REMINDER = Agent("reminder", ScriptedModel(reminding), [remind])


@pytest.fixture
def db(tmp_path: Path) -> str:
    RAN.clear()
    return f"sqlite:///{tmp_path / 'events.db'}"


def of_type(events: list[Any], kind: type) -> list[Any]:
    return [event for event in events if isinstance(event, kind)]


async def test_a_wait_decision_sleeps_and_a_resume_once_due_wakes_it_once(db: str) -> None:
    agent = waiting(BASE + HOUR)
    now = ManualClock()
    with trio.fail_after(LIMIT_S):
        async with Runtime(db, now=now) as runtime:
            slept = await runtime.run(agent, "buy bread", invocation_id="w-1")
            early = await runtime.resume("w-1", agent)
            now.at = BASE + 2 * HOUR
            done = await runtime.resume("w-1", agent)
            history = await runtime.history("w-1")

    assert slept.reason is TerminalReason.SLEEPING
    assert slept.paused
    assert slept.wake_at == BASE + HOUR
    assert early.reason is TerminalReason.SLEEPING  # not due: nothing recorded
    assert done.reason is TerminalReason.COMPLETED
    assert done.answer == "after: woke at 2026-03-01T10:00:00+00:00"
    [woke] = of_type(history, SleepEnded)
    assert not woke.early
    assert woke.timestamp == BASE + 2 * HOUR


async def test_resume_when_due_waits_in_this_process_and_wakes_it(
    db: str, clock: trio.testing.MockClock
) -> None:
    agent = waiting(BASE + timedelta(seconds=10))
    async with Runtime(db, now=virtual_now) as runtime:
        with trio.fail_after(LIMIT_S):
            await runtime.run(agent, "soon", invocation_id="v-1")
            done = await runtime.resume_when_due("v-1", agent)
            history = await runtime.history("v-1")

    assert done.reason is TerminalReason.COMPLETED
    [woke] = of_type(history, SleepEnded)
    assert woke.timestamp >= BASE + timedelta(seconds=10)


async def test_statistics_count_the_runs_resume_when_due_waits_for(
    db: str, clock: trio.testing.MockClock
) -> None:
    agent = waiting(BASE + timedelta(seconds=10))
    seen: list[int] = []
    async with Runtime(db, now=virtual_now) as runtime:
        with trio.fail_after(LIMIT_S):
            await runtime.run(agent, "soon", invocation_id="v-2")
            async with trio.open_nursery() as nursery:
                nursery.start_soon(runtime.resume_when_due, "v-2", agent)
                await trio.sleep(5)  # halfway to its wake time
                seen.append(runtime.statistics().runs_sleeping)
        seen.append(runtime.statistics().runs_sleeping)

    assert seen == [1, 0]


async def test_a_tool_that_sleeps_gets_its_result_given_on_waking_with_the_same_key(
    db: str, clock: trio.testing.MockClock
) -> None:
    async with Runtime(db, now=virtual_now) as runtime:
        with trio.fail_after(LIMIT_S):
            slept = await runtime.run(REMINDER, "remind bob", invocation_id="t-1")
            ran_before_waking = list(RAN)
            done = await runtime.resume_when_due("t-1", REMINDER)
            history = await runtime.history("t-1")

    assert slept.reason is TerminalReason.SLEEPING
    assert slept.wake_at == BASE + timedelta(seconds=10)
    assert ran_before_waking == ["start 1"]
    assert done.reason is TerminalReason.COMPLETED
    assert done.answer == "done: {'reminded': 'bob'}"
    [paused] = of_type(history, Paused)
    assert paused.sleeping_calls == ["r"]
    [results] = of_type(history, ResultsCommitted)
    key = results.results[0].effect_key
    ran = list(RAN)
    assert ran == ["start 1", "start 2", f"after {key} woke_at=True"]  # past its sleep: once
    assert len(of_type(history, SleepEnded)) == 1


async def test_a_naive_datetime_is_refused_as_the_tool_result(db: str) -> None:
    def decide(request: ModelRequest) -> dict[str, Any]:
        if request.step == 1:
            return {
                "kind": "tool_calls",
                "calls": [
                    {"id": "n", "name": "naive", "arguments": {"when": "2026-03-01T09:00:00"}}
                ],
            }
        return {"kind": "final", "answer": str(request.turns[-1].results[0].error)}

    agent = Agent("naive", ScriptedModel(decide), [naive])
    with trio.fail_after(LIMIT_S):
        async with Runtime(db, now=ManualClock()) as runtime:
            outcome = await runtime.run(agent, "sleep")

    assert outcome.reason is TerminalReason.COMPLETED
    assert outcome.answer is not None
    assert "tool_failed" in outcome.answer
    assert "sleep_until needs a datetime with a time zone" in outcome.answer


async def test_a_wait_in_the_past_wakes_at_once(db: str) -> None:
    agent = waiting(BASE - HOUR)
    with trio.fail_after(LIMIT_S):
        async with Runtime(db, now=ManualClock()) as runtime:
            outcome = await runtime.run(agent, "now")
            history = await runtime.history(outcome.invocation_id)

    assert outcome.reason is TerminalReason.COMPLETED
    assert len(of_type(history, SleepEnded)) == 1


async def test_wake_wakes_a_sleeping_invocation_early_and_only_once(db: str) -> None:
    agent = waiting(BASE + 24 * HOUR)
    with trio.fail_after(LIMIT_S):
        async with Runtime(db, now=ManualClock()) as runtime:
            await runtime.run(agent, "tomorrow", invocation_id="e-1")
            early = await runtime.wake("e-1", by="ops")
            with pytest.raises(NotWaitingError, match="does not sleep"):
                await runtime.wake("e-1", by="ops")
            done = await runtime.resume("e-1", agent)
            history = await runtime.history("e-1")

    assert early
    assert done.reason is TerminalReason.COMPLETED
    [woke] = of_type(history, SleepEnded)
    assert (woke.early, woke.by) == (True, "ops")


async def test_a_wake_of_an_invocation_that_does_not_sleep_is_refused(db: str) -> None:
    agent = Agent("done", ScriptedModel([{"kind": "final", "answer": "x"}]), [])
    with trio.fail_after(LIMIT_S):
        async with Runtime(db, now=ManualClock()) as runtime:
            await runtime.run(agent, "x", invocation_id="d-1")
            with pytest.raises(NotWaitingError):
                await runtime.wake("d-1")


async def test_a_cancel_of_a_sleeping_batch_ends_it_cancelled_with_its_results(db: str) -> None:
    with trio.fail_after(LIMIT_S):
        async with Runtime(db, now=ManualClock()) as runtime:
            await runtime.run(REMINDER, "remind bob", invocation_id="c-1")
            await runtime.request_cancel("c-1", by="ops", reason="not needed")
            outcome = await runtime.resume("c-1", REMINDER)
            history = await runtime.history("c-1")

    assert outcome.reason is TerminalReason.CANCELLED
    assert "while paused" in (outcome.detail or "")
    assert len(of_type(history, ResultsCommitted)) == 1
    ran = list(RAN)
    assert ran == ["start 1"]  # never called again


async def test_two_holders_waking_one_invocation_at_once_record_one_wake(db: str) -> None:
    agent = waiting(BASE + HOUR)
    now = ManualClock()
    with trio.fail_after(LIMIT_S):
        async with Runtime(db, now=now) as runtime:
            await runtime.run(agent, "x", invocation_id="r-1")
            now.at = BASE + 2 * HOUR
            driver: Driver = runtime.driver
            first = await driver.reads.invocation("r-1")
            second = await driver.reads.invocation("r-1")
            async with trio.open_nursery() as nursery:
                nursery.start_soon(driver.wake_if_due, first)
                nursery.start_soon(driver.wake_if_due, second)
            history = await runtime.history("r-1")

    assert len(of_type(history, SleepEnded)) == 1


async def test_a_clock_that_jumps_back_before_the_wake_time_wakes_nothing(db: str) -> None:
    agent = waiting(BASE + HOUR)
    with trio.fail_after(LIMIT_S):
        async with Runtime(db, now=ManualClock()) as runtime:
            await runtime.run(agent, "x", invocation_id="j-1")
        async with Runtime(db, now=lambda: BASE + HOUR - timedelta(seconds=1)) as behind:
            outcome = await behind.resume("j-1", agent)
            history = await behind.history("j-1")

    assert outcome.reason is TerminalReason.SLEEPING
    assert not of_type(history, SleepEnded)


async def test_a_replay_of_a_run_that_waited_wakes_it_at_once_and_matches(db: str) -> None:
    agent = waiting(BASE + HOUR)
    now = ManualClock()
    with trio.fail_after(LIMIT_S):
        async with Runtime(db, now=now) as runtime:
            await runtime.run(agent, "buy bread", invocation_id="p-1")
            now.at = BASE + 2 * HOUR
            await runtime.resume("p-1", agent)
            report = await runtime.replay(agent, ["p-1"])

    [replayed] = report.results
    assert replayed.identical, replayed.divergences


async def test_a_child_that_waits_makes_its_parents_call_sleep_until_it_is_due(db: str) -> None:
    child = waiting(BASE + HOUR)

    def delegates(request: ModelRequest) -> dict[str, Any]:
        if request.step == 1:
            return {
                "kind": "tool_calls",
                "calls": [{"id": "d", "name": child.name, "arguments": {"goal": "shop"}}],
            }
        return {"kind": "final", "answer": str(request.turns[-1].results[0].output)}

    parent = Agent("parent", ScriptedModel(delegates), [child.as_tool()])
    now = ManualClock()
    with trio.fail_after(LIMIT_S):
        async with Runtime(db, now=now) as runtime:
            slept = await runtime.run(parent, "go shopping", invocation_id="parent-1")
            now.at = BASE + 2 * HOUR
            done = await runtime.resume("parent-1", parent)
            history = await runtime.history("parent-1")
            [paused] = of_type(history, Paused)

    assert slept.reason is TerminalReason.SLEEPING
    assert slept.wake_at == BASE + HOUR
    assert paused.sleeping_calls == ["d"]
    assert done.reason is TerminalReason.COMPLETED
    assert done.answer is not None
    assert "after: woke at" in done.answer
