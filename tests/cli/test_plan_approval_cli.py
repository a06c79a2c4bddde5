"""Plan-then-approve from the command line: each command a new process over one SQLite file.

``run`` pauses ``plan_approval_required`` with the plan's digest; ``approve`` with it runs
the planned write without another pause, and a write outside the plan then pauses
``approval_required``; ``deny`` sends a plan back to the model.

Bad inputs tried: approving the plan with a wrong digest (refused, exit 2).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.support.cli import run_cli

pytestmark = pytest.mark.slow

APP = '''
from loop_actors import Agent, Budget, Planning, Reconciled, ScriptedModel, tool

@tool(effect="write", reconcile=lambda key: Reconciled(status="not_found"))
def refund(order_id: str, amount: int) -> dict:
    """Refund an order."""
    with open("refunds.log", "a") as log:
        log.write(f"{order_id} {amount}\\n")
    return {"refunded": amount}

@tool
def look_up(order_id: str) -> dict:
    """Read an order."""
    return {"order_id": order_id, "paid": 250}

def refund_call(call_id, order_id, amount):
    return {"kind": "tool_calls", "calls": [
        {"id": call_id, "name": "refund", "arguments": {"order_id": order_id, "amount": amount}}]}

PLAN = {"kind": "plan", "summary": "refund A-1", "steps": [
    {"tool": "refund", "arguments": {"order_id": "A-1", "amount": 250}}]}

agent = Agent("shop", ScriptedModel([
    {"kind": "tool_calls", "calls": [{"id": "c1", "name": "look_up",
                                       "arguments": {"order_id": "A-1"}}]},
    PLAN,
    refund_call("c2", "A-1", 250),
    refund_call("c3", "A-2", 40),
    {"kind": "final", "answer": "refunded"},
]), [look_up, refund], Budget(max_repeated_plan=3), planning=Planning(approve_by="person"))

revising = Agent("shop", ScriptedModel([
    PLAN,
    {**PLAN, "summary": "refund A-1, less"},
    {"kind": "final", "answer": "gave up"},
]), [look_up, refund], planning=Planning())
'''


@pytest.fixture
def app(tmp_path: Path) -> Path:
    (tmp_path / "shop_app.py").write_text(APP)
    return tmp_path


def cli(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return run_cli(*args, cwd=folder, timeout=60)


def test_an_approved_plan_runs_its_write_and_a_write_outside_it_pauses(app: Path) -> None:
    paused = cli(app, "run", "shop_app:agent", "--goal", "refund A-1", "--id", "p1", "--json")
    assert paused.returncode == 3, paused.stderr
    record = json.loads(paused.stdout)
    assert record["reason"] == "plan_approval_required"
    assert record["plan"] == [
        {
            "step": 1,
            "tool": "refund",
            "arguments": {"order_id": "A-1", "amount": 250},
            "description": "",
        }
    ]
    assert not (app / "refunds.log").exists()

    wrong = cli(app, "approve", "p1", "--digest", "0" * 64, "--by", "eve")
    assert wrong.returncode == 2
    assert "is not the digest" in wrong.stderr

    outside = cli(
        app, "approve", "p1", "--digest", record["digest"], "--by", "alice",
        "--agent", "shop_app:agent", "--json",
    )  # fmt: skip
    assert outside.returncode == 3, outside.stderr
    waiting = json.loads(outside.stdout)
    assert waiting["reason"] == "approval_required"
    assert [(c["call_id"], c["needs_approval"]) for c in waiting["pending_calls"]] == [("c3", True)]
    # The planned write ran without a pause; the one outside the plan waits.
    assert (app / "refunds.log").read_text() == "A-1 250\n"

    done = cli(
        app, "approve", "p1", "--digest", waiting["digest"], "--by", "alice",
        "--agent", "shop_app:agent", "--json",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["reason"] == "completed"
    assert (app / "refunds.log").read_text() == "A-1 250\nA-2 40\n"


def test_a_plan_pause_reads_as_its_writes_and_digest_and_deny_sends_it_back(app: Path) -> None:
    paused = cli(app, "run", "shop_app:revising", "--goal", "refund A-1", "--id", "p2")
    assert paused.returncode == 3, paused.stderr
    lines = paused.stdout.splitlines()
    assert lines[:3] == [
        "plan_approval_required",
        "refund A-1",
        '  1. refund {"order_id": "A-1", "amount": 250}',
    ]
    assert lines[3].startswith("digest=")
    denied = cli(app, "deny", "p2", "--by", "bob", "--reason", "ask first")
    assert denied.returncode == 0, denied.stderr
    again = cli(app, "resume", "p2", "--agent", "shop_app:revising", "--json")
    assert again.returncode == 3, again.stderr
    revised = json.loads(again.stdout)
    assert revised["reason"] == "plan_approval_required"
    assert revised["detail"] == "refund A-1, less"
    assert revised["digest"] != lines[3].removeprefix("digest=")
    history = cli(app, "history", "p2", "--json")
    kinds = [json.loads(line)["type"] for line in history.stdout.splitlines()]
    assert kinds.count("PlanProposed") == 2
    assert "ApprovalDenied" in kinds
