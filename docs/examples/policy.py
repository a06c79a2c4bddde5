"""Authorisation: a policy decides, call by call, who may do what to which object."""

import trio

from loop_actors import (
    AccessRequest,
    Agent,
    Deny,
    Final,
    ModelRequest,
    Runtime,
    ScriptedModel,
    ToolCall,
    ToolCalls,
    tool,
)

REFUNDERS = {"acme": {"alice"}}  # per tenant, who may refund


@tool(operation="read", object_from="order_id")
def read_order(order_id: str) -> str:
    """Read an order."""
    return f"{order_id}: 2 pears"


@tool(effect="write", operation="refund", object_from="order_id")
def refund_order(order_id: str, amount: int) -> str:
    """Refund an amount of euros on an order."""
    return f"refunded {amount} on {order_id}"


def policy(request: AccessRequest) -> bool | Deny:
    """Reads are open to all; refunds to the tenant's refunders, on the tenant's orders."""
    if request.operation == "read":
        return True
    if request.tenant is None or not str(request.object).startswith(f"{request.tenant}-"):
        return Deny(reason=f"{request.object} is not an order of {request.tenant}")
    if request.actor not in REFUNDERS.get(request.tenant, set()):
        return Deny(reason=f"{request.actor} may not refund for {request.tenant}")
    return True


def decide(request: ModelRequest) -> Final | ToolCalls:
    """Stand in for a real model: read an order and refund two, then report."""
    if request.step == 1:
        return ToolCalls(
            calls=[
                ToolCall(id="a", name="read_order", arguments={"order_id": "acme-7"}),
                ToolCall(
                    id="b", name="refund_order", arguments={"order_id": "acme-7", "amount": 5}
                ),
                ToolCall(
                    id="c", name="refund_order", arguments={"order_id": "zeta-1", "amount": 9}
                ),
            ]
        )
    return Final(
        answer="; ".join(
            f"{r.call_id}: {r.output}" if r.error is None else f"{r.call_id}: {r.error.message}"
            for r in request.results
        )
    )


agent = Agent("orders", ScriptedModel(decide), tools=[read_order, refund_order], policy=policy)


def suspended(request: AccessRequest) -> Deny:
    """A policy that ends the run instead of telling the model."""
    return Deny(reason=f"tenant {request.tenant} is suspended", stop=True)


strict = Agent("orders", ScriptedModel(decide), tools=[read_order, refund_order], policy=suspended)


async def main() -> None:
    async with Runtime() as runtime:
        for actor in ("alice", "bob"):
            outcome = await runtime.run(
                agent, "Refund acme-7 and zeta-1.", actor=actor, tenant="acme"
            )
            print(f"{actor}: {outcome.reason} - {outcome.answer}")
        stopped = await runtime.run(strict, "Refund acme-7.", actor="alice", tenant="acme")
        print(f"suspended: {stopped.reason} - {stopped.detail}")


if __name__ == "__main__":
    trio.run(main)
