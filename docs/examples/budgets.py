"""Token and cost budgets, a price table, and the wind-down notice."""

import trio

from loop_actors import (
    Agent,
    Budget,
    Final,
    ModelRequest,
    Price,
    Runtime,
    ScriptedModel,
    ToolCall,
    ToolCalls,
    Usage,
    tool,
)


@tool
def search(query: str) -> str:
    """Search the notes."""
    return f"nothing new about {query}"


def keep_searching(request: ModelRequest) -> ToolCalls:
    """A model that never stops by itself."""
    return ToolCalls(
        calls=[
            ToolCall(id=f"s{request.step}", name="search", arguments={"query": f"q{request.step}"})
        ]
    )


# Every call reports 400 input tokens; a real adapter reports what the provider counted.
tokens = Agent(
    "researcher",
    ScriptedModel(keep_searching, usage=Usage(input_tokens=400)),
    tools=[search],
    budget=Budget(max_tokens=1000, reserve_tokens=400, max_repeated_plan=10),
)

# No cost reported: the price table turns tokens into money (1 million input tokens: 1.00).
cost = Agent(
    "researcher",
    ScriptedModel(keep_searching, usage=Usage(input_tokens=1_000_000)),
    tools=[search],
    budget=Budget(max_cost=2.5, reserve_cost=1.0, max_repeated_plan=10),
    price=Price(input_per_million=1.0, output_per_million=4.0),
)

NOTICES: list[str] = []


def wind_down(request: ModelRequest) -> Final | ToolCalls:
    """A model that listens: it answers when told that the budget runs out."""
    NOTICES.extend(f"step {request.step}: {notice}" for notice in request.notices)
    if request.notices:
        return Final(answer=f"summary after {request.step - 1} searches")
    return keep_searching(request)


winding = Agent(
    "researcher",
    ScriptedModel(wind_down),
    tools=[search],
    budget=Budget(max_steps=6, max_repeated_plan=10, wind_down_steps=2),
    wind_down_notice="{steps_left} step(s) left: answer with what you have",
)


async def main() -> None:
    async with Runtime() as runtime:
        for name, agent in (("tokens", tokens), ("cost", cost), ("wind-down", winding)):
            outcome = await runtime.run(agent, "Find anything about pears.")
            print(
                f"{name}: {outcome.reason} after {outcome.steps} steps -",
                outcome.answer or outcome.detail,
            )
    print("\n".join(NOTICES))


if __name__ == "__main__":
    trio.run(main)
