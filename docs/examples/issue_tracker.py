"""An agent that files an issue with a write tool that has no ``reconcile``.

The tracker does not answer within the tool's timeout, so the write's outcome is
unknown and nobody can ask the tracker: a person settles it with
``loop-actors effects resolve`` (docs/how-to/resolve-an-effect-by-hand.md).
"""

from typing import Any

import trio

from loop_actors import Agent, ModelRequest, ScriptedModel, tool


@tool(effect="write", timeout_s=2)
async def create_issue(title: str) -> dict[str, Any]:
    """File an issue in the tracker (which, here, never answers)."""
    await trio.sleep_forever()
    return {"title": title}


def tracker_model(request: ModelRequest) -> dict[str, Any]:
    if request.step == 1:
        return {
            "kind": "tool_calls",
            "calls": [{"id": "c1", "name": "create_issue", "arguments": {"title": request.goal}}],
        }
    result = request.results[-1]
    return {"kind": "final", "answer": "filed" if result.ok else "not filed"}


agent = Agent("tracker", ScriptedModel(tracker_model), [create_issue])
