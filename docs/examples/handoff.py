"""Hand a conversation to another agent: triage looks the order up, then billing answers.

Run it from this folder: ``python handoff.py``. ``triage`` may hand off to ``billing``
(told the steps triage took) and to ``legal`` (told only the summary triage writes).
``Runtime.run`` follows the handoff and returns the last outcome, with the chain of ids.
"""

from __future__ import annotations

from typing import Any

import trio

from loop_actors import Agent, HandoffTo, ModelRequest, Runtime, ScriptedModel, tool


@tool
def look(order: str) -> dict[str, object]:
    """Look an order up."""
    return {"order": order, "paid": 40, "shipped": False}


def bills(request: ModelRequest) -> dict[str, Any]:
    origin = request.handed_off_from
    assert origin is not None  # billing only ever runs as the target of a handoff
    told = "its steps" if origin.seed and origin.seed.startswith("{") else "nothing"
    return {
        "kind": "final",
        "answer": f"refund of 40 issued (took over from {origin.source_agent}, told {told})",
    }


billing = Agent("billing", ScriptedModel(bills), [])
legal = Agent("legal", ScriptedModel(lambda request: {"kind": "final", "answer": "see terms"}), [])


def triages(request: ModelRequest) -> dict[str, Any]:
    if request.step == 1:
        return {
            "kind": "tool_calls",
            "calls": [{"id": "l1", "name": "look", "arguments": {"order": "A-1"}}],
        }
    return {
        "kind": "handoff",
        "to": "billing",
        "reason": "the customer wants a refund",
        "summary": "order A-1, paid 40, not shipped",
    }


triage = Agent(
    "triage",
    ScriptedModel(triages),
    [look],
    handoffs=[billing, HandoffTo(legal, history="summary")],
)


async def demo() -> None:
    async with Runtime("sqlite:///handoff.db") as runtime:
        outcome = await runtime.run(triage, "I want my money back", invocation_id="ticket-7")
        assert outcome.chain is not None
        print(f"{outcome.reason.value}: {outcome.answer}")
        print(f"chain: {len(outcome.chain)} invocations, from {outcome.chain[0]}")
        source = await runtime.load("ticket-7")
        assert source.terminated is not None
        print(f"ticket-7: {source.terminated.reason.value}: {source.terminated.detail}")


if __name__ == "__main__":
    trio.run(demo)
