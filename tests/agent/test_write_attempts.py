"""What a toolbox remembers of a write's attempts: only the ones whose function may still run.

A later reconcile of a write waits for an earlier attempt still running in this process
(tests/agent/test_timed_out_writes.py). An attempt that was refused before its function started,
or that has stopped, must not be waited for, nor kept.

Bad inputs tried: arguments the tool's types refuse (a string for an int), given to
``Tool.invoke`` of an async tool, a plain one run in a thread, and an inline one.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
import trio
from pydantic import ValidationError

from loop_actors import (
    Agent,
    ModelRequest,
    Reconciled,
    Runtime,
    ScriptedModel,
    TerminalReason,
    ToolContext,
    tool,
)


@tool(effect="write", reconcile=lambda amount: Reconciled(status="not_found"))
async def pay_async(amount: int, context: ToolContext) -> dict[str, Any]:
    """Pay (async)."""
    return {"paid": amount, "key": context.effect_key}


@tool(effect="write", reconcile=lambda amount: Reconciled(status="not_found"))
def pay_in_thread(amount: int, context: ToolContext) -> dict[str, Any]:
    """Pay (a plain function, run in a worker thread)."""
    return {"paid": amount, "key": context.effect_key}


@tool(effect="write", inline=True, reconcile=lambda amount: Reconciled(status="not_found"))
def pay_inline(amount: int, context: ToolContext) -> dict[str, Any]:
    """Pay (a plain function run on the trio thread)."""
    return {"paid": amount, "key": context.effect_key}


@pytest.mark.parametrize("pay", [pay_async, pay_in_thread, pay_inline])
async def test_a_write_refused_before_its_function_starts_is_not_left_running(pay: Any) -> None:
    running = threading.Event()
    with pytest.raises(ValidationError):
        await pay.invoke({"amount": "a lot"}, None, running=running)
    assert running.is_set()  # without it, a reconcile would wait for a call that never ran


@pytest.mark.parametrize("pay", [pay_async, pay_in_thread, pay_inline])
async def test_a_toolbox_keeps_no_attempt_of_a_write_that_has_stopped(
    db_url: str, pay: Any
) -> None:
    def decide(request: ModelRequest) -> dict[str, Any]:
        if request.step <= 3:
            return {
                "kind": "tool_calls",
                "calls": [
                    {
                        "id": f"p{request.step}",
                        "name": pay.name,
                        "arguments": {"amount": request.step},
                    }
                ],
            }
        return {"kind": "final", "answer": "paid"}

    agent = Agent("payer", ScriptedModel(decide), [pay])
    with trio.fail_after(30):
        async with Runtime(db_url) as runtime:
            for n in range(5):
                outcome = await runtime.run(agent, f"pay {n}")
                assert outcome.reason is TerminalReason.COMPLETED
    assert agent.toolbox._attempts == {}  # 15 writes, none remembered
