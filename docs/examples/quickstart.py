from loop_actors import Agent, Runtime, ScriptedModel, tool


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


# A deterministic stand-in for a real model: one decision per step.
model = ScriptedModel(
    [
        {
            "kind": "tool_calls",
            "calls": [{"id": "c1", "name": "add", "arguments": {"a": 2, "b": 3}}],
        },
        {"kind": "final", "answer": "2 + 3 = 5"},
    ]
)
agent = Agent("calculator", model, tools=[add])

outcome = Runtime("sqlite:///quickstart.db").run_sync(agent, "What is 2 + 3?")
print(outcome.reason, outcome.answer)
print(f"steps={outcome.steps} tool_calls={outcome.tool_calls} id={outcome.invocation_id}")
