"""The doom-loop guard: the same call failing the same way again and again ends the run."""

import trio

from loop_actors import (
    Agent,
    Budget,
    ErrorClass,
    Final,
    ModelRequest,
    Runtime,
    ScriptedModel,
    ToolCall,
    ToolCalls,
    ToolError,
    tool,
)

CALLS: list[str] = []


@tool
def fetch_invoice(invoice_id: str) -> str:
    """Fetch an invoice from the billing service."""
    CALLS.append(invoice_id)
    raise ToolError("billing is down", error_class=ErrorClass.UNAVAILABLE, retryable=True)


@tool(max_repeated_failures=2)
def charge_card(invoice_id: str) -> str:
    """Charge the card on file for an invoice (a tool that should not be hammered)."""
    CALLS.append(invoice_id)
    raise ToolError("card declined", error_class=ErrorClass.REJECTED)


def retry_forever(request: ModelRequest) -> Final | ToolCalls:
    """A model that retries the same call whatever comes back."""
    name = "charge_card" if request.goal.startswith("Charge") else "fetch_invoice"
    if request.step > 10:
        return Final(answer="gave up")
    call = ToolCall(id=f"c{request.step}", name=name, arguments={"invoice_id": "INV-7"})
    return ToolCalls(calls=[call])


# max_repeated_plan lets the same plan run again (the no_progress check would stop it first).
agent = Agent(
    "billing",
    ScriptedModel(retry_forever),
    tools=[fetch_invoice, charge_card],
    budget=Budget(max_repeated_plan=20),
    max_repeated_failures=3,
)


async def main() -> None:
    async with Runtime() as runtime:
        for goal in ("Fetch invoice INV-7.", "Charge invoice INV-7."):
            CALLS.clear()
            outcome = await runtime.run(agent, goal)
            print(f"{outcome.reason} after {len(CALLS)} calls - {outcome.detail}")


if __name__ == "__main__":
    trio.run(main)
