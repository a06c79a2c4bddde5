"""Handoffs: a model hands the conversation to another agent, which goes on as a new invocation.

``Runtime.run`` and ``resume`` follow the chain and return its last outcome with the
chain of ids; the target's first event names the source and carries what it is told
(the source's steps, the summary, or nothing); a chain followed again after a crash
finds its target instead of starting a second one.

Bad inputs tried: a handoff to an agent the source does not hand off to, one past the
chain's bound, an empty reason, ``handoffs`` that is not a list of agents, two targets
of one name, an unknown history policy; a handoff call next to another call, and one
whose arguments are not JSON (adapters).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio

from aggregates.handoffs import MAX_HANDOFFS, handoff_id_of
from loop_actors import (
    Agent,
    HandoffHistory,
    HandoffTo,
    ModelRequest,
    Runtime,
    ScriptedModel,
    TerminalReason,
    UsageError,
    tool,
)
from loop_actors._messages import ModelRequest as Request
from loop_actors.agent.adapters import as_handoff, handoff_schemas, system_prompt
from loop_actors.runtime.arguments import StartRequest

TOLD: dict[str, Any] = {}


@tool
def look(order: str) -> dict[str, object]:
    """Look an order up."""
    return {"order": order, "paid": 40}


def _billing(request: ModelRequest) -> dict[str, Any]:
    TOLD["billing"] = request.handed_off_from
    TOLD["billing goal"] = request.goal
    return {"kind": "final", "answer": "refund issued"}


BILLING = Agent("billing", ScriptedModel(_billing), [])


def triage(*targets: Agent | HandoffTo, to: str = "billing") -> Agent:
    def decide(request: ModelRequest) -> dict[str, Any]:
        if request.step == 1:
            return {
                "kind": "tool_calls",
                "calls": [{"id": "l", "name": "look", "arguments": {"order": "A-1"}}],
            }
        if request.step == 2:
            return {
                "kind": "handoff",
                "to": to,
                "reason": "a refund question",
                "summary": "order A-1 was paid 40",
            }
        return {"kind": "final", "answer": f"answered myself after: {request.turns[-1].rejection}"}

    return Agent("triage", ScriptedModel(decide), [look], handoffs=targets or [BILLING])


@pytest.fixture
def db(tmp_path: Path) -> str:
    TOLD.clear()
    return f"sqlite:///{tmp_path / 'events.db'}"


async def test_a_handoff_starts_the_target_with_the_sources_steps_and_returns_its_outcome(
    db: str,
) -> None:
    with trio.fail_after(30):
        async with Runtime(db) as runtime:
            outcome = await runtime.run(triage(), "refund my order", invocation_id="t1")
            source = await runtime.load("t1")
            target = await runtime.load(handoff_id_of("t1"))
    assert (outcome.reason, outcome.answer) == (TerminalReason.COMPLETED, "refund issued")
    assert outcome.chain == ["t1", handoff_id_of("t1")]
    assert outcome.invocation_id == handoff_id_of("t1")
    assert source.terminated is not None
    assert source.terminated.reason is TerminalReason.HANDED_OFF
    assert source.terminated.detail == "handed off to billing: a refund question"
    origin = target.handed_off_from
    assert origin is not None
    assert (origin.source_id, origin.source_agent, origin.hops, origin.chain_root) == (
        "t1",
        "triage",
        1,
        "t1",
    )
    assert origin.history is HandoffHistory.FULL
    assert origin.seed is not None
    assert '"paid": 40' in origin.seed  # the source's step: its lookup and its result
    assert TOLD["billing"] == origin  # the target's model is told
    assert TOLD["billing goal"] == "refund my order"
    assert target.agent_name == "billing"


@pytest.mark.parametrize(
    ("history", "seed"),
    [("summary", "order A-1 was paid 40"), ("none", None)],
)
async def test_what_the_target_is_told_follows_the_handoffs_history(
    db: str, history: str, seed: str | None
) -> None:
    with trio.fail_after(30):
        async with Runtime(db) as runtime:
            outcome = await runtime.run(
                triage(HandoffTo(BILLING, history=history)), "refund", invocation_id="t1"
            )
    assert outcome.answer == "refund issued"
    assert TOLD["billing"].seed == seed


async def test_a_chain_of_two_handoffs_is_followed_to_its_end(db: str) -> None:
    def hands_on(request: ModelRequest) -> dict[str, Any]:
        return {"kind": "handoff", "to": "billing", "reason": "billing knows"}

    support = Agent("support", ScriptedModel(hands_on), [], handoffs=[BILLING])
    with trio.fail_after(30):
        async with Runtime(db) as runtime:
            outcome = await runtime.run(triage(support, to="support"), "refund", invocation_id="t1")
            second = await runtime.load(handoff_id_of(handoff_id_of("t1")))
    assert outcome.chain == ["t1", handoff_id_of("t1"), handoff_id_of(handoff_id_of("t1"))]
    assert outcome.answer == "refund issued"
    assert second.handed_off_from is not None
    assert (second.handed_off_from.hops, second.handed_off_from.chain_root) == (2, "t1")


async def test_a_handoff_to_an_agent_it_does_not_hand_off_to_is_rejected_and_told(
    db: str,
) -> None:
    with trio.fail_after(30):
        async with Runtime(db) as runtime:
            outcome = await runtime.run(triage(to="legal"), "refund", invocation_id="t1")
            source = await runtime.load("t1")
    assert outcome.reason is TerminalReason.COMPLETED
    assert outcome.chain is None
    rejection = source.turns[1].rejection
    assert rejection is not None
    assert rejection.rejection_class.value == "unknown_handoff"
    assert rejection.problems == ["no handoff to 'legal': this agent may hand off to 'billing'"]
    assert "billing" not in TOLD


async def test_a_chain_stops_handing_off_past_its_bound(db: str) -> None:
    """An agent that hands off to itself: the handoff past MAX_HANDOFFS is refused, and told."""

    def again(request: ModelRequest) -> dict[str, Any]:
        if request.turns and request.turns[-1].rejection is not None:
            return {"kind": "final", "answer": request.turns[-1].rejection.problems[0]}
        return {"kind": "handoff", "to": "looper", "reason": "once more"}

    model = ScriptedModel(again)
    looper = Agent("looper", model, [], handoffs=[Agent("looper", model, [])])
    # A cycle (an Agent is frozen, and names its targets when it is made): its target is itself.
    object.__setattr__(looper, "handoffs", {"looper": HandoffTo(looper)})
    with trio.fail_after(60):
        async with Runtime(db) as runtime:
            outcome = await runtime.run(looper, "loop", invocation_id="t1")
    assert outcome.chain is not None
    assert len(outcome.chain) == MAX_HANDOFFS + 1
    assert len(set(outcome.chain)) == len(outcome.chain)
    assert outcome.reason is TerminalReason.COMPLETED
    assert outcome.answer == (
        f"no handoff: this chain made {MAX_HANDOFFS} handoffs, the most one chain makes"
    )


async def test_a_source_that_ended_handed_off_before_its_target_started_is_followed_once(
    db: str,
) -> None:
    """The crash case: the source's end is committed, the target never started."""
    agent = triage()
    with trio.fail_after(30):
        async with Runtime(db) as runtime:
            # The Driver's start alone records the source's end and follows nothing.
            request = StartRequest(agent=agent, goal="refund", invocation_id="t1")
            ended = await runtime.driver.start(request=request)
            assert ended.reason is TerminalReason.HANDED_OFF
            with pytest.raises(Exception, match="no invocation"):
                await runtime.load(handoff_id_of("t1"))
            first = await runtime.resume("t1", agent)
            events = len(await runtime.history(handoff_id_of("t1")))
            again = await runtime.resume("t1", agent)
            after = len(await runtime.history(handoff_id_of("t1")))
    assert first.chain == again.chain == ["t1", handoff_id_of("t1")]
    assert first.answer == again.answer == "refund issued"
    assert after == events  # the target ran once


@pytest.mark.parametrize(
    ("handoffs", "problem"),
    [
        ("billing", "must be a list of agents"),
        ([BILLING, BILLING], "two handoffs to agents named 'billing'"),
        (["billing"], "must be an Agent"),
    ],
)
def test_an_agent_refuses_malformed_handoffs(handoffs: Any, problem: str) -> None:
    with pytest.raises(UsageError, match=problem):
        Agent("triage", ScriptedModel(lambda r: {}), [], handoffs=handoffs)


def test_a_handoff_refuses_an_unknown_history() -> None:
    with pytest.raises(UsageError, match="history must be one of full, summary, none"):
        HandoffTo(BILLING, history="some")


def _request(handoffs: list[str]) -> Request:
    return Request(
        invocation_id="i", agent_name="triage", goal="g", step=1, turns=[], tools=[],
        handoffs=handoffs,
    )  # fmt: skip


def test_an_adapter_offers_a_transfer_tool_per_target_and_reads_a_call_of_one_as_a_handoff() -> (
    None
):
    request = _request(["billing", "legal team"])
    assert [s.name for s in handoff_schemas(request)] == [
        "transfer_to_billing",
        "transfer_to_legal_team",
    ]
    assert "transfer_to_billing, transfer_to_legal_team" in system_prompt(request)
    call = {"id": "c", "name": "transfer_to_legal_team", "arguments": '{"reason": "law"}'}
    assert as_handoff({"kind": "tool_calls", "calls": [call]}, request) == {
        "kind": "handoff",
        "to": "legal team",
        "reason": "law",
        "summary": None,
    }
    # Next to another call, or with arguments that are not JSON: left for the core to refuse.
    other = {"id": "d", "name": "look", "arguments": "{}"}
    mixed = {"kind": "tool_calls", "calls": [call, other]}
    assert as_handoff(mixed, request) is mixed
    broken = {"kind": "tool_calls", "calls": [{**call, "arguments": "{not json"}]}
    assert as_handoff(broken, request) is broken
    assert as_handoff({"kind": "final", "answer": "x"}, _request([])) == {
        "kind": "final",
        "answer": "x",
    }
