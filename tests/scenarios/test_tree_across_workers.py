"""A tree of invocations spread over worker processes, with SIGKILLs, on SQLite and PostgreSQL.

Real processes, real SIGKILL. The parent's worker has one slot (its run), so another
worker, which serves only the child's agent, claims the two children its batch submits;
both charge a service that keeps no idempotency keys, and wait. The parent's worker is
SIGKILLed there; the children finish where they run; a new worker takes the parent over
(its reconciliation finds each child and its outcome): each child started once, each
charge made once, the tree completed.

A worker SIGKILLed right after its run ended ``handed_off`` (``before_handoff_submit``:
the source's end is durable, its target not submitted) leaves the source's row claimed;
the next worker claims it, submits the target once and drives it.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from aggregates.handoffs import handoff_id_of
from aggregates.invocation import BatchDispatched
from loop_actors import EventStore
from tests.support.cli import CLI, cli_env, kill_all, run_cli
from tests.support.waiting import wait_until

pytestmark = pytest.mark.slow

APP = Path(__file__).parents[1] / "support" / "children_app.py"


class Folder:
    """A folder with the children app, a store, and the workers started on it."""

    def __init__(self, path: Path, db: str) -> None:
        self.path = path
        (path / "children_app.py").write_text(APP.read_text())
        self.db = db
        self.env = {"CHARGES_FILE": str(path / "charges.txt")}
        self.workers: list[subprocess.Popen[str]] = []

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        done = run_cli(*args, cwd=self.path, db=self.db, env=self.env)
        assert done.returncode == 0, done.stderr
        return done

    def start_worker(
        self, agent: str, *, concurrency: int = 4, **env: str
    ) -> subprocess.Popen[str]:
        process = subprocess.Popen(
            [
                *CLI, "worker", "--agent", agent, "--concurrency", str(concurrency),
                "--lease-s", "3", "--db", self.db,
            ],
            cwd=self.path,
            env=cli_env(**self.env, **env),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        self.workers.append(process)
        return process

    def charges(self) -> list[int]:
        path = self.path / "charges.txt"
        if not path.exists():
            return []
        return sorted(int(line.split()[1]) for line in path.read_text().splitlines())

    def kinds(self, invocation_id: str) -> list[str]:
        """The kinds of an invocation's events ([] if it does not exist)."""
        store = EventStore(self.db, read_only=True)
        try:
            if invocation_id not in store.invocation_ids():
                return []
            return [type(event).__name__ for event in store.events(invocation_id)]
        finally:
            store.close()

    def children_of(self, invocation_id: str) -> list[str]:
        store = EventStore(self.db, read_only=True)
        try:
            return [
                call.child_id
                for event in store.events(invocation_id)
                if isinstance(event, BatchDispatched)
                for call in event.calls
                if call.child_id
            ]
        finally:
            store.close()

    def holders(self, invocation_ids: list[str]) -> list[str | None]:
        store = EventStore(self.db, read_only=True)
        try:
            queue = store.open_queue()
            try:
                return [
                    row.holder if (row := queue.row(invocation_id)) is not None else None
                    for invocation_id in invocation_ids
                ]
            finally:
                queue.close()
        finally:
            store.close()


@pytest.fixture
def folder(tmp_path: Path, store_url: str) -> Iterator[Folder]:
    made = Folder(tmp_path, store_url)
    yield made  # pytest runs what follows whether the test passed or not
    kill_all(made.workers)


def stop(process: subprocess.Popen[str]) -> str:
    """SIGTERM a worker and give its report (stdout); it must exit 0."""
    process.send_signal(signal.SIGTERM)
    out, err = process.communicate(timeout=60)
    assert process.returncode == 0, err
    return out


def started(process: subprocess.Popen[str], folder: Folder) -> None:
    """Wait until the worker has registered (``loop-actors workers`` lists its pid)."""

    def listed() -> bool:
        assert process.poll() is None, process.communicate()
        done = run_cli("workers", "--json", cwd=folder.path, db=folder.db)
        return done.returncode == 0 and f'"pid": {process.pid}' in done.stdout

    wait_until(listed, 60, "the worker to register")


def test_a_parents_worker_killed_while_its_children_run_on_another_worker_charges_once(
    folder: Folder,
) -> None:
    folder.cli("submit", "children_app:BOSS", "--goal", "pay them", "--id", "root")
    hang = folder.path / "charges.txt.hang"
    hang.touch()  # each child charges, then waits until the file is gone
    children = folder.start_worker("children_app:PAYER")
    started(children, folder)
    parents = folder.start_worker("children_app:BOSS", concurrency=1)
    wait_until(lambda: len(folder.charges()) == 2, 60, "both children to charge")
    child_ids = folder.children_of("root")
    assert len(child_ids) == 2
    holders = folder.holders(child_ids)
    assert all(h is not None and f":{children.pid}:" in h for h in holders), holders
    os.kill(parents.pid, signal.SIGKILL)
    assert parents.wait(timeout=30) == -signal.SIGKILL

    hang.unlink()  # the children finish where they run, their parent's worker gone
    wait_until(lambda: all(folder.kinds(c)[-1:] == ["Terminated"] for c in child_ids), 60, "ends")
    again = folder.start_worker("children_app:BOSS")
    wait_until(lambda: folder.kinds("root")[-1:] == ["Terminated"], 60, "the parent to end")
    assert "outcomes: completed=1" in stop(again)
    assert "outcomes: completed=2" in stop(children)

    assert folder.charges() == [10, 20]  # each once, though the service would charge twice
    for child_id in child_ids:
        assert folder.kinds(child_id).count("InvocationStarted") == 1
    shown = folder.cli("show", "root").stdout
    assert "completed" in shown


def test_a_worker_killed_before_it_submits_a_handoffs_target_leaves_it_to_the_next(
    folder: Folder,
) -> None:
    folder.cli("submit", "children_app:TRIAGE", "--goal", "my refund", "--id", "t")
    dying = folder.start_worker("children_app:TRIAGE", LOOP_ACTORS_CRASH_AT="before_handoff_submit")
    assert dying.wait(timeout=60) == -signal.SIGKILL, dying.communicate()
    assert folder.kinds("t")[-1] == "Terminated"
    assert folder.kinds(handoff_id_of("t")) == []  # not submitted: the worker died first

    again = folder.start_worker("children_app:TRIAGE")
    target = handoff_id_of("t")
    wait_until(lambda: folder.kinds(target)[-1:] == ["Terminated"], 60, "the target to end")
    assert "completed=1" in stop(again)  # the target (and the source's row, left ended)
    assert folder.kinds(target).count("InvocationStarted") == 1
    assert folder.charges() == [-40]
