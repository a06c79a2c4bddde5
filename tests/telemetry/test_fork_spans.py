"""A fork's copied steps ran in its source, not in the fork: they are in none of its spans."""

from __future__ import annotations

import trio

from loop_actors import Agent, Runtime, ScriptedModel, tool
from tests.support.replies import calls, final
from tests.support.telemetry import attributes_of, in_memory_telemetry


@tool
def lookup(key: str) -> str:
    """Look a key up."""
    return key.upper()


def agent(answer: str) -> Agent:
    return Agent(
        "finder", ScriptedModel([calls(("a", "lookup", {"key": "x"})), final(answer)]), [lookup]
    )


async def test_a_fork_reports_only_the_steps_it_took_itself() -> None:
    with in_memory_telemetry() as captured, trio.fail_after(10):
        async with Runtime("memory://") as runtime:
            await runtime.run(agent("first"), "find x", invocation_id="source")
            captured.spans_exporter.clear()
            forked = await runtime.fork(
                "source", at_step=1, agent=agent("second"), by="ops", reason="try"
            )
        spans = captured.spans()
        points = captured.metrics()
    assert forked.outcome is not None
    assert forked.outcome.reason == "completed"
    assert sorted(span.name for span in spans) == ["chat", "invoke_agent finder"]
    [drive] = [s for s in spans if s.name == "invoke_agent finder"]
    assert attributes_of(drive)["loop_actors.invocation.forked_from"] == "source"
    calls_reported = sum(value for _, value, _ in points["loop_actors.tool.calls"])
    assert calls_reported == 1  # the source's call, once; the fork's copy is not counted
