"""``submit``, ``list --status``, ``workers`` and ``worker``'s bad input, through the real CLI.

Bad inputs tried: an empty goal, an id in the runtime's namespace, an unknown agent, an
unknown status, a concurrency of 0, a lease of 0.5 s, a negative grace, one agent twice.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.support.cli import run_cli

pytestmark = pytest.mark.slow

APP = Path(__file__).parents[1] / "support" / "payments_app.py"


@pytest.fixture
def project(tmp_path: Path) -> Path:
    shutil.copy(APP, tmp_path / "payments_app.py")
    return tmp_path


def cli(project: Path, *args: str) -> tuple[int, str, str]:
    result = run_cli(*args, cwd=project, db="sqlite:///run.db")
    return result.returncode, result.stdout, result.stderr


def test_submit_prints_the_id_records_it_runnable_and_again_records_nothing(project: Path) -> None:
    code, out, err = cli(project, "submit", "payments_app:agent", "--goal", "pay", "--id", "s-1")
    assert (code, out, err) == (0, "s-1\n", "")
    code, out, _ = cli(
        project, "submit", "payments_app:agent", "--goal", "pay", "--id", "s-1", "--json"
    )
    assert (code, json.loads(out)) == (0, {"invocation_id": "s-1"})
    code, out, _ = cli(project, "submit", "payments_app:agent", "--goal", "pay", "--json")
    generated = json.loads(out)["invocation_id"]
    code, out, _ = cli(project, "list", "--status", "runnable", "--json")
    assert code == 0
    rows = [json.loads(line) for line in out.splitlines()]
    assert sorted(row["invocation_id"] for row in rows) == sorted(["s-1", generated])
    assert {row["queue_status"] for row in rows} == {"runnable"}
    code, out, _ = cli(project, "list", "--status", "ended", "--json")
    assert (code, out) == (0, "")
    code, out, _ = cli(project, "history", "s-1", "--json")
    assert [json.loads(line)["type"] for line in out.splitlines()] == ["InvocationStarted"]
    # Nothing holds a lease: no live holder.
    code, out, _ = cli(project, "workers", "--json")
    assert (code, out) == (0, "")


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["submit", "payments_app:agent", "--goal", "  "], "--goal must not be empty"),
        (["submit", "payments_app:agent", "--goal", "g", "--id", "eff-1"], "eff-"),
        (["submit", "no_such_module:agent", "--goal", "g"], "cannot import module"),
        (["list", "--status", "running"], "invalid choice"),
        (["worker", "--agent", "payments_app:agent", "--concurrency", "0"], "at least 1"),
        (["worker", "--agent", "payments_app:agent", "--lease-s", "0.5"], "at least 1 second"),
        (["worker", "--agent", "payments_app:agent", "--grace-s", "-1"], "finite number"),
        (
            ["worker", "--agent", "payments_app:agent", "--agent", "payments_app:agent"],
            "two agents of one name",
        ),
    ],
)
def test_bad_queue_input_is_one_line_exit_2_and_writes_nothing(
    project: Path, args: list[str], says: str
) -> None:
    code, out, err = cli(project, *args)
    assert code == 2, err
    assert says in err
    assert len(err.strip().splitlines()) == 1
    assert out == ""
    assert not (project / "run.db").exists()


def test_workers_shows_a_killed_holder_not_alive_and_a_run_out_lease_not_held(
    project: Path,
) -> None:
    """Bad input: a worker whose process is gone (its pid dead on this machine) while its
    heartbeat is recent, holding one lease that ran out and one that still runs."""
    import subprocess
    import time

    import trio

    from aggregates.lease import HolderKind, HolderRow
    from loop_actors import Runtime
    from loop_actors.runtime.leases import machine_identity
    from tests.support.workers import AGENT

    gone = subprocess.Popen(["true"])
    gone.wait()  # its pid names no process now
    holder = "worker:host-x:dead:1"

    async def setup() -> None:
        async with Runtime(f"sqlite:///{project / 'run.db'}") as runtime:
            for name in ("q-short", "q-long"):
                await runtime.submit(AGENT, name, invocation_id=name)
            keeper = runtime._lease_keeper()
            queue = keeper.queue
            row = HolderRow(
                holder=holder,
                kind=HolderKind.WORKER,
                host="host-x",
                machine=machine_identity(),
                pid=gone.pid,
                started_at=0.0,
                heartbeat_at=0.0,
                lease_s=30.0,
                agents=[AGENT.name],
            )
            await keeper.call(queue.register, row)
            for lease_s in (1.0, 600.0):
                claimed = await keeper.call(
                    lambda s=lease_s: queue.claim(
                        holder=holder, agent_names=[AGENT.name], limit=1, lease_s=s
                    )
                )
                assert len(claimed) == 1

    trio.run(setup)
    time.sleep(1.2)  # the 1 s lease runs out
    code, out, _ = cli(project, "workers", "--json")
    assert code == 0
    records = {r["holder"]: r for r in map(json.loads, out.splitlines())}
    dead = records[holder]
    assert dead["alive"] is False
    assert [lease["invocation_id"] for lease in dead["leases"]] == ["q-long"]
    assert [lease["invocation_id"] for lease in dead["expired_leases"]] == ["q-short"]
    code, out, _ = cli(project, "workers")
    assert code == 0
    assert "0 live holder(s), 1 lease(s) held, 1 run out (to be taken over)" in out
    assert "q-short (epoch 1, ran out)" in out
