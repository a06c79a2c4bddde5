"""Compaction never separates a call from its result (property test over random histories)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from aggregates.context import compact, view_size
from aggregates.decisions import (
    EffectStatus,
    ErrorClass,
    ErrorInfo,
    Final,
    ToolCall,
    ToolCalls,
    ToolResult,
)
from aggregates.invocation import Turn


@st.composite
def histories(draw: st.DrawFn) -> list[Turn]:
    turns: list[Turn] = []
    for step in range(1, draw(st.integers(1, 30)) + 1):
        n = draw(st.integers(0, 4))
        if n == 0:
            turns.append(Turn(step=step, decision=Final(answer="x" * draw(st.integers(1, 50)))))
            continue
        calls = [
            ToolCall(id=f"s{step}c{i}", name="t", arguments={"v": "y" * draw(st.integers(0, 80))})
            for i in range(n)
        ]
        results = []
        for call in calls:
            kind = draw(st.sampled_from(["ok", "error", "unknown"]))
            if kind == "ok":
                results.append(ToolResult(call_id=call.id, name="t", output=call.arguments["v"]))
            else:
                results.append(
                    ToolResult(
                        call_id=call.id,
                        name="t",
                        error=ErrorInfo(
                            error_class=ErrorClass.OUTCOME_UNKNOWN
                            if kind == "unknown"
                            else ErrorClass.TOOL_FAILED,
                            retryable=False,
                            message="m",
                        ),
                        effect_key="k" if kind == "unknown" else None,
                        effect_status=EffectStatus.OUTCOME_UNKNOWN if kind == "unknown" else None,
                    )
                )
        turns.append(Turn(step=step, decision=ToolCalls(calls=calls), results=results))
    return turns


@settings(max_examples=300, deadline=None)
@given(histories(), st.integers(50, 5000), st.integers(0, 5))
def test_compaction_never_splits_a_call_from_its_result(
    turns: list[Turn], limit: int, keep_recent: int
) -> None:
    kept, compaction = compact(turns, limit=limit, keep_recent=keep_recent)
    original = {turn.step: turn for turn in turns}
    for turn in kept:
        assert turn == original[turn.step]  # whole turns, unchanged
        if isinstance(turn.decision, ToolCalls):
            assert [c.id for c in turn.decision.calls] == [r.call_id for r in turn.results]
    assert [t.step for t in kept] == sorted(t.step for t in kept)
    if compaction is None:
        assert kept == turns
        return
    assert kept[0] == turns[0]
    assert kept[-min(keep_recent, len(turns)) :] == turns[-min(keep_recent, len(turns)) :] or (
        keep_recent == 0
    )
    unsettled = [t.step for t in turns if any(r.effect_status for r in t.results)]
    assert set(unsettled) <= {t.step for t in kept}
    assert compaction.size_after == view_size(kept)
    assert set(compaction.dropped_steps).isdisjoint(compaction.kept_steps)
