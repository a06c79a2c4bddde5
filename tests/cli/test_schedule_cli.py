"""``loop-actors schedule add|list|pause|resume|remove``, and what ``workers`` shows of waits.

Bad inputs tried (each exit 2, nothing written): ``--every 0m``, ``--every 5x``, a cron
of four fields, a cron minute of 61, an unknown time zone, ``--tz`` with ``--every``,
neither ``--every`` nor ``--cron``, both, an unknown ``--overlap``, a second schedule of
one name, a name with a space, an agent that does not exist, an empty goal, a
``memory://`` store; a pause, resume and removal of a schedule that does not exist, and a
list of a store that does not exist.
"""

from __future__ import annotations

import json
import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from tests.support.cli import run_in_process, sleepers_folder


@pytest.fixture
def folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    return sleepers_folder(tmp_path, monkeypatch)


class Cli:
    def __init__(
        self, folder: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        self.folder = folder
        self.db = f"sqlite:///{folder / 'run.db'}"
        self.capsys = capsys
        self.monkeypatch = monkeypatch

    def __call__(self, *args: str, db: str | None = None) -> subprocess.CompletedProcess[str]:
        return run_in_process(
            *args,
            cwd=self.folder,
            db=db or self.db,
            capsys=self.capsys,
            monkeypatch=self.monkeypatch,
        )

    def records(self) -> list[dict[str, object]]:
        listed = self("schedule", "list", "--json")
        assert listed.returncode == 0, listed.stderr
        return [json.loads(line) for line in listed.stdout.splitlines()]


@pytest.fixture
def cli(folder: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> Cli:
    return Cli(folder, capsys, monkeypatch)


AGENT = ["--agent", "sleepers_app:agent"]


def test_add_prints_the_schedule_and_its_next_due_time(cli: Cli) -> None:
    added = cli("schedule", "add", "daily", *AGENT, "--goal", "report", "--cron", "0 9 * * 1-5",
                "--tz", "Europe/Paris")  # fmt: skip

    assert added.returncode == 0, added.stderr
    first, second = added.stdout.splitlines()
    assert (
        first == "schedule daily added: cron 0 9 * * 1-5 (Europe/Paris), overlap skip, catch-up one"
    )
    assert second.startswith("next due 20")
    assert "09:00 CE" in second  # its wall-clock time in Paris (CET or CEST)
    assert second.endswith(
        "a worker serving sleeper submits its runs (loop-actors worker --agent sleepers_app:agent)"
    )


def test_list_shows_each_schedule_and_json_says_all_of_it(cli: Cli) -> None:
    cli("schedule", "add", "tick", *AGENT, "--goal", "tick", "--every", "15m", "--overlap",
        "allow", "--catch-up", "all")  # fmt: skip
    cli("schedule", "add", "daily", *AGENT, "--goal", "report", "--cron", "30 2 * * *",
        "--tz", "America/New_York")  # fmt: skip

    listed = cli("schedule", "list")
    records = cli.records()

    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    assert lines[0].split() == ["schedule", "agent", "when", "overlap", "catch-up", "next", "due",
                                "runs"]  # fmt: skip
    assert lines[1].split()[:6] == ["daily", "sleeper", "cron", "30", "2", "*"]
    assert lines[2].split()[:6] == ["tick", "sleeper", "every", "15m", "allow", "all"]
    assert lines[-1] == "2 schedule(s), 2 active"
    daily, tick = records
    assert {k: daily[k] for k in ("name", "agent", "agent_ref", "goal", "every", "cron")} == {
        "name": "daily",
        "agent": "sleeper",
        "agent_ref": "sleepers_app:agent",
        "goal": "report",
        "every": None,
        "cron": "30 2 * * *",
    }
    assert (daily["time_zone"], daily["overlap"], daily["catch_up"]) == (
        "America/New_York",
        "skip",
        "one",
    )
    assert (tick["every"], tick["overlap"], tick["catch_up"], tick["state"]) == (
        "15m",
        "allow",
        "all",
        "active",
    )
    due = datetime.fromisoformat(str(tick["next_due"]))
    assert due.minute % 15 == 0
    assert 0 < due.timestamp() - datetime.now(UTC).timestamp() <= 15 * 60
    assert tick["next_invocation_id"] == f"tick@{due:%Y-%m-%dT%H:%M:%SZ}"
    assert (tick["runs"], tick["skipped"], tick["waiting"], tick["last_invocation_id"]) == (
        0,
        0,
        [],
        None,
    )


def test_pause_resume_and_remove_a_schedule(cli: Cli) -> None:
    cli("schedule", "add", "tick", *AGENT, "--goal", "tick", "--every", "1h")

    paused = cli("schedule", "pause", "tick")
    again = cli("schedule", "pause", "tick")
    [record] = cli.records()
    resumed = cli("schedule", "resume", "tick", "--json")
    removed = cli("schedule", "remove", "tick")

    assert paused.stdout == "schedule tick paused: its due times pass unrun until it is resumed\n"
    assert again.stdout == "schedule tick is paused already\n"
    assert (record["state"], record["next_due"]) == ("paused", None)
    assert json.loads(resumed.stdout)["state"] == "active"
    assert removed.stdout == "schedule tick removed (its runs are left as they are)\n"
    assert cli.records() == []
    assert [r.returncode for r in (paused, again, resumed, removed)] == [0, 0, 0, 0]


def test_add_json_prints_the_record_list_prints(cli: Cli) -> None:
    added = cli("schedule", "add", "tick", *AGENT, "--goal", "tick", "--every", "30s", "--json")

    assert added.returncode == 0, added.stderr
    record = json.loads(added.stdout)
    [listed] = cli.records()
    assert {k: v for k, v in record.items() if k != "next_due_in_s"} == {
        k: v for k, v in listed.items() if k != "next_due_in_s"
    }


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--every", "0m"], "--every must be at least 1s, got '0m'"),
        (["--every", "5x"], "--every takes a whole number and s, m or h (30s, 15m, 2h), got '5x'"),
        (["--cron", "0 9 * *"], "a cron expression has 5 fields"),
        (["--cron", "61 * * * *"], "the minute 61 is out of range (0-59)"),
        (["--cron", "0 9 * * *", "--tz", "Mars/Olympus"], "unknown time zone 'Mars/Olympus'"),
        (["--every", "1h", "--tz", "Europe/Paris"], "--tz is for --cron"),
        ([], "one of the arguments --every --cron is required"),
        (["--every", "1h", "--cron", "0 9 * * *"], "not allowed with argument"),
        (["--every", "1h", "--overlap", "wait"], "invalid choice: 'wait'"),
    ],
)
def test_a_bad_timing_is_a_usage_error_and_adds_nothing(
    cli: Cli, args: list[str], says: str
) -> None:
    refused = cli("schedule", "add", "tick", *AGENT, "--goal", "tick", *args)

    assert refused.returncode == 2
    assert says in refused.stderr
    assert not (cli.folder / "run.db").exists()


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["has space", *AGENT, "--goal", "g"], "a schedule's name is 1 to 64 letters"),
        (["tick", "--agent", "sleepers_app:nobody", "--goal", "g"], "has no attribute 'nobody'"),
        (["tick", *AGENT, "--goal", "  "], "goal: the goal is empty"),
    ],
)
def test_a_bad_name_agent_or_goal_is_a_usage_error(cli: Cli, args: list[str], says: str) -> None:
    refused = cli("schedule", "add", *args, "--every", "1h")

    assert refused.returncode == 2
    assert says in refused.stderr


def test_a_second_schedule_of_one_name_is_refused(cli: Cli) -> None:
    assert cli("schedule", "add", "tick", *AGENT, "--goal", "a", "--every", "1h").returncode == 0

    refused = cli("schedule", "add", "tick", *AGENT, "--goal", "b", "--every", "2h")

    assert refused.returncode == 2
    assert "a schedule named 'tick' exists already: remove it first" in refused.stderr
    [record] = cli.records()
    assert record["goal"] == "a"


def test_a_memory_store_is_refused(cli: Cli) -> None:
    refused = cli("schedule", "add", "tick", *AGENT, "--goal", "a", "--every", "1h", db="memory://")

    assert refused.returncode == 2
    assert "a memory:// store ends with this process" in refused.stderr


@pytest.mark.parametrize("verb", ["pause", "resume", "remove"])
def test_a_schedule_that_does_not_exist_is_refused(cli: Cli, verb: str) -> None:
    cli("schedule", "add", "tick", *AGENT, "--goal", "a", "--every", "1h")

    refused = cli("schedule", verb, "tock")

    assert refused.returncode == 2
    assert "no schedule named 'tock' (loop-actors schedule list shows them)" in refused.stderr


def test_list_of_a_store_that_does_not_exist_is_refused(cli: Cli) -> None:
    refused = cli("schedule", "list")

    assert refused.returncode == 2
    assert "no database at" in refused.stderr


def test_workers_shows_the_next_due_schedules_and_the_runs_waiting_to_be_due(cli: Cli) -> None:
    cli("schedule", "add", "tick", *AGENT, "--goal", "tick", "--every", "1h")
    wake_at = (datetime.now(UTC) + timedelta(hours=3)).replace(microsecond=0)
    ran = cli("run", "sleepers_app:agent", "--goal", wake_at.isoformat(), "--id", "nap")
    assert ran.returncode == 3, ran.stderr  # sleeping

    shown = cli("workers")
    records = [json.loads(line) for line in cli("workers", "--json").stdout.splitlines()]

    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert lines[-2].startswith("1 next due schedule(s): tick in ")
    assert lines[-1].startswith(
        "1 run(s) waiting to be due (asleep, for quota, or retried): nap in "
    )
    assert lines[-1].endswith(" h")
    schedule, waiting = (r for r in records if r["kind"] in ("schedule", "waiting"))
    assert (schedule["schedule"], schedule["agent"]) == ("tick", "sleeper")
    assert 0 < float(str(schedule["due_in_s"])) <= 3600
    assert (waiting["invocation_id"], waiting["due_at"]) == ("nap", wake_at.isoformat())
