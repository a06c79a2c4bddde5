"""The agent the eval how-to measures (docs/how-to/evaluate-your-loop.md).

``agent`` looks things up and may send a message; ``agent_tight`` is the same
agent with one loop decision changed: at most two steps. Each has its own
``version``, so an eval run of each is a run of its own (the runs' ids derive
from the agent's version).
"""

from __future__ import annotations

from loop_actors import Agent, Budget, ScriptedModel, tool

ORDERS = {"A-1": "shipped", "A-2": "delayed"}


@tool
def order_status(order_id: str) -> str:
    """The status of an order."""
    return ORDERS.get(order_id, "unknown")


@tool
def shipping_policy(region: str) -> str:
    """The shipping policy of a region."""
    return f"{region}: 3 to 5 working days"


@tool(effect="write")
def send_message(to: str, text: str) -> str:
    """Send a message to a customer (a write)."""
    return f"sent to {to}"


# The cases script the model's turns; this model answers only cases that do not.
fallback = ScriptedModel([{"kind": "final", "answer": "I can only answer scripted cases."}])

agent = Agent(
    "support", fallback, [order_status, shipping_policy, send_message], budget=Budget(max_steps=10)
)
agent_tight = Agent(
    "support",
    fallback,
    [order_status, shipping_policy, send_message],
    budget=Budget(max_steps=2),
    version="2-tight",
)
