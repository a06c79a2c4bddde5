"""Orchestration in code: a tool's body runs child agents in sequence, at once, in a loop.

Run it from this folder: ``python orchestration.py``. Three write tools, each offered by
an orchestrator agent of its own, run children with ``ToolContext.run_agent``:

- ``brief`` in sequence: a ``researcher`` finds facts, then a ``writer`` writes from them;
- ``quote`` at once (fan-out, fan-in): three ``quotes`` children in a trio nursery;
- ``polish`` in a loop: a ``writer`` drafts and an ``editor`` reviews, until it approves.

Each child is an invocation of its own, with a share of its parent's budget set aside
before it starts (``BudgetReserved``) and given back when it ends (``BudgetReturned``).
The example prints each outcome and what the children used of the parent's budget.
"""

from __future__ import annotations

import re
from typing import Any

import trio

from loop_actors import (
    Agent,
    Budget,
    ModelRequest,
    Reconciled,
    Resolution,
    Runtime,
    ScriptedModel,
    ToolContext,
    tool,
)


def answers(text: str) -> ScriptedModel:
    """A model that answers at once: ``text`` with the goal put in for ``{goal}``."""
    return ScriptedModel(
        lambda request: {"kind": "final", "answer": text.format(goal=request.goal)}
    )


researcher = Agent("researcher", answers("3 facts ({goal})"), [])
writer = Agent("writer", answers("draft of {goal}"), [])


def reviews(request: ModelRequest) -> dict[str, Any]:
    """The editor approves a draft from the second round on."""
    found = re.search(r"round (\d+)", request.goal)
    late = found is not None and int(found.group(1)) >= 2
    return {"kind": "final", "answer": "approved" if late else "revise: cite a source"}


editor = Agent("editor", ScriptedModel(reviews), [])
# Children started at once must fit together in what their parent has left.
quotes = Agent(
    "quotes", answers("{goal}: 120 EUR"), [], budget=Budget(max_steps=2, max_tool_calls=0)
)


def run_again(effect_key: str) -> Reconciled:
    """A body that only runs children is safe to run again: each finds its child."""
    return Reconciled(status=Resolution.NOT_FOUND)


@tool(effect="write", reconcile=run_again)
async def brief(context: ToolContext, topic: str) -> str | None:
    """Research a topic, then write about it (in sequence)."""
    facts = await context.run_agent(researcher, f"facts on {topic}", key="research")
    draft = await context.run_agent(writer, f"{topic} from {facts.answer}", key="write")
    return draft.answer


@tool(effect="write", reconcile=run_again)
async def quote(context: ToolContext) -> list[str | None]:
    """Ask three quote agents at once (fan-out, fan-in)."""
    companies = ("acme", "globex", "initech")
    got: dict[str, str | None] = {}

    async def ask(company: str) -> None:
        outcome = await context.run_agent(quotes, f"quote from {company}", key=company)
        got[company] = outcome.answer

    async with trio.open_nursery() as nursery:
        for company in companies:
            nursery.start_soon(ask, company)
    return [got[company] for company in companies]


@tool(effect="write", reconcile=run_again)
async def polish(context: ToolContext, topic: str) -> dict[str, Any]:
    """Draft and review until the editor approves (at most four rounds)."""
    verdict = None
    for round_ in range(1, 5):
        draft = await context.run_agent(writer, f"{topic}, round {round_}", key=f"draft-{round_}")
        review = await context.run_agent(
            editor, f"round {round_}: {draft.answer}", key=f"review-{round_}"
        )
        verdict = review.answer
        if verdict == "approved":
            return {"draft": draft.answer, "rounds": round_}
    return {"draft": None, "rounds": 4, "last_review": verdict}


def calls_then_reports(tool_name: str, arguments: dict[str, Any]) -> ScriptedModel:
    """An orchestrator's model: call its tool, then answer with the tool's output."""

    def decide(request: ModelRequest) -> dict[str, Any]:
        if request.step == 1:
            call = {"id": "c1", "name": tool_name, "arguments": arguments}
            return {"kind": "tool_calls", "calls": [call]}
        return {"kind": "final", "answer": str(request.turns[-1].results[0].output)}

    return ScriptedModel(decide)


BUDGET = Budget(max_steps=12, max_tool_calls=6)
in_sequence = Agent(
    "in_sequence", calls_then_reports("brief", {"topic": "tides"}), [brief], budget=BUDGET
)
at_once = Agent("at_once", calls_then_reports("quote", {}), [quote], budget=BUDGET)
in_a_loop = Agent(
    "in_a_loop", calls_then_reports("polish", {"topic": "tides"}), [polish], budget=BUDGET
)

STORE = "sqlite:///orchestration.db"


async def demo() -> None:
    async with Runtime(STORE) as runtime:
        for agent in (in_sequence, at_once, in_a_loop):
            outcome = await runtime.run(agent, f"run {agent.name}", invocation_id=agent.name)
            print(f"{agent.name}: {outcome.reason.value}: {outcome.answer}")
            assert outcome.children is not None
            print(
                f"  own steps={outcome.steps}, children's steps={outcome.children.steps} "
                f"(within {BUDGET.max_steps})"
            )


if __name__ == "__main__":
    trio.run(demo)
