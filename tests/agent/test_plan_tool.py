"""A provider's model plans through ``propose_plan``: offered while planning, read as a plan.

Against a fake OpenAI-compatible server on loopback. Bad inputs tried: a plan call next to
another call, and one whose arguments are not JSON (both left for the core to refuse).
"""

from __future__ import annotations

import json
from typing import Any

from loop_actors import (
    Agent,
    OpenAIModel,
    Planning,
    Reconciled,
    RetryPolicy,
    Runtime,
    TerminalReason,
    tool,
)
from loop_actors._messages import ModelRequest
from loop_actors.agent.adapters import system_prompt
from loop_actors.agent.plan_tool import PLAN_INSTRUCTION, PLAN_TOOL, as_plan, plan_schemas
from tests.support.fake_providers import openai_text, openai_tool_calls, serve

FAST = RetryPolicy(max_attempts=3, base_s=0.001, max_delay_s=0.01)
REFUNDS: list[int] = []


@tool
async def look_up(order_id: str) -> dict[str, Any]:
    """Read an order."""
    return {"order_id": order_id, "paid": 30}


@tool(effect="write", reconcile=lambda key: Reconciled(status="not_found"))
async def refund(amount: int) -> dict[str, int]:
    """Refund an amount."""
    REFUNDS.append(amount)
    return {"refunded": amount}


def _request(*, planning: bool) -> ModelRequest:
    return ModelRequest(
        invocation_id="i", agent_name="a", goal="g", step=1, turns=[], tools=[],
        planning=planning,
    )  # fmt: skip


def test_the_plan_tool_is_offered_only_while_planning_and_a_call_of_it_is_a_plan() -> None:
    assert plan_schemas(_request(planning=False)) == []
    request = _request(planning=True)
    assert [s.name for s in plan_schemas(request)] == [PLAN_TOOL]
    assert PLAN_INSTRUCTION in system_prompt(request)
    steps = [{"tool": "refund", "arguments": {"amount": 30}}]
    call = {"id": "c", "name": PLAN_TOOL, "arguments": json.dumps({"steps": steps})}
    assert as_plan({"kind": "tool_calls", "calls": [call]}, request) == {
        "kind": "plan",
        "steps": steps,
        "summary": "",
    }
    mixed = {"kind": "tool_calls", "calls": [call, {"id": "d", "name": "look_up"}]}
    assert as_plan(mixed, request) is mixed
    broken = {"kind": "tool_calls", "calls": [{**call, "arguments": "{not json"}]}
    assert as_plan(broken, request) is broken
    assert as_plan({"kind": "tool_calls", "calls": [call]}, _request(planning=False))["kind"] == (
        "tool_calls"
    )


async def test_an_openai_model_plans_with_the_read_tools_then_writes_once_approved(
    db_url: str,
) -> None:
    plan = json.dumps(
        {"summary": "refund 30", "steps": [{"tool": "refund", "arguments": {"amount": 30}}]}
    )
    replies = [
        openai_tool_calls(("p1", PLAN_TOOL, plan)),
        openai_tool_calls(("c1", "refund", '{"amount": 30}')),
        openai_text("refunded 30"),
    ]
    with serve(replies) as provider:
        model = OpenAIModel("gpt-test", base_url=f"{provider.url}/v1", retry=FAST)
        agent = Agent("shop", model, [look_up, refund], planning=Planning())
        paused = await Runtime(db_url).run(agent, "refund the order", invocation_id="o1")
        assert paused.reason is TerminalReason.PLAN_APPROVAL_REQUIRED
        assert paused.digest is not None
        await Runtime(db_url).approve("o1", digest=paused.digest, by="alice")
        done = await Runtime(db_url).resume("o1", agent)
        first, second, _ = provider.requests
    assert done.reason is TerminalReason.COMPLETED
    assert REFUNDS == [30]
    assert [t["function"]["name"] for t in first["tools"]] == ["look_up", PLAN_TOOL]
    assert [t["function"]["name"] for t in second["tools"]] == ["look_up", "refund"]
    shown = [m["content"] for m in second["messages"] if isinstance(m.get("content"), str)]
    assert any(text.startswith("My plan: refund 30") for text in shown)
    assert "The plan was approved by alice." in shown
