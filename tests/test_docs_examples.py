"""Every code example of the docs is a file under docs/examples that runs here for real.

Each example runs as a subprocess with the project's interpreter, in a fresh
temporary directory, against a SQLite file in that directory.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
from contextlib import closing
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "docs" / "examples"
TESTED_EXAMPLES = {
    "quickstart.py",
    "first_agent.py",
    "async_runtime.py",
    "custom_tool.py",
    "scripted_model.py",
    "cancellation.py",
    "payments_agent.py",
    "crash_and_resume.py",
}
TIMEOUT_S = 60


def _env(tmp_path: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {
        k: v for k, v in os.environ.items() if k not in ("LOOP_ACTORS_CRASH_AT", "PAYMENTS_DOWN")
    }
    env["LOOP_ACTORS_DB"] = f"sqlite:///{tmp_path / 'docs.db'}"
    env["PAYMENTS_DB"] = str(tmp_path / "payments.db")  # the payment service's own file
    env["PYTHONDONTWRITEBYTECODE"] = "1"  # keep docs/examples free of __pycache__
    env.update(extra or {})
    return env


def _run_example(name: str, tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(EXAMPLES / name), *args],
        cwd=tmp_path,
        env=_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=False,
    )


def _cli(
    *args: str, tmp_path: Path, cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    script = Path(sys.executable).with_name("loop-actors")
    command = [str(script)] if script.exists() else [sys.executable, "-m", "loop_actors._cli"]
    return subprocess.run(
        [*command, *args],
        cwd=cwd,
        env=_env(tmp_path, env),
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=False,
    )


def _lines(result: subprocess.CompletedProcess[str]) -> list[str]:
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()


# --------------------------------------------------------------------------- scripts


def test_quickstart_completes_with_the_scripted_answer(tmp_path: Path) -> None:
    lines = _lines(_run_example("quickstart.py", tmp_path))
    assert lines[0] == "completed 2 + 3 = 5"
    assert lines[1].startswith("steps=2 tool_calls=1 id=")
    assert (tmp_path / "quickstart.db").exists()


def test_first_agent_answers_from_its_tool_result(tmp_path: Path) -> None:
    lines = _lines(_run_example("first_agent.py", tmp_path))
    assert lines == ["completed Order A-1001 is shipped."]
    assert (tmp_path / "docs.db").exists()


def test_async_runtime_runs_three_invocations_concurrently(tmp_path: Path) -> None:
    lines = _lines(_run_example("async_runtime.py", tmp_path))
    assert lines == [
        "ask-A-1001 completed Order A-1001 is shipped.",
        "ask-A-1002 completed Order A-1002 is being packed.",
        "ask-A-9999 cannot_continue no order A-9999",
    ]


def test_async_runtime_run_again_returns_the_recorded_outcomes(tmp_path: Path) -> None:
    first = _lines(_run_example("async_runtime.py", tmp_path))
    second = _lines(_run_example("async_runtime.py", tmp_path))
    assert second == first


def test_custom_tool_returns_structured_errors_and_rejects_bad_arguments(tmp_path: Path) -> None:
    lines = _lines(_run_example("custom_tool.py", tmp_path))
    schema = json.loads(lines[0].removeprefix("reserve schema: "))
    assert schema["required"] == ["item"]
    assert schema["properties"]["quantity"]["default"] == 1
    assert schema["additionalProperties"] is False
    assert lines[1] == "stock('apple') called directly: 3"
    assert lines[2] == (
        "completed - s0: Fruit & Co; s1: 3; "
        "s2: invalid_arguments (no item named 'kiwi'); r1: reserved 2 apple"
    )
    assert lines[3].startswith("invalid_decision - call r2: arguments for reserve are invalid:")
    assert "quantity" in lines[3]


def test_scripted_model_variants_end_as_documented(tmp_path: Path) -> None:
    lines = _lines(_run_example("scripted_model.py", tmp_path))
    assert lines == [
        "dicts: completed - echoed",
        "models: completed - echoed",
        "function: completed - the tool said: say hi",
        "async function: completed - step 1 of scripted-async-function",
        "slow: deadline_exceeded - the model did not answer in time",
        "too short: model_error - ScriptExhaustedError: "
        "the script has 1 decision(s), step 2 was asked",
        "custom: completed - SAY HI",
    ]


def test_cancellation_records_cancelled_both_ways(tmp_path: Path) -> None:
    lines = _lines(_run_example("cancellation.py", tmp_path))
    assert lines == [
        "running: ['by-id']",
        "by-id: cancelled - cancel requested while tools ran",
        "by-scope: cancelled - the caller cancelled",
    ]


# --------------------------------------------------------------------------- the CLI


def test_cli_runs_the_first_agent_and_shows_its_history(tmp_path: Path) -> None:
    run = _cli(
        "run",
        "first_agent:agent",
        "--goal",
        "Where is order A-1002?",
        "--id",
        "order-a-1002",
        tmp_path=tmp_path,
        cwd=EXAMPLES,
    )
    assert _lines(run) == [
        "completed",
        "Order A-1002 is being packed.",
        "steps=2 tool_calls=1 events=6 id=order-a-1002",
    ]
    history = _cli("history", "order-a-1002", tmp_path=tmp_path, cwd=tmp_path)
    types = [line.split()[2] for line in _lines(history)]
    assert types == [
        "InvocationStarted",
        "DecisionProposed",
        "BatchDispatched",
        "ResultsCommitted",
        "DecisionProposed",
        "Terminated",
    ]


def test_cli_history_json_has_one_record_per_event(tmp_path: Path) -> None:
    _cli(
        "run",
        "first_agent:agent",
        "--goal",
        "Where is order A-1001?",
        "--id",
        "order-a-1001",
        tmp_path=tmp_path,
        cwd=EXAMPLES,
    )
    history = _cli("history", "order-a-1001", "--json", tmp_path=tmp_path, cwd=tmp_path)
    records = [json.loads(line) for line in _lines(history)]
    assert [r["position"] for r in records] == [1, 2, 3, 4, 5, 6]
    assert {r["invocation_id"] for r in records} == {"order-a-1001"}
    assert {"position", "type", "invocation_id", "timestamp", "data"} <= set(records[0])
    assert records[2]["type"] == "BatchDispatched"
    assert records[2]["data"]["calls"][0]["arguments"] == {"order_id": "A-1001"}
    assert records[-1]["data"]["reason"] == "completed"


def test_cli_run_json_exits_4_when_the_agent_cannot_continue(tmp_path: Path) -> None:
    run = _cli(
        "run",
        "first_agent:agent",
        "--goal",
        "Where is my order?",
        "--json",
        tmp_path=tmp_path,
        cwd=EXAMPLES,
    )
    assert run.returncode == 4, run.stderr
    outcome = json.loads(run.stdout)
    assert outcome["reason"] == "cannot_continue"
    assert outcome["detail"] == "the goal names no order id"
    assert outcome["answer"] is None


def test_cli_run_exits_2_when_the_agent_cannot_be_loaded(tmp_path: Path) -> None:
    run = _cli("run", "first_agent:nobody", "--goal", "x", tmp_path=tmp_path, cwd=EXAMPLES)
    assert run.returncode == 2
    assert "has no attribute 'nobody'" in run.stderr
    assert not (tmp_path / "docs.db").exists()


# --------------------------------------------------------------------------- crash and resume

PAY_GOAL = "Pay bob 30 and carol 20"
PAID = "bob 30 paid (R-0001); carol 20 paid (R-0002)"
RESUMED = ["completed", PAID, "steps=2 tool_calls=2 events=6 id=pay-1"]


def _service(tmp_path: Path) -> list[tuple[str, int, int]]:
    """The payment service's payments: recipient, amount, requests that carried its key."""
    if not (tmp_path / "payments.db").exists():
        return []
    with closing(sqlite3.connect(tmp_path / "payments.db")) as db:
        rows = db.execute(
            "SELECT recipient, amount, (SELECT COUNT(*) FROM requests r WHERE r.key = p.key)"
            " FROM payments p ORDER BY receipt"
        ).fetchall()
    return [(str(r), int(a), int(n)) for r, a, n in rows]


def _crash(invocation_id: str, goal: str, tmp_path: Path, *, at: str) -> None:
    crashed = _cli(
        "run",
        "payments_agent:agent",
        "--goal",
        goal,
        "--id",
        invocation_id,
        tmp_path=tmp_path,
        cwd=EXAMPLES,
        env={"LOOP_ACTORS_CRASH_AT": at},
    )
    assert crashed.returncode == -signal.SIGKILL, (crashed.stdout, crashed.stderr)
    assert crashed.stdout == ""


def test_crash_and_resume_pays_each_recipient_exactly_once(tmp_path: Path) -> None:
    lines = _lines(_run_example("crash_and_resume.py", tmp_path))
    assert lines == [
        "run: killed by SIGKILL",
        f"completed - {PAID}",
        "resume: exit 0",
        "resumed again: completed",
        "p1 pay: reconciled",
        "p2 pay: committed",
        "sweep: settled=0 open=0",
        "service: bob 30, 1 request(s) with its key",
        "service: carol 20, 1 request(s) with its key",
    ]
    assert list(tmp_path.iterdir()) == []  # it worked in a temporary folder of its own


def test_payments_agent_script_refuses_a_payment_over_the_limit(tmp_path: Path) -> None:
    run = _run_example("payments_agent.py", tmp_path, "run", "pay-3", "Pay frank 5000")
    assert _lines(run) == ["completed - frank 5000 not paid (over the limit of 1000)"]
    again = _run_example("payments_agent.py", tmp_path, "resume", "pay-3")
    assert _lines(again) == _lines(run)
    assert not (tmp_path / "payments.db").exists()  # the service was never asked


def test_cli_resume_after_a_crash_mid_batch_pays_each_recipient_once(tmp_path: Path) -> None:
    _crash("pay-1", PAY_GOAL, tmp_path, at="after_write_returned:1")
    assert _service(tmp_path) == [("bob", 30, 1)]  # paid, but nothing of it recorded

    resume = ("resume", "pay-1", "--agent", "payments_agent:agent")
    assert _lines(_cli(*resume, tmp_path=tmp_path, cwd=EXAMPLES)) == RESUMED
    assert _service(tmp_path) == [("bob", 30, 1), ("carol", 20, 1)]

    history = _cli("history", "pay-1", "--json", tmp_path=tmp_path, cwd=tmp_path)
    records = [json.loads(line) for line in _lines(history)]
    (dispatched,) = [r["data"] for r in records if r["type"] == "BatchDispatched"]
    keys = [call["effect_key"] for call in dispatched["calls"]]
    assert all(key.startswith("eff-") and len(key) == 44 for key in keys)
    (committed,) = [r["data"] for r in records if r["type"] == "ResultsCommitted"]
    assert [(r["effect_key"], r["effect_status"]) for r in committed["results"]] == [
        (keys[0], "reconciled"),
        (keys[1], "committed"),
    ]
    ledger = _cli("history", keys[1], "--json", tmp_path=tmp_path, cwd=tmp_path)
    assert [json.loads(line)["type"] for line in _lines(ledger)] == [
        "EffectPrepared",
        "EffectDispatched",
        "EffectReconciled",
        "EffectDispatched",
        "EffectCommitted",
    ]

    again = _cli(*resume, tmp_path=tmp_path, cwd=EXAMPLES)
    assert _lines(again) == RESUMED  # nothing runs again
    assert _service(tmp_path) == [("bob", 30, 1), ("carol", 20, 1)]


def test_cli_resume_pauses_while_the_service_is_down_and_the_sweeper_finishes(
    tmp_path: Path,
) -> None:
    _crash("pay-2", "Pay dave 40 and erin 2000", tmp_path, at="after_write_returned:1")
    paused = _cli(
        "resume",
        "pay-2",
        "--agent",
        "payments_agent:agent",
        tmp_path=tmp_path,
        cwd=EXAMPLES,
        env={"PAYMENTS_DOWN": "1"},
    )
    assert paused.returncode == 3, paused.stderr
    down = "ConnectionError: the payment service is down"
    assert paused.stdout.splitlines() == [
        "reconciliation_required",
        "the outcome of a write is unknown and its service cannot be asked: "
        f"eff-f3844000a0f768b7894886465c4e739b4c77b301 (pay): {down}; "
        f"eff-e23a744300dc855306aaee01ba1a426fe79a5003 (pay): {down}",
        "steps=1 tool_calls=2 events=4 id=pay-2",
    ]

    sweep = ("reconcile", "--agent", "payments_agent:agent")
    still_down = _cli(*sweep, tmp_path=tmp_path, cwd=EXAMPLES, env={"PAYMENTS_DOWN": "1"})
    assert still_down.returncode == 3, still_down.stderr
    assert still_down.stdout.splitlines() == [
        "resumed pay-2: reconciliation_required",
        "effects settled=0 open=2",
    ]

    assert _lines(_cli(*sweep, tmp_path=tmp_path, cwd=EXAMPLES)) == [
        "resumed pay-2: completed",
        "effects settled=2 open=0",
    ]
    assert _service(tmp_path) == [("dave", 40, 1)]
    report = json.loads(_lines(_cli(*sweep, "--json", tmp_path=tmp_path, cwd=EXAMPLES))[0])
    assert report == {"resumed": [], "effects_settled": 0, "effects_open": 0, "left_running": []}


def test_cli_reconcile_leaves_alone_an_invocation_that_may_be_running(tmp_path: Path) -> None:
    _crash("pay-4", "Pay bob 30", tmp_path, at="after_dispatch_commit")
    sweep = _cli("reconcile", "--agent", "payments_agent:agent", tmp_path=tmp_path, cwd=EXAMPLES)
    assert sweep.returncode == 3, sweep.stderr
    assert sweep.stdout.splitlines() == [
        "left alone pay-4: not paused (it may be running); resume it",
        "effects settled=0 open=1",
    ]
    resume = _cli(
        "resume", "pay-4", "--agent", "payments_agent:agent", tmp_path=tmp_path, cwd=EXAMPLES
    )
    assert _lines(resume)[:2] == ["completed", "bob 30 paid (R-0001)"]
    assert _service(tmp_path) == [("bob", 30, 1)]


CHANGED_AGENT = """\
from typing import Any

from loop_actors import Agent, ScriptedModel, ToolContext, tool
from payments_agent import PaymentService, decide, reconcile_payment


@tool(effect="write", reconcile=reconcile_payment)
def pay(recipient: str, amount: int, context: ToolContext, memo: str = "") -> dict[str, Any]:
    \"\"\"Pay, with a memo.\"\"\"
    assert context.effect_key is not None
    return PaymentService().pay(context.effect_key, recipient, amount)


agent = Agent("payments", ScriptedModel(decide), tools=[pay])
"""


def test_cli_resume_refuses_a_changed_tool_unless_allowed(tmp_path: Path) -> None:
    _crash("pay-1", PAY_GOAL, tmp_path, at="after_results_commit:1")
    (tmp_path / "changed_payments.py").write_text(CHANGED_AGENT)
    resume = ("resume", "pay-1", "--agent", "changed_payments:agent")
    env = {"PYTHONPATH": str(tmp_path)}
    refused = _cli(*resume, tmp_path=tmp_path, cwd=EXAMPLES, env=env)
    assert refused.returncode == 2
    assert refused.stderr == (
        "loop-actors: error: the tool catalogue changed since the invocation started: "
        "tool 'pay' changed its schema or effect "
        "(allow_catalogue_change / --allow-catalogue-change resumes anyway)\n"
    )
    allowed = _cli(*resume, "--allow-catalogue-change", tmp_path=tmp_path, cwd=EXAMPLES, env=env)
    assert _lines(allowed) == RESUMED
    assert _service(tmp_path) == [("bob", 30, 1), ("carol", 20, 1)]


def test_an_unknown_crash_point_makes_the_import_fail(tmp_path: Path) -> None:
    run = _cli(
        "run",
        "payments_agent:agent",
        "--goal",
        PAY_GOAL,
        tmp_path=tmp_path,
        cwd=EXAMPLES,
        env={"LOOP_ACTORS_CRASH_AT": "after_nothing"},
    )
    assert run.returncode == 1
    assert "ValueError: 'after_nothing' is not a valid CrashPoint" in run.stderr
    assert not (tmp_path / "payments.db").exists()


# --------------------------------------------------------------------------- the docs


def _python_blocks(markdown: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```$", markdown, flags=re.MULTILINE | re.DOTALL)


def _doc_pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def test_every_example_file_is_run_by_a_test() -> None:
    assert {path.name for path in EXAMPLES.glob("*.py")} == TESTED_EXAMPLES


@pytest.mark.parametrize("page", _doc_pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_python_in_the_docs_is_quoted_verbatim_from_an_example(page: Path) -> None:
    sources = [path.read_text() for path in EXAMPLES.glob("*.py")]
    for block in _python_blocks(page.read_text()):
        assert any(block in source for source in sources), f"not from docs/examples:\n{block}"


@pytest.mark.parametrize("page", _doc_pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_in_the_docs_point_to_existing_files(page: Path) -> None:
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text())
    local = [target for target in targets if "://" not in target]
    missing = [target for target in local if not (page.parent / target).exists()]
    assert not missing, f"{page.name} links to missing files: {missing}"


# --------------------------------------------------------------------------- MCP tools

TESTED_EXAMPLES.add("mcp_agent.py")


def test_mcp_agent_calls_the_tools_of_its_mcp_server_over_stdio(tmp_path: Path) -> None:
    lines = _lines(_run_example("mcp_agent.py", tmp_path))
    assert lines == [
        "stock: read -",
        "set_label: write re-sent if unknown",
        "order: write -",
        "completed - s1: {'item': 'pear', 'count': 0}; "
        "s2: Error executing tool stock: no item named 'kiwi'; "
        "o1: ordered 5 pear; l1: {'result': \"pear labelled 'soon'\"}",
        "invalid_decision - call o2: arguments for order are invalid: "
        "arguments: 'quantity' is a required property",
    ]
