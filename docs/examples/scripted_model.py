"""The ways to script a model, and what each run ends with."""

import trio

from loop_actors import (
    Agent,
    Budget,
    Final,
    Model,
    ModelReply,
    ModelRequest,
    Runtime,
    ScriptedModel,
    ToolCall,
    ToolCalls,
    Usage,
    tool,
)


@tool
def echo(text: str) -> str:
    """Return the text unchanged."""
    return text


# 1. A list of decisions as plain dicts (the JSON shape a real model would send).
as_dicts = ScriptedModel(
    [
        {
            "kind": "tool_calls",
            "calls": [{"id": "c1", "name": "echo", "arguments": {"text": "hi"}}],
        },
        {"kind": "final", "answer": "echoed"},
    ]
)

# 2. The same list as decision models.
as_models = ScriptedModel(
    [
        ToolCalls(calls=[ToolCall(id="c1", name="echo", arguments={"text": "hi"})]),
        Final(answer="echoed"),
    ]
)


# 3. A function of the request: it sees the goal, the step and the committed history.
def repeat_back(request: ModelRequest) -> ToolCalls | Final:
    if not request.results:
        return ToolCalls(calls=[ToolCall(id="c1", name="echo", arguments={"text": request.goal})])
    return Final(answer=f"the tool said: {request.results[-1].output}")


as_function = ScriptedModel(repeat_back)


# 4. An async function works too.
async def think_then_answer(request: ModelRequest) -> Final:
    await trio.sleep(0.01)  # e.g. waiting for a provider
    return Final(answer=f"step {request.step} of {request.agent_name}")


as_async_function = ScriptedModel(think_then_answer, usage=Usage(input_tokens=12, output_tokens=5))

# 5. Simulated latency: every answer takes delay_s seconds (trio time).
slow = ScriptedModel([Final(answer="too late")], delay_s=5.0)

# 6. A script that runs out: step 2 has no decision.
too_short = ScriptedModel(
    [{"kind": "tool_calls", "calls": [{"id": "c1", "name": "echo", "arguments": {"text": "hi"}}]}]
)


# 7. Any object with an async decide(request) -> ModelReply is a Model.
class ShoutingModel:
    async def decide(self, request: ModelRequest) -> ModelReply:
        answer = Final(answer=request.goal.upper())
        return ModelReply(proposal=answer, usage=Usage(input_tokens=3, output_tokens=2))


def main() -> None:
    runtime = Runtime()
    runs: list[tuple[str, Model, Budget | None]] = [
        ("dicts", as_dicts, None),
        ("models", as_models, None),
        ("function", as_function, None),
        ("async function", as_async_function, None),
        ("slow", slow, Budget(deadline_s=0.1)),
        ("too short", too_short, None),
        ("custom", ShoutingModel(), None),
    ]
    for label, model, budget in runs:
        agent = Agent(f"scripted-{label.replace(' ', '-')}", model, tools=[echo], budget=budget)
        outcome = runtime.run_sync(agent, "say hi")
        print(f"{label}: {outcome.reason} - {outcome.answer or outcome.detail}")


if __name__ == "__main__":
    main()
