"""The agent the audit tests run: a read, then a write with an effect key, then an answer."""

from __future__ import annotations

from typing import Any

from loop_actors import Agent, ModelRequest, Reconciled, ScriptedModel, ToolContext, tool

RUNS: list[str] = []
"""The keys ``lookup`` was called with (a test clears it to see whether anything ran)."""


@tool
async def lookup(key: str) -> dict[str, str]:
    """Look up a value."""
    RUNS.append(key)
    return {"key": key, "value": "refund-under-100"}


@tool(effect="write", reconcile=lambda key: Reconciled(status="not_found"))
async def refund(amount: int, context: ToolContext) -> dict[str, Any]:
    """Refund an amount."""
    return {"receipt": f"r-{context.effect_key}", "amount": amount}


def decide(request: ModelRequest) -> dict[str, Any]:
    if request.step == 1:
        return {
            "kind": "tool_calls",
            "calls": [{"id": "c1", "name": "lookup", "arguments": {"key": "policy"}}],
        }
    if request.step == 2:
        return {
            "kind": "tool_calls",
            "calls": [{"id": "c2", "name": "refund", "arguments": {"amount": 40}}],
        }
    return {"kind": "final", "answer": "refunded 40 under refund-under-100"}


AGENT = Agent("auditor", ScriptedModel(decide), [lookup, refund])
