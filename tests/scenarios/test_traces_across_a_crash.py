"""A run SIGKILLed mid-batch and resumed in a new process is one trace of two linked drives.

The payments agent runs in a real subprocess in an application that exports spans to a
file; it is killed after its first payment reached the service and before the results
were committed. ``loop-actors resume`` in a second process reports both drives: the
lost one (from the history: its process died before it could) and its own, and the
payment the reconciler settled is one ``reconcile pay`` span, never an ``execute_tool``.
"""

from __future__ import annotations

import json
import shutil
import signal
from pathlib import Path
from typing import Any

import pytest

from loop_actors.telemetry.spans import span_id_of, trace_id_of
from tests.support.cli import run_cli

pytestmark = pytest.mark.slow

SUPPORT = Path(__file__).parents[1] / "support"
Crashed = tuple[
    list[dict[str, Any]], list[dict[str, Any]], dict[str, list[tuple[dict[str, Any], float]]]
]
INVOCATION = "inv-crash"


def loop_actors(*args: str, cwd: Path, crash_at: str | None = None) -> Any:
    env = {
        "PAYMENTS_DB": str(cwd / "service.db"),
        "SPANS_FILE": str(cwd / "spans.jsonl"),
        "METRICS_FILE": str(cwd / "metrics.jsonl"),
    }
    if crash_at is not None:
        env["LOOP_ACTORS_CRASH_AT"] = crash_at
    return run_cli(*args, cwd=cwd, db="sqlite:///run.db", env=env)


def exported(cwd: Path) -> list[dict[str, Any]]:
    path = cwd / "spans.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]


def counted(cwd: Path) -> dict[str, list[tuple[dict[str, Any], float]]]:
    """Each counter's points, from every process's metrics file."""
    found: dict[str, list[tuple[dict[str, Any], float]]] = {}
    for line in (cwd / "metrics.jsonl").read_text().splitlines():
        for resource in json.loads(line)["resource_metrics"]:
            for scope in resource["scope_metrics"]:
                for metric in scope["metrics"]:
                    for point in metric["data"]["data_points"]:
                        if "value" in point:
                            found.setdefault(metric["name"], []).append(
                                (point["attributes"], point["value"])
                            )
    return found


@pytest.fixture
def crashed_and_resumed(tmp_path: Path) -> Crashed:
    for name in ("payments_app.py", "otel_payments_app.py"):
        shutil.copy(SUPPORT / name, tmp_path / name)
    run = ("run", "otel_payments_app:agent", "--goal", "pay bob and carol", "--id", INVOCATION)
    crashed = loop_actors(*run, cwd=tmp_path, crash_at="after_write_returned:1")
    assert crashed.returncode == -signal.SIGKILL, (crashed.stdout, crashed.stderr)
    before = exported(tmp_path)
    resumed = loop_actors("resume", INVOCATION, "--agent", "otel_payments_app:agent", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    return before, exported(tmp_path), counted(tmp_path)


def test_the_killed_run_and_its_resume_are_one_trace_of_two_linked_drives(
    crashed_and_resumed: Crashed,
) -> None:
    before, spans, _ = crashed_and_resumed
    assert [s for s in before if s["name"].startswith("invoke_agent")] == []  # it died driving
    assert {s["context"]["trace_id"] for s in spans} == {f"0x{trace_id_of(INVOCATION, None):032x}"}
    drives = sorted(
        (s for s in spans if s["name"] == "invoke_agent payments"),
        key=lambda s: s["attributes"]["loop_actors.drive"],
    )
    assert [d["attributes"]["loop_actors.drive.end"] for d in drives] == ["lease_lost", "ended"]
    lost, resumed = drives
    assert lost["context"]["span_id"] == f"0x{span_id_of(INVOCATION, 'drive', '0'):016x}"
    assert [link["context"]["span_id"] for link in resumed["links"]] == [lost["context"]["span_id"]]
    assert resumed["attributes"]["loop_actors.resumed_from"] == lost["context"]["span_id"][2:]
    assert resumed["attributes"]["loop_actors.terminal_reason"] == "completed"
    assert lost["status"]["status_code"] == "UNSET"


def test_the_payment_settled_by_reconciliation_is_reported_once_as_a_reconcile_span(
    crashed_and_resumed: Crashed,
) -> None:
    _, spans, _ = crashed_and_resumed
    pays = [s for s in spans if s["attributes"].get("gen_ai.tool.name") == "pay"]
    by_key: dict[str, list[str]] = {}
    for span in pays:
        by_key.setdefault(span["attributes"]["loop_actors.effect.key_hash"], []).append(
            span["name"]
        )
    assert sorted(by_key.values()) == [["execute_tool pay"], ["reconcile pay"]]
    [settled] = [s for s in pays if s["name"] == "reconcile pay"]
    assert settled["attributes"]["loop_actors.effect.status"] == "reconciled"
    assert settled["attributes"]["gen_ai.operation.name"] == "reconcile"
    assert len({s["context"]["span_id"] for s in spans}) == len(spans)  # nothing twice


def test_the_resumed_run_is_counted_once_with_each_of_its_calls_and_writes_once(
    crashed_and_resumed: Crashed,
) -> None:
    _, _, points = crashed_and_resumed
    runs = [(a["loop_actors.terminal_reason"], v) for a, v in points["loop_actors.invocation.runs"]]
    assert runs == [("completed", 1)]
    assert sum(v for _, v in points["loop_actors.tool.calls"]) == 5  # as Terminated.tool_calls
    effects = {a["loop_actors.effect.status"]: v for a, v in points["loop_actors.effects"]}
    assert effects == {"reconciled": 1, "committed": 1}
