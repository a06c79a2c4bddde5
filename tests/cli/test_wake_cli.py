"""``loop-actors run`` of an agent that sleeps, ``loop-actors wake``, and ``worker --rate-limit``.

Bad inputs tried: a wake of an invocation that does not sleep (any more), of one that
does not exist, and a wake with no --by; a --rate-limit of two fields, with a count that is
not a number, with neither count, with a count of 0.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from tests.support.cli import run_in_process, sleepers_folder


@pytest.fixture
def folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    return sleepers_folder(tmp_path, monkeypatch)


def test_run_json_says_the_invocation_sleeps_and_until_when(
    folder: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    db = f"sqlite:///{folder / 'run.db'}"
    wake_at = (datetime.now(UTC) + timedelta(days=1)).replace(microsecond=0)

    ran = run_in_process(
        "run",
        "sleepers_app:agent",
        "--goal",
        wake_at.isoformat(),
        "--id",
        "s-1",
        "--json",
        cwd=folder,
        db=db,
        capsys=capsys,
        monkeypatch=monkeypatch,
    )

    assert ran.returncode == 3, ran.stderr
    outcome = json.loads(ran.stdout)
    assert outcome["reason"] == "sleeping"
    assert datetime.fromisoformat(outcome["wake_at"]) == wake_at


def test_wake_wakes_it_early_and_a_second_wake_is_refused(
    folder: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    db = f"sqlite:///{folder / 'run.db'}"
    wake_at = datetime.now(UTC) + timedelta(days=1)

    def cli(*args: str) -> tuple[int, str, str]:
        done = run_in_process(*args, cwd=folder, db=db, capsys=capsys, monkeypatch=monkeypatch)
        return done.returncode, done.stdout, done.stderr

    assert cli("run", "sleepers_app:agent", "--goal", wake_at.isoformat(), "--id", "s-2")[0] == 3
    code, out, _ = cli("wake", "s-2", "--by", "ops", "--json")
    assert code == 0
    assert json.loads(out) == {"invocation_id": "s-2", "early": True}
    code, _, err = cli("wake", "s-2")
    assert code == 2
    assert "does not sleep" in err
    code, out, _ = cli("resume", "s-2", "--agent", "sleepers_app:agent", "--json")
    assert code == 0
    assert json.loads(out)["reason"] == "completed"


def test_wake_with_agent_resumes_it_at_once(
    folder: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    db = f"sqlite:///{folder / 'run.db'}"
    wake_at = datetime.now(UTC) + timedelta(days=1)

    def cli(*args: str) -> tuple[int, str]:
        done = run_in_process(*args, cwd=folder, db=db, capsys=capsys, monkeypatch=monkeypatch)
        return done.returncode, done.stdout

    cli("run", "sleepers_app:agent", "--goal", wake_at.isoformat(), "--id", "s-3")
    code, out = cli("wake", "s-3", "--agent", "sleepers_app:agent")

    assert code == 0
    assert out.startswith("completed")
    assert (folder / "calls.log").read_text().splitlines()[:2] == ["start 1", "start 2"]


def test_wake_of_an_unknown_invocation_is_a_usage_error(
    folder: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    db = f"sqlite:///{folder / 'run.db'}"
    run_in_process(
        "run",
        "sleepers_app:agent",
        "--goal",
        datetime.now(UTC).isoformat(),
        cwd=folder,
        db=db,
        capsys=capsys,
        monkeypatch=monkeypatch,
    )

    done = run_in_process(
        "wake", "nobody", cwd=folder, db=db, capsys=capsys, monkeypatch=monkeypatch
    )

    assert done.returncode == 2


@pytest.mark.parametrize(
    "value", ["openai:gpt", "openai:gpt:many:-", "openai:gpt:-:-", "openai:gpt:0:10"]
)
def test_a_malformed_rate_limit_of_a_worker_is_a_usage_error(
    folder: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    done = run_in_process(
        "worker",
        "--agent",
        "sleepers_app:agent",
        "--rate-limit",
        value,
        cwd=folder,
        db=f"sqlite:///{folder / 'run.db'}",
        capsys=capsys,
        monkeypatch=monkeypatch,
    )

    assert done.returncode == 2
    assert "--rate-limit" in done.stderr
