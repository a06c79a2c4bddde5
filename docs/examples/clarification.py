"""An agent that asks which order the customer means, and is answered."""

import re

import trio

from loop_actors import (
    Agent,
    CannotContinue,
    Clarification,
    Final,
    ModelRequest,
    NotWaitingError,
    Runtime,
    ScriptedModel,
)

ORDERS = {"A-1001": "shipped", "A-1002": "being packed"}


def decide(request: ModelRequest) -> Final | Clarification | CannotContinue:
    """Stand in for a real model: ask when the goal names no order, then use the reply."""
    text = request.goal
    if request.turns and request.turns[-1].reply is not None:
        text = request.turns[-1].reply  # the person's answer to the question
    found = re.search(r"[A-Z]-\d+", text)
    if found is None:
        if request.turns:  # asked once already
            return CannotContinue(reason="the customer named no order")
        return Clarification(question="Which order do you mean (e.g. A-1001)?")
    if found[0] not in ORDERS:
        return CannotContinue(reason=f"there is no order {found[0]}")
    return Final(answer=f"Order {found[0]} is {ORDERS[found[0]]}.")


agent = Agent("orders-asking", ScriptedModel(decide))


async def main() -> None:
    async with Runtime() as runtime:
        paused = await runtime.run(agent, "Where is my order?", invocation_id="ask-1")
        print(paused.reason, "-", paused.detail)

        await runtime.clarify("ask-1", answer="It is A-1002.", by="support desk")
        outcome = await runtime.resume("ask-1", agent)
        print(outcome.reason, "-", outcome.answer)

        # Only an invocation that waits for an answer takes one.
        try:
            await runtime.clarify("ask-1", answer="A-1001")
        except NotWaitingError:
            print("ask-1 waits for nothing now")

        await runtime.run(agent, "Where is my order?", invocation_id="ask-2")
        await runtime.clarify("ask-2", answer="A-9999")
        ended = await runtime.resume("ask-2", agent)
        print(ended.reason, "-", ended.detail)


if __name__ == "__main__":
    trio.run(main)
