"""The verification gate: only an answer the verifier passes completes the run."""

import trio

from aggregates.invocation import Turn
from loop_actors import (
    Agent,
    Final,
    ModelRequest,
    Runtime,
    ScriptedModel,
    ToolCall,
    ToolCalls,
    tool,
)


@tool
def count_stock(item: str) -> int:
    """How many of an item are in stock."""
    return {"pear": 42, "apple": 7}.get(item, 0)


def answer_checks_out(answer: str, turns: list[Turn]) -> bool | str:
    """Pass an answer only if it quotes a count that a tool really returned."""
    counts = {str(result.output) for turn in turns for result in turn.results if result.ok}
    if any(count in answer.split() for count in counts):
        return True
    return f"the answer quotes no count a tool returned (returned: {', '.join(sorted(counts))})"


def careless(request: ModelRequest) -> Final | ToolCalls:
    """A model that guesses first, and corrects itself once told why it was refused."""
    if request.step == 1:
        return ToolCalls(calls=[ToolCall(id="n", name="count_stock", arguments={"item": "pear"})])
    last = request.turns[-1]
    if last.verification is not None:  # the verifier's evidence for the refused answer
        return Final(answer=f"There are {request.results[-1].output} pears.")
    return Final(answer="There are about 40 pears.")


def stubborn(request: ModelRequest) -> Final | ToolCalls:
    """A model that never corrects itself."""
    if request.step == 1:
        return ToolCalls(calls=[ToolCall(id="n", name="count_stock", arguments={"item": "pear"})])
    return Final(answer="There are plenty of pears.")


def agent(model: ScriptedModel) -> Agent:
    return Agent(
        "stock",
        model,
        tools=[count_stock],
        verifier=answer_checks_out,
        max_verification_attempts=2,
    )


async def main() -> None:
    async with Runtime() as runtime:
        fixed = await runtime.run(
            agent(ScriptedModel(careless)), "How many pears?", invocation_id="v1"
        )
        print(f"careless: {fixed.reason} after {fixed.steps} steps - {fixed.answer}")
        invocation = await runtime.load("v1")
        for turn in invocation.turns:
            if turn.verification is not None:
                print(f"  step {turn.step} refused: {turn.verification}")

        failed = await runtime.run(agent(ScriptedModel(stubborn)), "How many pears?")
        print(f"stubborn: {failed.reason} after {failed.steps} steps - {failed.detail}")


if __name__ == "__main__":
    trio.run(main)
