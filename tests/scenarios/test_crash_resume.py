"""The crash suite: SIGKILL at every crash point, then resume; no write ever happens twice.

Each case runs the payment agent in a real subprocess with one crash point armed
(``LOOP_ACTORS_CRASH_AT``), checks that the process died of SIGKILL, resumes it
with ``loop-actors resume`` in a second process, and compares with a run that
never crashed: same reason, same answer, every payment exactly once at the
service, and a history without gap, duplicate or reordering.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.support.cli import run_cli
from tests.support.history import assert_history_is_whole
from tests.support.payments_app import PaymentService

pytestmark = pytest.mark.slow

APP = Path(__file__).parents[1] / "support" / "payments_app.py"
INVOCATION = "inv-crash"

CRASH_CASES = [
    "after_start_commit",
    "after_dispatch_commit:1",
    "after_dispatch_commit:2",
    "after_dispatch_commit:3",
    "after_write_returned:1",
    "after_write_returned:2",
    "after_results_commit:1",
    "after_results_commit:2",
    "after_results_commit:3",
    "before_final_commit",
]


def loop_actors(
    *args: str, cwd: Path, crash_at: str | None = None, inline: bool = False
) -> subprocess.CompletedProcess[str]:
    env = {"PAYMENTS_DB": str(cwd / "service.db")}
    if inline:
        env["PAYMENTS_INLINE"] = "1"  # the tools run in the batch's own task
    if crash_at is not None:
        env["LOOP_ACTORS_CRASH_AT"] = crash_at
    return run_cli(*args, cwd=cwd, db="sqlite:///run.db", env=env)


def workspace(tmp_path: Path, name: str) -> Path:
    folder = tmp_path / name
    folder.mkdir()
    shutil.copy(APP, folder / "payments_app.py")
    return folder


def run_args() -> tuple[str, ...]:
    return (
        "run",
        "payments_app:agent",
        "--goal",
        "pay bob and carol",
        "--id",
        INVOCATION,
        "--json",
    )


def history(cwd: Path) -> list[dict[str, Any]]:
    result = loop_actors("history", INVOCATION, "--json", cwd=cwd)
    assert result.returncode == 0, result.stderr
    return [json.loads(line) for line in result.stdout.splitlines()]


@pytest.fixture(scope="module")
def baseline(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    folder = workspace(tmp_path_factory.mktemp("baseline"), "run")
    result = loop_actors(*run_args(), cwd=folder)
    assert result.returncode == 0, result.stderr
    outcome = json.loads(result.stdout)
    return {"outcome": outcome, "types": [r["type"] for r in history(folder)]}


@pytest.mark.parametrize("inline", [False, True], ids=["in-threads", "inline"])
@pytest.mark.parametrize("crash_at", CRASH_CASES)
def test_killed_at_a_crash_point_resume_finishes_like_an_uncrashed_run(
    tmp_path: Path, baseline: dict[str, Any], crash_at: str, inline: bool
) -> None:
    folder = workspace(tmp_path, "run")
    crashed = loop_actors(*run_args(), cwd=folder, crash_at=crash_at, inline=inline)
    assert crashed.returncode == -signal.SIGKILL, (crashed.stdout, crashed.stderr)

    resumed = loop_actors(
        "resume", INVOCATION, "--agent", "payments_app:agent", "--json", cwd=folder, inline=inline
    )
    assert resumed.returncode == 0, resumed.stderr
    outcome = json.loads(resumed.stdout)
    expected = baseline["outcome"]
    assert (outcome["reason"], outcome["answer"]) == (expected["reason"], expected["answer"])
    assert (outcome["steps"], outcome["tool_calls"]) == (expected["steps"], expected["tool_calls"])

    service = PaymentService(folder / "service.db")
    payments = service.payments()
    assert [(recipient, amount) for _, recipient, amount in payments] == [
        ("bob", 30),
        ("carol", 20),
    ]
    # Every request that reached the service used the payment's one key.
    keys = {recipient: key for key, recipient, _ in payments}
    assert all(keys[recipient] == key for key, recipient in service.attempts())

    records = history(folder)
    assert_history_is_whole(records)

    again = loop_actors(
        "resume", INVOCATION, "--agent", "payments_app:agent", "--json", cwd=folder, inline=inline
    )
    assert again.returncode == 0
    assert json.loads(again.stdout) == outcome
    assert len(history(folder)) == len(records)  # resuming a finished invocation runs nothing


def test_a_write_whose_reply_is_lost_is_reconciled_not_retried(tmp_path: Path) -> None:
    folder = workspace(tmp_path, "run")
    (folder / "service.db.lose-reply").touch()
    result = loop_actors(*run_args(), cwd=folder)
    assert result.returncode == 0, result.stderr
    service = PaymentService(folder / "service.db")
    assert len(service.attempts()) == 2  # one request per payment: no blind retry
    effects = [
        result
        for record in history(folder)
        if record["type"] == "ResultsCommitted"
        for result in record["data"]["results"]
        if result["name"] == "pay"
    ]
    assert [e["effect_status"] for e in effects] == ["reconciled", "committed"]
    assert effects[0]["output"]["receipt"].startswith("rcpt-")


def test_an_unreachable_service_pauses_and_a_later_resume_completes(tmp_path: Path) -> None:
    folder = workspace(tmp_path, "run")
    down = folder / "service.db.down"
    down.touch()
    paused = loop_actors(*run_args(), cwd=folder)
    assert paused.returncode == 3, paused.stderr
    assert json.loads(paused.stdout)["reason"] == "reconciliation_required"

    still_down = loop_actors(
        "resume", INVOCATION, "--agent", "payments_app:agent", "--json", cwd=folder
    )
    assert still_down.returncode == 3

    down.unlink()
    resumed = loop_actors(
        "resume", INVOCATION, "--agent", "payments_app:agent", "--json", cwd=folder
    )
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout)["reason"] == "completed"
    service = PaymentService(folder / "service.db")
    assert [(r, a) for _, r, a in service.payments()] == [("bob", 30), ("carol", 20)]
    assert_history_is_whole(history(folder))


def test_the_reconcile_sweeper_resumes_a_paused_invocation_once_the_service_answers(
    tmp_path: Path,
) -> None:
    folder = workspace(tmp_path, "run")
    down = folder / "service.db.down"
    down.touch()
    assert loop_actors(*run_args(), cwd=folder).returncode == 3
    waiting = loop_actors("reconcile", "--agent", "payments_app:agent", cwd=folder)
    assert waiting.returncode == 3, waiting.stderr
    down.unlink()
    swept = loop_actors("reconcile", "--agent", "payments_app:agent", "--json", cwd=folder)
    assert swept.returncode == 0, swept.stderr
    report = json.loads(swept.stdout)
    assert [o["reason"] for o in report["resumed"]] == ["completed"]
    assert report["effects_open"] == 0


def test_resuming_with_a_removed_tool_is_refused_unless_allowed(tmp_path: Path) -> None:
    folder = workspace(tmp_path, "run")
    crashed = loop_actors(*run_args(), cwd=folder, crash_at="after_results_commit:1")
    assert crashed.returncode == -signal.SIGKILL
    (folder / "changed_app.py").write_text(
        "from payments_app import ScriptedModel, Agent, Budget, pay, _decide\n"
        "agent = Agent('payments', ScriptedModel(_decide), [pay], Budget(max_steps=6))\n"
    )
    refused = loop_actors("resume", INVOCATION, "--agent", "changed_app:agent", cwd=folder)
    assert refused.returncode == 2
    assert "read_balance" in refused.stderr
    assert "removed" in refused.stderr


def test_a_write_its_service_never_saw_in_three_dispatches_is_finished_by_the_sweeper(
    tmp_path: Path,
) -> None:
    """Issue 33 C: the ledger holds the writes ``prepared`` (not open); the sweep resumes anyway.

    Each payment request is lost on its way while ``service.db.lose-request`` exists: the
    service answers "not found" for its key, the write is dispatched again with it, three
    times, and the run pauses. Nothing is open then, so a sweep that followed open effects
    only said "nothing waits" (exit 0) and left it paused for ever.
    """
    folder = workspace(tmp_path, "run")
    lost = folder / "service.db.lose-request"
    lost.touch()
    paused = loop_actors(*run_args(), cwd=folder)
    assert paused.returncode == 3, paused.stderr
    outcome = json.loads(paused.stdout)
    assert outcome["reason"] == "reconciliation_required"
    assert (
        "a write was dispatched 3 times and its service still does not know its key"
        in (outcome["detail"])
    )
    listed = loop_actors("effects", "list", "--json", cwd=folder)
    assert (listed.returncode, listed.stdout) == (0, "")  # both writes are `prepared`

    still_lost = loop_actors("reconcile", "--agent", "payments_app:agent", "--json", cwd=folder)
    assert still_lost.returncode == 3, still_lost.stderr
    report = json.loads(still_lost.stdout)
    assert [o["reason"] for o in report["resumed"]] == ["reconciliation_required"]
    assert (report["effects_open"], report["invocations_waiting"]) == (0, 1)

    lost.unlink()
    swept = loop_actors("reconcile", "--agent", "payments_app:agent", cwd=folder)
    assert swept.returncode == 0, swept.stderr
    assert swept.stdout.splitlines() == [
        f"resumed {INVOCATION}: completed",
        "effects settled=0 open=0 invocations waiting=0",
    ]
    service = PaymentService(folder / "service.db")
    assert [(r, a) for _, r, a in service.payments()] == [("bob", 30), ("carol", 20)]
    # The lost requests never reached it; each key reached it once, when it got through.
    assert sorted(r for _, r in service.attempts()) == ["bob", "carol"]
    records = history(folder)
    assert_history_is_whole(records)
    assert records[-1]["data"]["reason"] == "completed"
    again = loop_actors("reconcile", "--agent", "payments_app:agent", cwd=folder)
    assert (again.returncode, again.stdout.splitlines()) == (
        0,
        ["effects settled=0 open=0 invocations waiting=0"],
    )
