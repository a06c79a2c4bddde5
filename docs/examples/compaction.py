"""Compaction: a long history is cut to fit the model's context, and the run records it."""

import trio

from aggregates.invocation import ContextCompacted
from loop_actors import (
    Agent,
    Budget,
    Final,
    ModelRequest,
    Runtime,
    ScriptedModel,
    ToolCall,
    ToolCalls,
    tool,
)


@tool
def read_page(page: int) -> str:
    """Read one page of the manual."""
    return f"page {page}: " + "lorem ipsum " * 20


SEEN: list[str] = []


def reader(request: ModelRequest) -> Final | ToolCalls:
    """Read eight pages, one a step, then answer; note what each request showed."""
    steps = ",".join(str(turn.step) for turn in request.turns)
    SEEN.append(f"step {request.step} sees [{steps}] {request.notices}")
    if request.step > 8:
        return Final(answer="read 8 pages")
    call = ToolCall(id=f"p{request.step}", name="read_page", arguments={"page": request.step})
    return ToolCalls(calls=[call])


agent = Agent(
    "manual-reader",
    ScriptedModel(reader),
    tools=[read_page],
    budget=Budget(max_repeated_plan=10),
    context_limit=1500,  # JSON characters of history the model is given at most
    keep_recent_turns=2,
)


async def main() -> None:
    async with Runtime() as runtime:
        outcome = await runtime.run(agent, "Summarise the manual.", invocation_id="manual")
        print(outcome.reason, "-", outcome.answer)
        print("\n".join(SEEN[-2:]))
        events = await runtime.history("manual")
        compacted = [event for event in events if isinstance(event, ContextCompacted)]
        last = compacted[-1]
        print(f"{len(compacted)} ContextCompacted, the last: step {last.step}")
        print(f"dropped {last.dropped_steps}, kept {last.kept_steps}")
        print(f"view size {last.size_before} -> {last.size_after} characters")
        invocation = await runtime.load("manual")  # the store keeps every turn
        print("turns in the store:", [turn.step for turn in invocation.turns])


if __name__ == "__main__":
    trio.run(main)
