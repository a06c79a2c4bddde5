"""``submit``, ``list --status``, ``workers`` and ``worker``'s bad input, through the real CLI.

Bad inputs tried: an empty goal, an id in the runtime's namespace, an unknown agent, an
unknown status, a concurrency of 0, a lease of 0.5 s, a negative grace, one agent twice.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.cli_support import run_cli

APP = Path(__file__).parent / "scenarios" / "payments_app.py"


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
