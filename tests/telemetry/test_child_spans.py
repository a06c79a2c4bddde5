"""A child invocation's drives are child spans of the parent's call, in the parent's trace."""

from __future__ import annotations

from typing import Any

import trio
from opentelemetry import trace

from loop_actors import Agent, Budget, ModelRequest, Runtime, ScriptedModel, ToolContext, tool
from loop_actors.telemetry import report
from tests.support.telemetry import attributes_of, in_memory_telemetry, span_tree


@tool(effect="write")
def book(item: str, context: ToolContext) -> dict[str, str]:
    """Book an item."""
    return {"booked": item}


def books(item: str) -> Any:
    def decide(request: ModelRequest) -> dict[str, Any]:
        if request.step == 1:
            return {
                "kind": "tool_calls",
                "calls": [{"id": "b1", "name": "book", "arguments": {"item": item}}],
            }
        return {"kind": "final", "answer": f"{item} booked"}

    return decide


flights = Agent("flights", ScriptedModel(books("a flight")), [book], budget=Budget(max_steps=5))
hotels = Agent("hotels", ScriptedModel(books("a room")), [book], budget=Budget(max_steps=5))


def plans(request: ModelRequest) -> dict[str, Any]:
    if request.step == 1:
        return {
            "kind": "tool_calls",
            "calls": [
                {"id": "f", "name": "flights", "arguments": {"goal": "Lisbon, 3 May"}},
                {"id": "h", "name": "hotels", "arguments": {"goal": "Lisbon, 3-5 May"}},
            ],
        }
    return {"kind": "final", "answer": "booked"}


travel = Agent(
    "travel",
    ScriptedModel(plans),
    [flights.as_tool(), hotels.as_tool()],
    budget=Budget(max_steps=12, max_tool_calls=10),
)


async def test_children_are_child_spans_of_the_calls_that_started_them_in_one_trace() -> None:
    with in_memory_telemetry() as captured, trio.fail_after(10):
        async with Runtime("memory://") as runtime:
            with trace.get_tracer("app").start_as_current_span("request") as outer:
                outcome = await runtime.run(travel, "a trip to Lisbon", invocation_id="trip-1")
        spans = captured.spans()
    assert outcome.reason == "completed"
    assert {span.context.trace_id for span in spans} == {outer.get_span_context().trace_id}
    tree = span_tree(spans)
    assert ("invoke_agent travel", "request") in tree
    assert ("invoke_agent flights", "execute_tool flights") in tree
    assert ("invoke_agent hotels", "execute_tool hotels") in tree
    assert ("execute_tool flights", "invoke_agent travel") in tree
    assert ("execute_tool book", "invoke_agent flights") in tree
    [flight] = [s for s in spans if s.name == "invoke_agent flights"]
    assert attributes_of(flight)["loop_actors.invocation.parent_id"] == "trip-1"
    [parent] = [s for s in spans if s.name == "invoke_agent travel"]
    totals = attributes_of(parent)
    assert totals["loop_actors.tree.steps"] == 2 + 2 * 2  # its own and its children's
    assert totals["loop_actors.tree.tool_calls"] == 2 + 2 * 1


async def test_a_child_re_exported_alone_keeps_its_place_in_the_tree() -> None:
    with in_memory_telemetry() as captured, trio.fail_after(10):
        async with Runtime("memory://") as runtime:
            await runtime.run(travel, "a trip to Lisbon", invocation_id="trip-1")
            history = await runtime.history("trip-1")
            children = [
                call.child_id
                for event in history
                for call in getattr(event, "calls", None) or []
                if getattr(call, "child_id", None)
            ]
            child_history = await runtime.history(children[0])
        live = {
            (s.context.trace_id, s.context.span_id, s.parent.span_id if s.parent else None)
            for s in captured.spans()
        }
    again = report(child_history, root_trace_parent=None)
    assert {(s.trace_id, s.span_id, s.parent_span_id) for s in again.spans} <= live
