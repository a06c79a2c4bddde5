"""Every code example of the docs is a file under docs/examples that runs here for real.

Each example runs as a subprocess with the project's interpreter, in a fresh
temporary directory, against a SQLite file in that directory.
"""

from __future__ import annotations

import ast
import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

from tests.support.docs import ROOT, doc_pages
from tests.support.stored_bytes import readable_bytes

pytestmark = pytest.mark.slow

EXAMPLES = ROOT / "docs" / "examples"
TESTED_EXAMPLES = {
    "quickstart.py",
    "first_agent.py",
    "async_runtime.py",
    "asyncio_app.py",
    "batch_of_jobs.py",
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
    command = [str(script)] if script.exists() else [sys.executable, "-m", "loop_actors.cli.main"]
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


def test_asyncio_app_runs_concurrently_times_out_and_raises_typed_errors(tmp_path: Path) -> None:
    expected = [
        "ask-A-1001 completed Order A-1001 is shipped.",
        "ask-A-1002 completed Order A-1002 is being packed.",
        "ask-A-9999 cannot_continue no order A-9999",
        "courier: timed out, recorded as cancelled",
        "error: InvocationNotFoundError no invocation with id 'no-such-id'",
    ]
    assert _lines(_run_example("asyncio_app.py", tmp_path)) == expected
    # Run again on the same store: the orders' recorded outcomes, a new courier run.
    assert _lines(_run_example("asyncio_app.py", tmp_path)) == expected


def test_a_batch_of_jobs_runs_ten_at_a_time_and_a_second_run_starts_nothing(
    tmp_path: Path,
) -> None:
    first = _lines(_run_example("batch_of_jobs.py", tmp_path))
    assert first == [
        "jobs: 50, at most 10 in flight",
        "started by this run: 50, found in the store: 0",
        "reasons: completed",
        "job-003: ticket 3 is closed",
    ]
    again = _lines(_run_example("batch_of_jobs.py", tmp_path))
    assert again[1] == "started by this run: 0, found in the store: 50"
    assert again[2:] == first[2:]


def test_a_batch_killed_midway_and_run_again_finishes_every_job_started_once(
    tmp_path: Path,
) -> None:
    killed = subprocess.run(
        [sys.executable, str(EXAMPLES / "batch_of_jobs.py")],
        cwd=tmp_path,
        env=_env(tmp_path, {"LOOP_ACTORS_CRASH_AT": "after_results_commit:15"}),
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=False,
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    lines = _lines(_run_example("batch_of_jobs.py", tmp_path))
    started, found = (int(n) for n in re.findall(r"\d+", lines[1]))
    assert started + found == 50
    assert found >= 10  # the jobs in flight when it died were resumed, not started again
    assert lines[2:] == ["reasons: completed", "job-003: ticket 3 is closed"]
    with closing(sqlite3.connect(tmp_path / "docs.db")) as db:
        starts = db.execute(
            "SELECT COUNT(*), COUNT(DISTINCT originator_id) FROM stored_events"
            " WHERE topic LIKE '%InvocationStarted'"
        ).fetchone()
    assert starts == (50, 50)


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
    # The model is told what was wrong with its call, corrects it, and the run goes on.
    assert lines[3].startswith("told: call r2: arguments for reserve are invalid: quantity:")
    assert lines[4] == "completed - r3: only 0 pear left"
    # With max_invalid_proposals=0 the first invalid proposal ends the run.
    assert lines[5].startswith("invalid_decision - call r2: arguments for reserve are invalid:")
    assert "quantity" in lines[5]


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
RESUMED = ["completed", PAID, "steps=2 tool_calls=2 events=7 id=pay-1"]
"""Seven events: the resume's ``LeaseAcquired`` took the killed run's lease over."""


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
        "steps=1 tool_calls=2 events=5 id=pay-2",  # with the resume's LeaseAcquired
    ]

    sweep = ("reconcile", "--agent", "payments_agent:agent")
    still_down = _cli(*sweep, tmp_path=tmp_path, cwd=EXAMPLES, env={"PAYMENTS_DOWN": "1"})
    assert still_down.returncode == 3, still_down.stderr
    assert still_down.stdout.splitlines() == [
        "resumed pay-2: reconciliation_required",
        "effects settled=0 open=2 invocations waiting=1",
    ]

    assert _lines(_cli(*sweep, tmp_path=tmp_path, cwd=EXAMPLES)) == [
        "resumed pay-2: completed",
        "effects settled=2 open=0 invocations waiting=0",
    ]
    assert _service(tmp_path) == [("dave", 40, 1)]
    report = json.loads(_lines(_cli(*sweep, "--json", tmp_path=tmp_path, cwd=EXAMPLES))[0])
    assert report == {
        "resumed": [],
        "effects_settled": 0,
        "effects_open": 0,
        "left_running": [],
        "needs_person": [],
        "effects_waiting": 0,
        "invocations_waiting": 0,
    }


def test_cli_reconcile_leaves_alone_an_invocation_that_may_be_running(tmp_path: Path) -> None:
    _crash("pay-4", "Pay bob 30", tmp_path, at="after_dispatch_commit")
    sweep = _cli("reconcile", "--agent", "payments_agent:agent", tmp_path=tmp_path, cwd=EXAMPLES)
    assert sweep.returncode == 3, sweep.stderr
    assert sweep.stdout.splitlines() == [
        "left alone pay-4: not paused (it may be running); resume it",
        "effects settled=0 open=1 invocations waiting=0",
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
    # The changed agent's folder first; the code under test stays importable as it was.
    env = {
        "PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))
    }
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


def test_every_example_file_is_run_by_a_test() -> None:
    assert {path.name for path in EXAMPLES.glob("*.py")} == TESTED_EXAMPLES


@pytest.mark.parametrize("page", doc_pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_python_in_the_docs_is_quoted_verbatim_from_an_example(page: Path) -> None:
    sources = [path.read_text() for path in EXAMPLES.glob("*.py")]
    for block in _python_blocks(page.read_text()):
        assert any(block in source for source in sources), f"not from docs/examples:\n{block}"


@pytest.mark.parametrize("page", doc_pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_in_the_docs_point_to_existing_files(page: Path) -> None:
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text())
    local = [target for target in targets if "://" not in target]
    missing = [target for target in local if not (page.parent / target).exists()]
    assert not missing, f"{page.name} links to missing files: {missing}"


# --------------------------------------------------------------------------- MCP tools

TESTED_EXAMPLES.add("mcp_agent.py")
TESTED_EXAMPLES.add("verify_checkpoint.py")  # run by tests/audit/test_audit_checkpoint.py
TESTED_EXAMPLES.add("issue_tracker.py")  # run by tests/docs/test_docs_samples.py
TESTED_EXAMPLES.add("otel_traces.py")  # run by tests/telemetry/test_otel_example.py
TESTED_EXAMPLES.add("follow_stream.py")  # run by tests/console/test_stream_example.py
TESTED_EXAMPLES.add("console_bulk.py")  # by tests/docs/test_docs_printed_outputs.py


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


# --------------------------------------------------------------------------- model providers

TESTED_EXAMPLES.add("provider_agent.py")

PROVIDER_GOAL = "Where is order A-1001?"


def _run_provider_agent(url: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(EXAMPLES / "provider_agent.py"), PROVIDER_GOAL],
        cwd=tmp_path,
        env=_env(tmp_path, {"PROVIDER_BASE_URL": f"{url}/v1"}),
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=False,
    )


def test_provider_agent_retries_a_rate_limit_and_records_usage(tmp_path: Path) -> None:
    from tests.support.fake_providers import openai_error, openai_text, openai_tool_calls, serve

    call = ("call_1", "order_status", '{"order_id": "A-1001"}')
    with serve(
        [
            openai_error(429, "slow down", {"retry-after-ms": "1"}),
            openai_tool_calls(call, prompt=52, completion=18),
            openai_text("Order A-1001 is shipped."),
        ]
    ) as provider:
        lines = _lines(_run_provider_agent(provider.url, tmp_path))
    assert lines == [
        "completed - Order A-1001 is shipped.",
        "step 1: in=52 out=18 attempts=2 cost=0.0000186",
        "step 2: in=7 out=3 attempts=1 cost=0.0000028",
    ]
    assert provider.paths == ["/v1/chat/completions"] * 3
    first, _, last = provider.requests
    assert first["model"] == "llama3.2"
    (schema,) = first["tools"]
    assert schema == {
        "type": "function",
        "function": {
            "name": "order_status",
            "description": "Look up the status of an order by its id, e.g. A-1001.",
            "parameters": {
                "additionalProperties": False,
                "properties": {"order_id": {"title": "Order Id", "type": "string"}},
                "required": ["order_id"],
                "title": "order_status_arguments",
                "type": "object",
            },
        },
    }
    assert last["messages"][0]["content"].startswith("You are the agent 'orders'.")
    assert last["messages"][1:] == [
        {"role": "user", "content": PROVIDER_GOAL},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "order_status", "arguments": '{"order_id": "A-1001"}'},
                }
            ],
        },
        {
            "role": "tool",
            "tool_call_id": "call_1",
            "content": '{"order_id": "A-1001", "status": "shipped"}',
        },
    ]


def test_provider_agent_is_not_retried_after_an_authentication_error(tmp_path: Path) -> None:
    from tests.support.fake_providers import openai_error, openai_text, serve

    with serve([openai_error(401, "Incorrect API key provided"), openai_text("never")]) as provider:
        lines = _lines(_run_provider_agent(provider.url, tmp_path))
    assert lines == [
        "model_error - ModelCallError: [authentication] after 1 attempt(s): "
        "Error code: 401 - Incorrect API key provided",
    ]  # no decision was made, so no usage is recorded
    assert len(provider.requests) == 1


def test_cli_runs_the_provider_agent_with_the_model_it_is_given(tmp_path: Path) -> None:
    from tests.support.fake_providers import openai_text, openai_tool_calls, serve

    call = ("call_1", "order_status", '{"order_id": "A-1002"}')
    with serve([openai_tool_calls(call), openai_text("Order A-1002 is being packed.")]) as provider:
        url = f"{provider.url}/v1"
        run = _cli(
            "run",
            "provider_agent:agent",
            "--goal",
            "Where is order A-1002?",
            "--id",
            "provider-1",
            "--model",
            "openai:qwen2.5-7b-instruct",
            "--base-url",
            url,
            tmp_path=tmp_path,
            cwd=EXAMPLES,
            env={"PROVIDER_BASE_URL": url},
        )
    assert _lines(run) == [
        "completed",
        "Order A-1002 is being packed.",
        "steps=2 tool_calls=1 events=6 id=provider-1",
    ]
    assert [request["model"] for request in provider.requests] == ["qwen2.5-7b-instruct"] * 2


# --------------------------------------------------------------------------- loop policies

TESTED_EXAMPLES.update(
    {
        "approvals.py",
        "clarification.py",
        "policy.py",
        "budgets.py",
        "doom_loop.py",
        "verifier.py",
        "reflection.py",
        "compaction.py",
        "cancel_request.py",
    }
)
REFUND_GOAL = "Refund orders A-1 and A-2."
DENIED_R1 = "r1: denied (denied by bob: no receipt; it did not run and must not be retried as is)"


def test_approvals_pause_then_approve_deny_and_refuse_a_wrong_digest(tmp_path: Path) -> None:
    lines = _lines(_run_example("approvals.py", tmp_path))
    assert lines == [
        "approval_required exit 3 refunded: []",
        "  r1 {'order_id': 'A-1', 'amount': 250} needs_approval=True",
        "  r2 {'order_id': 'A-2', 'amount': 20} needs_approval=False",
        "a wrong digest is refused",
        "completed - r1: refunded 250 on A-1; r2: refunded 20 on A-2",
        f"completed - {DENIED_R1}; r2: refunded 20 on A-2",
        "refunded: [250, 20, 20]",
        "refund-1: InvocationStarted DecisionProposed Paused ApprovalGranted BatchDispatched "
        "ResultsCommitted DecisionProposed Terminated",
    ]


def test_cli_approve_and_deny_a_paused_refund(tmp_path: Path) -> None:
    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return _cli(*args, tmp_path=tmp_path, cwd=EXAMPLES)

    run = ("run", "approvals:agent", "--goal", REFUND_GOAL)
    paused = cli(*run, "--id", "refund-3", "--json")
    assert paused.returncode == 3, paused.stderr
    record = json.loads(paused.stdout)
    assert record["reason"] == "approval_required"
    assert record["digest"] == record["detail"]
    assert [(c["call_id"], c["needs_approval"]) for c in record["pending_calls"]] == [
        ("r1", True),
        ("r2", False),
    ]
    wrong = cli("approve", "refund-3", "--digest", "123", "--by", "eve")
    assert wrong.returncode == 2
    assert wrong.stderr.startswith("loop-actors: error: refused: digest 123 is not the digest")
    approved = cli(
        "approve", "refund-3", "--digest", record["digest"], "--by", "alice",
        "--note", "receipt seen", "--agent", "approvals:agent",
    )  # fmt: skip
    assert _lines(approved) == [
        "completed",
        "r1: refunded 250 on A-1; r2: refunded 20 on A-2",
        "steps=2 tool_calls=2 events=8 id=refund-3",
    ]

    assert cli(*run, "--id", "refund-4").returncode == 3
    assert _lines(cli("deny", "refund-4", "--by", "bob", "--reason", "no receipt")) == [
        "recorded deny for refund-4; resume it to continue"
    ]
    assert _lines(cli("resume", "refund-4", "--agent", "approvals:agent"))[1] == (
        f"{DENIED_R1}; r2: refunded 20 on A-2"
    )
    history = _cli("history", "refund-4", "--json", tmp_path=tmp_path, cwd=tmp_path)
    denied = [json.loads(x)["data"] for x in _lines(history) if '"ApprovalDenied"' in x]
    assert [(d["by"], d["reason"]) for d in denied] == [("bob", "no receipt")]


def test_clarification_is_answered_from_python(tmp_path: Path) -> None:
    lines = _lines(_run_example("clarification.py", tmp_path))
    assert lines == [
        "clarification_required - Which order do you mean (e.g. A-1001)?",
        "completed - Order A-1002 is being packed.",
        "ask-1 waits for nothing now",
        "cannot_continue - there is no order A-9999",
    ]


def test_cli_clarify_answers_and_resumes(tmp_path: Path) -> None:
    run = ("run", "clarification:agent", "--goal", "Where is my order?", "--id", "ask-3")
    paused = _cli(*run, tmp_path=tmp_path, cwd=EXAMPLES)
    assert paused.returncode == 3, paused.stderr
    assert paused.stdout.splitlines()[:2] == [
        "clarification_required",
        "Which order do you mean (e.g. A-1001)?",
    ]
    answer = ("clarify", "ask-3", "--answer", "A-1001", "--by", "desk")
    answered = _cli(*answer, "--agent", "clarification:agent", tmp_path=tmp_path, cwd=EXAMPLES)
    assert _lines(answered) == [
        "completed",
        "Order A-1001 is shipped.",
        "steps=2 tool_calls=0 events=6 id=ask-3",
    ]
    again = _cli(*answer, tmp_path=tmp_path, cwd=EXAMPLES)
    assert again.returncode == 2
    assert "does not wait for an answer" in again.stderr


def test_policy_refuses_calls_per_actor_and_tenant(tmp_path: Path) -> None:
    lines = _lines(_run_example("policy.py", tmp_path))
    assert lines == [
        "alice: completed - a: acme-7: 2 pears; b: refunded 5 on acme-7; "
        "c: refused by policy: zeta-1 is not an order of acme",
        "bob: completed - a: acme-7: 2 pears; b: refused by policy: bob may not refund for acme; "
        "c: refused by policy: zeta-1 is not an order of acme",
        "suspended: invalid_decision - refused by policy: call a: tenant acme is suspended",
    ]


def test_cli_run_passes_actor_and_tenant_to_the_policy(tmp_path: Path) -> None:
    run = _cli(
        "run", "policy:agent", "--goal", "Refund acme-7 and zeta-1.", "--id", "p-1",
        "--actor", "bob", "--tenant", "acme", tmp_path=tmp_path, cwd=EXAMPLES,
    )  # fmt: skip
    assert _lines(run)[1] == (
        "a: acme-7: 2 pears; b: refused by policy: bob may not refund for acme; "
        "c: refused by policy: zeta-1 is not an order of acme"
    )
    history = _cli("history", "p-1", "--json", tmp_path=tmp_path, cwd=tmp_path)
    started = json.loads(_lines(history)[0])["data"]
    assert (started["actor"], started["tenant"]) == ("bob", "acme")


def test_budgets_stop_before_the_call_that_would_pass_them(tmp_path: Path) -> None:
    lines = _lines(_run_example("budgets.py", tmp_path))
    assert lines == [
        "tokens: token_budget_exhausted after 2 steps - "
        "800 of 1000 tokens used, 400 reserved for the next call",
        "cost: cost_budget_exhausted after 2 steps - "
        "2.000000 of 2.500000 spent, 1.000000 reserved for the next call",
        "wind-down: completed after 5 steps - summary after 4 searches",
        "step 5: 2 step(s) left: answer with what you have",
    ]


def test_doom_loop_guard_ends_repeated_failures(tmp_path: Path) -> None:
    lines = _lines(_run_example("doom_loop.py", tmp_path))
    assert lines == [
        "repeated_failure after 3 calls - the same call failed the same way 3 times in a row",
        "repeated_failure after 2 calls - the same call failed the same way 2 times in a row",
    ]


def test_verifier_sends_evidence_back_then_gives_up(tmp_path: Path) -> None:
    lines = _lines(_run_example("verifier.py", tmp_path))
    evidence = "the answer quotes no count a tool returned (returned: 42)"
    assert lines == [
        "careless: completed after 3 steps - There are 42 pears.",
        f"  step 2 refused: {evidence}",
        "stubborn: verification_failed after 3 steps - "
        f"2 answer(s) failed verification; last: {evidence}",
    ]


def test_reflection_sends_the_answer_back_once_then_the_critic_accepts(tmp_path: Path) -> None:
    lines = _lines(_run_example("reflection.py", tmp_path))
    assert lines == [
        "completed after 3 steps - There are 42 pears in stock.",
        "  round 1 on step 2: revise: Say how many pears there are.",
        "  round 2 on step 3: accept",
        "agent: 660 tokens; critic: 2 round(s), 320 tokens",
    ]


def test_compaction_leaves_old_turns_out_of_the_view_only(tmp_path: Path) -> None:
    lines = _lines(_run_example("compaction.py", tmp_path))
    note = "left out to fit the context"
    assert lines[:3] == [
        "completed - read 8 pages",
        f"step 8 sees [1,6,7] ['4 earlier step(s) {note} (steps 2-5): 4 call(s), 0 of them failed.']",
        f"step 9 sees [1,7,8] ['5 earlier step(s) {note} (steps 2-6): 5 call(s), 0 of them failed.']",
    ]
    assert lines[3:5] == [
        "5 ContextCompacted, the last: step 9",
        "dropped [2, 3, 4, 5, 6], kept [1, 7, 8]",
    ]
    sizes = re.fullmatch(r"view size (\d+) -> (\d+) characters", lines[5])
    assert sizes is not None
    assert int(sizes[1]) > 4000  # the durations in results vary by a few characters
    assert int(sizes[2]) < 1800
    assert lines[6] == "turns in the store: [1, 2, 3, 4, 5, 6, 7, 8, 9]"


def test_cancel_request_stops_a_run_of_another_runtime(tmp_path: Path) -> None:
    lines = _lines(_run_example("cancel_request.py", tmp_path))
    assert lines == [
        "request_cancel: requested",
        "export-1: cancelled - cancel requested while tools ran: requested by ops (wrong month)",
        "stopped within a second: True",
        "paused: ended",
        "again: already_ended",
        "ask-1: cancelled - cancelled by ops while paused",
    ]


def test_cli_cancel_ends_a_paused_invocation_and_records_the_request(tmp_path: Path) -> None:
    run = ("run", "clarification:agent", "--goal", "Where is my order?", "--id", "ask-4")
    assert _cli(*run, tmp_path=tmp_path, cwd=EXAMPLES).returncode == 3
    cancel = ("cancel", "ask-4", "--by", "ops", "--reason", "customer left")
    assert _lines(_cli(*cancel, tmp_path=tmp_path, cwd=tmp_path)) == ["ask-4: ended"]
    again = _cli("cancel", "ask-4", "--json", tmp_path=tmp_path, cwd=tmp_path)
    assert json.loads(_lines(again)[0]) == {"invocation_id": "ask-4", "result": "already_ended"}
    history = _cli("history", "ask-4", "--json", tmp_path=tmp_path, cwd=tmp_path)
    ended = json.loads(_lines(history)[-1])
    assert ended["type"] == "Terminated"
    assert ended["data"]["detail"] == "cancelled by ops while paused: customer left"
    request = _cli("history", "cancel:ask-4", "--json", tmp_path=tmp_path, cwd=tmp_path)
    (record,) = [json.loads(line) for line in _lines(request)]
    assert record["type"] == "CancelRequested"
    assert record["data"] == {"invocation_id": "ask-4", "by": "ops", "reason": "customer left"}


TESTED_EXAMPLES.add("keep_secrets.py")


def test_secrets_example_stores_redacted_values(tmp_path: Path) -> None:
    result = _run_example("keep_secrets.py", tmp_path)
    assert result.returncode == 0, result.stderr
    assert _lines(result) == [
        "completed - charged 12",
        "stored arguments: {'card_number': '[redacted]'}",
        "stored output: {'token': '[redacted]', 'last4': '1111'}",
    ]
    data = readable_bytes(p for p in tmp_path.iterdir() if p.is_file())
    assert b"4111111111111111" not in data


TESTED_EXAMPLES.add("secrets_in_errors.py")


def test_secrets_example_drops_a_refused_calls_arguments_and_scrubs_an_error(
    tmp_path: Path,
) -> None:
    result = _run_example("secrets_in_errors.py", tmp_path)
    lines = _lines(result)
    assert lines[0] == "cannot_continue"
    assert lines[1].startswith(
        "stored refused call: {'id': 'c', 'name': 'check_crad', 'arguments': "
        "{'dropped': True, 'size': 34, 'sha256': '"
    )
    assert lines[2] == "stored error: ValueError: card [redacted] has expired"
    data = readable_bytes(p for p in tmp_path.iterdir() if p.is_file())
    assert b"4111111111111111" not in data


# --------------------------------------------------------------------------- read models and audit

TESTED_EXAMPLES.update({"custom_projection.py", "verify_export.py"})


def test_custom_projection_is_built_incrementally_rebuilt_and_reset(tmp_path: Path) -> None:
    lines = _lines(_run_example("custom_projection.py", tmp_path))
    assert lines == [
        "plan of ask-apple: [['s1', 'n1']]",
        "ask-kiwi: terminated, 2 tool calls",
        "ask-pear: terminated, 2 tool calls",
        "ask-apple: terminated, 2 tool calls",
        "metrics clerk: invocations=3 tool_calls=6 failed={'tool_failed': 1} "
        "effects={'committed': 3}",
        "ask-kiwi s1 stock: tool_failed, effect None",
        "ask-kiwi n1 note_visit: ok, effect committed",
        "open effects: 0",
        "tool_calls: applied 27 events, now at 27",
        "note_visit: 3 calls, 0 failed",
        "stock: 3 calls, 1 failed",
        "behind by 9 events",
        "tool_calls: applied 9 events, now at 36",
        "rebuilt equals incremental: True",
        "version 2 starts at 0",
        "tool_calls: applied 36 events, now at 36",
        "files: shop.db shop.views.db tool_calls.db visits.log",
    ]
    assert list(tmp_path.iterdir()) == []  # it worked in a temporary folder of its own


def _read_model(*args: str, tmp_path: Path) -> list[Any]:
    return [
        json.loads(line) for line in _lines(_cli(*args, "--json", tmp_path=tmp_path, cwd=tmp_path))
    ]


def test_cli_read_model_commands_answer_from_the_views_file(tmp_path: Path) -> None:
    for goal, invocation_id in (("Where is order A-1001?", "q-1"), ("Where is it?", "q-2")):
        run = ("run", "first_agent:agent", "--goal", goal, "--id", invocation_id)
        assert _cli(*run, tmp_path=tmp_path, cwd=EXAMPLES).returncode in (0, 4)
    assert not (tmp_path / "docs.views.db").exists()  # nothing built until asked

    listed = _read_model("list", "--reason", "completed", tmp_path=tmp_path)
    assert [(r["invocation_id"], r["status"], r["steps"]) for r in listed] == [
        ("q-1", "terminated", 2)
    ]
    assert (tmp_path / "docs.views.db").exists()  # next to docs.db
    (shown,) = _read_model("show", "q-1", tmp_path=tmp_path)
    assert shown["steps"][0]["calls"][0]["output"] == {"order_id": "A-1001", "status": "shipped"}
    by_reason = {r["group"]: r for r in _read_model("metrics", "--by", "reason", tmp_path=tmp_path)}
    assert sorted(by_reason) == ["cannot_continue", "completed"]
    assert by_reason["completed"]["tool_calls"] == 1
    assert _read_model("effects", tmp_path=tmp_path) == []
    status = _read_model("projections", "status", tmp_path=tmp_path)
    assert [(s["name"], s["lag"]) for s in status] == [
        ("trajectory", 0),
        ("metrics", 0),
        ("open_effects", 0),
    ]
    rebuilt = _read_model("projections", "rebuild", "metrics", tmp_path=tmp_path)
    assert [(r["name"], r["events"]) for r in rebuilt] == [("metrics", status[0]["head"])]


VERIFIER_IMPORTS = {"argparse", "hashlib", "json", "sys", "collections.abc", "typing"}


def _verify_export(
    tmp_path: Path, *args: str, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(EXAMPLES / "verify_export.py"), *args],
        cwd=tmp_path,
        env=_env(tmp_path),
        input=stdin,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=False,
    )


def test_verify_export_checks_a_history_and_names_the_tampered_position(tmp_path: Path) -> None:
    run = ("run", "first_agent:agent", "--goal", "Where is order A-1001?", "--id", "order-1")
    assert _cli(*run, tmp_path=tmp_path, cwd=EXAMPLES).returncode == 0
    export = _lines(_cli("history", "order-1", "--json", tmp_path=tmp_path, cwd=tmp_path))
    (audit,) = _read_model("audit", "verify", "order-1", tmp_path=tmp_path)
    head = audit["head_hash"]
    assert json.loads(export[-1])["hash"] == head

    piped = _verify_export(tmp_path, stdin="\n".join(export) + "\n")
    assert _lines(piped) == [f"OK order-1: 6 events, head {head}"]
    (tmp_path / "export.jsonl").write_text("\n".join(export) + "\n")
    anchored = _verify_export(tmp_path, "export.jsonl", "--head", head)
    assert _lines(anchored) == [f"OK order-1: 6 events, head {head}, anchored at 6"]
    earlier = json.loads(export[2])["hash"]  # a head anchored when 3 events existed
    grown = _verify_export(tmp_path, "export.jsonl", "--head", earlier)
    assert _lines(grown) == [f"OK order-1: 6 events, head {head}, anchored at 3"]

    records = [json.loads(line) for line in export]
    assert {r["format"] for r in records} == {2}  # hashed as stored
    records[3]["stored"] = records[3]["stored"].replace("shipped", "lost")  # position 4
    (tmp_path / "tampered.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    tampered = _verify_export(tmp_path, "tampered.jsonl")
    assert tampered.returncode == 1
    assert tampered.stdout == (
        "BROKEN order-1 at position 4: its hash does not match its content and the previous hash\n"
    )
    records = [json.loads(line) for line in export]
    records[3]["data"]["results"][0]["output"]["status"] = "lost"  # what a reader is shown
    (tmp_path / "shown.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    shown = _verify_export(tmp_path, "shown.jsonl")
    assert shown.stdout == (
        "BROKEN order-1 at position 4: its data is not what its stored body holds\n"
    )

    # The last event cut off: the chain alone still holds; the anchored head does not.
    (tmp_path / "cut.jsonl").write_text("\n".join(export[:-1]) + "\n")
    assert _verify_export(tmp_path, "cut.jsonl").returncode == 0
    cut = _verify_export(tmp_path, "cut.jsonl", "--head", head)
    assert cut.returncode == 1
    assert cut.stdout == f"BROKEN order-1: the anchored head {head} is not in this history\n"

    assert _verify_export(tmp_path, stdin="not json\n").returncode == 2


def test_verify_export_needs_nothing_of_loop_actors() -> None:
    tree = ast.parse((EXAMPLES / "verify_export.py").read_text())
    imported = {
        alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
    }
    imported |= {node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert imported <= VERIFIER_IMPORTS


# --------------------------------------------------------------------------- eval

TESTED_EXAMPLES.add("eval_agent.py")
TESTED_EXAMPLES.add("tune_agent.py")  # run by tests/docs/test_docs_samples.py (the eval tutorial)


def test_eval_example_passes_then_the_tight_agent_breaks_the_write_case(tmp_path: Path) -> None:
    """docs/how-to/evaluate-your-loop.md: the cases pass; max_steps=2 fails one; compare."""
    before = _cli(
        "eval", str(EXAMPLES / "eval_cases.json"), "--json", str(tmp_path / "before.json"),
        tmp_path=tmp_path, cwd=EXAMPLES,
    )  # fmt: skip
    assert before.returncode == 0, before.stderr
    after = _cli(
        "eval", str(EXAMPLES / "eval_cases.json"), "--agent", "eval_agent:agent_tight",
        "--json", str(tmp_path / "after.json"), tmp_path=tmp_path, cwd=EXAMPLES,
    )  # fmt: skip
    assert after.returncode == 4
    report = json.loads((tmp_path / "after.json").read_text())
    failed = [(c["case_id"], c["reason"]) for c in report["cases"] if c["status"] != "passed"]
    assert failed == [("tells-the-customer", "max_steps")]
    compared = _cli(
        "eval", "compare", str(tmp_path / "before.json"), str(tmp_path / "after.json"),
        "--json", str(tmp_path / "diff.json"), tmp_path=tmp_path, cwd=tmp_path,
    )  # fmt: skip
    assert compared.returncode == 4
    diff = json.loads((tmp_path / "diff.json").read_text())
    assert diff["cases"][0]["case_id"] == "tells-the-customer"
    assert diff["cases"][0]["flip"] == "broke"


TESTED_EXAMPLES.add("ticket_workers.py")


def test_two_workers_drive_every_submitted_job_once_and_a_second_run_claims_nothing(
    tmp_path: Path,
) -> None:
    expected = ["claimed by both workers: 20", "completed: 20", "ticket-03: ticket 3 is closed"]
    assert _lines(_run_example("ticket_workers.py", tmp_path)) == expected
    again = _lines(_run_example("ticket_workers.py", tmp_path))
    # Submitting the same ids records nothing new; every job has ended: nothing is claimed.
    assert again == ["claimed by both workers: 0", "completed: 0", "ticket-03: ticket 3 is closed"]
    with closing(sqlite3.connect(tmp_path / "docs.db")) as db:
        starts = db.execute(
            "SELECT COUNT(*), COUNT(DISTINCT originator_id) FROM stored_events"
            " WHERE topic LIKE '%InvocationStarted'"
        ).fetchone()
        statuses = db.execute("SELECT DISTINCT status FROM loop_actors_queue").fetchall()
    assert starts == (20, 20)
    assert statuses == [("ended",)]


TESTED_EXAMPLES.add("move_to_postgresql.py")


def test_move_to_postgresql_copies_a_sqlite_store_and_goes_on_there(
    tmp_path: Path, postgres_url: str
) -> None:
    lines = _lines(_run_example("move_to_postgresql.py", tmp_path, postgres_url))
    assert lines == [
        "completed",
        "approval_required",
        "loop-actors audit checkpoint: exit 0",
        "loop-actors store copy: exit 0",
        "the same as the source's",
        "loop-actors audit verify: exit 0",
        "completed - done: refund 1043",
        "11 events of o-2 on PostgreSQL",
    ]


TESTED_EXAMPLES.add("replay_change.py")


def test_replay_example_reports_each_change_and_refunds_nothing_more(tmp_path: Path) -> None:
    lines = _lines(_run_example("replay_change.py", tmp_path))
    assert lines == [
        "recorded: full completed, short max_steps, refunds [40]",
        "same agent: identical=True",
        "refunds need approval: approval_required at step 2 (refund now waits for approval)",
        "a larger step budget: past_recording at step 2",
        "refunds after the replays: [40]",
    ]


TESTED_EXAMPLES.add("fork_a_run.py")


def test_fork_example_repeats_the_refund_only_when_told_live(tmp_path: Path) -> None:
    lines = _lines(_run_example("fork_a_run.py", tmp_path))
    assert lines == [
        "source: completed, refunds 1",
        "writes=approve: approval_required, changed ['budget.max_steps'], refunds 1",
        "writes=deny: completed, changed ['budget.max_steps'], refunds 1",
        "writes=dedupe: completed, changed ['budget.max_steps'], refunds 1",
        "writes=live: completed, changed ['budget.max_steps'], refunds 2",
        "refunds sent: 2, under 2 different keys",
    ]


TESTED_EXAMPLES.add("sub_agents.py")

SUB_AGENTS_OUTPUT = [
    "trip: completed: a flight booked for Lisbon, 3 May; a room booked for Lisbon, 3-5 May",
    "trip's own steps=2 tool_calls=2",
    "its children's steps=4 tool_calls=2",
    "quotes: completed: quote from acme: 120 EUR | quote from globex: 120 EUR | "
    "quote from initech: 120 EUR",
    "bookings: 2, under 2 different keys",
]


def test_sub_agents_example_delegates_and_lists_only_the_roots(tmp_path: Path) -> None:
    lines = _lines(_run_example("sub_agents.py", tmp_path))
    assert lines[:5] == SUB_AGENTS_OUTPUT
    table = "\n".join(lines[5:])
    assert "│ quotes │ orchestrator │ completed │" in table
    assert "│ trip   │ travel       │ completed │" in table
    assert "child-" not in table  # list --root leaves the children out
    # The how-to's "see the tree": show ends with the children, drawn as a tree.
    shown = _cli("show", "trip", "--db", "sqlite:///sub_agents.db", tmp_path=tmp_path, cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    tree = shown.stdout.splitlines()[-3:]
    assert tree[0] == "children:"
    assert tree[1].startswith("├─ child-")  # the children run at once: either comes first
    assert tree[2].startswith("└─ child-")
    assert sorted(line.split()[2] for line in tree[1:]) == ["flights", "hotels"]


TESTED_EXAMPLES.add("orchestration.py")

ORCHESTRATION_OUTPUT = [
    "in_sequence: completed: draft of tides from 3 facts (facts on tides)",
    "  own steps=2, children's steps=2 (within 12)",
    "at_once: completed: ['quote from acme: 120 EUR', 'quote from globex: 120 EUR', "
    "'quote from initech: 120 EUR']",
    "  own steps=2, children's steps=3 (within 12)",
    "in_a_loop: completed: {'draft': 'draft of tides, round 2', 'rounds': 2}",
    "  own steps=2, children's steps=4 (within 12)",
]


def test_orchestration_example_runs_children_in_sequence_at_once_and_in_a_loop(
    tmp_path: Path,
) -> None:
    assert _lines(_run_example("orchestration.py", tmp_path)) == ORCHESTRATION_OUTPUT
    # Each child's share was set aside and came back: the sequence's second child got
    # what the first left (the parent keeps a step, the first used one).
    listed = _cli(
        "history", "in_sequence", "--json", "--db", "sqlite:///orchestration.db",
        tmp_path=tmp_path, cwd=tmp_path,
    )  # fmt: skip
    assert listed.returncode == 0, listed.stderr
    records = [json.loads(line) for line in listed.stdout.splitlines()]
    shares = [r["data"]["allotment"]["steps"] for r in records if r["type"] == "BudgetReserved"]
    assert shares == [10, 9]
    assert [r["type"] for r in records].count("BudgetReturned") == 2


TESTED_EXAMPLES.add("handoff.py")

HANDOFF_OUTPUT = [
    "completed: refund of 40 issued (took over from triage, told its steps)",
    "chain: 2 invocations, from ticket-7",
    "ticket-7: handed_off: handed off to billing: the customer wants a refund",
]


def test_handoff_example_follows_the_chain_to_billing(tmp_path: Path) -> None:
    assert _lines(_run_example("handoff.py", tmp_path)) == HANDOFF_OUTPUT


TESTED_EXAMPLES.add("logs_and_statistics.py")


def test_logs_and_statistics_example_prints_json_records_and_a_run_in_flight(
    tmp_path: Path,
) -> None:
    lines = _lines(_run_example("logs_and_statistics.py", tmp_path))
    records = [json.loads(line) for line in lines if line.startswith("{")]
    assert [r["message"].split(" (")[0] for r in records] == [
        "invocation order-7 started",
        "invocation order-7 ended: completed",
    ]
    assert records[1]["reason"] == "completed"
    assert [line for line in lines if not line.startswith("{")] == [
        "in flight: 1, leases held: 1",
        "ended: 1 (completed 1)",
        "journal: 4 commits, 6 events, 1.50 events per transaction",
        "last error: None",
    ]


TESTED_EXAMPLES.add("let_an_agent_wait.py")

LET_AN_AGENT_WAIT_OUTPUT = [
    "reminder: sleeping (wake_at set: True)",
    "reminder: completed: reminded ann",
    "the tool: called, called, past its sleep",
    "shopper: sleeping: the shop opens tomorrow",
    "woken early: True",
    "shopper: completed: bought bread early",
]


def test_let_an_agent_wait_example_sleeps_wakes_and_is_woken_early(tmp_path: Path) -> None:
    assert _lines(_run_example("let_an_agent_wait.py", tmp_path)) == LET_AN_AGENT_WAIT_OUTPUT


TESTED_EXAMPLES.add("share_rate_limits.py")

SHARE_RATE_LIMITS_OUTPUT = [
    "without a shared limit: ['completed', 'model_error'], some refused: True",
    "with RateLimit(requests_per_minute=180): ['completed'], 0 refused",
    "most served in one second: 3; calls that waited: 8",
]


def test_share_rate_limits_example_stays_under_the_providers_limit(tmp_path: Path) -> None:
    assert _lines(_run_example("share_rate_limits.py", tmp_path)) == SHARE_RATE_LIMITS_OUTPUT


TESTED_EXAMPLES.add("schedule_an_agent.py")

SCHEDULE_AN_AGENT_OUTPUT = [
    "added tick: every 2s, overlap allow, active",
    "added weekday-report: 0 9 * * 1-5 (Europe/Paris), next at 09:00 in Paris, paused",
    "one run a due time: True",
    "the worker submitted each: True",
    "all completed: True",
]


def test_schedule_an_agent_example_runs_each_due_time_once(tmp_path: Path) -> None:
    assert _lines(_run_example("schedule_an_agent.py", tmp_path)) == SCHEDULE_AN_AGENT_OUTPUT


TESTED_EXAMPLES.add("plan_then_approve.py")

PLAN_THEN_APPROVE_OUTPUT = [
    "plan_approval_required: refund the broken kettle",
    "  1. refund {'order_id': 'A-1', 'amount': 250}",
    "a wrong digest is refused",
    "approval_required: c4 refund {'order_id': 'A-2', 'amount': 40} needs_approval=True",
    "refunded so far: [('A-1', 250)]",
    "completed - refunded A-1 (planned) and A-2 (approved on its own)",
    "plan of step 2 (approved by alice): made ['refund A-1 at step 3']; "
    "outside ['refund A-2 at step 4']",
    "refund-2 after the denial: plan_approval_required: refund 200 once the receipt is in",
]


def test_plan_then_approve_example_runs_the_plan_and_pauses_a_write_outside_it(
    tmp_path: Path,
) -> None:
    assert _lines(_run_example("plan_then_approve.py", tmp_path)) == PLAN_THEN_APPROVE_OUTPUT


def test_cli_approves_the_plan_of_the_example_and_shows_it_against_what_was_done(
    tmp_path: Path,
) -> None:
    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return _cli(*args, tmp_path=tmp_path, cwd=EXAMPLES)

    paused = cli("run", "plan_then_approve:agent", "--goal", "refund A-1", "--id", "p-1", "--json")
    assert paused.returncode == 3, paused.stderr
    record = json.loads(paused.stdout)
    assert record["reason"] == "plan_approval_required"
    assert [w["tool"] for w in record["plan"]] == ["refund"]
    approved = cli(
        "approve", "p-1", "--digest", record["digest"], "--by", "alice",
        "--agent", "plan_then_approve:agent", "--json",
    )  # fmt: skip
    assert approved.returncode == 3, approved.stderr
    assert json.loads(approved.stdout)["reason"] == "approval_required"
    shown = _lines(cli("show", "p-1"))
    assert any("step 2: plan — 1 write(s): refund the broken kettle (approved by alice)" in line
               for line in shown)  # fmt: skip
    assert any("c3 refund(" in line and "[plan step 1]" in line for line in shown)
    assert any("plan of step 2: 1 of 1 write(s) made, 0 outside it" in line for line in shown)
