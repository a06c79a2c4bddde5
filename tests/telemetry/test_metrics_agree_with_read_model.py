"""The metric points of a mixed batch of runs agree with the metrics read model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import trio

from loop_actors import Agent, Budget, Runtime, ScriptedModel, ToolError, Usage, tool
from projections.metrics import metrics
from tests.support.replies import calls, final
from tests.support.telemetry import in_memory_telemetry


@tool
def lookup(key: str) -> str:
    """Look a key up; ``missing`` fails."""
    if key == "missing":
        raise ToolError("no such key")
    return key.upper()


@tool(effect="write", requires_approval=lambda arguments: arguments["amount"] > 100)
def pay(amount: int) -> str:
    """Pay an amount; above 100 a person approves."""
    return f"paid {amount}"


USAGE = Usage(input_tokens=11, output_tokens=3, cost=0.01, provider="openai", model="m")

COMPLETES = [calls(("a", "lookup", {"key": "x"}), ("b", "lookup", {"key": "missing"})), final("ok")]
LOOPS = [calls((f"c{i}", "lookup", {"key": f"k{i}"})) for i in range(5)]
PAYS = [calls(("p", "pay", {"amount": 30})), final("paid")]
NEEDS_APPROVAL = [calls(("p", "pay", {"amount": 300})), final("paid big")]


def agent(name: str, script: list[Any], max_steps: int = 6) -> Agent:
    return Agent(
        name, ScriptedModel(script, usage=USAGE), [lookup, pay], Budget(max_steps=max_steps)
    )


async def mixed_batch(runtime: Runtime) -> None:
    for i in range(3):
        await runtime.run(agent("finder", COMPLETES), "find", invocation_id=f"done-{i}")
    await runtime.run(agent("looper", LOOPS, max_steps=3), "loop", invocation_id="loop-0")
    await runtime.run(agent("payer", PAYS), "pay", invocation_id="pay-0")
    big = agent("payer", NEEDS_APPROVAL)
    paused = await runtime.run(big, "pay big", invocation_id="big-0")
    assert paused.digest is not None
    await runtime.approve("big-0", digest=paused.digest, by="alice")
    await runtime.resume("big-0", big)


def total(
    points: dict[str, list[tuple[dict[str, Any], float, int]]], name: str, **match: Any
) -> float:
    return sum(
        value
        for attributes, value, _ in points.get(name, [])
        if all(attributes.get(k) == v for k, v in match.items())
    )


def by_attribute(
    points: dict[str, list[tuple[dict[str, Any], float, int]]], name: str, attribute: str
) -> dict[str, int]:
    found: dict[str, int] = {}
    for attributes, value, _ in points[name]:
        found[attributes[attribute]] = found.get(attributes[attribute], 0) + int(value)
    return found


async def test_runs_turns_calls_tokens_cost_and_effects_agree_with_the_read_model(
    tmp_path: Path,
) -> None:
    with in_memory_telemetry() as captured, trio.fail_after(30):
        async with Runtime(f"sqlite:///{tmp_path / 'runs.db'}", follow_projections=True) as runtime:
            await mixed_batch(runtime)
            assert runtime.projections is not None
            while any(s.lag for s in runtime.projections.status()):  # noqa: ASYNC110 - polls a database
                await trio.sleep(0.01)
            rows = metrics(runtime.projections, "reason")
        points = captured.metrics()
    by_reason = {row.group: row for row in rows}
    runs = by_attribute(points, "loop_actors.invocation.runs", "loop_actors.terminal_reason")
    assert runs == {reason: row.invocations for reason, row in by_reason.items()}
    assert runs == {"completed": 5, "max_steps": 1}
    assert total(points, "loop_actors.invocation.turns") == sum(
        row.steps_mean * row.invocations for row in rows
    )
    assert total(points, "loop_actors.tool.calls") == sum(row.tool_calls for row in rows)
    failed = by_attribute(points, "loop_actors.tool.calls", "loop_actors.tool.outcome")
    failed.pop("ok")
    read_failed: dict[str, int] = {}
    for row in rows:
        for error_class, n in row.failed_calls.items():
            read_failed[error_class] = read_failed.get(error_class, 0) + n
    assert failed == read_failed
    tokens_in = total(points, "gen_ai.client.token.usage", **{"gen_ai.token.type": "input"})
    tokens_out = total(points, "gen_ai.client.token.usage", **{"gen_ai.token.type": "output"})
    assert tokens_in == sum(row.input_tokens for row in rows)
    assert tokens_out == sum(row.output_tokens for row in rows)
    assert abs(total(points, "loop_actors.cost") - sum(row.cost for row in rows)) < 1e-9
    effects = by_attribute(points, "loop_actors.effects", "loop_actors.effect.status")
    read_effects: dict[str, int] = {}
    for row in rows:
        for status, n in row.effects.items():
            read_effects[status] = read_effects.get(status, 0) + n
    assert effects == read_effects
