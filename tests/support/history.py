"""Checks of an invocation's history as ``loop-actors history --json`` prints it."""

from __future__ import annotations

from typing import Any


def assert_history_is_whole(records: list[dict[str, Any]]) -> None:
    """No gap, duplicate or reordering: positions 1..n, one start, one end, steps in order."""
    assert [r["position"] for r in records] == list(range(1, len(records) + 1))
    types = [r["type"] for r in records]
    assert types[0] == "InvocationStarted"
    assert types.count("InvocationStarted") == 1
    assert types.count("Terminated") == 1
    assert types[-1] == "Terminated"
    steps = [r["data"]["step"] for r in records if r["type"] == "DecisionProposed"]
    assert steps == list(range(1, len(steps) + 1))
    for record in records:
        if record["type"] == "ResultsCommitted":
            ids = [result["call_id"] for result in record["data"]["results"]]
            assert len(ids) == len(set(ids))
