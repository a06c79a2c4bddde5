"""Keep secrets out of the event store: redacted fields, and encryption at rest."""

from typing import Any

import trio

from loop_actors import Agent, ModelRequest, Runtime, ScriptedModel, tool

CARD = "4111111111111111"


@tool(sensitive_arguments=["card_number"], sensitive_output=["token"])
def tokenize(card_number: str) -> dict[str, str]:
    """Exchange a card number for a payment token."""
    return {"token": "tok_" + card_number[-4:] + "_live", "last4": card_number[-4:]}


@tool(sensitive_arguments=["token"])
def charge(token: str, amount: int) -> dict[str, int]:
    """Charge a token."""
    return {"charged": amount}


def decide(request: ModelRequest) -> dict[str, Any]:
    if request.step == 1:
        return {
            "kind": "tool_calls",
            "calls": [{"id": "t", "name": "tokenize", "arguments": {"card_number": CARD}}],
        }
    if request.step == 2:
        # In this process the model still sees the real token, and uses it.
        token = request.results[0].output["token"]  # type: ignore[index,call-overload]
        return {
            "kind": "tool_calls",
            "calls": [{"id": "c", "name": "charge", "arguments": {"token": token, "amount": 12}}],
        }
    return {"kind": "final", "answer": "charged 12"}


agent = Agent("payer", ScriptedModel(decide), [tokenize, charge])


async def main() -> None:
    async with Runtime() as runtime:  # $LOOP_ACTORS_DB, else sqlite:///loop-actors.db
        outcome = await runtime.run(agent, "charge the card", invocation_id="pay-1")
        print(outcome.reason, "-", outcome.answer)
        invocation = await runtime.load("pay-1")
        print("stored arguments:", invocation.turns[0].decision.calls[0].arguments)  # type: ignore[union-attr]
        print("stored output:", invocation.turns[0].results[0].output)


trio.run(main)
