"""A refund agent whose large refunds wait for a person: approve, deny, stale digests."""

import trio

from loop_actors import (
    Agent,
    ApprovalRefusedError,
    Final,
    ModelRequest,
    Runtime,
    ScriptedModel,
    ToolCall,
    ToolCalls,
    ToolResult,
    tool,
)

REFUNDED: list[int] = []  # what really ran, in this process


@tool(effect="write", requires_approval=lambda arguments: arguments["amount"] > 100)
def refund(order_id: str, amount: int) -> str:
    """Refund an amount of euros on an order; above 100 a person must approve it."""
    REFUNDED.append(amount)
    return f"refunded {amount} on {order_id}"


def describe(result: ToolResult) -> str:
    if result.error is None:
        return f"{result.call_id}: {result.output}"
    return f"{result.call_id}: {result.error.error_class} ({result.error.message})"


def decide(request: ModelRequest) -> Final | ToolCalls:
    """Stand in for a real model: ask for two refunds, then report what came back."""
    if request.step == 1:
        return ToolCalls(
            calls=[
                ToolCall(id="r1", name="refund", arguments={"order_id": "A-1", "amount": 250}),
                ToolCall(id="r2", name="refund", arguments={"order_id": "A-2", "amount": 20}),
            ]
        )
    return Final(answer="; ".join(describe(result) for result in request.results))


agent = Agent("refunds", ScriptedModel(decide), tools=[refund])
GOAL = "Refund orders A-1 and A-2."


async def main() -> None:
    async with Runtime() as runtime:
        paused = await runtime.run(agent, GOAL, invocation_id="refund-1")
        print(paused.reason, "exit", paused.exit_code, "refunded:", REFUNDED)
        for call in paused.pending_calls or []:
            print(
                f"  {call['call_id']} {call['arguments']} needs_approval={call['needs_approval']}"
            )
        assert paused.digest is not None

        # An approval names the digest of the batch it approves: any other is refused.
        try:
            await runtime.approve("refund-1", digest="0" * 64, by="mallory")
        except ApprovalRefusedError:
            print("a wrong digest is refused")

        await runtime.approve("refund-1", digest=paused.digest, by="alice", note="receipt seen")
        approved = await runtime.resume("refund-1", agent)
        print(approved.reason, "-", approved.answer)

        # A denial: the calls that needed approval get a `denied` result; the others run.
        await runtime.run(agent, GOAL, invocation_id="refund-2")
        await runtime.deny("refund-2", by="bob", reason="no receipt")
        denied = await runtime.resume("refund-2", agent)
        print(denied.reason, "-", denied.answer)
        print("refunded:", REFUNDED)

        events = await runtime.history("refund-1")
        print("refund-1:", " ".join(type(event).__name__ for event in events))


if __name__ == "__main__":
    trio.run(main)
