"""Every code example of the docs is a file under docs/examples that runs here for real.

Each example runs as a subprocess with the project's interpreter, in a fresh
temporary directory, against a SQLite file in that directory.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
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
}
TIMEOUT_S = 60


def _env(tmp_path: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["LOOP_ACTORS_DB"] = f"sqlite:///{tmp_path / 'docs.db'}"
    env["PYTHONDONTWRITEBYTECODE"] = "1"  # keep docs/examples free of __pycache__
    return env


def _run_example(name: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(EXAMPLES / name)],
        cwd=tmp_path,
        env=_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=False,
    )


def _cli(*args: str, tmp_path: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    script = Path(sys.executable).with_name("loop-actors")
    command = [str(script)] if script.exists() else [sys.executable, "-m", "loop_actors._cli"]
    return subprocess.run(
        [*command, *args],
        cwd=cwd,
        env=_env(tmp_path),
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
    assert set(records[0]) == {"position", "type", "invocation_id", "timestamp", "data"}
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
