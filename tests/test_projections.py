"""Read models: exactly once, rebuildable, live, and killable mid-batch."""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import trio

from loop_actors import (
    Agent,
    Budget,
    ModelRequest,
    Reconciled,
    Runtime,
    ScriptedModel,
    ToolContext,
    ToolError,
    tool,
)
from loop_actors._store import EventStore
from loop_actors._views import open_runner
from projections import list_open_effects, load_trajectory, metrics
from tests.cli_support import run_cli

TABLES = [
    "trajectory_invocations",
    "trajectory_steps",
    "trajectory_calls",
    "metrics_invocations",
    "metrics_failed_calls",
    "metrics_effects",
    "open_effects",
]


@tool
async def lookup(key: str) -> dict[str, str]:
    """Look up a key."""
    if key == "missing":
        raise ToolError("no such key")
    return {"key": key}


def _write_reconcile(key: str) -> Reconciled:
    raise ConnectionError("down")


@tool(effect="write", reconcile=_write_reconcile)
async def pay(amount: int, context: ToolContext) -> str:
    """Pay; amounts over 100 lose their reply."""
    if amount > 100:
        raise TimeoutError("reply lost")
    return f"paid {amount}"


def behaviour(kind: int) -> Any:
    """Six kinds of invocation, so that every read model sees every outcome."""

    def decide(request: ModelRequest) -> dict[str, Any]:
        step = request.step
        if kind == 0:  # completed after reads, one failing
            if step == 1:
                return {
                    "kind": "tool_calls",
                    "calls": [
                        {"id": "a", "name": "lookup", "arguments": {"key": "x"}},
                        {"id": "b", "name": "lookup", "arguments": {"key": "missing"}},
                    ],
                }
            return {"kind": "final", "answer": "done"}
        if kind == 1:  # no progress
            return {
                "kind": "tool_calls",
                "calls": [{"id": "a", "name": "lookup", "arguments": {"key": "same"}}],
            }
        if kind == 2:  # invalid decision
            return {"kind": "tool_calls", "calls": []}
        if kind == 3:  # paused for clarification
            return {"kind": "clarification", "question": "which?"}
        if kind == 4:  # a committed write, then done
            if step == 1:
                return {
                    "kind": "tool_calls",
                    "calls": [{"id": "p", "name": "pay", "arguments": {"amount": 5}}],
                }
            return {"kind": "final", "answer": "paid"}
        # a write whose reply is lost and whose service is down: paused, effect open
        return {
            "kind": "tool_calls",
            "calls": [{"id": "p", "name": "pay", "arguments": {"amount": 500}}],
        }

    return decide


AGENTS = [
    Agent(f"agent-{kind % 2}", ScriptedModel(behaviour(kind)), [lookup, pay], Budget(max_steps=4))
    for kind in range(6)
]


async def populate(url: str, start: int, count: int) -> None:
    async with Runtime(url) as runtime, trio.open_nursery() as nursery:
        for i in range(start, start + count):
            nursery.start_soon(
                partial(
                    runtime.run,
                    AGENTS[i % 6],
                    f"goal {i}",
                    invocation_id=f"inv-{i:05d}",
                    task_class=f"c{i % 3}",
                )
            )


def dump(views: Path) -> dict[str, list[tuple[Any, ...]]]:
    connection = sqlite3.connect(views)
    try:
        return {
            table: sorted(connection.execute(f"SELECT * FROM {table}").fetchall(), key=repr)  # noqa: S608
            for table in TABLES
        }
    finally:
        connection.close()


def test_rebuild_equals_incremental_on_thousands_of_mixed_invocations(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'events.db'}"
    store_views = tmp_path / "incremental.db"
    store = EventStore(url)
    runner = open_runner(store, str(store_views), batch_size=97)  # built on an empty store
    total = 0
    for wave in range(3):
        trio.run(populate, url, total, 400)
        total += 400
        reports = runner.catch_up()
        assert all(r.events > 0 for r in reports), wave
    runner.close()
    runner = open_runner(store, str(tmp_path / "rebuilt.db"))
    runner.rebuild()
    head = runner.head()
    assert [s.lag for s in runner.status()] == [0, 0, 0]
    runner.close()
    assert dump(store_views) == dump(tmp_path / "rebuilt.db")

    runner = open_runner(store, str(store_views))
    assert all(s.position == head for s in runner.status())
    by_reason = {row.group: row for row in metrics(runner, "reason")}
    assert by_reason["completed"].invocations == 400  # kinds 0 and 4
    assert by_reason["no_progress"].invocations == 200
    assert by_reason["no_progress"].repeated_plans == 0  # stopped before the repeat ran
    assert by_reason["invalid_decision"].invocations == 200
    assert by_reason["clarification_required"].invocations == 200
    assert by_reason["reconciliation_required"].invocations == 200
    assert by_reason["completed"].failed_calls == {"tool_failed": 200}
    assert by_reason["completed"].effects == {"committed": 200}
    assert by_reason["reconciliation_required"].effects == {"outcome_unknown": 200}
    assert sum(row.invocations for row in metrics(runner, "task-class")) == 1200
    assert len(list_open_effects(runner)) == 200
    trajectory = load_trajectory(runner, "inv-00004")
    assert trajectory is not None
    assert trajectory.steps[0].calls[0].effect_status == "committed"
    runner.close()
    store.close()


def cli(*args: str, cwd: Path, crash_at: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {"LOOP_ACTORS_CRASH_AT": crash_at} if crash_at else None
    return run_cli(*args, cwd=cwd, db="sqlite:///events.db", env=env)


def test_a_runner_killed_mid_batch_and_restarted_counts_nothing_twice(tmp_path: Path) -> None:
    trio.run(populate, f"sqlite:///{tmp_path / 'events.db'}", 0, 60)
    killed = cli(
        "projections", "catch-up", "metrics", "--batch-size", "50",
        cwd=tmp_path, crash_at="projection_batch_applied:3",
    )  # fmt: skip
    assert killed.returncode == -signal.SIGKILL
    status = cli("projections", "status", "metrics", "--json", cwd=tmp_path)
    (position,) = [json.loads(line)["position"] for line in status.stdout.splitlines()]
    head = json.loads(status.stdout)["head"]
    assert position == 100  # two whole batches; the third died with its transaction
    assert head > 100

    resumed = cli("projections", "catch-up", "--batch-size", "50", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    incremental = dump(tmp_path / "events.views.db")
    rebuilt = cli("projections", "rebuild", cwd=tmp_path)
    assert rebuilt.returncode == 0, rebuilt.stderr
    assert dump(tmp_path / "events.views.db") == incremental
    by_reason = json.loads(
        cli("metrics", "--by", "agent", "--json", cwd=tmp_path).stdout.splitlines()[0]
    )
    assert by_reason["invocations"] == 30


async def test_a_runtime_following_projections_keeps_them_caught_up(db_url: str) -> None:
    async with Runtime(db_url, follow_projections=True) as runtime:
        assert runtime.projections is not None
        for i in range(5):
            await runtime.run(AGENTS[0], "g", invocation_id=f"live-{i}")
        with trio.fail_after(10):
            while runtime.projections.status()[0].lag:  # noqa: ASYNC110 - polls a database
                await trio.sleep(0.01)
        rows = metrics(runtime.projections, "reason")
    assert [(r.group, r.invocations) for r in rows] == [("completed", 5)]


@pytest.mark.parametrize(
    "args",
    [
        ("show", "inv-00000"),
        ("list",),
        ("list", "--reason", "completed", "--agent", "agent-0"),
        ("metrics", "--by", "task-class"),
        ("effects",),
        ("projections", "status"),
    ],
)
def test_read_model_commands_print_json_lines(tmp_path: Path, args: tuple[str, ...]) -> None:
    trio.run(populate, f"sqlite:///{tmp_path / 'events.db'}", 0, 12)
    result = cli(*args, "--json", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    assert lines
    text = cli(*args, cwd=tmp_path)
    assert text.returncode == 0
    assert text.stdout.strip()


def test_list_filters_by_reason_and_agent(tmp_path: Path) -> None:
    trio.run(populate, f"sqlite:///{tmp_path / 'events.db'}", 0, 12)
    result = cli("list", "--reason", "no_progress", "--json", cwd=tmp_path)
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert {r["reason"] for r in rows} == {"no_progress"}
    assert len(rows) == 2


def test_show_of_an_unknown_invocation_is_a_usage_error(tmp_path: Path) -> None:
    trio.run(populate, f"sqlite:///{tmp_path / 'events.db'}", 0, 2)
    result = cli("show", "nobody", cwd=tmp_path)
    assert result.returncode == 2
    assert "nobody" in result.stderr


def test_show_json_counts_the_invocations_events(tmp_path: Path) -> None:
    trio.run(populate, f"sqlite:///{tmp_path / 'events.db'}", 0, 1)
    shown = json.loads(cli("show", "inv-00000", "--json", cwd=tmp_path).stdout)
    history = cli("history", "inv-00000", "--json", cwd=tmp_path).stdout.splitlines()
    assert shown["events"] == len(history) > 0
