"""A parent SIGKILLed with its children under way: resumed, each child exists once, each charge once.

The parent (``children_app:BOSS``) runs in a real ``loop-actors run`` process and starts
two ``payer`` children at once; each charges a service that does **not** deduplicate
(``$CHARGES_FILE``: one line per charge), then waits (the ``.hang`` switch). With both
charges made and neither recorded, the process is killed with SIGKILL. A resume in a
new process must find both children (never start a third), settle each charge by asking
the service (never charge again), and complete the parent. The same when a child is
finished by hand while the parent is down: the parent then reads its recorded outcome.
And an orchestration tool that fans out three children from code, killed mid-way.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import trio

from aggregates.children import child_id_of
from aggregates.invocation import BatchDispatched
from loop_actors import Runtime
from tests.support.cli import CLI, cli_env, run_cli

pytestmark = pytest.mark.slow

APP = Path(__file__).parents[1] / "support" / "children_app.py"


def workspace(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    (tmp_path / "children_app.py").write_text(APP.read_text())
    return tmp_path, {"CHARGES_FILE": str(tmp_path / "charges.txt")}


def charges(folder: Path) -> list[tuple[str, int]]:
    path = folder / "charges.txt"
    if not path.exists():
        return []
    return [(k, int(a)) for k, a in (line.split() for line in path.read_text().splitlines())]


def run_until_charged(folder: Path, env: dict[str, str], agent: str, count: int) -> None:
    """Start ``loop-actors run`` and SIGKILL it once ``count`` charges are made and waiting."""
    (folder / "charges.txt.hang").touch()
    process = subprocess.Popen(
        [*CLI, "run", agent, "--goal", "pay them", "--id", "root", "--db", "sqlite:///run.db"],
        cwd=folder,
        env=cli_env(**env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while len(charges(folder)) < count:
            assert process.poll() is None, process.communicate()
            assert time.monotonic() < deadline, "the children did not charge in time"
            time.sleep(0.05)
        os.kill(process.pid, signal.SIGKILL)
        assert process.wait(timeout=30) == -signal.SIGKILL
    finally:
        if process.poll() is None:
            process.kill()
        process.communicate()
    (folder / "charges.txt.hang").unlink()


def tree(folder: Path) -> dict[str, Any]:
    """The root and every invocation whose parent is the root, read from the store."""

    async def read() -> dict[str, Any]:
        async with Runtime(f"sqlite:///{folder / 'run.db'}") as runtime:
            events = await runtime.history("root")
            child_ids = [
                call.child_id
                for event in events
                if isinstance(event, BatchDispatched)
                for call in event.calls
                if call.child_id
            ]
            children = {cid: await runtime.history(cid) for cid in child_ids}
            return {"root": events, "children": children}

    return trio.run(read)


def resume(folder: Path, env: dict[str, str], invocation: str, agent: str) -> dict[str, Any]:
    done = run_cli(
        "resume", invocation, "--agent", agent, "--take-over", "--json",
        cwd=folder, db="sqlite:///run.db", env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    outcome: dict[str, Any] = json.loads(done.stdout)
    return outcome


def test_a_parent_killed_after_its_children_charged_resumes_without_charging_twice(
    tmp_path: Path,
) -> None:
    folder, env = workspace(tmp_path)
    run_until_charged(folder, env, "children_app:BOSS", 2)
    assert sorted(a for _, a in charges(folder)) == [10, 20]

    outcome = resume(folder, env, "root", "children_app:BOSS")
    assert (outcome["reason"], outcome["answer"]) == ("completed", "both paid")
    assert outcome["children"]["tool_calls"] == 2
    # Each charge made once, under its one effect key; each child started once.
    assert sorted(a for _, a in charges(folder)) == [10, 20]
    found = tree(folder)
    assert len(found["children"]) == 2
    for history in found["children"].values():
        kinds = [type(e).__name__ for e in history]
        assert kinds.count("InvocationStarted") == 1
        assert kinds[-1] == "Terminated"
        assert history[-1].reason.value == "completed"


def test_the_children_a_resumed_parent_finds_unfinished_run_at_once(tmp_path: Path) -> None:
    """Killed with both children charged; resumed, each must meet the other to finish."""
    folder, env = workspace(tmp_path)
    run_until_charged(folder, env, "children_app:MEETING_BOSS", 2)
    (folder / "charges.txt.meet").touch()
    outcome = resume(folder, env, "root", "children_app:MEETING_BOSS")
    # One child driven to its end before the other starts would wait 20 s in vain.
    assert (outcome["reason"], outcome["answer"]) == ("completed", "met met")
    assert sorted(a for _, a in charges(folder)) == [10, 20]


def test_a_child_finished_while_its_parent_was_down_gives_its_recorded_outcome(
    tmp_path: Path,
) -> None:
    folder, env = workspace(tmp_path)
    run_until_charged(folder, env, "children_app:BOSS", 2)
    found = tree(folder)
    child_ids = list(found["children"])
    assert len(child_ids) == 2
    # Both children are finished by hand while the parent is down.
    for child_id in child_ids:
        finished = resume(folder, env, child_id, "children_app:PAYER")
        assert finished["reason"] == "completed"
        assert finished["parent_id"] == "root"
    lengths = {cid: len(h) for cid, h in tree(folder)["children"].items()}

    outcome = resume(folder, env, "root", "children_app:BOSS")
    assert outcome["reason"] == "completed"
    assert sorted(a for _, a in charges(folder)) == [10, 20]
    after = tree(folder)["children"]
    assert {cid: len(h) for cid, h in after.items()} == lengths  # not driven again


def test_an_orchestration_tool_killed_mid_fan_out_starts_each_child_once(tmp_path: Path) -> None:
    folder, env = workspace(tmp_path)
    run_until_charged(folder, env, "children_app:ORCHESTRATOR", 3)
    outcome = resume(folder, env, "root", "children_app:ORCHESTRATOR")
    assert (outcome["reason"], outcome["answer"]) == ("completed", "fanned out")
    assert sorted(a for _, a in charges(folder)) == [1, 2, 3]

    async def kids() -> tuple[list[Any], list[list[Any]]]:
        async with Runtime(f"sqlite:///{folder / 'run.db'}") as runtime:
            events = list(await runtime.history("root"))
            key = next(e for e in events if isinstance(e, BatchDispatched)).calls[0].effect_key
            assert key is not None
            ids = [child_id_of(key, f"pay-{a}") for a in (1, 2, 3)]
            return events, [list(await runtime.history(child_id)) for child_id in ids]

    parent, children = trio.run(kids)
    for history in children:
        assert [type(e).__name__ for e in history].count("InvocationStarted") == 1
        assert history[-1].reason.value == "completed"
    # Each child's share was set aside once, before it started (the killed run recorded
    # them; the resumed run found them), and came back once.
    ids = sorted(history[0].originator_id for history in children)
    reserved = [e.child_id for e in parent if type(e).__name__ == "BudgetReserved"]
    returned = [e.child_id for e in parent if type(e).__name__ == "BudgetReturned"]
    assert sorted(reserved) == ids
    assert sorted(returned) == ids


@pytest.mark.parametrize("crash_at", ["after_start_commit:2", "after_write_returned:1"])
def test_a_handoff_killed_as_its_target_starts_or_writes_is_followed_once(
    tmp_path: Path, crash_at: str
) -> None:
    """``run`` SIGKILLed as the target's start is committed, or as its refund returned."""
    folder, env = workspace(tmp_path)
    crashed = run_cli(
        "run", "children_app:TRIAGE", "--goal", "refund me", "--id", "root", "--json",
        cwd=folder, db="sqlite:///run.db", env={**env, "LOOP_ACTORS_CRASH_AT": crash_at},
    )  # fmt: skip
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr
    outcome = resume(folder, env, "root", "children_app:TRIAGE")
    assert (outcome["reason"], outcome["answer"]) == ("completed", "refunded 40")
    assert outcome["chain"][0] == "root"
    assert len(outcome["chain"]) == 2
    assert [amount for _, amount in charges(folder)] == [-40]  # refunded once
    again = resume(folder, env, "root", "children_app:TRIAGE")
    assert again == outcome
