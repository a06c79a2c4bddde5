"""A goal submitted inside the application's span is driven by a worker in that span's trace."""

from __future__ import annotations

from pathlib import Path

import trio
from opentelemetry import trace

from loop_actors import Runtime, Worker
from tests.support.telemetry import in_memory_telemetry, span_tree
from tests.telemetry.test_span_tree import two_turns


async def test_a_worker_reports_a_submitted_run_under_the_span_that_submitted_it(
    tmp_path: Path,
) -> None:
    db = f"sqlite:///{tmp_path / 'queue.db'}"
    agent = two_turns()
    with in_memory_telemetry() as captured, trio.fail_after(30):
        async with Runtime(db) as runtime:
            with trace.get_tracer("app").start_as_current_span("enqueue") as outer:
                await runtime.submit(agent, "find", invocation_id="queued-1")
        report = await Worker(agent, db, concurrency=2, poll_s=0.01).run(until_idle=True)
        spans = captured.spans()
        points = captured.metrics()
    assert report.outcomes.get("completed") == 1
    assert {span.context.trace_id for span in spans} == {outer.get_span_context().trace_id}
    assert ("invoke_agent finder", "enqueue") in span_tree(spans)
    assert [value for _, value, _ in points["loop_actors.invocation.runs"]] == [1]
