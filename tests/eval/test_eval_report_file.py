"""The eval report as a typed document: it reads back byte for byte, and a broken file is refused.

A real report (two cases run on a real SQLite file, one failing, with tool fakes) is
written once; each test reads it, or a hand-edited copy of it, through
``load_report`` and through ``eval compare`` run in-process.

Bad inputs tried: a missing key (of the report, of an entry), a value of the wrong
type (a count that is a word, entries that are an object, an unknown status, a pass
rate that is a word), an unknown key (of the report, of an entry, of a failed
expectation, of the agent), an agent without a version, an entry listed twice, a report
of another format; and hostile text in a goal, a tool's output, a tool's error and an
entry's error.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
import trio

from loop_actors import Agent, Runtime, ScriptedModel, tool
from loop_actors.cli import ExitCode
from loop_actors.eval.evaluate import Suite, compare, report, run_suite, write_json
from loop_actors.eval.html import compare_html, eval_html
from loop_actors.eval.report import (
    Comparison,
    EvalReport,
    ReportFileError,
    document_json,
    load_report,
)
from projections.evaluation import CaseStatus
from tests.support.cli import run_in_process
from tests.support.eval import send

PAYLOAD = "</script><img src=x onerror=alert(1)>"
"""Closes the page's script if written as it is, then runs code from an image's onerror."""


@tool
def lookup(key: str) -> str:
    """Look a key up."""
    return f"value of {key}"


AGENT = Agent("filed", ScriptedModel([{"kind": "final", "answer": "unscripted"}]), [lookup, send])

SUITE = {
    "name": "filed",
    "agent": "unused:agent",
    "cases": [
        {
            "id": "answers",
            "goal": f"say hi {PAYLOAD}",
            "task_class": "chat",
            "proves": "a final answer is scored",
            "model": [{"kind": "final", "answer": "hi"}],
            "expect": {"reason": "completed", "answer": {"equals": "hi"}},
        },
        {
            "id": "looks-up",
            "goal": "look it up and tell ops",
            "task_class": "write",
            "fakes": {"lookup": {"output": PAYLOAD}, "send": {"error": PAYLOAD}},
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
            "expect": {"answer": {"equals": "not done"}},
        },
    ],
}


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The report of SUITE, as ``eval --json`` writes it."""
    folder = tmp_path_factory.mktemp("report")

    async def run() -> EvalReport:
        with trio.fail_after(60):
            runtime = Runtime(f"sqlite:///{folder / 'eval.db'}")
            suite = Suite.model_validate(SUITE)
            results = await run_suite(runtime, AGENT, suite, "filed", concurrency=2)
            return report("filed", AGENT, results)

    path = folder / "report.json"
    write_json(path, trio.run(run))
    return path


def _edited(written: Path, folder: Path, edit: Callable[[dict[str, Any]], None]) -> Path:
    data = json.loads(written.read_text())
    edit(data)
    path = folder / "edited.json"
    path.write_text(json.dumps(data, indent=2))
    return path


def test_a_report_reads_back_through_its_model_and_writes_the_same_bytes(written: Path) -> None:
    text = written.read_text()
    loaded = load_report(written)
    assert document_json(loaded) == text
    assert [(c.case_id, c.status) for c in loaded.cases] == [
        ("answers", CaseStatus.PASSED),
        ("looks-up", CaseStatus.FAILED),
    ]
    assert list(json.loads(text)) == list(EvalReport.model_fields)  # the keys, in order


def test_a_comparison_reads_back_through_its_model(written: Path) -> None:
    loaded = load_report(written)
    comparison = compare(loaded, loaded)
    text = document_json(comparison)
    assert document_json(Comparison.model_validate_json(text)) == text
    assert (comparison.paired, comparison.broke, comparison.fixed) == (2, 0, 0)


def test_a_report_written_before_the_later_keys_still_reads(written: Path, tmp_path: Path) -> None:
    """The keys added to loop-actors-eval/1 after its first release have their defaults."""
    later = ("proves", "attempts", "effects_dispatched_twice", "effects_left_open")

    def as_first_written(data: dict[str, Any]) -> None:
        for case in data["cases"]:
            for key in (*later, "approvals", "trajectory"):
                del case[key]
        for group in [data["totals"], *data["by_task_class"].values(), *data["by_reason"].values()]:
            del group["effects_dispatched_twice"], group["effects_left_open"]

    loaded = load_report(_edited(written, tmp_path, as_first_written))
    assert [(c.attempts, c.trajectory, c.approvals) for c in loaded.cases] == [(1, None, [])] * 2


def _drop_status(data: dict[str, Any]) -> None:
    del data["cases"][0]["status"]


def _drop_totals(data: dict[str, Any]) -> None:
    del data["totals"]


def _drop_agent_version(data: dict[str, Any]) -> None:
    del data["agent"]["version"]


def _steps_as_a_word(data: dict[str, Any]) -> None:
    data["cases"][1]["steps"] = "many"


def _cases_as_an_object(data: dict[str, Any]) -> None:
    data["cases"] = {"answers": data["cases"][0]}


def _unknown_status(data: dict[str, Any]) -> None:
    data["cases"][0]["status"] = "maybe"


def _pass_rate_as_a_word(data: dict[str, Any]) -> None:
    data["totals"]["pass_rate"] = "high"


def _unknown_report_key(data: dict[str, Any]) -> None:
    data["colour"] = "red"


def _unknown_entry_key(data: dict[str, Any]) -> None:
    data["cases"][1]["latency"] = 3


def _unknown_failure_key(data: dict[str, Any]) -> None:
    data["cases"][1]["failures"][0]["note"] = "hand-edited"


def _listed_twice(data: dict[str, Any]) -> None:
    data["cases"].append(copy.deepcopy(data["cases"][0]))


def _another_format(data: dict[str, Any]) -> None:
    data["format"] = "loop-actors-eval/2"
    del data["totals"]  # not reported: a file of another format is not read further


BROKEN = [
    (_drop_status, "cases[0].status: Field required"),
    (_drop_totals, "totals: Field required"),
    (_drop_agent_version, "agent.version: Field required"),
    (
        _steps_as_a_word,
        "cases[1].steps: Input should be a valid integer, unable to parse string as an integer",
    ),
    (_cases_as_an_object, "cases: Input should be a valid list"),
    (_unknown_status, "cases[0].status: Input should be 'passed', 'failed' or 'error'"),
    (
        _pass_rate_as_a_word,
        "totals.pass_rate: Input should be a valid number, unable to parse string as a number",
    ),
    (_unknown_report_key, "colour: Extra inputs are not permitted"),
    (_unknown_entry_key, "cases[1].latency: Extra inputs are not permitted"),
    (_unknown_failure_key, "cases[1].failures[0].note: Extra inputs are not permitted"),
    (_listed_twice, "cases: listed twice: answers epoch 1"),
    (_another_format, "format: expected 'loop-actors-eval/1', got 'loop-actors-eval/2'"),
]


@pytest.mark.parametrize(("edit", "problem"), BROKEN, ids=[edit.__name__ for edit, _ in BROKEN])
def test_a_broken_report_is_refused_with_its_problem_located(
    written: Path, tmp_path: Path, edit: Callable[[dict[str, Any]], None], problem: str
) -> None:
    path = _edited(written, tmp_path, edit)
    with pytest.raises(ReportFileError) as refused:
        load_report(path)
    assert refused.value.problems == [problem]


@pytest.mark.parametrize("broken", BROKEN, ids=[edit.__name__ for edit, _ in BROKEN])
def test_eval_compare_of_a_broken_report_exits_2_and_writes_nothing(
    written: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    broken: tuple[Callable[[dict[str, Any]], None], str],
) -> None:
    edit, problem = broken
    path = _edited(written, tmp_path, edit)
    result = run_in_process(
        "eval", "compare", str(written), str(path), "--json", "c.json", "--html", "c.html",
        cwd=tmp_path, capsys=capsys, monkeypatch=monkeypatch,
    )  # fmt: skip
    assert result.returncode == ExitCode.USAGE_ERROR
    assert result.stderr == f"loop-actors: error: {path}: 1 problem(s)\n  {problem}\n"
    assert result.stdout == ""
    assert not (tmp_path / "c.json").exists()
    assert not (tmp_path / "c.html").exists()


class _Elements(HTMLParser):
    """The start tags of a page, the text of its scripts, and its text."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[str] = []
        self.scripts: list[str] = []
        self.text: list[str] = []
        self._in_script = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        self._in_script = tag == "script"
        if self._in_script:
            self.scripts.append("")

    def handle_endtag(self, tag: str) -> None:
        self._in_script = False

    def handle_data(self, data: str) -> None:
        if self._in_script:
            self.scripts[-1] += data
        else:
            self.text.append(data)


def _parsed(page: str) -> _Elements:
    elements = _Elements()
    elements.feed(page)
    elements.close()
    return elements


def test_a_closing_script_tag_in_a_goal_an_output_and_an_error_injects_no_element(
    written: Path,
) -> None:
    loaded = load_report(written)
    errored = loaded.cases[1].model_copy(
        update={"status": CaseStatus.ERROR, "error": f"ToolError: {PAYLOAD}"}
    )
    broken = loaded.model_copy(update={"cases": [loaded.cases[0], errored]})
    for page in (eval_html(loaded), compare_html(compare(loaded, broken), loaded, broken)):
        elements = _parsed(page)
        assert "img" not in elements.tags
        assert elements.tags.count("script") == 1  # the page's own, last
        assert "alert" not in elements.scripts[0]
        text = "".join(elements.text)
        assert f"say hi {PAYLOAD}" in text  # the goal, shown as text
        assert f'"{PAYLOAD}"' in text  # the fake lookup's output (JSON)
    compared = "".join(_parsed(compare_html(compare(loaded, broken), loaded, broken)).text)
    assert f"error: ToolError: {PAYLOAD}" in compared  # the entry's error
    assert "".join(_parsed(eval_html(loaded)).text).count(PAYLOAD) >= 3  # + the fake's error
