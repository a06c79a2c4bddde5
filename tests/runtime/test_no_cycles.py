"""A finished invocation is freed by reference counting: it leaves no garbage cycle behind.

A cycle between the controller and its turn core (a bound method handed to the core) made
every finished invocation wait for the cyclic garbage collector, which cost about 65 us a
turn in collections (docs/performance.md, section 1).
"""

from __future__ import annotations

import gc
from pathlib import Path
from typing import Any

import trio

from aggregates.invocation import Invocation
from aggregates.turn import TurnCore
from loop_actors import Agent, Budget, ModelRequest, Runtime, ScriptedModel, tool
from loop_actors.runtime.controller import Controller


@tool
async def lookup(key: str) -> dict[str, Any]:
    """Return a small record at once."""
    return {"key": key, "ok": True}


def decide(request: ModelRequest) -> dict[str, Any]:
    if request.results:
        return {"kind": "final", "answer": "done"}
    return {
        "kind": "tool_calls",
        "calls": [
            {"id": f"c{j}", "name": "lookup", "arguments": {"key": f"k{j}"}} for j in range(3)
        ],
    }


AGENT = Agent("cycles", ScriptedModel(decide), [lookup], Budget(max_steps=3, max_tool_calls=3))


def test_finished_invocations_leave_no_controller_core_or_invocation_to_the_collector(
    tmp_path: Path,
) -> None:
    """Tried: three runs on a real SQLite file with the collector off, then a collection
    that keeps what it finds: none of it is a controller, a turn core or an invocation."""

    async def main() -> None:
        with trio.fail_after(30):
            async with Runtime(f"sqlite:///{tmp_path / 'cycles.db'}") as runtime:
                await runtime.run(AGENT, "warm up")
                gc.collect()
                gc.disable()
                gc.set_debug(gc.DEBUG_SAVEALL)
                for i in range(3):
                    outcome = await runtime.run(AGENT, f"goal {i}")
                    assert outcome.reason == "completed"
                gc.collect()

    gc.garbage.clear()
    try:
        trio.run(main)
        found = [o for o in gc.garbage if isinstance(o, Controller | TurnCore | Invocation)]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
    assert found == []
