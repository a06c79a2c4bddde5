"""The spans of a run, built from its committed events: names, parents, kinds, attributes, ids."""

from __future__ import annotations

from typing import Any

import trio
from opentelemetry import trace
from opentelemetry.trace import SpanKind, StatusCode

from aggregates.invocation import InvocationStarted
from loop_actors import Agent, Budget, Runtime, ScriptedModel, Usage, tool
from loop_actors.telemetry import report
from loop_actors.telemetry.spans import span_id_of, trace_id_of
from tests.support.replies import calls, final
from tests.support.telemetry import attributes_of, in_memory_telemetry, span_tree, times

USAGE = Usage(
    input_tokens=120,
    output_tokens=30,
    latency_ms=250.0,
    cost=0.002,
    provider="openai",
    model="gpt-test",
    response_model="gpt-test-2026",
    finish_reason="tool_calls",
    cache_read_input_tokens=100,
    cache_write_input_tokens=7,
)


@tool
async def lookup(key: str) -> dict[str, str]:
    """Look a key up."""
    await trio.sleep(0.01)
    return {"key": key, "value": key.upper()}


def two_turns() -> Agent:
    script = [
        calls(("a", "lookup", {"key": "alpha"}), ("b", "lookup", {"key": "beta"})),
        final("alpha and beta"),
    ]
    return Agent("finder", ScriptedModel(script, usage=USAGE), [lookup], Budget(max_steps=4))


async def test_a_two_turn_run_with_parallel_calls_is_one_drive_with_its_chats_and_calls() -> None:
    with in_memory_telemetry() as captured, trio.fail_after(10):
        async with Runtime("memory://") as runtime:
            outcome = await runtime.run(two_turns(), "find alpha and beta", invocation_id="inv-1")
        spans = captured.spans()
    assert outcome.reason == "completed"
    assert span_tree(spans) == [
        ("chat gpt-test", "invoke_agent finder"),
        ("chat gpt-test", "invoke_agent finder"),
        ("execute_tool lookup", "invoke_agent finder"),
        ("execute_tool lookup", "invoke_agent finder"),
        ("invoke_agent finder", None),
    ]
    assert {span.context.trace_id for span in spans} == {trace_id_of("inv-1", None)}
    kinds = {span.name: span.kind for span in spans}
    assert kinds == {
        "invoke_agent finder": SpanKind.INTERNAL,
        "chat gpt-test": SpanKind.CLIENT,
        "execute_tool lookup": SpanKind.INTERNAL,
    }
    assert all(span.status.status_code is StatusCode.UNSET for span in spans)


async def test_each_span_carries_the_conventions_attributes_and_usage_only_on_chats() -> None:
    with in_memory_telemetry() as captured, trio.fail_after(10):
        async with Runtime("memory://") as runtime:
            await runtime.run(two_turns(), "find alpha and beta", invocation_id="inv-1")
        spans = captured.spans()
    by_name: dict[str, list[dict[str, Any]]] = {}
    for span in spans:
        by_name.setdefault(span.name, []).append(attributes_of(span))
    [agent] = by_name["invoke_agent finder"]
    assert agent["gen_ai.operation.name"] == "invoke_agent"
    assert agent["gen_ai.agent.name"] == "finder"
    assert agent["gen_ai.conversation.id"] == "inv-1"
    assert agent["loop_actors.terminal_reason"] == "completed"
    assert agent["loop_actors.drive"] == 0
    assert agent["loop_actors.drive.end"] == "ended"
    assert "error.type" not in agent
    assert not any(name.startswith("gen_ai.usage.") for name in agent)
    assert agent["loop_actors.tree.tokens"] == 2 * 150
    assert agent["loop_actors.tree.tool_calls"] == 2
    chat = by_name["chat gpt-test"][0]
    assert chat["gen_ai.operation.name"] == "chat"
    assert chat["gen_ai.provider.name"] == "openai"
    assert chat["gen_ai.request.model"] == "gpt-test"
    assert chat["gen_ai.response.model"] == "gpt-test-2026"
    assert chat["gen_ai.response.finish_reasons"] == ("tool_calls",)
    assert chat["gen_ai.usage.input_tokens"] == 120
    assert chat["gen_ai.usage.output_tokens"] == 30
    assert chat["gen_ai.usage.cache_read.input_tokens"] == 100
    assert chat["gen_ai.usage.cache_write.input_tokens"] == 7
    tools = sorted(by_name["execute_tool lookup"], key=lambda a: str(a["gen_ai.tool.call.id"]))
    assert [t["gen_ai.tool.call.id"] for t in tools] == ["a", "b"]
    assert all(t["gen_ai.tool.name"] == "lookup" for t in tools)
    assert all(t["loop_actors.tool.outcome"] == "ok" for t in tools)
    assert all("gen_ai.tool.call.arguments" not in t for t in tools)  # content is off


async def test_the_parallel_calls_overlap_inside_their_drive() -> None:
    with in_memory_telemetry() as captured, trio.fail_after(10):
        async with Runtime("memory://") as runtime:
            await runtime.run(two_turns(), "find alpha and beta", invocation_id="inv-1")
        spans = captured.spans()
    [agent] = [s for s in spans if s.name.startswith("invoke_agent")]
    a, b = [s for s in spans if s.name.startswith("execute_tool")]
    assert times(a)[0] == times(b)[0]  # one plan group: they start together
    start, end = times(agent)
    assert all(start <= times(s)[0] <= times(s)[1] <= end for s in spans)


async def test_a_re_export_of_the_history_gives_the_same_trace_and_span_ids() -> None:
    with in_memory_telemetry() as captured, trio.fail_after(10):
        async with Runtime("memory://") as runtime:
            await runtime.run(two_turns(), "find alpha and beta", invocation_id="inv-1")
            history = await runtime.history("inv-1")
        live = {(s.name, s.context.trace_id, s.context.span_id) for s in captured.spans()}
    again = report(history, root_trace_parent=None)
    assert {(s.name, s.trace_id, s.span_id) for s in again.spans} == live
    assert span_id_of("inv-1", "drive", "0") in {span_id for _, _, span_id in live}


async def test_a_run_started_inside_an_application_span_joins_its_trace() -> None:
    with in_memory_telemetry() as captured, trio.fail_after(10):
        tracer = trace.get_tracer("the-application")
        async with Runtime("memory://") as runtime:
            with tracer.start_as_current_span("handle request") as outer:
                await runtime.run(two_turns(), "find alpha and beta", invocation_id="inv-1")
            started = (await runtime.history("inv-1"))[0]
        spans = captured.spans()
    context = outer.get_span_context()
    assert {span.context.trace_id for span in spans} == {context.trace_id}
    [agent] = [s for s in spans if s.name == "invoke_agent finder"]
    assert agent.parent is not None
    assert agent.parent.span_id == context.span_id
    assert started.trace_parent is not None  # type: ignore[attr-defined]
    assert started.trace_parent.span_id == f"{context.span_id:016x}"  # type: ignore[attr-defined]


async def test_goals_submitted_inside_an_application_span_record_it_for_the_worker() -> None:
    with in_memory_telemetry(), trio.fail_after(10):
        tracer = trace.get_tracer("the-application")
        async with Runtime("memory://") as runtime:
            with tracer.start_as_current_span("enqueue") as outer:
                one = await runtime.submit(two_turns(), "find alpha", invocation_id="sub-1")
                await runtime.submit_many(two_turns(), ["find beta", "find gamma"])
            started = (await runtime.history(one))[0]
            assert isinstance(started, InvocationStarted)
    assert started.trace_parent is not None
    assert started.trace_parent.span_id == f"{outer.get_span_context().span_id:016x}"
