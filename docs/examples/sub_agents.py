"""Sub-agents: a parent delegates to child agents, in one batch and from code.

Run it from this folder: ``python sub_agents.py``. A ``travel`` agent asks, in one
batch, a ``flights`` and a ``hotels`` agent (each offered with ``Agent.as_tool``) to
book; each child is an invocation of its own, with its share of the parent's budget.
Then an ``orchestrator`` whose tool runs three ``quotes`` children at once from code
(``ToolContext.run_agent``). It prints each outcome and the tree the store holds.
"""

from __future__ import annotations

from typing import Any

import trio

from loop_actors import (
    Agent,
    Budget,
    ChildOutcome,
    ModelRequest,
    Runtime,
    ScriptedModel,
    ToolContext,
    tool,
)
from loop_actors.cli import main

BOOKED: list[tuple[str, str]] = []


@tool(effect="write")
def book(item: str, context: ToolContext) -> dict[str, str]:
    """Book an item (the effect key is the booking service's idempotency key)."""
    assert context.effect_key is not None
    BOOKED.append((item, context.effect_key))
    return {"booked": item}


def books(item: str) -> Any:
    def decide(request: ModelRequest) -> dict[str, Any]:
        if request.step == 1:
            return {
                "kind": "tool_calls",
                "calls": [{"id": "b1", "name": "book", "arguments": {"item": item}}],
            }
        return {"kind": "final", "answer": f"{item} booked for {request.goal}"}

    return decide


flights = Agent("flights", ScriptedModel(books("a flight")), [book], budget=Budget(max_steps=5))
hotels = Agent("hotels", ScriptedModel(books("a room")), [book], budget=Budget(max_steps=5))


def plans(request: ModelRequest) -> dict[str, Any]:
    if request.step == 1:
        return {
            "kind": "tool_calls",
            "calls": [
                {"id": "f", "name": "flights", "arguments": {"goal": "Lisbon, 3 May"}},
                {"id": "h", "name": "hotels", "arguments": {"goal": "Lisbon, 3-5 May"}},
            ],
        }
    # Each call's output is its child's outcome: its reason, answer, what it spent.
    outcomes = [ChildOutcome.read(result.output) for result in request.turns[-1].results]
    return {"kind": "final", "answer": "; ".join(str(o.answer) for o in outcomes if o)}


travel = Agent(
    "travel",
    ScriptedModel(plans),
    [flights.as_tool(), hotels.as_tool()],
    budget=Budget(max_steps=12, max_tool_calls=10),
)


def quote(request: ModelRequest) -> dict[str, Any]:
    return {"kind": "final", "answer": f"{request.goal}: 120 EUR"}


# Children run at once from code each ask for their agent's budget: these fit together
# in what the orchestrator has left (the default, 20 steps and 50 tool calls, would not).
quotes = Agent("quotes", ScriptedModel(quote), [], budget=Budget(max_steps=2, max_tool_calls=0))


@tool(effect="write")
async def compare(context: ToolContext) -> list[str | None]:
    """Ask three quote agents at once (fan-out, fan-in)."""
    answers: dict[str, str | None] = {}

    async def ask(company: str) -> None:
        outcome = await context.run_agent(quotes, f"quote from {company}", key=company)
        answers[company] = outcome.answer

    async with trio.open_nursery() as nursery:
        for company in ("acme", "globex", "initech"):
            nursery.start_soon(ask, company)
    return [answers[company] for company in ("acme", "globex", "initech")]


def orchestrates(request: ModelRequest) -> dict[str, Any]:
    if request.step == 1:
        return {"kind": "tool_calls", "calls": [{"id": "c", "name": "compare", "arguments": {}}]}
    answers = request.turns[-1].results[0].output
    assert isinstance(answers, list)
    return {"kind": "final", "answer": " | ".join(str(answer) for answer in answers)}


orchestrator = Agent("orchestrator", ScriptedModel(orchestrates), [compare])

STORE = "sqlite:///sub_agents.db"


async def demo() -> None:
    async with Runtime(STORE) as runtime:
        trip = await runtime.run(travel, "plan my trip", invocation_id="trip")
        print(f"trip: {trip.reason.value}: {trip.answer}")
        print(f"trip's own steps={trip.steps} tool_calls={trip.tool_calls}")
        assert trip.children is not None
        print(f"its children's steps={trip.children.steps} tool_calls={trip.children.tool_calls}")
        compared = await runtime.run(orchestrator, "compare quotes", invocation_id="quotes")
        print(f"quotes: {compared.reason.value}: {compared.answer}")
    print(f"bookings: {len(BOOKED)}, under {len({key for _, key in BOOKED})} different keys")


if __name__ == "__main__":
    trio.run(demo)
    main(["list", "--root", "--db", STORE])
