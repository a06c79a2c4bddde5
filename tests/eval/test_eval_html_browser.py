"""The HTML reports in a real headless Chromium: charts drawn, a trajectory shown, nothing run.

Debian's ``chromium`` (``/usr/bin/chromium``; ``.ci/test`` installs it when missing),
driven by Playwright, opens the files ``loop-actors eval --html`` and ``eval compare
--html`` wrote. The screenshots are kept as test artefacts under ``test-artifacts/``
(ignored by git) and pytest's ``tmp_path``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.browser import launched_browser, screenshot
from tests.support.cli import run_cli
from tests.support.eval import AGENT, CHECKS, HOSTILE_ANSWER, HOSTILE_GOAL, hostile_suite

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with launched_browser() as launched:
        yield launched


@pytest.fixture(scope="module")
def reports(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run of the hostile suite (one failing case), then the same suite fixed, and a compare."""
    project = tmp_path_factory.mktemp("browser")
    (project / "suite_agent.py").write_text(AGENT)
    (project / "checks.py").write_text(CHECKS)
    (project / "hostile.json").write_text(json.dumps(hostile_suite()))
    db = f"sqlite:///{project / 'eval.db'}"
    first = run_cli(
        "eval", "hostile.json", "--json", "a.json", "--html", "a.html", cwd=project, db=db
    )
    assert first.returncode == 4, first.stderr
    fixed = hostile_suite()
    fixed["cases"][0]["model"] = [{"kind": "final", "answer": "hi"}]
    (project / "hostile.json").write_text(json.dumps(fixed))
    second = run_cli("eval", "hostile.json", "--json", "b.json", cwd=project, db=db)
    assert second.returncode == 0, second.stderr
    compared = run_cli("eval", "compare", "a.json", "b.json", "--html", "compare.html", cwd=project)
    assert compared.returncode == 0, compared.stderr
    return project


def _open(browser: Any, path: Path) -> Any:
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    requests: list[str] = []
    page.on("request", lambda request: requests.append(request.url))
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.goto(path.as_uri())
    page.wait_for_load_state("load")
    page.requests, page.errors = requests, errors
    return page


def _screenshot(page: Any, tmp_path: Path, name: str) -> Path:
    return screenshot(page, tmp_path, name)


def _chart_sizes(page: Any) -> dict[str, tuple[float, float]]:
    sizes = {}
    for figure in page.locator("figure").all():
        title = figure.locator("figcaption").inner_text()
        box = figure.locator("svg.chart").bounding_box()
        sizes[title] = (box["width"], box["height"])
    return sizes


def test_the_eval_report_draws_its_charts_and_shows_a_trajectory(
    browser: Any, reports: Path, tmp_path: Path
) -> None:
    page = _open(browser, reports / "a.html")
    sizes = _chart_sizes(page)
    assert set(sizes) == {
        "cases by terminal reason",
        "cases by task class",
        "latency",
        "cost",
        "tokens",
        "steps",
    }
    assert all(width > 100 and height > 50 for width, height in sizes.values()), sizes
    bars = page.locator("figure:has-text('cases by terminal reason') rect.bar")
    assert bars.count() == 2  # completed: one passed, one failed
    assert all(bar.bounding_box()["width"] > 0 for bar in bars.all())
    # The passing case's trajectory is folded; open it and read its parallel batch.
    parallel = page.locator("details#case-1")
    assert not parallel.locator(".batch").first.is_visible()
    parallel.locator("summary").click()
    batch = parallel.locator(".batch").first
    assert batch.is_visible()
    assert parallel.get_by_text("one batch: 2 calls run in parallel").is_visible()
    calls = batch.locator(".call")
    assert calls.count() == 2
    first_call, second_call = (calls.nth(i).bounding_box() for i in (0, 1))
    assert abs(first_call["y"] - second_call["y"]) < 1  # side by side: one batch
    assert parallel.get_by_text("committed").first.is_visible()
    _screenshot(page, tmp_path, "eval-report.png")
    page.close()


def test_values_from_the_log_are_shown_as_text_and_never_run(browser: Any, reports: Path) -> None:
    page = _open(browser, reports / "a.html")
    assert page.evaluate("typeof window.pwned") == "undefined"
    failing = page.locator("details#case-0")
    assert failing.get_attribute("open") is not None  # a failed case is open
    assert failing.get_by_text(HOSTILE_GOAL).first.is_visible()
    assert failing.get_by_text(HOSTILE_ANSWER).first.is_visible()
    assert failing.get_by_text("answer.equals").first.is_visible()
    assert page.locator("img").count() == 0
    assert [url for url in page.requests if not url.startswith("file://")] == []
    assert page.errors == []
    page.close()


def test_the_status_filter_hides_the_other_cases(browser: Any, reports: Path) -> None:
    page = _open(browser, reports / "a.html")
    page.locator("button[data-show=failed]").click()
    assert page.locator("details#case-0").is_visible()
    assert not page.locator("details#case-1").is_visible()
    page.locator("button[data-show=all]").click()
    assert page.locator("details#case-1").is_visible()
    page.close()


def test_the_compare_report_shows_the_flipped_case_first_side_by_side(
    browser: Any, reports: Path, tmp_path: Path
) -> None:
    page = _open(browser, reports / "compare.html")
    sizes = _chart_sizes(page)
    assert len(sizes) == 4
    assert all(width > 100 and height > 50 for width, height in sizes.values()), sizes
    first = page.locator("details.case").first
    assert "fixed" in first.locator("summary").inner_text()
    assert "answers#1" in first.locator("summary").inner_text()
    sides = first.locator(".side")
    assert sides.count() == 2
    left, right = (sides.nth(i).bounding_box() for i in (0, 1))
    assert left["x"] + left["width"] <= right["x"]  # A on the left, B on the right
    assert sides.nth(0).get_by_text("answer.equals").first.is_visible()  # why A failed
    assert sides.nth(1).get_by_text("terminated: completed").is_visible()
    assert page.evaluate("typeof window.pwned") == "undefined"
    assert page.get_by_text("95% bootstrap interval").is_visible()
    _screenshot(page, tmp_path, "eval-compare.png")
    page.close()


PAYLOAD = "</script><img src=x onerror=alert(1)>"


@pytest.fixture(scope="module")
def injected(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """PAYLOAD in a goal, a tool's output and a tool's error (eval --html), and in an
    entry's error (a hand-edited report, compare --html)."""
    project = tmp_path_factory.mktemp("injected")
    (project / "suite_agent.py").write_text(AGENT)
    suite = {
        "name": "injected",
        "agent": "suite_agent:agent",
        "cases": [
            {
                "id": "injects",
                "goal": f"look it up {PAYLOAD}",
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
            }
        ],
    }
    (project / "injected.json").write_text(json.dumps(suite))
    db = f"sqlite:///{project / 'eval.db'}"
    ran = run_cli(
        "eval", "injected.json", "--json", "a.json", "--html", "a.html", cwd=project, db=db
    )
    assert ran.returncode == 4, ran.stderr
    edited = json.loads((project / "a.json").read_text())
    edited["cases"][0] |= {"status": "error", "error": f"ToolError: {PAYLOAD}", "failures": []}
    (project / "b.json").write_text(json.dumps(edited))
    compared = run_cli("eval", "compare", "a.json", "b.json", "--html", "c.html", cwd=project)
    assert compared.returncode == 0, compared.stderr  # failed in A, errored in B: not broke
    return project


@pytest.mark.parametrize("name", ["a.html", "c.html"])
def test_a_closing_script_tag_in_a_goal_an_output_and_an_error_injects_no_element(
    browser: Any, injected: Path, name: str
) -> None:
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    dialogs: list[str] = []
    errors: list[str] = []

    def dismissed(dialog: Any) -> None:
        dialogs.append(dialog.message)
        dialog.dismiss()

    page.on("dialog", dismissed)  # before the page loads: an onerror would run while it does
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.goto((injected / name).as_uri())
    page.wait_for_load_state("load")
    page.evaluate("document.querySelectorAll('details').forEach(d => { d.open = true; })")
    assert page.locator("img").count() == 0
    assert page.locator("script").count() == 1  # the page's own
    assert dialogs == []
    assert errors == []
    shown = page.locator("body").inner_text()
    if name == "a.html":
        assert f"look it up {PAYLOAD}" in shown  # the goal
        assert f'"{PAYLOAD}"' in shown  # the fake lookup's output
        assert shown.count(PAYLOAD) >= 3  # and the fake send's error
    else:
        assert f"error: ToolError: {PAYLOAD}" in shown  # the entry's error, in B
    page.close()
