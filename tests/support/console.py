"""The console under test: a real hypercorn server on a free port, and the agents it shows."""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

import httpx2
import pytest
import trio

from loop_actors import (
    Agent,
    Clarification,
    Final,
    ModelRequest,
    Runtime,
    ScriptedModel,
    ToolCall,
    ToolCalls,
    tool,
)
from loop_actors.console import ConsoleSettings, serve_console

TOKEN = "console-test-token-0123456789"

DROPPED_STREAMS = pytest.mark.filterwarnings(
    "ignore:Async generator .* was garbage collected before it had been exhausted:ResourceWarning"
)
"""For a test that drops a stream mid-way: httpx2's line reader leaves its inner byte
generators unexhausted, and under trio their garbage collection warns (the response
itself is closed), as tests/agent/test_mcp.py notes for the MCP SDK."""
HOSTILE = "<script>alert('pwned')</script>"


@tool(effect="write", requires_approval=lambda arguments: arguments["amount"] > 100)
def refund(order_id: str, amount: int) -> str:
    """Refund an amount on an order; above 100 a person approves it."""
    return f"refunded {amount} on {order_id}: {HOSTILE}"


def _refunds(request: ModelRequest) -> Final | ToolCalls:
    if request.step == 1:
        return ToolCalls(
            calls=[ToolCall(id="r1", name="refund", arguments={"order_id": "A-1", "amount": 250})]
        )
    return Final(answer="; ".join(str(result.output) for result in request.results))


refunds = Agent("refunds", ScriptedModel(_refunds), tools=[refund])
"""Pauses for approval at step 1; after it, completes with the tool's output (``<script>``)."""


async def paused_refund(db_url: str, invocation_id: str = "refund-1") -> str:
    """Run ``refunds`` until it pauses; the digest to approve."""
    with trio.fail_after(30):
        async with Runtime(db_url) as runtime:
            outcome = await runtime.run(
                refunds, f"refund A-1 {HOSTILE}", invocation_id=invocation_id
            )
    assert outcome.digest is not None, outcome
    return outcome.digest


async def completed_refund(db_url: str, invocation_id: str = "refund-done") -> None:
    """Run ``refunds`` through its approval to the end (the output holds ``<script>``)."""
    with trio.fail_after(30):
        async with Runtime(db_url) as runtime:
            paused = await runtime.run(refunds, "refund A-1", invocation_id=invocation_id)
            assert paused.digest is not None
            await runtime.approve(invocation_id, digest=paused.digest, by="alice")
            done = await runtime.resume(invocation_id, refunds)
    assert done.reason.value == "completed", done


def _asks(request: ModelRequest) -> Final | Clarification:
    if request.turns and request.turns[-1].reply is not None:
        return Final(answer=f"you said {request.turns[-1].reply}")
    return Clarification(question=f"which order? {HOSTILE}")


asker = Agent("asker", ScriptedModel(_asks))
"""Pauses with a question (holding ``<script>``); completes with the answer it got."""


def gated_agent(gates: list[trio.Event]) -> Agent:
    """An agent of ``len(gates)`` tool steps; step N's tool waits for ``gates[N - 1]``."""

    @tool
    async def wait_for_gate(n: int) -> str:
        """Wait until the gate of step n opens."""
        await gates[n - 1].wait()
        return f"gate {n} open"

    def decide(request: ModelRequest) -> Final | ToolCalls:
        if request.step <= len(gates):
            call = ToolCall(
                id=f"g{request.step}", name="wait_for_gate", arguments={"n": request.step}
            )
            return ToolCalls(calls=[call])
        return Final(answer="all gates passed")

    return Agent("gated", ScriptedModel(decide), tools=[wait_for_gate])


async def server_sent(response: httpx2.Response) -> AsyncGenerator[dict[str, str]]:
    """The events of an SSE response as they come: each one's fields (comments left out)."""
    fields: dict[str, str] = {}
    async for line in response.aiter_lines():
        if not line:
            if fields:
                yield fields
            fields = {}
            continue
        if line.startswith(":"):
            continue
        name, _, value = line.partition(":")
        fields[name] = value[1:] if value.startswith(" ") else value


@asynccontextmanager
async def serving(
    db_url: str,
    *,
    host: str = "127.0.0.1",
    token: str = TOKEN,
    forwarded_allow_ips: Sequence[str] = (),
    agents: Sequence[Agent] = (),
) -> AsyncIterator[str]:
    """The console on ``db_url`` on a free port, for the block: its base URL."""
    settings = ConsoleSettings.resolve(
        db_url=db_url, host=host, port=0, token=token, forwarded_allow_ips=forwarded_allow_ips
    )
    async with trio.open_nursery() as nursery:
        bound: list[str] = await nursery.start(partial(serve_console, settings, agents=agents))
        try:
            yield bound[0]
        finally:
            nursery.cancel_scope.cancel()


def client(base: str, **kwargs: Any) -> httpx2.AsyncClient:
    """An HTTP client of the console (no token unless given as a header)."""
    return httpx2.AsyncClient(base_url=base, timeout=10, **kwargs)


def bearer(token: str = TOKEN) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def _waits(request: ModelRequest) -> dict[str, Any]:
    if request.step == 1:
        return {
            "kind": "wait",
            "reason": "the shop opens in a year",
            "until": "2999-01-01T00:00:00Z",
        }
    return {"kind": "final", "answer": "bought"}


sleeper = Agent("sleeper", ScriptedModel(_waits))
"""Sleeps until 2999 at step 1 (a resume before then drives nothing)."""


async def event_types(db_url: str, invocation_id: str) -> list[str]:
    """The types of an invocation's committed events, in order."""
    async with Runtime(db_url) as runtime:
        return [type(event).__name__ for event in await runtime.history(invocation_id)]


@tool(effect="write", requires_approval=True)
def big_charge(amount: int) -> dict[str, int]:
    """Charge a large amount (a person approves it first)."""
    return {"charged": amount}


def _delegates_to(tool_name: str, goal: str) -> Any:
    def decide(request: ModelRequest) -> dict[str, Any]:
        if request.step == 1:
            call = {"id": "d", "name": tool_name, "arguments": {"goal": goal}}
            return {"kind": "tool_calls", "calls": [call]}
        return {"kind": "final", "answer": "done"}

    return decide


def _charges(request: ModelRequest) -> dict[str, Any]:
    if request.step == 1:
        call = {"id": "c", "name": "big_charge", "arguments": {"amount": 900}}
        return {"kind": "tool_calls", "calls": [call]}
    return {"kind": "final", "answer": "paid"}


approver = Agent("approver", ScriptedModel(_charges), [big_charge])
middle = Agent("middle", ScriptedModel(_delegates_to("approver", "pay 900")), [approver.as_tool()])
delegating_root = Agent(
    "root", ScriptedModel(_delegates_to("middle", "get it paid")), [middle.as_tool()]
)
"""Delegates to ``middle``, which delegates to ``approver``, which waits for an approval."""
