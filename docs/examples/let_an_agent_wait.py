"""Let an agent wait: a tool that sleeps until a time, a model that waits, an early wake.

Run it from this folder: ``python let_an_agent_wait.py``. The invocation pauses
``sleeping`` with ``wake_at`` recorded and no process holding it; here this process
wakes it itself (``resume_when_due``), or a person wakes it early (``wake``).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import trio

from loop_actors import Agent, ModelRequest, Runtime, ScriptedModel, ToolContext, tool

CALLS: list[str] = []


@tool(effect="write")
async def remind(ctx: ToolContext, who: str, at: str) -> str:
    """Send ``who`` a reminder at ``at`` (an ISO time with a zone)."""
    CALLS.append("called")
    await ctx.sleep_until(datetime.fromisoformat(at))  # the run pauses here
    CALLS.append("past its sleep")  # reached once, when it wakes
    return f"reminded {who}"


def reminds(request: ModelRequest) -> dict[str, Any]:
    if request.step == 1:
        soon = (datetime.now(UTC) + timedelta(seconds=1)).isoformat()
        return {
            "kind": "tool_calls",
            "calls": [{"id": "r", "name": "remind", "arguments": {"who": "ann", "at": soon}}],
        }
    return {"kind": "final", "answer": request.turns[-1].results[0].output}


def waits(request: ModelRequest) -> dict[str, Any]:
    if request.step == 1:
        tomorrow = datetime.now(UTC) + timedelta(days=1)
        return {"kind": "wait", "reason": "the shop opens tomorrow", "until": tomorrow.isoformat()}
    told = request.turns[-1].reply or ""  # "woke at <time>", and " (early, by <who>)"
    return {"kind": "final", "answer": "bought bread" + (" early" if "early" in told else "")}


reminder = Agent("reminder", ScriptedModel(reminds), [remind])
shopper = Agent("shopper", ScriptedModel(waits), [])


async def main() -> None:
    async with Runtime("memory://") as runtime:
        slept = await runtime.run(reminder, "remind ann", invocation_id="reminder")
        print(f"reminder: {slept.reason.value} (wake_at set: {slept.wake_at is not None})")
        done = await runtime.resume_when_due("reminder", reminder)
        print(f"reminder: {done.reason.value}: {done.answer}")
        print(f"the tool: {', '.join(CALLS)}")

        waiting = await runtime.run(shopper, "buy bread", invocation_id="shopper")
        print(f"shopper: {waiting.reason.value}: {waiting.detail}")
        early = await runtime.wake("shopper", by="ops")
        print(f"woken early: {early}")
        done = await runtime.resume("shopper", shopper)
        print(f"shopper: {done.reason.value}: {done.answer}")


if __name__ == "__main__":
    trio.run(main)
