"""Test a loop change against past runs: replay recorded invocations under a changed agent.

Run it from this folder: ``python replay_change.py``. It records two runs of a refund
agent (one stopped by its step budget), then replays them under the same agent and
under one whose refunds need approval. The refund service counts its calls: a replay
makes none.
"""

from __future__ import annotations

from typing import Any

import trio

from loop_actors import Agent, Budget, Runtime, ScriptedModel, tool

REFUNDS: list[int] = []

SCRIPT: list[dict[str, Any]] = [
    {
        "kind": "tool_calls",
        "calls": [{"id": "c1", "name": "lookup", "arguments": {"order": "A-1"}}],
    },
    {"kind": "tool_calls", "calls": [{"id": "c2", "name": "refund", "arguments": {"amount": 40}}]},
    {"kind": "final", "answer": "refunded 40"},
]


@tool
def lookup(order: str) -> dict[str, object]:
    """Look an order up."""
    return {"order": order, "paid": 40}


def refund(amount: int) -> dict[str, str]:
    """Refund the customer."""
    REFUNDS.append(amount)
    return {"receipt": f"rf-{len(REFUNDS)}"}


def desk(*, budget: int = 10, approval: bool = False) -> Agent:
    """The refund desk agent; ``approval``: refunds wait for a person."""
    tools = [lookup, tool(effect="write", requires_approval=approval)(refund)]
    return Agent("refund-desk", ScriptedModel(SCRIPT), tools, Budget(max_steps=budget))


async def main() -> None:
    async with Runtime("memory://") as runtime:
        full = await runtime.run(desk(), "refund order A-1", invocation_id="full")
        short = await runtime.run(desk(budget=1), "refund order A-1", invocation_id="short")
        print(f"recorded: full {full.reason}, short {short.reason}, refunds {REFUNDS}")

        same = await runtime.replay(desk(), ["full"])
        print(f"same agent: identical={same.identical}")

        stricter = await runtime.replay(desk(approval=True), ["full"])
        first = stricter.results[0].first
        assert first is not None
        print(f"refunds need approval: {first.kind} at step {first.step} ({first.detail})")

        roomier = await runtime.replay(desk(budget=10), ["short"])
        first = roomier.results[0].first
        assert first is not None
        print(f"a larger step budget: {first.kind} at step {first.step}")
        print(f"refunds after the replays: {REFUNDS}")


if __name__ == "__main__":
    trio.run(main)
