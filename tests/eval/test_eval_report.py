"""``loop-actors eval``: YAML cases, answer checks, the HTML report, compare's intervals, progress.

The CLI runs in a real subprocess on a real SQLite file; the progress bar is
looked for on a real pseudo-terminal.
"""

from __future__ import annotations

import json
import os
import pty
import re
import select
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.support.cli import CLI, cli_env, run_cli
from tests.support.eval import AGENT, CHECKS, eval_db, hostile_suite

pytestmark = pytest.mark.slow

YAML_SUITE = """\
# The issue's smallest file, in YAML.
agent: suite_agent:agent
cases:
  - id: answers
    goal: say hi
    task_class: chat
    model:
      - {kind: final, answer: hi}
    expect:
      reason: completed
      answer: {equals: hi, check: "checks:short"}
  - id: looks-up
    goal: look it up
    task_class: lookup
    model:
      - kind: tool_calls
        calls: [{id: c1, name: lookup, arguments: {key: k}}]
      - {kind: final, answer: v}
    expect:
      reason: completed
      tools:
        required: [lookup]
        match: [{tool: lookup, arguments: {key: k}}]
"""


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "suite_agent.py").write_text(AGENT)
    (tmp_path / "checks.py").write_text(CHECKS)
    (tmp_path / "cases.yaml").write_text(YAML_SUITE)
    (tmp_path / "hostile.json").write_text(json.dumps(hostile_suite()))
    return tmp_path


def _eval(project: Path, *args: str) -> Any:
    return run_cli("eval", *args, cwd=project, db=eval_db(project))


def _json(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def test_a_yaml_cases_file_runs_with_its_answer_check_and_argument_match(project: Path) -> None:
    result = _eval(project, "cases.yaml", "--json", "report.json")
    assert result.returncode == 0, result.stdout + result.stderr
    report = _json(project / "report.json")
    assert report["suite"] == "cases"
    assert [c["status"] for c in report["cases"]] == ["passed", "passed"]


def test_an_answer_check_that_fails_says_why_and_exits_4(project: Path) -> None:
    text = YAML_SUITE.replace("answer: hi}", "answer: hello}").replace("equals: hi, ", "")
    (project / "long.yaml").write_text(text)
    result = _eval(project, "long.yaml", "--json", "report.json")
    assert result.returncode == 4
    failures = _json(project / "report.json")["cases"][0]["failures"]
    assert failures == [
        {
            "expectation": "answer.check[checks:short]",
            "passed": False,
            "why": "5 characters, at most 3",
        }
    ]


@pytest.mark.parametrize(
    ("reference", "problem"),
    [
        ("no_such_module:short", "cannot import module 'no_such_module'"),
        ("checks:missing", "module 'checks' has no attribute 'missing'"),
        ("checks:NOT_CALLABLE", "checks:NOT_CALLABLE is a int, not a callable"),
    ],
)
def test_an_answer_check_that_cannot_be_imported_is_bad_input(
    project: Path, reference: str, problem: str
) -> None:
    """Bad inputs: a missing module, a missing attribute, an attribute that is not callable."""
    (project / "bad.yaml").write_text(YAML_SUITE.replace("checks:short", reference))
    result = _eval(project, "bad.yaml")
    assert result.returncode == 2
    assert f"cases[0].expect.answer.check: {problem}" in result.stderr
    assert not (project / "eval.db").exists()


def test_a_yaml_file_that_breaks_the_schema_names_each_location(project: Path) -> None:
    """Bad inputs (YAML): a YAML date as a goal, an unknown key, an argument match without
    a tool, a check that is not MODULE:ATTR."""
    text = (
        YAML_SUITE.replace("goal: say hi", "goal: 2026-12-01")
        .replace("task_class: lookup", "task_class: lookup\n    colour: red")
        .replace("{tool: lookup, ", "{")
        .replace('"checks:short"', '"short"')
    )
    (project / "bad.yaml").write_text(text)
    result = _eval(project, "bad.yaml")
    assert result.returncode == 2
    lines = [line.strip().split(":")[0] for line in result.stderr.splitlines()[1:]]
    assert lines == [
        "cases[0].goal",
        "cases[0].expect.answer.check",
        "cases[1].expect.tools.match[0].tool",
        "cases[1].colour",
    ]


def test_schema_covers_every_expectation(project: Path) -> None:
    result = run_cli("eval", "schema", cwd=project)
    assert result.returncode == 0
    defs = json.loads(result.stdout)["$defs"]
    assert {"schema", "check", "equals", "contains", "regex"} <= set(
        defs["AnswerExpectation"]["properties"]
    )
    assert {"required", "forbidden", "sequence", "match"} <= set(
        defs["ToolsExpectation"]["properties"]
    )
    assert defs["ArgumentMatch"]["properties"]["mode"]["$ref"].endswith("MatchMode")
    assert "max_wall_time_ms" in defs["LimitsExpectation"]["properties"]
    assert {"committed", "never_attempted"} <= set(defs["EffectsExpectation"]["properties"])
    assert set(defs["ApprovalsExpectation"]["properties"]) == {"required", "forbidden"}
    assert "approvals" in defs["Expectations"]["properties"]


def test_the_report_holds_each_runs_trajectory(project: Path) -> None:
    assert _eval(project, "hostile.json", "--json", "r.json").returncode == 4
    parallel = _json(project / "r.json")["cases"][1]
    steps = parallel["trajectory"]["steps"]
    assert [s["kind"] for s in steps] == ["tool_calls", "tool_calls", "final"]
    assert [c["call_id"] for c in steps[0]["calls"]] == ["c1", "c2"]
    assert steps[1]["calls"][0]["effect_status"] == "committed"
    assert "decision" not in steps[0]  # the summary and calls say it


def test_the_report_counts_writes_left_open_even_when_no_case_expects_it(project: Path) -> None:
    suite = {
        "name": "unsafe",
        "agent": "suite_agent:agent",
        "cases": [
            {
                "id": "flaky",
                "goal": "send it",
                "task_class": "write",
                "model": [
                    {
                        "kind": "tool_calls",
                        "calls": [{"id": "w1", "name": "flaky_send", "arguments": {"to": "ops"}}],
                    },
                    {"kind": "final", "answer": "sent"},
                ],
            }
        ],
    }
    (project / "unsafe.json").write_text(json.dumps(suite))
    result = _eval(project, "unsafe.json", "--json", "r.json")
    assert result.returncode == 0  # no expectation failed
    report = _json(project / "r.json")
    assert report["cases"][0]["effects_left_open"] == 1
    assert report["totals"]["effects_left_open"] == 1
    assert report["totals"]["effects_dispatched_twice"] == 0
    assert report["by_task_class"]["write"]["effects_left_open"] == 1
    assert "effect safety: 1 write(s) left open" in result.stdout


def test_the_html_report_escapes_every_value_from_the_log(project: Path) -> None:
    assert _eval(project, "hostile.json", "--html", "report.html").returncode == 4
    page = (project / "report.html").read_text()
    assert page.count("<script>") == 1  # the page's own script, at the end
    assert "window.pwned" not in page.split("<script>")[1]
    assert "&lt;script&gt;window.pwned = 1&lt;/script&gt; say hi" in page
    assert "&lt;img src=x onerror=&quot;window.pwned = 2&quot;&gt; hello" in page
    assert "&lt;/pre&gt;&lt;script&gt;window.pwned = 3&lt;/script&gt;" in page
    assert "chat&lt;b&gt;" in page
    assert "<img" not in page
    assert "http://" not in page
    assert "https://" not in page  # nothing to fetch: no CDN, no font, no image


def test_an_html_path_in_a_missing_folder_is_refused_before_anything_runs(project: Path) -> None:
    """Bad inputs: --html into a folder that does not exist, for eval and for compare."""
    result = _eval(project, "cases.yaml", "--html", "missing/report.html")
    assert (result.returncode, "cannot write the report" in result.stderr) == (2, True)
    assert not (project / "eval.db").exists()
    compared = run_cli(
        "eval", "compare", "a.json", "b.json", "--html", "missing/c.html", cwd=project
    )
    assert (compared.returncode, "cannot write the report" in compared.stderr) == (2, True)


def _two_reports(project: Path) -> None:
    assert _eval(project, "hostile.json", "--json", "a.json").returncode == 4
    fixed = hostile_suite()
    fixed["cases"][0]["model"] = [{"kind": "final", "answer": "hi"}]
    (project / "hostile.json").write_text(json.dumps(fixed))
    assert _eval(project, "hostile.json", "--json", "b.json").returncode == 0


def test_compare_gives_seeded_bootstrap_intervals_of_cost_and_latency(project: Path) -> None:
    _two_reports(project)
    runs = [
        run_cli("eval", "compare", "a.json", "b.json", "--json", f"d{i}.json", cwd=project)
        for i in (1, 2)
    ]
    assert [r.returncode for r in runs] == [0, 0]  # nothing broke: one case was fixed
    first, second = _json(project / "d1.json"), _json(project / "d2.json")
    assert first["bootstrap"] == second["bootstrap"]
    latency = first["bootstrap"]["latency_ms"]
    assert latency["pairs"] == 2
    assert latency["low"] <= latency["mean_delta"] <= latency["high"]
    assert first["bootstrap"]["cost"] == {"pairs": 2, "mean_delta": 0, "low": 0, "high": 0}
    assert "mean Δlatency_ms" in runs[0].stdout
    assert "95% bootstrap interval" in runs[0].stdout


def test_compare_html_shows_the_flipped_case_first_side_by_side(project: Path) -> None:
    _two_reports(project)
    result = run_cli("eval", "compare", "a.json", "b.json", "--html", "compare.html", cwd=project)
    assert result.returncode == 0, result.stderr
    page = (project / "compare.html").read_text()
    sections = re.findall(r'<details class="case" id="pair-(\d+)"[^>]*>(.*?)</summary>', page)
    assert "fixed" in sections[0][1]
    assert "answers#1" in sections[0][1]
    assert "parallel#1" in sections[1][1]
    assert page.count("<script>") == 1
    assert "&lt;img src=x onerror=&quot;window.pwned = 2&quot;&gt; hello" in page


def _on_a_terminal(project: Path, *args: str) -> tuple[int, str]:
    """Run the CLI with stdout and stderr on a pseudo-terminal; what it drew, and its code."""
    controller, terminal = pty.openpty()
    env = cli_env(COLUMNS="120", TERM="xterm")
    process = subprocess.Popen(
        [*CLI, *args, "--db", eval_db(project)],
        cwd=project,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=terminal,
        stderr=terminal,
    )
    os.close(terminal)
    chunks: list[bytes] = []
    while True:
        ready, _, _ = select.select([controller], [], [], 60)
        if not ready:
            process.kill()
            break
        try:
            chunk = os.read(controller, 65536)
        except OSError:  # the terminal closed: the process is done writing
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(controller)
    drawn = b"".join(chunks).decode(errors="replace")
    return process.wait(timeout=60), re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", drawn)


def test_a_progress_bar_is_drawn_on_a_terminal_only(project: Path) -> None:
    code, drawn = _on_a_terminal(project, "eval", "cases.yaml")
    assert code == 0
    assert re.search(r"━+\s+[0-2]/2\s+0 failed", drawn)  # the bar: done of total, failures
    assert "2/2 passed" in drawn  # then the table
    piped = _eval(project, "cases.yaml")
    assert piped.returncode == 0
    assert "━" not in piped.stdout + piped.stderr
    assert piped.stderr == ""
    assert "\x1b[" not in piped.stdout  # no control sequences in piped output


def _faked_suite(fakes: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": "faked",
        "agent": "suite_agent:agent",
        "cases": [
            {
                "id": "faked",
                "goal": "look it up and tell ops",
                "task_class": "write",
                "fakes": fakes,
                "model": [
                    {
                        "kind": "tool_calls",
                        "calls": [
                            {"id": "c1", "name": "lookup", "arguments": {"key": "k"}},
                            {"id": "w1", "name": "send", "arguments": {"to": "ops"}},
                        ],
                    },
                    {"kind": "final", "answer": "done"},
                ],
            }
        ],
    }


def _calls(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    steps = report["cases"][0]["trajectory"]["steps"]
    return {call["name"]: call for call in steps[0]["calls"]}


def test_a_fake_answers_for_its_tool_and_the_other_tools_run_for_real(project: Path) -> None:
    suite = _faked_suite({"lookup": {"output": {"faked": True}}})
    (project / "faked.json").write_text(json.dumps(suite))
    assert _eval(project, "faked.json", "--json", "r.json").returncode == 0
    calls = _calls(_json(project / "r.json"))
    assert (calls["lookup"]["status"], calls["lookup"]["output"]) == ("ok", {"faked": True})
    assert calls["send"]["output"] == "sent to ops"  # the real tool


def test_a_faked_write_fails_as_its_error_class_says(project: Path) -> None:
    """A fake error on a write: tool_failed is a rejection; outcome_unknown leaves it open."""
    rejected = _faked_suite({"send": {"error": "mailbox full"}})
    (project / "rejected.json").write_text(json.dumps(rejected))
    assert _eval(project, "rejected.json", "--json", "r.json").returncode == 0
    send = _calls(_json(project / "r.json"))["send"]
    assert (send["status"], send["error_message"]) == ("tool_failed", "mailbox full")
    assert send["effect_status"] == "rejected"
    unknown = _faked_suite({"send": {"error": "reset", "error_class": "outcome_unknown"}})
    (project / "unknown.json").write_text(json.dumps(unknown))
    assert _eval(project, "unknown.json", "--json", "u.json").returncode == 0
    report = _json(project / "u.json")
    assert report["totals"]["effects_left_open"] == 1
    # A changed fake is another run: the fakes are part of the run's id.
    assert (
        report["cases"][0]["invocation_id"]
        != _json(project / "r.json")["cases"][0]["invocation_id"]
    )


def test_bad_fakes_are_refused_before_anything_runs(project: Path) -> None:
    """Bad inputs: a fake of a tool the agent does not have, a fake with both an output
    and an error, one with neither, an error class without an error, an unknown class."""
    unknown = _faked_suite({"no_such_tool": {"output": 1}})
    (project / "unknown.json").write_text(json.dumps(unknown))
    result = _eval(project, "unknown.json")
    assert result.returncode == 2
    assert "cases[0].fakes.no_such_tool: the agent suite has no tool 'no_such_tool'" in (
        result.stderr
    )
    bad = _faked_suite(
        {
            "lookup": {"output": 1, "error": "x"},
            "send": {},
            "flaky_send": {"output": 1, "error_class": "timeout"},
        }
    )
    bad["cases"].append(
        dict(bad["cases"][0], id="other", fakes={"lookup": {"error": "x", "error_class": "boom"}})
    )
    (project / "bad.json").write_text(json.dumps(bad))
    result = _eval(project, "bad.json")
    assert result.returncode == 2
    lines = [line.strip() for line in result.stderr.splitlines()[1:]]
    assert lines[:3] == [
        "cases[0].fakes.lookup: give exactly one of output and error",
        "cases[0].fakes.send: give exactly one of output and error",
        "cases[0].fakes.flaky_send: error_class and retryable go with error",
    ]
    assert lines[3].startswith("cases[1].fakes.lookup.error_class: Input should be")
    assert not (project / "eval.db").exists()


def test_with_tools_replaces_tools_by_name_and_keeps_the_catalogue_of_a_fake() -> None:
    """Bad inputs: a tool the agent does not have, something that is not a Tool."""
    from loop_actors import Agent, ScriptedModel, UsageError, tool
    from loop_actors.eval.fakes import ToolFake, with_fakes

    @tool(effect="write", requires_approval=True)
    def pay(amount: int) -> str:
        """Pay."""
        return "paid"

    @tool
    def other(x: int) -> int:
        """Another tool, named pay."""
        return x

    agent = Agent("a", ScriptedModel([{"kind": "final", "answer": "x"}]), [pay])
    faked = with_fakes(agent, {"pay": ToolFake.model_validate({"output": "fake"})})
    assert faked.toolbox.catalogue_digest == agent.toolbox.catalogue_digest
    assert faked.settings == agent.settings  # the same approval rule is recorded
    assert faked.toolbox.tools["pay"].fn() == "fake"
    assert agent.toolbox.tools["pay"].fn(amount=1) == "paid"  # the original is untouched
    with pytest.raises(UsageError, match="has no tool 'other' to replace"):
        agent.with_tools(other)
    with pytest.raises(UsageError, match="with_tools takes tools"):
        agent.with_tools(len)  # type: ignore[arg-type]


def test_compare_html_of_a_hand_edited_report_still_renders(project: Path) -> None:
    """Bad inputs: a trajectory whose steps are a string, a step whose cost, tokens and a
    call's duration are text, an infinite latency in a step, an approval that is a number."""
    assert _eval(project, "hostile.json", "--json", "a.json").returncode == 4
    edited = _json(project / "a.json")
    edited["cases"][0]["trajectory"] = {"steps": "not a list"}
    edited["cases"][0]["approvals"] = [3]
    edited["cases"][1]["trajectory"]["steps"][0] |= {
        "cost": "free",
        "input_tokens": "many",
        "latency_ms": 1e309,
        "calls": [{"name": "lookup", "duration_ms": "slow"}, "not a call"],
    }
    (project / "b.json").write_text(json.dumps(edited))
    refused = run_cli("eval", "compare", "a.json", "b.json", "--html", "c.html", cwd=project)
    assert refused.returncode == 2  # a typed part of an entry is checked, and located
    assert "cases[0].approvals[0]: Input should be a valid dictionary" in refused.stderr
    edited["cases"][0]["approvals"] = []
    (project / "b.json").write_text(json.dumps(edited))
    result = run_cli("eval", "compare", "a.json", "b.json", "--html", "c.html", cwd=project)
    assert result.returncode == 0, result.stderr
    page = (project / "c.html").read_text()
    assert "lookup" in page
