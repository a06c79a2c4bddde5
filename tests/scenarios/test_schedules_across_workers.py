"""A schedule run by worker processes, killed and started, on SQLite and PostgreSQL.

Real processes and real time: ``--every 2s`` stands in for "every minute", about a
dozen seconds for "five minutes". The first worker is told to die (SIGKILL) right after
its first check decides runs, before it submits them; then two workers run, one is
SIGKILLed half-way and another started. Every due time from the first to the
schedule's next is submitted exactly once, under its id (``tick@TIME``), and each run
completes: none is missing, none doubled, whichever worker submitted it. The schedule
catches up on all and allows overlaps, so that which due times are run does not hang on
how long the processes take to start (the policies' rules: tests/aggregates).
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest

from aggregates.schedules import Schedule
from loop_actors import EventStore
from tests.support.cli import CLI, cli_env, kill_all, run_cli
from tests.support.waiting import wait_until

pytestmark = pytest.mark.slow

APP = """
from loop_actors import Agent, ScriptedModel

agent = Agent("ticker", ScriptedModel(lambda request: {"kind": "final", "answer": request.goal}))
"""
EVERY_S = 2


class Folder:
    def __init__(self, path: Path, db: str) -> None:
        self.path = path
        (path / "app.py").write_text(APP)
        self.db = db
        self.workers: list[subprocess.Popen[str]] = []

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        done = run_cli(*args, cwd=self.path, db=self.db)
        assert done.returncode == 0, done.stderr
        return done

    def start_worker(self, **env: str) -> subprocess.Popen[str]:
        process = subprocess.Popen(
            [*CLI, "worker", "--agent", "app:agent", "--lease-s", "2", "--db", self.db],
            cwd=self.path,
            env=cli_env(**env),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.workers.append(process)
        return process

    def row(self) -> Schedule:
        store = EventStore(self.db, read_only=True)
        try:
            queue = store.open_queue()
            try:
                [row] = queue.schedules()[0]
                return row
            finally:
                queue.close()
        finally:
            store.close()

    def reasons(self) -> set[str]:
        store = EventStore(self.db, read_only=True)
        try:
            return {
                str(getattr(store.events(invocation_id)[-1], "reason", None))
                for invocation_id in store.invocation_ids()
            }
        finally:
            store.close()

    def runs(self) -> dict[str, list[str]]:
        """The schedule's invocations: the kinds of their events."""
        store = EventStore(self.db, read_only=True)
        try:
            return {
                invocation_id: [type(event).__name__ for event in store.events(invocation_id)]
                for invocation_id in store.invocation_ids()
                if invocation_id.startswith("tick@")
            }
        finally:
            store.close()


@pytest.fixture
def folder(tmp_path: Path, store_url: str) -> Iterator[Folder]:
    made = Folder(tmp_path, store_url)
    yield made  # pytest runs what follows whether the test passed or not
    kill_all(made.workers)


def test_every_due_time_is_submitted_once_through_a_crash_and_a_sigkill(folder: Folder) -> None:
    added = json.loads(
        folder.cli("schedule", "add", "tick", "--agent", "app:agent", "--goal", "tick",
                   "--every", f"{EVERY_S}s", "--overlap", "allow", "--catch-up", "all",
                   "--json").stdout
    )  # fmt: skip
    first_due = datetime.fromisoformat(added["next_due"])
    dying = folder.start_worker(LOOP_ACTORS_CRASH_AT="after_schedule_decided")
    assert dying.wait(timeout=30) == -signal.SIGKILL  # it decided runs, and died
    assert folder.row().submitting  # decided, not submitted
    folder.start_worker()
    victim = folder.start_worker()
    time.sleep(2 * EVERY_S)
    victim.send_signal(signal.SIGKILL)
    assert victim.wait(timeout=10) == -signal.SIGKILL
    folder.start_worker()
    time.sleep(2 * EVERY_S)
    folder.cli("schedule", "pause", "tick")  # no due time is decided after this
    # The runs the dying worker decided are submitted by another, RESUBMIT_AFTER_S on.
    wait_until(lambda: not folder.row().submitting, 30, "every decided run submitted")
    wait_until(
        lambda: all(kinds[-1] == "Terminated" for kinds in folder.runs().values()),
        30,
        "every run ended",
    )

    row = folder.row()
    runs = folder.runs()

    dues = range(int(first_due.timestamp()), row.next_due, EVERY_S)
    assert len(dues) >= 5
    assert sorted(runs) == [row.invocation_id(due) for due in dues]  # each once, none missing
    assert row.runs == len(dues)
    assert row.submitting == ()
    for invocation_id, kinds in runs.items():
        assert kinds.count("InvocationStarted") == 1, invocation_id
        assert kinds.count("Terminated") == 1, invocation_id
    assert folder.reasons() == {"completed"}
