"""Six kinds of invocation run in parallel, so that every read model sees every outcome."""

from __future__ import annotations

from functools import partial
from typing import Any

import trio

from loop_actors import (
    Agent,
    Budget,
    ModelRequest,
    Reconciled,
    Runtime,
    ScriptedModel,
    ToolContext,
    ToolError,
    tool,
)

TABLES = [
    "trajectory_invocations",
    "trajectory_steps",
    "trajectory_calls",
    "metrics_invocations",
    "metrics_failed_calls",
    "metrics_effects",
    "open_effects",
]


@tool
async def lookup(key: str) -> dict[str, str]:
    """Look up a key."""
    if key == "missing":
        raise ToolError("no such key")
    return {"key": key}


def _write_reconcile(key: str) -> Reconciled:
    raise ConnectionError("down")


@tool(effect="write", reconcile=_write_reconcile)
async def pay(amount: int, context: ToolContext) -> str:
    """Pay; amounts over 100 lose their reply."""
    if amount > 100:
        raise TimeoutError("reply lost")
    return f"paid {amount}"


def behaviour(kind: int) -> Any:
    """Six kinds of invocation, so that every read model sees every outcome."""

    def decide(request: ModelRequest) -> dict[str, Any]:
        step = request.step
        if kind == 0:  # completed after reads, one failing
            if step == 1:
                return {
                    "kind": "tool_calls",
                    "calls": [
                        {"id": "a", "name": "lookup", "arguments": {"key": "x"}},
                        {"id": "b", "name": "lookup", "arguments": {"key": "missing"}},
                    ],
                }
            return {"kind": "final", "answer": "done"}
        if kind == 1:  # no progress
            return {
                "kind": "tool_calls",
                "calls": [{"id": "a", "name": "lookup", "arguments": {"key": "same"}}],
            }
        if kind == 2:  # invalid decision
            return {"kind": "tool_calls", "calls": []}
        if kind == 3:  # paused for clarification
            return {"kind": "clarification", "question": "which?"}
        if kind == 4:  # a committed write, then done
            if step == 1:
                return {
                    "kind": "tool_calls",
                    "calls": [{"id": "p", "name": "pay", "arguments": {"amount": 5}}],
                }
            return {"kind": "final", "answer": "paid"}
        # a write whose reply is lost and whose service is down: paused, effect open
        return {
            "kind": "tool_calls",
            "calls": [{"id": "p", "name": "pay", "arguments": {"amount": 500}}],
        }

    return decide


AGENTS = [
    Agent(f"agent-{kind % 2}", ScriptedModel(behaviour(kind)), [lookup, pay], Budget(max_steps=4))
    for kind in range(6)
]


async def populate(url: str, start: int, count: int) -> None:
    async with Runtime(url) as runtime, trio.open_nursery() as nursery:
        for i in range(start, start + count):
            nursery.start_soon(
                partial(
                    runtime.run,
                    AGENTS[i % 6],
                    f"goal {i}",
                    invocation_id=f"inv-{i:05d}",
                    task_class=f"c{i % 3}",
                )
            )
