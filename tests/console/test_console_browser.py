"""The console end to end in headless Chromium: list, filter, a trajectory, approve from the inbox.

Real processes throughout: ``loop-actors run`` pauses an invocation, ``loop-actors serve``
serves the console, Chromium (Playwright) approves it from the inbox with the token typed
once, and a ``loop-actors worker`` resumes it, which the invocation's page follows live
until it shows ``completed``. Screenshots are test artefacts (``test-artifacts/``);
with ``LOOP_ACTORS_DOCS_SCREENSHOTS=1`` the inbox's also replaces the how-to's
(``docs/how-to/images/console-approvals.png``). At the end, the other paused invocation
is cancelled by a bulk action over the list's filter (its dry run, then the typed
confirmation).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.browser import launched_browser, screenshot
from tests.support.cli import CLI, cli_env, run_cli
from tests.support.console import HOSTILE, TOKEN

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
AGENT = "tests.support.console:refunds"
DOCS_SHOT = ROOT / "docs" / "how-to" / "images" / "console-approvals.png"


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with launched_browser() as launched:
        yield launched


def _start(*args: str, db: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*CLI, *args, "--db", db],
        cwd=ROOT,
        env=cli_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _stop(process: subprocess.Popen[str]) -> str:
    process.send_signal(signal.SIGTERM)
    try:
        _, err = process.communicate(timeout=20)
    except subprocess.TimeoutExpired:
        process.kill()
        _, err = process.communicate()
    return err


@pytest.fixture
def console(tmp_path: Path) -> Iterator[tuple[str, str]]:
    """A store with a paused and a completed invocation, and ``serve`` on it: (base URL, db)."""
    db = f"sqlite:///{tmp_path / 'console.db'}"
    paused = run_cli(
        "run", AGENT, "--goal", f"refund A-1 {HOSTILE}", "--id", "refund-1", cwd=ROOT, db=db
    )
    assert paused.returncode == 3, paused.stderr
    other = run_cli("run", AGENT, "--goal", "refund B-2", "--id", "refund-2", cwd=ROOT, db=db)
    assert other.returncode == 3, other.stderr
    server = _start("serve", "--port", "0", "--token", TOKEN, db=db)
    assert server.stdout is not None
    first = server.stdout.readline()
    assert first.startswith("loop-actors console on http://127.0.0.1:"), first + _stop(server)
    base = first.split(" on ", 1)[1].strip().rstrip("/")
    try:
        yield base, db
    finally:
        said = _stop(server)
    assert server.returncode == 0, said
    assert "SIGTERM: the console stops" in said


def _page(browser: Any) -> Any:
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.problems = []
    page.on("pageerror", lambda error: page.problems.append(str(error)))
    page.on("dialog", lambda dialog: page.problems.append(f"dialog {dialog.message}"))
    page.on(
        "console",
        lambda message: page.problems.append(message.text) if message.type == "error" else None,
    )
    return page


def test_an_operator_filters_reads_and_approves_from_the_inbox(
    browser: Any, console: tuple[str, str], tmp_path: Path
) -> None:
    base, db = console
    page = _page(browser)
    # The list, then filtered in the URL by the form.
    page.goto(f"{base}/invocations")
    rows = page.locator("#invocations tbody tr")
    assert rows.count() == 2
    page.select_option("select[name=status]", "paused")
    page.fill("input[name=agent]", "refunds")
    page.click("#filter")
    page.wait_for_url("**/invocations?*status=paused*")
    assert "agent=refunds" in page.url
    assert page.locator("#invocations tbody tr").count() == 2
    page.goto(f"{base}/invocations?agent=nobody")
    assert page.get_by_text("No invocation matches.").is_visible()
    screenshot(page, tmp_path, "console-invocations.png")
    # A trajectory: its goal holds a script, shown as text.
    page.goto(f"{base}/invocations")
    page.click("text=refund-1")
    page.wait_for_url("**/invocations/refund-1")
    assert page.locator(".goal").first.inner_text() == f"refund A-1 {HOSTILE}"
    assert page.locator(".waiting table.calls").get_by_text('"amount": 250').is_visible()
    screenshot(page, tmp_path, "console-trajectory.png")
    # The inbox: without the token the approval is refused, and nothing is recorded.
    page.goto(f"{base}/approvals")
    inbox = page.locator("#approval-refund-1")
    inbox.locator("form[data-action=approve] input[name=by]").fill("alice")
    inbox.locator("form[data-action=approve] input[name=note]").fill("receipt seen")
    inbox.locator("button.approve").click()
    page.locator("#flash.error").wait_for()
    assert "401" in page.locator("#flash").inner_text()
    # The token, typed once for this tab (kept in sessionStorage), then the approval.
    page.fill("#token", TOKEN)
    page.click("#token-form button")
    assert page.locator("#token-state").inner_text() == "token kept for this tab"
    shot = screenshot(page, tmp_path, "console-approvals.png")
    if os.environ.get("LOOP_ACTORS_DOCS_SCREENSHOTS") == "1":
        DOCS_SHOT.parent.mkdir(exist_ok=True)
        shutil.copy(shot, DOCS_SHOT)
    inbox.locator("button.approve").click()
    page.locator("#flash.ok").wait_for()
    assert "refund-1: approved by alice" in page.locator("#flash").inner_text()
    # A worker resumes it; its page follows the stream and shows the end.
    page.goto(f"{base}/invocations/refund-1")
    worker = _start("worker", "--agent", AGENT, db=db)
    try:
        page.locator("#status", has_text="terminated").wait_for(timeout=60_000)
    finally:
        _stop(worker)
    assert page.locator("dd", has_text="completed").first.is_visible()
    assert page.locator("pre.output").first.inner_text().count("<script>") == 1
    decisions = page.locator("table", has_text="receipt seen")
    assert decisions.get_by_text("alice").is_visible()
    screenshot(page, tmp_path, "console-completed.png")
    # The metrics, charted.
    page.goto(f"{base}/metrics")
    bars = page.locator("svg.chart rect.bar")
    assert bars.count() == 10  # two groups (completed, approval_required), five charts
    counted = page.locator("figure", has_text="invocations").locator("rect.bar").all()
    assert [bar.bounding_box()["width"] for bar in counted] == [480, 480]  # one each
    screenshot(page, tmp_path, "console-metrics.png")
    # The inbox has only the other one left.
    page.goto(f"{base}/approvals")
    assert page.locator("section.waiting").count() == 1
    assert page.locator("#approval-refund-2").is_visible()
    # A bulk cancel over the list's filter: a dry run, then the confirmation it gave.
    page.goto(f"{base}/invocations?agent=refunds&status=paused")
    page.click("details.bulk summary")
    page.fill("#bulk-form input[name=by]", "carol")
    page.click("#bulk-count")
    page.locator("#bulk-dry.ok").wait_for()
    assert page.locator("#bulk-dry").inner_text().startswith("1 to cancel: refund-2.")
    page.fill("#bulk-form input[name=confirm]", page.locator("#bulk-confirm-text").inner_text())
    page.click("#bulk-apply")
    page.locator("#flash.ok", has_text="cancel: refund-2: ended").wait_for()
    page.goto(f"{base}/approvals")
    assert page.get_by_text("Nothing waits for an approval.").is_visible()
    # The one refused request was ours, without the token; no script was refused by the CSP.
    assert page.problems == [
        "Failed to load resource: the server responded with a status of 401 ()"
    ]
    page.close()
