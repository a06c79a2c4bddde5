"""An agent that answers "where is my order?" with one tool call."""

import re

from loop_actors import (
    Agent,
    CannotContinue,
    Final,
    ModelRequest,
    Runtime,
    ScriptedModel,
    ToolCall,
    ToolCalls,
    ToolError,
    tool,
)

ORDERS = {"A-1001": "shipped", "A-1002": "being packed"}


@tool
def order_status(order_id: str) -> dict[str, str]:
    """Look up the status of an order by its id, e.g. A-1001."""
    if order_id not in ORDERS:
        raise ToolError(f"no order {order_id}")
    return {"order_id": order_id, "status": ORDERS[order_id]}


def decide(request: ModelRequest) -> Final | ToolCalls | CannotContinue:
    """Stand in for a real model: look the order up, then answer from the result."""
    found = re.search(r"[A-Z]-\d+", request.goal)
    if found is None:
        return CannotContinue(reason="the goal names no order id")
    if not request.results:  # step 1: nothing looked up yet
        call = ToolCall(id="lookup-1", name="order_status", arguments={"order_id": found[0]})
        return ToolCalls(calls=[call])
    result = request.results[-1]
    if result.error is not None:
        return CannotContinue(reason=result.error.message)
    assert isinstance(result.output, dict)
    return Final(answer=f"Order {found[0]} is {result.output['status']}.")


agent = Agent("orders", ScriptedModel(decide), tools=[order_status])

if __name__ == "__main__":
    outcome = Runtime().run_sync(agent, "Where is order A-1001?")
    print(outcome.reason, outcome.answer)
