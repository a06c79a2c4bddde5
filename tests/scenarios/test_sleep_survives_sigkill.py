"""A sleeping invocation outlives every process: real workers, real SIGKILL, real time.

The agent (``sleepers_app``) calls a write tool that sleeps until the time its goal
names (a few seconds ahead). Three ``loop-actors worker`` processes serve it; once it
sleeps, all three are killed with SIGKILL, and three new ones started. One of them wakes
it when it is due: exactly one ``SleepEnded`` is committed, the tool runs past its sleep
exactly once, and the invocation completes.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import trio

from loop_actors import EventStore, Runtime
from tests.support import sleepers_app
from tests.support.cli import CLI, cli_env, run_cli

pytestmark = pytest.mark.slow

HERE = Path(__file__).parents[1] / "support"
SLEEP_S = 12.0
"""How far ahead the tool sleeps: long enough for the first workers to be killed."""


class Folder:
    def __init__(self, path: Path) -> None:
        self.path = path
        shutil.copy(HERE / "sleepers_app.py", path / "sleepers_app.py")
        self.db = f"sqlite:///{path / 'run.db'}"
        self.log = path / "calls.log"
        self.env = {"SLEEPERS_LOG": str(self.log)}
        self.workers: list[subprocess.Popen[str]] = []

    def start_worker(self) -> subprocess.Popen[str]:
        process = subprocess.Popen(
            [*CLI, "worker", "--agent", "sleepers_app:agent", "--lease-s", "2", "--db", self.db],
            cwd=self.path,
            env=cli_env(**self.env),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.workers.append(process)
        return process

    def kinds(self, invocation_id: str) -> list[str]:
        store = EventStore(self.db, read_only=True)
        try:
            return [type(event).__name__ for event in store.events(invocation_id)]
        finally:
            store.close()

    def wait_for(self, invocation_id: str, kind: str, timeout_s: float) -> list[str]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            kinds = self.kinds(invocation_id)
            if kind in kinds:
                return kinds
            time.sleep(0.2)
        raise AssertionError(f"no {kind} in {invocation_id} after {timeout_s} s: {kinds}")

    def calls(self) -> list[str]:
        return self.log.read_text().splitlines() if self.log.exists() else []


@pytest.fixture
def folder(tmp_path: Path) -> Iterator[Folder]:
    made = Folder(tmp_path)
    try:
        yield made
    finally:
        for process in made.workers:
            if process.poll() is None:
                process.kill()
            process.communicate(timeout=10)


def test_a_sleeping_invocation_survives_the_sigkill_of_every_worker_and_wakes_once(
    folder: Folder, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SLEEPERS_LOG", str(folder.log))
    for _ in range(3):
        folder.start_worker()
    wake_at = datetime.now(UTC) + timedelta(seconds=SLEEP_S)

    async def submit() -> str:
        async with Runtime(folder.db) as runtime:
            return await runtime.submit(sleepers_app.agent, wake_at.isoformat(), invocation_id="s")

    trio.run(submit)
    kinds = folder.wait_for("s", "Paused", timeout_s=SLEEP_S - 2)
    assert "SleepEnded" not in kinds
    for process in folder.workers:
        process.send_signal(signal.SIGKILL)
    for process in folder.workers:
        process.wait(timeout=10)
    assert datetime.now(UTC) < wake_at  # all dead before it was due
    for _ in range(3):
        folder.start_worker()

    kinds = folder.wait_for("s", "Terminated", timeout_s=SLEEP_S + 30)

    assert kinds.count("SleepEnded") == 1
    assert kinds[-1] == "Terminated"
    calls = folder.calls()
    assert calls[0] == "start 1"
    assert [line for line in calls if line.startswith("after")] == [calls[-1]]  # once
    shown = run_cli("history", "s", "--json", cwd=folder.path, db=folder.db)
    records = [json.loads(line) for line in shown.stdout.splitlines()]
    [woke] = [r for r in records if r["type"] == "SleepEnded"]
    assert datetime.fromisoformat(woke["timestamp"]) >= wake_at
    ended = records[-1]
    assert ended["data"]["reason"] == "completed"
