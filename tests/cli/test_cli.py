"""The ``loop-actors`` command, run as a real subprocess."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.support.cli import run_cli

pytestmark = pytest.mark.slow

AGENTS = '''
from loop_actors import Agent, Budget, ScriptedModel, tool

@tool
def lookup(key: str) -> dict:
    """Look up a key."""
    return {"key": key, "value": key.upper()}

answering = Agent(
    "answering",
    ScriptedModel([
        {"kind": "tool_calls", "calls": [{"id": "c1", "name": "lookup", "arguments": {"key": "profile"}}]},
        {"kind": "final", "answer": "profile=PROFILE"},
    ]),
    [lookup],
)
asking = Agent("asking", ScriptedModel([{"kind": "clarification", "question": "Which one?"}]))
looping = Agent(
    "looping",
    ScriptedModel(lambda r: {"kind": "tool_calls", "calls": [{"id": "c", "name": "lookup", "arguments": {"key": "x"}}]}),
    [lookup],
    Budget(max_repeated_plan=1),
)
not_an_agent = 42
'''


def cli(
    *args: str, cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return run_cli(*args, cwd=cwd, env=env)


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "agents.py").write_text(AGENTS)
    return tmp_path


def test_demo_prints_the_seed_lines_and_a_trajectory(tmp_path: Path) -> None:
    result = cli("demo", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "completed"
    assert lines[1] == "profile=active; policy=refund-under-100"
    assert lines[2].startswith("steps=2 tool_calls=2 ")
    assert "call-profile lookup" in result.stdout
    assert (tmp_path / "loop-actors.db").exists()  # the default SQLite file


def test_demo_prints_the_tree_that_show_prints_for_its_invocation(tmp_path: Path) -> None:
    """One fold and one renderer: the demo's events and the read model agree."""
    demo = cli("demo", "--db", "sqlite:///demo.db", cwd=tmp_path)
    assert demo.returncode == 0, demo.stderr
    invocation_id = demo.stdout.splitlines()[2].rpartition("id=")[2]
    shown = cli("show", invocation_id, "--db", "sqlite:///demo.db", cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    tree = shown.stdout.splitlines()
    assert tree[0].startswith(f"{invocation_id}  agent demo  completed")
    assert demo.stdout.splitlines()[4 : 4 + len(tree)] == tree


def test_run_json_prints_the_outcome_and_exits_0(project: Path) -> None:
    result = cli(
        "run", "agents:answering", "--goal", "g", "--json", "--db", "sqlite:///x.db", cwd=project
    )
    assert result.returncode == 0, result.stderr
    outcome = json.loads(result.stdout)
    assert outcome["reason"] == "completed"
    assert outcome["answer"] == "profile=PROFILE"
    assert (outcome["steps"], outcome["tool_calls"]) == (2, 1)
    assert outcome["invocation_id"]


def test_paused_run_exits_3_and_other_reasons_exit_4(project: Path) -> None:
    paused = cli("run", "agents:asking", "--goal", "g", "--json", cwd=project)
    assert paused.returncode == 3, paused.stderr
    assert json.loads(paused.stdout)["reason"] == "clarification_required"
    stuck = cli("run", "agents:looping", "--goal", "g", "--json", cwd=project)
    assert stuck.returncode == 4, stuck.stderr
    assert json.loads(stuck.stdout)["reason"] == "no_progress"


def test_database_comes_from_the_environment(project: Path) -> None:
    env = {"LOOP_ACTORS_DB": f"sqlite:///{project / 'env.db'}"}
    result = cli("run", "agents:answering", "--goal", "g", "--json", cwd=project, env=env)
    assert result.returncode == 0, result.stderr
    assert (project / "env.db").exists()
    assert not (project / "loop-actors.db").exists()


def test_an_existing_id_never_starts_a_second_invocation(project: Path) -> None:
    args = ("run", "agents:answering", "--goal", "g", "--id", "order-42", "--json")
    first = cli(*args, cwd=project)
    second = cli(*args, cwd=project)
    assert first.returncode == second.returncode == 0
    assert json.loads(first.stdout) == json.loads(second.stdout)
    history = cli("history", "order-42", "--json", cwd=project)
    types = [json.loads(line)["type"] for line in history.stdout.splitlines()]
    assert types.count("InvocationStarted") == 1
    other_goal = cli("run", "agents:answering", "--goal", "other", "--id", "order-42", cwd=project)
    assert other_goal.returncode == 2
    assert "order-42" in other_goal.stderr


def test_history_json_lists_every_event_in_order(project: Path) -> None:
    cli("run", "agents:answering", "--goal", "g", "--id", "h1", cwd=project)
    result = cli("history", "h1", "--json", cwd=project)
    assert result.returncode == 0, result.stderr
    records = [json.loads(line) for line in result.stdout.splitlines()]
    assert [r["position"] for r in records] == [1, 2, 3, 4, 5, 6]
    assert [r["type"] for r in records] == [
        "InvocationStarted",
        "DecisionProposed",
        "BatchDispatched",
        "ResultsCommitted",
        "DecisionProposed",
        "Terminated",
    ]
    assert records[0]["data"]["goal"] == "g"
    assert records[-1]["data"]["reason"] == "completed"
    text = cli("history", "h1", cwd=project)
    assert len(text.stdout.splitlines()) == 6


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("run", "nosuchmodule:agent", "--goal", "g"), "nosuchmodule"),
        (("run", "agents:nosuchattr", "--goal", "g"), "nosuchattr"),
        (("run", "agents:not_an_agent", "--goal", "g"), "not a loop_actors.Agent"),
        (("run", "agents", "--goal", "g"), "MODULE:ATTR"),
        (("run", "agents:answering"), "--goal"),
        (("run", "agents:answering", "--goal", "  "), "--goal"),
        (
            ("run", "agents:answering", "--goal", "g", "--db", "sqlite:////nonexistent-dir/x.db"),
            "nonexistent-dir",
        ),
        (
            ("run", "agents:answering", "--goal", "g", "--db", "mysql://x"),
            "unsupported database URL",
        ),
        (("history", "nobody"), "no database"),
        (("frobnicate",), "invalid choice"),
    ],
    ids=[
        "unknown-module",
        "unknown-attribute",
        "not-an-agent",
        "no-colon",
        "missing-goal",
        "blank-goal",
        "unwritable-db",
        "unsupported-db",
        "history-without-database",
        "unknown-command",
    ],
)
def test_bad_input_gives_one_clear_line_exit_2_and_writes_nothing(
    project: Path, args: tuple[str, ...], message: str
) -> None:
    before = sorted(p.name for p in project.iterdir())
    result = cli(*args, cwd=project)
    assert result.returncode == 2
    assert result.stdout == ""
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert message in result.stderr
    after = sorted(p.name for p in project.iterdir() if p.name != "__pycache__")
    assert after == [name for name in before if name != "__pycache__"]


def test_history_on_a_missing_database_file_is_a_usage_error(project: Path) -> None:
    result = cli("history", "x", "--db", f"sqlite:///{project / 'absent.db'}", cwd=project)
    assert result.returncode == 2
    assert not (project / "absent.db").exists()


def test_history_of_an_unknown_id_is_a_usage_error(project: Path) -> None:
    cli("run", "agents:answering", "--goal", "g", cwd=project)
    result = cli("history", "nobody", cwd=project)
    assert result.returncode == 2
    assert "nobody" in result.stderr


def test_run_on_the_in_memory_store_works_from_the_cli(project: Path) -> None:
    result = cli("run", "agents:answering", "--goal", "g", "--db", "memory://", cwd=project)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[0] == "completed"
