"""A run awaited from asyncio inside the application's span joins that span's trace."""

from __future__ import annotations

import asyncio

from opentelemetry import trace

from aggregates.invocation import InvocationStarted
from loop_actors import AsyncioRuntime
from tests.support.telemetry import in_memory_telemetry, span_tree
from tests.telemetry.test_span_tree import two_turns


async def run_in_a_request() -> tuple[int, int, InvocationStarted]:
    async with AsyncioRuntime("memory://") as runtime:
        with trace.get_tracer("web").start_as_current_span("POST /find") as request:
            await asyncio.wait_for(runtime.run(two_turns(), "find", invocation_id="a-1"), 10)
        started = (await runtime.history("a-1"))[0]
    assert isinstance(started, InvocationStarted)
    context = request.get_span_context()
    return context.trace_id, context.span_id, started


def test_an_asyncio_callers_span_is_the_parent_of_the_runs_drive() -> None:
    with in_memory_telemetry() as captured:
        trace_id, span_id, started = asyncio.run(run_in_a_request())
        spans = captured.spans()
    assert started.trace_parent is not None
    assert started.trace_parent.span_id == f"{span_id:016x}"
    assert {span.context.trace_id for span in spans} == {trace_id}
    assert ("invoke_agent finder", "POST /find") in span_tree(spans)
