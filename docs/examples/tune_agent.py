"""The shop agent of the eval tutorial (docs/tutorial/evaluate-and-tune.md).

``agent`` counts stock and refunds orders (a refund above 100 waits for a person).
``agent_verified`` is the same agent with one loop decision changed: a verifier
refuses a final answer that quotes no count a tool returned, so the model must
try again. Each has its own ``version``: an eval of each is a run of its own.
``quotes_the_stock`` is the cases file's answer check.
"""

from __future__ import annotations

import re

from aggregates.invocation import Turn
from loop_actors import Agent, ScriptedModel, tool

STOCK = {"pear": 42, "apple": 7}


@tool
def count_stock(item: str) -> int:
    """How many of an item are in stock."""
    return STOCK.get(item, 0)


@tool(effect="write", requires_approval=lambda arguments: arguments["amount"] > 100)
def refund(order_id: str, amount: int) -> str:
    """Refund an amount of euros on an order; above 100 a person must approve it."""
    return f"refunded {amount} on {order_id}"


def _counts_in(answer: str) -> set[int]:
    return {int(number) for number in re.findall(r"\b\d+\b", answer)}


def quotes_the_stock(answer: str) -> bool | str:
    """The answer check: the answer quotes a real stock count."""
    if _counts_in(answer) & set(STOCK.values()):
        return True
    return f"the answer quotes no stock count: {answer!r}"


def quotes_a_returned_count(answer: str, turns: list[Turn]) -> bool | str:
    """The verifier: pass an answer only if it quotes a count a tool returned in this run."""
    returned = {
        result.output
        for turn in turns
        for result in turn.results
        if result.ok and isinstance(result.output, int)
    }
    if _counts_in(answer) & returned:
        return True
    return f"quote a count a tool returned ({', '.join(map(str, sorted(returned)))})"


# The cases script the model's turns; this model answers only cases that do not.
fallback = ScriptedModel([{"kind": "final", "answer": "I can only answer scripted cases."}])

agent = Agent("shop", fallback, [count_stock, refund])
agent_verified = Agent(
    "shop",
    fallback,
    [count_stock, refund],
    verifier=quotes_a_returned_count,
    max_verification_attempts=2,
    version="2-verified",
)
