"""An agent with a critic, for reflection's crash tests (``critic_app:agent`` on the CLI).

The agent counts pears, answers vaguely, and gives the count once its critic asked for
it; the critic (by round) asks for a revision, then accepts. :func:`counted_agent` is
the same agent whose models count their calls, for a resume in the test's process.
"""

from __future__ import annotations

from typing import Any

from loop_actors import Agent, Critic, ModelRequest, ScriptedModel, Usage, tool

GOAL = "How many pears are in stock?"
ANSWER = "There are 42 pears in stock."


@tool
def count_stock(item: str) -> int:
    """How many of an item are in stock."""
    return {"pear": 42}.get(item, 0)


def writer(request: ModelRequest) -> dict[str, Any]:
    if request.step == 1:
        call = {"id": "n", "name": "count_stock", "arguments": {"item": "pear"}}
        return {"kind": "tool_calls", "calls": [call]}
    if request.turns[-1].critique is not None:
        return {"kind": "final", "answer": ANSWER}
    return {"kind": "final", "answer": "We have plenty of pears."}


VERDICTS: list[dict[str, str]] = [
    {"kind": "revise", "critique": "Say how many pears there are."},
    {"kind": "accept"},
]


def reviewer(request: ModelRequest) -> dict[str, str]:
    return VERDICTS[request.step - 1]  # by round


def counted_agent(asked: list[str]) -> Agent:
    """The agent, its model and its critic's noting each call (``agent:N``, ``critic:N``)."""

    def counted_writer(request: ModelRequest) -> dict[str, Any]:
        asked.append(f"agent:{request.step}")
        return writer(request)

    def counted_reviewer(request: ModelRequest) -> dict[str, str]:
        asked.append(f"critic:{request.step}")
        return reviewer(request)

    return Agent(
        "stock",
        ScriptedModel(counted_writer, usage=Usage(input_tokens=100)),
        tools=[count_stock],
        critic=Critic(ScriptedModel(counted_reviewer, usage=Usage(input_tokens=50)), max_rounds=2),
    )


agent = counted_agent([])
