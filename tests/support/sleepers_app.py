"""An agent whose write tool sleeps until the time its goal names, for process tests.

Copied into a test's folder and loaded as ``sleepers_app:agent``. Each call of the tool
appends a line to the file ``$SLEEPERS_LOG``: ``start <attempt>`` when it is called,
``after <effect key>`` once past its sleep, so a test counts how often each part ran.
"""

from __future__ import annotations

import os
from datetime import datetime
from pathlib import Path
from typing import Any

from loop_actors import Agent, ModelRequest, ScriptedModel, ToolContext, tool


def _note(line: str) -> None:
    with Path(os.environ["SLEEPERS_LOG"]).open("a") as log:
        log.write(line + "\n")


@tool(effect="write")
async def remind(ctx: ToolContext, at: str) -> dict[str, Any]:
    """Send a reminder at ``at`` (an ISO time with a zone)."""
    _note(f"start {ctx.attempt}")
    await ctx.sleep_until(datetime.fromisoformat(at))
    _note(f"after {ctx.effect_key}")
    return {"reminded_at": at}


def _decide(request: ModelRequest) -> dict[str, Any]:
    if request.step == 1:
        return {
            "kind": "tool_calls",
            "calls": [{"id": "r", "name": "remind", "arguments": {"at": request.goal}}],
        }
    return {"kind": "final", "answer": f"reminded: {request.turns[-1].results[0].output}"}


agent = Agent("sleeper", ScriptedModel(_decide), [remind])
