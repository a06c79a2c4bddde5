"""The workers' tests' agent (a lookup, then an answer naming the goal) and a run's queue row."""

from __future__ import annotations

from typing import Any

from loop_actors import Agent, ModelRequest, Runtime, ScriptedModel, tool


@tool
def look(item: str) -> str:
    """Look something up."""
    return f"saw {item}"


def two_steps(request: ModelRequest) -> dict[str, Any]:
    if request.step == 1:
        return {
            "kind": "tool_calls",
            "calls": [{"id": "c1", "name": "look", "arguments": {"item": request.goal}}],
        }
    return {"kind": "final", "answer": f"done {request.goal}"}


AGENT = Agent("looker", ScriptedModel(two_steps), [look])


async def queue_row(db_url: str, invocation_id: str) -> Any:
    async with Runtime(db_url) as runtime:
        keeper = runtime._lease_keeper()
        return await keeper.call(keeper.queue.row, invocation_id)
