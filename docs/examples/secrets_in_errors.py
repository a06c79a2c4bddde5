"""What the store keeps of a secret quoted in an error, or sent in a refused proposal."""

from typing import Any

import trio

from loop_actors import Agent, ModelRequest, Runtime, ScriptedModel, tool

CARD = "4111111111111111"


@tool(sensitive_arguments=["card_number"])
def check_card(card_number: str) -> str:
    """Check a card (this one has expired, and the error says which)."""
    raise ValueError(f"card {card_number} has expired")


def decide(request: ModelRequest) -> Any:
    if request.step == 1:  # a misspelt tool name: refused, and the model is asked again
        return {
            "kind": "tool_calls",
            "calls": [{"id": "c", "name": "check_crad", "arguments": {"card_number": CARD}}],
        }
    if request.step == 2:  # arguments as JSON text, as the OpenAI adapter passes them
        arguments = '{"card_number": "' + CARD + '"}'
        return {
            "kind": "tool_calls",
            "calls": [{"id": "c", "name": "check_card", "arguments": arguments}],
        }
    return {"kind": "cannot_continue", "reason": "the card has expired"}


agent = Agent("checker", ScriptedModel(decide), [check_card])


async def main() -> None:
    async with Runtime() as runtime:  # $LOOP_ACTORS_DB, else sqlite:///loop-actors.db
        outcome = await runtime.run(agent, "check the card", invocation_id="check-1")
        print(outcome.reason)
        refused, checked = (await runtime.load("check-1")).turns[:2]
        assert refused.rejection is not None
        print("stored refused call:", refused.rejection.raw["calls"][0])  # type: ignore[index,call-overload]
        assert checked.results[0].error is not None
        print("stored error:", checked.results[0].error.message)


trio.run(main)
