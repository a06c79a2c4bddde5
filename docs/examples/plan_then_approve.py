"""Plan, then approve: the agent plans its refunds, a person approves, exactly those run.

Run it from this folder: ``python plan_then_approve.py``. The agent is given
``planning=Planning(approve_by="person")``: it starts read-only (it is offered only
``look_up``), proposes a plan of the refund it will make, and the run pauses
``plan_approval_required``. Once alice approves the plan (by its digest), the planned
refund runs without another pause; a second refund, outside the plan, waits for its own
approval. A second run's plan is denied: the model is told, and proposes a revised one.
"""

from __future__ import annotations

from typing import Any

import trio

from loop_actors import (
    Agent,
    ApprovalRefusedError,
    ModelRequest,
    Planning,
    Reconciled,
    Runtime,
    ScriptedModel,
    tool,
)
from projections import build_trajectory, plans_against_done

REFUNDED: list[tuple[str, int]] = []


@tool
def look_up(order_id: str) -> dict[str, Any]:
    """Read an order."""
    return {"order_id": order_id, "paid": 250, "item": "kettle"}


@tool(effect="write", reconcile=lambda key: Reconciled(status="not_found"))
def refund(order_id: str, amount: int) -> dict[str, Any]:
    """Refund an order."""
    REFUNDED.append((order_id, amount))
    return {"refunded": amount, "order_id": order_id}


def plan(amount: int, summary: str) -> dict[str, Any]:
    return {
        "kind": "plan",
        "summary": summary,
        "steps": [
            {
                "tool": "refund",
                "arguments": {"order_id": "A-1", "amount": amount},
                "description": "the kettle arrived broken",
            }
        ],
    }


def refund_call(call_id: str, order_id: str, amount: int) -> dict[str, Any]:
    call = {"id": call_id, "name": "refund", "arguments": {"order_id": order_id, "amount": amount}}
    return {"kind": "tool_calls", "calls": [call]}


def decide(request: ModelRequest) -> dict[str, Any]:
    match request.step:
        case 1:
            lookup = {"id": "c1", "name": "look_up", "arguments": {"order_id": "A-1"}}
            return {"kind": "tool_calls", "calls": [lookup]}
        case 2:
            return plan(250, "refund the broken kettle")
        case 3 if (request.turns[-1].approval or "").startswith("denied"):
            return plan(200, "refund 200 once the receipt is in")
        case 3:
            return refund_call("c3", "A-1", 250)  # the planned write
        case 4:
            return refund_call("c4", "A-2", 40)  # a write the plan does not hold
    return {"kind": "final", "answer": "refunded A-1 (planned) and A-2 (approved on its own)"}


agent = Agent(
    "refunds", ScriptedModel(decide), [look_up, refund], planning=Planning(approve_by="person")
)


async def demo() -> None:
    async with Runtime("sqlite:///plan_then_approve.db") as runtime:
        paused = await runtime.run(agent, "refund order A-1", invocation_id="refund-1")
        assert paused.digest is not None
        assert paused.plan is not None
        print(f"{paused.reason.value}: {paused.detail}")
        for write in paused.plan:
            print(f"  {write['step']}. {write['tool']} {write['arguments']}")
        try:
            await runtime.approve("refund-1", digest="0" * 64, by="mallory")
        except ApprovalRefusedError:
            print("a wrong digest is refused")

        await runtime.approve("refund-1", digest=paused.digest, by="alice")
        outside = await runtime.resume("refund-1", agent)
        assert outside.digest is not None
        assert outside.pending_calls is not None
        for call in outside.pending_calls:
            print(
                f"{outside.reason.value}: {call['call_id']} {call['name']} "
                f"{call['arguments']} needs_approval={call['needs_approval']}"
            )
        print(f"refunded so far: {REFUNDED}")

        await runtime.approve("refund-1", digest=outside.digest, by="alice")
        done = await runtime.resume("refund-1", agent)
        print(f"{done.reason.value} - {done.answer}")

        # The trajectory: the plan against what was done.
        for shown in plans_against_done(build_trajectory(await runtime.history("refund-1"))):
            made = [f"{w.tool} {w.arguments['order_id']} at step {w.made_at}" for w in shown.writes]
            extra = [f"{w.tool} {w.arguments['order_id']} at step {w.step}" for w in shown.outside]
            print(f"plan of step {shown.step} ({shown.approval}): made {made}; outside {extra}")

        # A denied plan goes back to the model, which revises it.
        await runtime.run(agent, "refund order A-1", invocation_id="refund-2")
        await runtime.deny("refund-2", by="bob", reason="ask for the receipt first")
        revised = await runtime.resume("refund-2", agent)
        print(f"refund-2 after the denial: {revised.reason.value}: {revised.detail}")


if __name__ == "__main__":
    trio.run(demo)
