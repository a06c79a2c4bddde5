"""The runtime in an asyncio program: concurrent runs, a timeout, a typed error."""

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from types import SimpleNamespace
from typing import Any
from uuid import uuid4

import trio
from first_agent import agent

from loop_actors import (
    Agent,
    AsyncioRuntime,
    InvocationNotFoundError,
    ModelRequest,
    Outcome,
    ScriptedModel,
    ToolCall,
    ToolCalls,
    tool,
)


@tool
async def wait_for_courier() -> str:
    """Wait until the courier answers (here: practically forever)."""
    await trio.sleep(3600)  # tools and models run in the runtime's trio thread
    return "answered"


def always_wait(request: ModelRequest) -> ToolCalls:
    return ToolCalls(calls=[ToolCall(id=f"wait-{request.step}", name="wait_for_courier")])


courier = Agent("courier", ScriptedModel(always_wait), tools=[wait_for_courier])


async def handle_request(runtime: AsyncioRuntime, order_id: str) -> Outcome:
    """What a request handler of a web service (FastAPI, aiohttp, ...) awaits."""
    goal = f"Where is order {order_id}?"
    return await runtime.run(agent, goal, invocation_id=f"ask-{order_id}")


@asynccontextmanager
async def lifespan(app: Any) -> AsyncIterator[None]:
    """A FastAPI lifespan (``FastAPI(lifespan=lifespan)``): one runtime for the app's life."""
    async with AsyncioRuntime() as runtime:
        app.state.runtime = runtime
        yield


async def main() -> None:
    app = SimpleNamespace(state=SimpleNamespace())  # stands in for a FastAPI app
    async with lifespan(app):
        runtime: AsyncioRuntime = app.state.runtime
        # Concurrent requests share the runtime's store and Journal (group commit).
        orders = ["A-1001", "A-1002", "A-9999"]
        outcomes = await asyncio.gather(*(handle_request(runtime, o) for o in orders))
        for outcome in outcomes:
            print(outcome.invocation_id, outcome.reason, outcome.answer or outcome.detail)

        # An asyncio timeout cancels the run, which is recorded as cancelled.
        courier_id = f"courier-{uuid4().hex}"
        try:
            async with asyncio.timeout(0.5):
                await runtime.run(courier, "Wait for the courier.", invocation_id=courier_id)
        except TimeoutError:
            recorded = Outcome.of(await runtime.load(courier_id))
            print("courier: timed out, recorded as", recorded.reason)

        # The runtime's exceptions reach asyncio with their own types.
        try:
            await runtime.history("no-such-id")
        except InvocationNotFoundError as error:
            print("error:", type(error).__name__, error)


if __name__ == "__main__":
    asyncio.run(main())
