"""A `loop-actors run` whose commit meets a held lock answers within the documented bound.

A commit is answered within the URL's ``lock_timeout + lock_retry``
(docs/reference/cli.md; 5 + 2 = 7 s with the defaults); the command used to go on
waiting that long again for each write of its close (the lease given back during the
run, again at close, the holder deregistered: three more lock timeouts, 23 s in all)
before it printed the outcome. Once a commit failed, those writes are tried once
without waiting: the leases run out by themselves.

Real processes, a real SQLite file, its write lock held by another process (``BEGIN
EXCLUSIVE``) as another program could. Bad input tried: the store locked from the
moment the tool returns until well after the command has answered.
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

from loop_actors import Runtime
from tests.support.cli import CLI, cli_env, run_cli

LOCK_TIMEOUT_S = 2
LOCK_RETRY_S = 0.5
BOUND_S = 2 * LOCK_TIMEOUT_S + LOCK_RETRY_S + 1.5
"""The commit's wait (a lock timeout and the retry window; a commit queued behind its
group's first attempt may wait about one timeout more), plus time for the process to
print and exit. Three more lock timeouts (the close's writes, each waiting) exceed it."""

REPO = Path(__file__).resolve().parents[2]


def _path(tmp_path: Path) -> str:
    """The agent's folder, then this tree (a worktree's, not the installed one)."""
    return f"{tmp_path}{os.pathsep}{REPO}"


DEFAULT_LOCK_TIMEOUT_S = 5
DEFAULT_LOCK_RETRY_S = 2
SLACK_S = 2.5
"""Time for the process to print its outcome and exit on a loaded machine: less than
one more lock timeout, so a write that waited once more after the failed commit fails."""

BLOCKER = """
import pathlib, sqlite3, sys, time
blocker = sqlite3.connect(sys.argv[1], isolation_level=None)
blocker.execute("BEGIN EXCLUSIVE")
pathlib.Path("locked").write_text("1")
deadline = time.monotonic() + 120
while not pathlib.Path("release").exists() and time.monotonic() < deadline:
    time.sleep(0.01)
blocker.rollback()
"""
"""Another process that holds the store's write lock until ``release`` appears."""

AGENT = '''
import pathlib, time
from loop_actors import Agent, ScriptedModel, tool

@tool
def wait_for_the_lock(key: str) -> str:
    """Say that the tool runs, then wait until the test holds the store's lock."""
    pathlib.Path("inside").write_text("1")
    while not pathlib.Path("locked").exists():
        time.sleep(0.01)
    return key

model = ScriptedModel([
    {"kind": "tool_calls",
     "calls": [{"id": "c1", "name": "wait_for_the_lock", "arguments": {"key": "k"}}]},
    {"kind": "final", "answer": "done"},
])
agent = Agent("locked", model, tools=[wait_for_the_lock])
'''


def _run_until_its_tool_runs(tmp_path: Path, url: str) -> subprocess.Popen[str]:
    """Start ``loop-actors run`` on a new store at ``url``; return once its tool runs."""
    (tmp_path / "agents.py").write_text(AGENT)
    with Runtime(url.partition("?")[0]) as runtime:  # the store exists before the lock
        runtime.open_sync()
    process = subprocess.Popen(
        [*CLI, "run", "agents:agent", "--goal", "g", "--id", "inv-1", "--db", url],
        cwd=tmp_path,
        env=cli_env(PYTHONPATH=_path(tmp_path)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 60
    while not (tmp_path / "inside").exists():
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            raise AssertionError(("the tool never ran", process.communicate()))
        time.sleep(0.01)
    return process


def test_a_run_whose_commit_meets_a_held_lock_exits_within_the_lock_bound(
    tmp_path: Path,
) -> None:
    db_file = tmp_path / "store.db"
    url = f"sqlite:///{db_file}?lock_timeout={LOCK_TIMEOUT_S}&lock_retry={LOCK_RETRY_S}"
    process = _run_until_its_tool_runs(tmp_path, url)
    try:
        blocker = sqlite3.connect(db_file, isolation_level=None)
        blocker.execute("BEGIN EXCLUSIVE")
        locked_at = time.monotonic()
        (tmp_path / "locked").write_text("1")
        out, err = process.communicate(timeout=60)
        answered_after = time.monotonic() - locked_at
        blocker.rollback()
        blocker.close()
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()

    assert process.returncode == 4, (out, err)
    assert out.splitlines()[0] == "checkpoint_failed", out
    assert answered_after < BOUND_S, (answered_after, err)
    assert answered_after >= LOCK_TIMEOUT_S  # it did wait for the lock
    # Nothing after the failed commit was lost: the run resumes from it, the tool once more.
    resumed = run_cli(
        "resume",
        "inv-1",
        "--agent",
        "agents:agent",
        cwd=tmp_path,
        db=url,
        env={"PYTHONPATH": _path(tmp_path)},
    )
    assert resumed.returncode == 0, resumed.stderr
    assert resumed.stdout.splitlines()[:2] == ["completed", "done"]


def test_with_the_default_url_a_locked_commit_is_answered_within_lock_timeout_and_retry(
    tmp_path: Path,
) -> None:
    """The documented bound itself: 5 + 2 s with a plain URL, the lock held by another
    process; the outcome line names both waits."""
    db_file = tmp_path / "store.db"
    process = _run_until_its_tool_runs(tmp_path, f"sqlite:///{db_file}")
    blocker: subprocess.Popen[str] | None = None
    try:
        deadline = time.monotonic() + 60
        blocker = subprocess.Popen(
            [sys.executable, "-c", BLOCKER, str(db_file)], cwd=tmp_path, text=True
        )
        while not (tmp_path / "locked").exists():  # the tool returns once it appears
            assert blocker.poll() is None, "the blocker could not take the lock"
            assert time.monotonic() < deadline, "the blocker never took the lock"
            time.sleep(0.01)
        locked_at = time.monotonic()
        out, err = process.communicate(timeout=60)
        answered_after = time.monotonic() - locked_at
    finally:
        (tmp_path / "release").write_text("1")
        if process.poll() is None:
            process.kill()
            process.communicate()
        if blocker is not None:
            blocker.wait(timeout=30)

    assert process.returncode == 4, (out, err)
    assert out.splitlines()[0] == "checkpoint_failed", out
    assert answered_after >= DEFAULT_LOCK_TIMEOUT_S  # it did wait for the lock
    assert answered_after < DEFAULT_LOCK_TIMEOUT_S + DEFAULT_LOCK_RETRY_S + SLACK_S, (
        answered_after,
        err,
    )
    assert (
        f"still locked after waiting {DEFAULT_LOCK_TIMEOUT_S} s "
        f"and retrying for {DEFAULT_LOCK_RETRY_S} s" in err
    ), err
