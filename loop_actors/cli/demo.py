"""Seed 000's example: look up a profile and a policy in parallel, then answer."""

from __future__ import annotations

import trio

from loop_actors._messages import ModelRequest
from loop_actors.agent.agent import Agent
from loop_actors.agent.model import ScriptedModel
from loop_actors.agent.tools import tool

VALUES = {"profile": "active", "policy": "refund-under-100"}


@tool
async def lookup(key: str) -> dict[str, str]:
    """Look up a key (the profile answers last, to show that call order is kept)."""
    if key == "profile":
        await trio.sleep(0.01)
    if key not in VALUES:
        raise KeyError(f"key {key!r} not found")
    return {"key": key, "value": VALUES[key]}


def _decide(request: ModelRequest) -> dict[str, object]:
    if not request.turns:
        return {
            "kind": "tool_calls",
            "calls": [
                {"id": "call-profile", "name": "lookup", "arguments": {"key": "profile"}},
                {"id": "call-policy", "name": "lookup", "arguments": {"key": "policy"}},
            ],
        }
    values = {
        r.output["key"]: r.output["value"] for r in request.results if isinstance(r.output, dict)
    }
    return {"kind": "final", "answer": f"profile={values['profile']}; policy={values['policy']}"}


demo_agent = Agent(name="demo", model=ScriptedModel(_decide), tools=[lookup])
"""The demo agent: ``loop-actors run loop_actors.cli.demo:demo_agent --goal ...`` runs it too."""

DEMO_GOAL = "Can this customer get a refund? Look up their profile and the refund policy."
