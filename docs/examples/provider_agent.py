"""An agent on a real model: any server that speaks the OpenAI Chat Completions API.

Start a local server (vLLM, llama.cpp's llama-server, Ollama...), then:

    PROVIDER_BASE_URL=http://localhost:11434/v1 PROVIDER_MODEL=llama3.2 \
        python docs/examples/provider_agent.py "Where is order A-1001?"

or `loop-actors run provider_agent:agent --goal "Where is order A-1001?"` from this
folder, with the same variables.
"""

import os
import sys

import trio

from loop_actors import Agent, Budget, OpenAIModel, Price, RetryPolicy, Runtime, ToolError, tool

ORDERS = {"A-1001": "shipped", "A-1002": "being packed"}


@tool
def order_status(order_id: str) -> dict[str, str]:
    """Look up the status of an order by its id, e.g. A-1001."""
    if order_id not in ORDERS:
        raise ToolError(f"no order {order_id}")
    return {"order_id": order_id, "status": ORDERS[order_id]}


model = OpenAIModel(
    os.environ.get("PROVIDER_MODEL", "llama3.2"),
    base_url=os.environ["PROVIDER_BASE_URL"],  # e.g. http://localhost:8000/v1 for vLLM
    retry=RetryPolicy(max_attempts=4, base_s=0.5, max_delay_s=8.0),
    # What a hosted model would charge per million tokens (a local one costs nothing).
    price=Price(input_per_million=0.15, output_per_million=0.60),
)
agent = Agent(
    "orders",
    model,
    tools=[order_status],
    budget=Budget(max_steps=6, max_tokens=20_000, max_cost=0.05),
)


async def main(goal: str) -> None:
    async with Runtime() as runtime:
        outcome = await runtime.run(agent, goal)
        print(outcome.reason, "-", outcome.answer or outcome.detail)
        # Every DecisionProposed event records the usage of the call that made it.
        for event in await runtime.history(outcome.invocation_id):
            usage = getattr(event, "usage", None)
            if usage is not None:
                print(
                    f"step {getattr(event, 'step', '?')}: in={usage.input_tokens} "
                    f"out={usage.output_tokens} attempts={usage.attempts} cost={usage.cost:.7f}"
                )


if __name__ == "__main__":
    trio.run(main, sys.argv[1] if len(sys.argv) > 1 else "Where is order A-1001?")
