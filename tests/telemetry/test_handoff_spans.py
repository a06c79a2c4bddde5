"""A handoff's target goes on in its source's trace, and `trace export` follows the chain."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio
from opentelemetry import trace

from loop_actors import Agent, ModelRequest, Runtime, ScriptedModel
from loop_actors.cli.trace import tree_spans
from loop_actors.store.store import EventStore
from loop_actors.store.url import resolve_db_url
from tests.support.telemetry import attributes_of, in_memory_telemetry

billing = Agent("billing", ScriptedModel([{"kind": "final", "answer": "refunded"}]), [])


def triages(request: ModelRequest) -> dict[str, Any]:
    return {"kind": "handoff", "to": "billing", "reason": "a refund", "summary": "order A-1"}


triage = Agent("triage", ScriptedModel(triages), [], handoffs=[billing])


@pytest.mark.parametrize("inside_a_span", [False, True])
async def test_a_handoff_target_is_in_the_trace_of_the_chain_it_continues(
    tmp_path: Path, inside_a_span: bool
) -> None:
    db = f"sqlite:///{tmp_path / 'chain.db'}"
    with in_memory_telemetry() as captured, trio.fail_after(10):
        async with Runtime(db) as runtime:
            if inside_a_span:
                with trace.get_tracer("app").start_as_current_span("request"):
                    outcome = await runtime.run(triage, "refund A-1", invocation_id="t-1")
            else:
                outcome = await runtime.run(triage, "refund A-1", invocation_id="t-1")
        spans = [s for s in captured.spans() if s.name.startswith("invoke_agent")]
    assert outcome.reason == "completed"
    assert sorted(s.name for s in spans) == ["invoke_agent billing", "invoke_agent triage"]
    assert len({s.context.trace_id for s in spans}) == 1
    [target] = [s for s in spans if s.name == "invoke_agent billing"]
    assert attributes_of(target)["loop_actors.invocation.handed_off_from"] == "t-1"
    store = EventStore(resolve_db_url(db), create=False, read_only=True)
    try:
        again, invocations = tree_spans(store, "t-1", content=False)
    finally:
        store.close()
    assert invocations == 2
    live = {
        (s.context.trace_id, s.context.span_id) for s in captured.spans() if s.name != "request"
    }
    assert {(s.trace_id, s.span_id) for s in again} == live
