"""Tools with options, schemas from type hints, structured errors and argument checks."""

import json
from typing import Any

import trio

from loop_actors import (
    Agent,
    ErrorClass,
    ModelRequest,
    Runtime,
    ScriptedModel,
    ToolError,
    tool,
)

STOCK = {"apple": 3, "pear": 0}


@tool(timeout_s=2.0)
def stock(item: str) -> int:
    """How many of an item are in stock."""
    if item not in STOCK:
        raise ToolError(f"no item named {item!r}", error_class=ErrorClass.INVALID_ARGUMENTS)
    return STOCK[item]


@tool(name="reserve", effect="write", description="Reserve some items for the customer.")
async def reserve_items(item: str, quantity: int = 1) -> str:
    await trio.sleep(0.01)  # stands in for a call to the shop's API
    if STOCK.get(item, 0) < quantity:
        raise ToolError(f"only {STOCK.get(item, 0)} {item} left", retryable=True)
    return f"reserved {quantity} {item}"


@tool(inline=True)
def shop_name() -> str:
    """The shop's name (instant, so it runs inline on the event loop)."""
    return "Fruit & Co"


def shopper(request: ModelRequest) -> dict[str, object]:
    if request.step == 1:  # three reads: they run concurrently
        return {
            "kind": "tool_calls",
            "calls": [
                {"id": "s0", "name": "shop_name", "arguments": {}},
                {"id": "s1", "name": "stock", "arguments": {"item": "apple"}},
                {"id": "s2", "name": "stock", "arguments": {"item": "kiwi"}},
            ],
        }
    if request.step == 2:  # a write runs alone, after the reads before it
        return {
            "kind": "tool_calls",
            "calls": [
                {"id": "r1", "name": "reserve", "arguments": {"item": "apple", "quantity": 2}}
            ],
        }
    lines: list[str] = []
    for result in request.results:
        if result.error is None:
            lines.append(f"{result.call_id}: {result.output}")
        else:
            lines.append(f"{result.call_id}: {result.error.error_class} ({result.error.message})")
    return {"kind": "final", "answer": "; ".join(lines)}


shop = Agent("shop", ScriptedModel(shopper), tools=[stock, reserve_items, shop_name])

# Arguments are checked against the schema before anything runs: a bad call
# makes the whole decision invalid, and nothing is dispatched. The model is shown
# the problems and asked again (max_invalid_proposals times in a row at most).
bad_call = {
    "kind": "tool_calls",
    "calls": [{"id": "r2", "name": "reserve", "arguments": {"item": "pear", "quantity": "two"}}],
}


def careless_then_careful(request: ModelRequest) -> dict[str, Any]:
    if request.step == 1:
        return bad_call
    if request.step == 2:
        rejection = request.turns[-1].rejection  # what was wrong, as the model is told
        assert rejection is not None
        print("told:", rejection.problems[0])
        return {
            "kind": "tool_calls",
            "calls": [
                {"id": "r3", "name": "reserve", "arguments": {"item": "pear", "quantity": 2}}
            ],
        }
    result = request.results[-1]
    answer = result.output if result.error is None else result.error.message
    return {"kind": "final", "answer": f"{result.call_id}: {answer}"}


careless = Agent(
    "careless-shop", ScriptedModel(careless_then_careful), tools=[stock, reserve_items]
)
strict = Agent(
    "strict-shop", ScriptedModel([bad_call]), tools=[stock, reserve_items], max_invalid_proposals=0
)


def main() -> None:
    print("reserve schema:", json.dumps(reserve_items.schema, sort_keys=True))
    print("stock('apple') called directly:", stock(item="apple"))

    runtime = Runtime()
    outcome = runtime.run_sync(shop, "Reserve two apples and check the kiwis.")
    print(outcome.reason, "-", outcome.answer)

    outcome = runtime.run_sync(careless, "Reserve two pears.")
    print(outcome.reason, "-", outcome.answer)

    outcome = runtime.run_sync(strict, "Reserve two pears.")
    print(outcome.reason, "-", outcome.detail)


if __name__ == "__main__":
    main()
