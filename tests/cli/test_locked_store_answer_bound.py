"""A `loop-actors run` whose commit meets a held lock answers within the documented bound.

A commit is answered within the URL's ``lock_timeout + lock_retry``
(docs/reference/cli.md); the command used to go on waiting that long again for each
write of its close (the lease given back during the run, again at close, the holder
deregistered: three more lock timeouts) before it printed the outcome. Once a commit
failed, those writes are tried once without waiting: the leases run out by themselves.

A real process, a real SQLite file, its write lock held from this process (``BEGIN
EXCLUSIVE``) as another program could. Bad input tried: the store locked from the
moment the tool returns until well after the command has answered.
"""

from __future__ import annotations

import sqlite3
import subprocess
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


def test_a_run_whose_commit_meets_a_held_lock_exits_within_the_lock_bound(
    tmp_path: Path,
) -> None:
    (tmp_path / "agents.py").write_text(AGENT)
    db_file = tmp_path / "store.db"
    url = f"sqlite:///{db_file}?lock_timeout={LOCK_TIMEOUT_S}&lock_retry={LOCK_RETRY_S}"
    with Runtime(f"sqlite:///{db_file}") as runtime:  # the store exists before the lock
        runtime.open_sync()
    process = subprocess.Popen(
        [*CLI, "run", "agents:agent", "--goal", "g", "--id", "inv-1", "--db", url],
        cwd=tmp_path,
        env=cli_env(PYTHONPATH=str(tmp_path)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "inside").exists():
            assert process.poll() is None, process.communicate()
            assert time.monotonic() < deadline, "the tool never ran"
            time.sleep(0.01)
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
        env={"PYTHONPATH": str(tmp_path)},
    )
    assert resumed.returncode == 0, resumed.stderr
    assert resumed.stdout.splitlines()[:2] == ["completed", "done"]
