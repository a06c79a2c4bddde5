"""Reflection: a critic reviews each final answer; a "revise" verdict sends it back."""

from typing import Any

import trio

from aggregates.invocation import CritiqueReturned
from loop_actors import (
    Agent,
    Critic,
    CriticBudget,
    Final,
    ModelRequest,
    Runtime,
    ScriptedModel,
    ToolCall,
    ToolCalls,
    Usage,
    tool,
)


@tool
def count_stock(item: str) -> int:
    """How many of an item are in stock."""
    return {"pear": 42, "apple": 7}.get(item, 0)


def writer(request: ModelRequest) -> Final | ToolCalls:
    """The agent's model: vague at first, precise once the critic asked for it."""
    if request.step == 1:
        return ToolCalls(calls=[ToolCall(id="n", name="count_stock", arguments={"item": "pear"})])
    last = request.turns[-1]
    if last.critique is not None:  # the critique of the answer before (also in request.notices)
        return Final(answer=f"There are {request.results[-1].output} pears in stock.")
    return Final(answer="We have plenty of pears.")


def reviewer(request: ModelRequest) -> dict[str, Any]:
    """The critic's model: it accepts only an answer that says how many."""
    answer = request.review or ""  # the final answer under review; request.step is the round
    if any(character.isdigit() for character in answer):
        return {"kind": "accept"}
    return {"kind": "revise", "critique": "Say how many pears there are."}


agent = Agent(
    "stock",
    ScriptedModel(writer, usage=Usage(input_tokens=200, output_tokens=20)),
    tools=[count_stock],
    critic=Critic(
        ScriptedModel(reviewer, usage=Usage(input_tokens=150, output_tokens=10)),
        max_rounds=2,
        budget=CriticBudget(max_tokens=2_000),
    ),
)


async def main() -> None:
    async with Runtime() as runtime:
        outcome = await runtime.run(agent, "How many pears are in stock?", invocation_id="r-1")
        print(f"{outcome.reason} after {outcome.steps} steps - {outcome.answer}")
        for event in await runtime.history("r-1"):
            if isinstance(event, CritiqueReturned):
                said = f": {event.critique}" if event.critique else ""
                print(f"  round {event.round} on step {event.step}: {event.verdict}{said}")
        critic = outcome.critic  # the critic's rounds and usage, apart from the agent's
        assert critic is not None
        invocation = await runtime.load("r-1")
        print(
            f"agent: {invocation.input_tokens + invocation.output_tokens} tokens; "
            f"critic: {critic.rounds} round(s), {critic.tokens} tokens"
        )


if __name__ == "__main__":
    trio.run(main)
