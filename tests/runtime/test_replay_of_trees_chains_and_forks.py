"""Replay of what 0.2 records: sub-agents' children, handoff chains, forks, sleeps.

Each recorded invocation is replayed under the agent that ran it (the given agent, its
sub-agents, its handoffs' targets), from where it came from (a child's parent and
budget, a handoff's source, a fork's origin), and nothing is called: a model that
counts its answers proves it. A handoff is not followed by the replay of its source;
its target is an invocation of its own, replayed on its own.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import trio

from aggregates.replay import DivergenceKind
from loop_actors import (
    Agent,
    Budget,
    ForkWrites,
    HandoffTo,
    ModelRequest,
    Runtime,
    ScriptedModel,
    ToolContext,
    tool,
)
from loop_actors.runtime.replay import agents_of

ASKED: list[str] = []
"""Every agent whose model answered, in order (a replay must add none)."""

RAN: list[str] = []
"""Every tool function that ran (a replay must add none)."""


def counting(name: str, script: Any) -> ScriptedModel:
    def decide(request: ModelRequest) -> Any:
        ASKED.append(name)
        return script(request)

    return ScriptedModel(decide)


@tool
def look(order: str) -> dict[str, object]:
    """Look an order up."""
    RAN.append("look")
    return {"order": order, "total": 40}


@tool(effect="write")
def pay(amount: int, context: ToolContext) -> dict[str, str]:
    """Charge the customer."""
    RAN.append("pay")
    return {"receipt": f"r-{context.effect_key}"}


@tool(effect="write")
async def remind(who: str, context: ToolContext) -> str:
    """Remind someone next year."""
    await context.sleep_until(NEXT_YEAR)
    RAN.append("remind")
    return f"reminded {who}"


NEXT_YEAR = datetime(2099, 1, 1, tzinfo=UTC)


def _calls(name: str, **arguments: object) -> dict[str, Any]:
    return {"kind": "tool_calls", "calls": [{"id": "c1", "name": name, "arguments": arguments}]}


def _checker(request: ModelRequest) -> dict[str, Any]:
    if request.step == 1:
        return _calls("look", order="A-1")
    return {"kind": "final", "answer": "A-1 totals 40"}


checker = Agent("checker", counting("checker", _checker), [look], Budget(max_steps=4))
billing = Agent(
    "billing",
    counting("billing", lambda r: {"kind": "final", "answer": f"billed: {r.handed_off_from}"}),
    [look],
)


def _desk(request: ModelRequest) -> dict[str, Any]:
    match request.goal, request.step:
        case "check", 1:
            return _calls("checker", goal="check A-1")
        case "hand over", 1:
            return {"kind": "handoff", "to": "billing", "reason": "a refund", "summary": "A-1"}
        case "pay", 1:
            return _calls("look", order="A-1")
        case "pay", 2:
            return _calls("pay", amount=40)
        case "remind", 1:
            return _calls("remind", who="ann")
    return {"kind": "final", "answer": "done"}


desk = Agent(
    "desk",
    counting("desk", _desk),
    [look, pay, remind, checker.as_tool()],
    Budget(max_steps=10, max_tool_calls=10),
    handoffs=[HandoffTo(billing, history="summary")],
)


@pytest.fixture
def url(tmp_path: Path) -> str:
    ASKED.clear()
    RAN.clear()
    return f"sqlite:///{tmp_path / 'source.db'}"


async def replayed_all(url: str) -> dict[str, Any]:
    """Replay every invocation under ``desk`` with ``--check``: nothing may be asked or run."""
    asked, ran = list(ASKED), list(RAN)
    async with Runtime(url) as runtime:
        report = await runtime.replay(desk, every=True, check=True)
    assert (asked, ran) == (ASKED, RAN)  # no model answered, no tool ran
    return {result.invocation_id: result for result in report.results}


def test_the_agents_a_replay_knows_are_the_given_one_its_sub_agents_and_handoffs() -> None:
    assert list(agents_of(desk)) == ["desk", "checker", "billing"]


async def test_a_child_replays_under_the_sub_agent_that_ran_it(url: str) -> None:
    with trio.fail_after(30):
        async with Runtime(url) as runtime:
            outcome = await runtime.run(desk, "check", invocation_id="parent")
        assert outcome.answer == "done"
        results = await replayed_all(url)
    assert len(results) == 2
    for result in results.values():
        assert result.identical, (result.invocation_id, result.divergences)
    [child] = [r for r in results.values() if r.invocation_id != "parent"]
    assert child.recorded_agent == "checker"


async def test_a_handoff_source_is_not_followed_and_its_target_replays_on_its_own(
    url: str,
) -> None:
    """The source's replay ends ``handed_off``; billing's model is not asked for it."""
    with trio.fail_after(30):
        async with Runtime(url) as runtime:
            outcome = await runtime.run(desk, "hand over", invocation_id="source")
        assert outcome.chain is not None
        results = await replayed_all(url)
    assert [(r.invocation_id, r.recorded_agent, r.replayed) for r in results.values()] == [
        ("source", "desk", "handed_off"),
        (outcome.chain[1], "billing", "completed"),
    ]
    assert all(r.identical for r in results.values())


@pytest.mark.parametrize(
    ("writes", "ended"),
    [(ForkWrites.APPROVE, "approval_required"), (ForkWrites.DEDUPE, "completed")],
)
async def test_a_fork_replays_from_its_origin_and_repeats_no_write(
    url: str, writes: ForkWrites, ended: str
) -> None:
    """Its repeat of the source's payment waits for a person again (approve) or reuses the
    source's receipt again (dedupe): the judgement is its origin's, as recorded."""
    with trio.fail_after(30):
        async with Runtime(url) as runtime:
            await runtime.run(desk, "pay", invocation_id="source")
            forked = await runtime.fork(
                "source", at_step=1, by="ops", reason="again", agent=desk, fork_id="fork",
                writes=writes,
            )  # fmt: skip
        assert forked.outcome is not None
        assert forked.outcome.reason == ended
        results = await replayed_all(url)
    assert results["fork"].identical, results["fork"].divergences
    assert results["fork"].replayed == ended


async def test_a_call_still_asleep_replays_to_its_sleep(url: str) -> None:
    with trio.fail_after(30):
        async with Runtime(url) as runtime:
            outcome = await runtime.run(desk, "remind", invocation_id="sleeper")
        assert outcome.reason == "sleeping"
        results = await replayed_all(url)
    assert results["sleeper"].identical, results["sleeper"].divergences
    assert results["sleeper"].replayed == "sleeping"


async def test_a_call_that_slept_and_was_woken_replays_woken_by_the_same_person(
    url: str,
) -> None:
    with trio.fail_after(30):
        async with Runtime(url) as runtime:
            await runtime.run(desk, "remind", invocation_id="sleeper")
            assert await runtime.wake("sleeper", by="ops")
            outcome = await runtime.resume("sleeper", desk)
        assert outcome.reason == "completed"
        results = await replayed_all(url)
    assert results["sleeper"].identical, results["sleeper"].divergences
    assert RAN.count("remind") == 1  # the recorded run's, after its wake; none of the replay's


async def test_a_wait_woken_early_is_woken_again_at_its_recorded_time(url: str) -> None:
    """What the model is told on waking (when, by whom) is in its next request's digest: a
    replay that woke it at another time or by another person would be asked another view."""

    def wait_then_answer(request: ModelRequest) -> dict[str, Any]:
        if request.step == 1:
            return {"kind": "wait", "reason": "later", "until": NEXT_YEAR.isoformat()}
        return {"kind": "final", "answer": request.turns[-1].reply or ""}

    waits = Agent("waiter", counting("waiter", wait_then_answer), [look])
    with trio.fail_after(30):
        async with Runtime(url) as runtime:
            await runtime.run(waits, "wait", invocation_id="waiter")
            await runtime.wake("waiter", by="ops")
            outcome = await runtime.resume("waiter", waits)
            report = await runtime.replay(waits, ["waiter"], check=True)
    assert outcome.answer is not None
    assert "(early, by ops)" in outcome.answer
    [result] = report.results
    assert result.identical, result.divergences
    assert DivergenceKind.MODEL_INPUT_CHANGED not in [d.kind for d in result.divergences]
