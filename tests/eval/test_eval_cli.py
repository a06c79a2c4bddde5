"""``loop-actors eval``: cases files run as invocations in a real subprocess, on real SQLite."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.support.cli import run_cli
from tests.support.eval import eval_db, read_report

pytestmark = pytest.mark.slow

SUITE_AGENT = '''
from loop_actors import Agent, ScriptedModel, tool

@tool
def lookup(key: str) -> str:
    """Look a key up."""
    return {"k": "v"}.get(key, "")

agent = Agent("suite", ScriptedModel([{"kind": "final", "answer": "unscripted"}]), [lookup])
'''

# The smallest useful file of issue 16, verbatim.
SMALLEST = """{"agent": "suite_agent:agent",
 "cases": [
   {"id": "answers", "goal": "say hi", "task_class": "chat",
    "model": [{"kind": "final", "answer": "hi"}],
    "expect": {"reason": "completed", "answer": {"equals": "hi"}}},
   {"id": "looks-up", "goal": "look it up", "task_class": "lookup",
    "model": [{"kind": "tool_calls", "calls": [{"id": "c1", "name": "lookup",
               "arguments": {"key": "k"}}]}, {"kind": "final", "answer": "v"}],
    "expect": {"reason": "completed", "tools": {"required": ["lookup"]}}}]}
"""


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "suite_agent.py").write_text(SUITE_AGENT)
    (tmp_path / "cases.json").write_text(SMALLEST)
    return tmp_path


def _eval(project: Path, *args: str, **env: str) -> Any:
    return run_cli("eval", *args, cwd=project, db=eval_db(project), env=env or None)


def _write(project: Path, name: str, suite: dict[str, Any]) -> str:
    (project / name).write_text(json.dumps(suite))
    return name


def _events_of(project: Path, invocation_id: str) -> list[str]:
    result = run_cli("history", invocation_id, "--json", cwd=project, db=eval_db(project))
    assert result.returncode == 0, result.stderr
    return [json.loads(line)["type"] for line in result.stdout.splitlines()]


def test_the_issues_smallest_file_runs_as_written_and_passes(project: Path) -> None:
    result = _eval(project, "cases.json", "--json", "report.json")
    assert result.returncode == 0, result.stderr
    report = read_report(project / "report.json")
    assert report["format"] == "loop-actors-eval/1"
    assert [(c["case_id"], c["epoch"], c["status"]) for c in report["cases"]] == [
        ("answers", 1, "passed"),
        ("looks-up", 1, "passed"),
    ]
    looks_up = report["cases"][1]
    assert (looks_up["reason"], looks_up["steps"], looks_up["tool_calls"]) == ("completed", 2, 1)
    assert report["totals"]["pass_rate"] == 1.0
    assert set(report["by_task_class"]) == {"chat", "lookup"}
    assert set(report["by_reason"]) == {"completed"}
    assert "2/2 passed" in result.stdout


def test_each_run_is_an_ordinary_invocation_that_show_and_history_read(project: Path) -> None:
    assert _eval(project, "cases.json", "--json", "report.json").returncode == 0
    invocation_id = read_report(project / "report.json")["cases"][1]["invocation_id"]
    assert _events_of(project, invocation_id) == [
        "InvocationStarted",
        "DecisionProposed",
        "BatchDispatched",
        "ResultsCommitted",
        "DecisionProposed",
        "Terminated",
    ]
    shown = run_cli("show", invocation_id, "--json", cwd=project, db=eval_db(project))
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["task_class"] == "lookup"


def test_running_the_same_suite_again_reuses_the_finished_runs(project: Path) -> None:
    assert _eval(project, "cases.json", "--json", "first.json").returncode == 0
    assert _eval(project, "cases.json", "--json", "second.json").returncode == 0
    first, second = read_report(project / "first.json"), read_report(project / "second.json")
    assert [c["invocation_id"] for c in first["cases"]] == [
        c["invocation_id"] for c in second["cases"]
    ]
    assert first["cases"] == second["cases"]  # same recorded latency: nothing ran again
    for case in second["cases"]:
        assert _events_of(project, case["invocation_id"]).count("InvocationStarted") == 1


def test_an_edited_expectation_rescores_the_recorded_run_and_an_edited_goal_runs_anew(
    project: Path,
) -> None:
    assert _eval(project, "cases.json", "--json", "first.json").returncode == 0
    suite = json.loads(SMALLEST)
    suite["cases"][0]["expect"]["answer"] = {"equals": "hello"}
    suite["cases"][1]["goal"] = "look it up again"
    assert _eval(project, _write(project, "cases.json", suite), "--json", "r.json").returncode == 4
    first, second = read_report(project / "first.json"), read_report(project / "r.json")
    assert second["cases"][0]["invocation_id"] == first["cases"][0]["invocation_id"]
    assert second["cases"][0]["latency_ms"] == first["cases"][0]["latency_ms"]
    assert second["cases"][0]["failures"][0]["expectation"] == "answer.equals"
    assert second["cases"][1]["invocation_id"] != first["cases"][1]["invocation_id"]


def test_a_run_killed_midway_continues_where_it_stopped(project: Path) -> None:
    """SIGKILL (a crash point) after the tool case's results commit; the same command again."""
    killed = _eval(
        project, "cases.json", "--concurrency", "1", LOOP_ACTORS_CRASH_AT="after_results_commit"
    )
    assert killed.returncode == -9
    again = _eval(project, "cases.json", "--json", "report.json")
    assert again.returncode == 0, again.stderr
    looks_up = read_report(project / "report.json")["cases"][1]
    events = _events_of(project, looks_up["invocation_id"])
    assert events.count("InvocationStarted") == 1
    assert events.count("BatchDispatched") == 1  # the committed step was not run again
    assert events[-1] == "Terminated"


def test_failed_expectations_exit_4_and_say_why(project: Path) -> None:
    suite = {
        "agent": "suite_agent:agent",
        "cases": [
            {
                "id": "wrong-answer",
                "goal": "say hi",
                "task_class": "chat",
                "model": [{"kind": "final", "answer": "hello"}],
                "expect": {"reason": "completed", "answer": {"equals": "hi"}},
            },
            {
                "id": "no-tool",
                "goal": "look it up",
                "task_class": "lookup",
                "model": [{"kind": "final", "answer": "v"}],
                "expect": {"tools": {"required": ["lookup"]}, "limits": {"max_steps": 1}},
            },
        ],
    }
    result = _eval(project, _write(project, "failing.json", suite), "--json", "report.json")
    assert result.returncode == 4, result.stderr
    report = read_report(project / "report.json")
    failures = {c["case_id"]: c["failures"] for c in report["cases"]}
    assert failures == {
        "wrong-answer": [
            {"expectation": "answer.equals", "passed": False, "why": "expected 'hi': got 'hello'"}
        ],
        "no-tool": [
            {
                "expectation": "tools.required[lookup]",
                "passed": False,
                "why": "lookup was never called",
            }
        ],
    }
    assert report["totals"]["false_success"] == 2  # both completed, both failed
    assert "0/2 passed" in result.stdout


def test_an_errored_case_is_counted_in_the_totals(project: Path) -> None:
    """A case that cannot be driven: killed after its dispatch, then its tool's schema
    changed, so its resume is refused (CatalogueChangedError); the other case still runs.
    One case at a time, so that the first case has ended before the second one's dispatch
    kills the process (run together, the first could be cut short too and be refused)."""
    killed = _eval(
        project, "cases.json", "--concurrency", "1", LOOP_ACTORS_CRASH_AT="after_dispatch_commit"
    )
    assert killed.returncode == -9
    agent_file = project / "suite_agent.py"
    agent_file.write_text(agent_file.read_text().replace("key: str", "name: str"))
    result = _eval(project, "cases.json", "--json", "report.json")
    assert result.returncode == 4, result.stderr
    report = read_report(project / "report.json")
    errored = report["cases"][1]
    assert errored["status"] == "error"
    assert errored["error"].startswith("CatalogueChangedError")
    totals = report["totals"]
    assert (totals["cases"], totals["passed"], totals["errored"], totals["pass_rate"]) == (
        2,
        1,
        1,
        0.5,
    )
    assert report["by_reason"]["error"]["errored"] == 1
    assert "1 errored" in result.stdout


def test_epochs_give_one_entry_and_one_invocation_each(project: Path) -> None:
    suite = json.loads(SMALLEST)
    suite["cases"][0]["epochs"] = 3
    assert _eval(project, _write(project, "epochs.json", suite), "--json", "r.json").returncode == 0
    cases = read_report(project / "r.json")["cases"]
    answers = [c for c in cases if c["case_id"] == "answers"]
    assert [c["epoch"] for c in answers] == [1, 2, 3]
    assert len({c["invocation_id"] for c in answers}) == 3


def test_a_bad_cases_file_gets_one_located_error_per_problem_and_writes_nothing(
    project: Path,
) -> None:
    """Bad inputs: an unknown top-level key, an unknown reason, a zero epoch, a blank goal,
    an invalid regex, an unknown sequence mode."""
    suite = json.loads(SMALLEST)
    suite["extra"] = 1
    suite["cases"][1]["expect"]["reason"] = "finished"
    suite["cases"][1]["epochs"] = 0
    suite["cases"][0]["goal"] = ""
    suite["cases"][0]["expect"]["answer"] = {"regex": "("}
    suite["cases"][1]["expect"]["tools"]["sequence"] = {"steps": ["lookup"], "mode": "sorted"}
    result = _eval(project, _write(project, "bad.json", suite))
    assert result.returncode == 2
    lines = [line.strip() for line in result.stderr.splitlines()[1:]]
    assert [line.split(":")[0] for line in lines] == [
        "cases[0].goal",
        "cases[0].expect.answer.regex",
        "cases[1].epochs",
        "cases[1].expect.reason[0]",
        "cases[1].expect.tools.sequence.mode",
        "extra",
    ]
    assert "bad.json: 6 problem(s)" in result.stderr
    assert not (project / "eval.db").exists()


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("{", "line 1 column 2: not JSON"),
        ('{"cases": []}', "cases: List should have at least 1 item"),
        (
            '{"agent": "a:b", "model": "openai:x", "cases": [{"id": "x", "goal": "g", '
            '"task_class": "c"}]}',
            "give exactly one of agent (MODULE:ATTR) and model",
        ),
        (
            '{"agent": "a:b", "cases": [{"id": "x", "goal": "g", "task_class": "c"}, '
            '{"id": "x", "goal": "g", "task_class": "c"}]}',
            "cases[1].id: 'x' is used twice",
        ),
        (
            '{"agent": "a:b", "cases": [{"id": "x y", "goal": "g", "task_class": "c"}]}',
            "cases[0].id: String should match pattern",
        ),
        (
            '{"agent": "a:b", "cases": [{"id": "x", "goal": "g", "task_class": "c", '
            '"model": [{"answer": "hi"}]}]}',
            "cases[0].model: turn 0 has no 'kind'",
        ),
    ],
)
def test_malformed_cases_files_exit_2_with_the_problem(
    project: Path, text: str, problem: str
) -> None:
    """Bad inputs: not JSON, no cases, both agent and model, a duplicate id, an id with a
    space, a scripted turn without kind."""
    (project / "bad.json").write_text(text)
    result = _eval(project, "bad.json")
    assert result.returncode == 2
    assert problem in result.stderr


def test_bad_command_lines_exit_2(project: Path) -> None:
    """Bad inputs: a missing file, a YAML file that is not YAML, a zero concurrency, an agent
    that is not one, a file whose name cannot name the suite (and no name given)."""
    assert "cannot read" in _eval(project, "missing.json").stderr
    (project / "my cases.json").write_text(SMALLEST)
    unnamed = _eval(project, "my cases.json")
    assert (unnamed.returncode, "give a name" in unnamed.stderr) == (2, True)
    (project / "cases.yaml").write_text("cases: [\n  - id: x\n goal: y\n")
    broken = _eval(project, "cases.yaml")
    assert broken.returncode == 2
    assert "cases.yaml: 1 problem(s)" in broken.stderr
    assert "line 2 column 3: not YAML" in broken.stderr
    assert _eval(project, "cases.json", "--concurrency", "0").returncode == 2
    suite = json.loads(SMALLEST)
    suite["agent"] = "suite_agent:lookup"
    not_agent = _eval(project, _write(project, "tool.json", suite))
    assert not_agent.returncode == 2
    assert "not a loop_actors.Agent" in not_agent.stderr
    assert not (project / "eval.db").exists()


def test_a_report_path_in_a_missing_folder_is_refused_before_anything_runs(project: Path) -> None:
    """Bad inputs: --json into a folder that does not exist, --json naming a folder."""
    for target in ("missing/report.json", "."):
        result = _eval(project, "cases.json", "--json", target)
        assert result.returncode == 2
        assert "cannot write the report" in result.stderr
    assert not (project / "eval.db").exists()


def test_schema_prints_the_cases_files_json_schema(project: Path) -> None:
    result = run_cli("eval", "schema", cwd=project)
    assert result.returncode == 0
    schema = json.loads(result.stdout)
    assert schema["title"] == "Suite"
    assert set(schema["required"]) == {"cases"}
    assert "Expectations" in schema["$defs"]


def test_compare_puts_the_flipped_case_first_with_a_paired_p_value(project: Path) -> None:
    assert _eval(project, "cases.json", "--json", "a.json").returncode == 0
    suite = json.loads(SMALLEST)
    suite["cases"][1]["model"] = [{"kind": "final", "answer": "v"}]  # no longer looks it up
    assert _eval(project, _write(project, "cases.json", suite), "--json", "b.json").returncode == 4
    result = run_cli("eval", "compare", "a.json", "b.json", "--json", "diff.json", cwd=project)
    assert result.returncode == 4, result.stderr
    diff = read_report(project / "diff.json")
    assert [(c["case_id"], c["flip"]) for c in diff["cases"]] == [
        ("looks-up", "broke"),
        ("answers", None),
    ]
    assert diff["cases"][0]["tool_calls"] == -1
    assert (diff["broke"], diff["fixed"], diff["mcnemar_p"]) == (1, 0, 1.0)
    assert diff["pass_rate"] == {"a": 1.0, "b": 0.5}
    assert "McNemar exact p = 1" in result.stdout


def test_compare_refuses_files_that_are_not_reports(project: Path) -> None:
    """Bad inputs: one report only, a cases file instead of a report, another format."""
    assert _eval(project, "cases.json", "--json", "a.json").returncode == 0
    assert run_cli("eval", "compare", "a.json", cwd=project).returncode == 2
    wrong = run_cli("eval", "compare", "a.json", "cases.json", cwd=project)
    assert wrong.returncode == 2
    assert "cases.json" in wrong.stderr
    (project / "old.json").write_text('{"format": "loop-actors-eval/0", "cases": []}')
    old = run_cli("eval", "compare", "a.json", "old.json", cwd=project)
    assert "expected 'loop-actors-eval/1'" in old.stderr
