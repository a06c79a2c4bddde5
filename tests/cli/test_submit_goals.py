"""``loop-actors submit MODULE:ATTR --goals FILE``, through the real CLI (a new process each).

Bad inputs tried: a malformed JSON line, a JSON line that is not an object, an unknown
field, a field given twice, a field that is not a string, a line without a goal, an
empty goal, a blank line, an id given twice in the file, an id in the runtime's
namespace, a file that does not exist, a directory, a file that is not UTF-8, an empty
file, ``--id`` with ``--goals``, an id that names an invocation of another goal; a
submission SIGKILLed after a chunk's commit, before its queue rows (10,000 goals, on
SQLite and on PostgreSQL), then run again.
"""

from __future__ import annotations

import json
import os
import pty
import shutil
import subprocess
from pathlib import Path

import pytest

from aggregates.lease import QueueStatus
from tests.support.cli import CLI, cli_env, run_cli
from tests.support.store_rows import queue_rows, stored_ids

pytestmark = pytest.mark.slow

APP = Path(__file__).parents[1] / "support" / "payments_app.py"

GOALS = (
    "pay bob 10\n"
    '{"goal": "pay carol 20", "id": "pay-carol"}\n'
    '  {"goal": "pay dave 30", "id": "pay-dave", "task_class": "payments", "tenant": "acme"}\n'
    "pay erin 40\r\n"
)
"""Plain lines and JSON lines, mixed; one with blanks before it, one ending in CRLF."""


@pytest.fixture
def project(tmp_path: Path) -> Path:
    shutil.copy(APP, tmp_path / "payments_app.py")
    return tmp_path


def submit(project: Path, *args: str, db: str | None = None) -> subprocess.CompletedProcess[str]:
    return run_cli("submit", "payments_app:agent", *args, cwd=project, db=db or "sqlite:///run.db")


def test_a_goals_file_is_submitted_in_order_and_again_submits_nothing(project: Path) -> None:
    (project / "goals.txt").write_text(GOALS, encoding="utf-8")
    first = submit(project, "--goals", "goals.txt")
    assert first.returncode == 0, first.stderr
    ids = first.stdout.splitlines()
    assert len(ids) == 4
    assert ids[1:3] == ["pay-carol", "pay-dave"]
    assert first.stderr == (
        "loop-actors: goals.txt: 4 goals: 4 submitted, 0 already submitted "
        "(their ids name invocations of the same goal)\n"
    )
    rows = queue_rows(f"sqlite:///{project / 'run.db'}")
    assert sorted(rows) == sorted(ids)
    assert {(row.status, row.agent_ref) for row in rows.values()} == {
        (QueueStatus.RUNNABLE, "payments_app:agent")
    }
    history = run_cli("history", "pay-dave", "--json", cwd=project, db="sqlite:///run.db")
    started = json.loads(history.stdout.splitlines()[0])["data"]
    assert (started["goal"], started["task_class"], started["tenant"]) == (
        "pay dave 30",
        "payments",
        "acme",
    )

    again = submit(project, "--goals", "goals.txt", "--json")
    assert again.returncode == 0, again.stderr
    records = [json.loads(line) for line in again.stdout.splitlines()]
    assert [(r["line"], r["status"]) for r in records] == [
        (1, "submitted"),  # no id: a new invocation each time
        (2, "already_submitted"),
        (3, "already_submitted"),
        (4, "submitted"),
    ]
    assert [r["invocation_id"] for r in records[1:3]] == ["pay-carol", "pay-dave"]
    assert "2 submitted, 2 already submitted" in again.stderr
    assert len(stored_ids(f"sqlite:///{project / 'run.db'}")) == 6


def test_goals_are_read_from_standard_input_and_the_options_fill_in_what_a_line_lacks(
    project: Path,
) -> None:
    options = ["--task-class", "batch", "--tenant", "acme", "--db", "sqlite:///run.db"]
    done = subprocess.run(
        [*CLI, "submit", "payments_app:agent", "--goals", "-", *options],
        input='{"goal": "pay bob 10", "id": "b-1", "tenant": "other"}\n',
        cwd=project,
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert (done.returncode, done.stdout) == (0, "b-1\n"), done.stderr
    history = run_cli("history", "b-1", "--json", cwd=project, db="sqlite:///run.db")
    started = json.loads(history.stdout.splitlines()[0])["data"]
    assert (started["task_class"], started["tenant"]) == ("batch", "other")


def test_a_progress_bar_is_drawn_on_a_terminal_and_none_when_piped(project: Path) -> None:
    (project / "goals.txt").write_text("".join(f"goal {n}\n" for n in range(1200)), "utf-8")
    main, terminal = pty.openpty()
    process = subprocess.Popen(
        [*CLI, "submit", "payments_app:agent", "--goals", "goals.txt", "--db", "sqlite:///t.db"],
        cwd=project,
        env=cli_env(TERM="xterm", COLUMNS="100"),
        stdout=subprocess.DEVNULL,
        stderr=terminal,
    )
    os.close(terminal)
    drawn = b""
    while True:
        try:
            chunk = os.read(main, 4096)
        except OSError:  # the process closed the terminal
            break
        if not chunk:
            break
        drawn += chunk
    assert process.wait(timeout=120) == 0
    os.close(main)
    assert b"submitting" in drawn
    assert b"1200/1200" in drawn or b"/1200" in drawn
    piped = submit(project, "--goals", "goals.txt")
    assert piped.returncode == 0
    assert piped.stderr.splitlines() == [
        "loop-actors: goals.txt: 1200 goals: 1200 submitted, 0 already submitted "
        "(their ids name invocations of the same goal)"
    ]


@pytest.mark.parametrize(
    ("content", "says"),
    [
        ('ok\n{"goal": "pay", "id": }\n', "goals.txt:2: not a JSON object: Expecting value"),
        ("ok\n{not json\n", "goals.txt:2: not a JSON object"),
        ('ok\n{"goal": "a", "amount": 3}\n', "goals.txt:2: unknown field 'amount'"),
        ('{"goal": "a", "goal": "b"}\n', "goals.txt:1: the field 'goal' is given twice"),
        ('{"goal": "a", "id": 7}\n', "goals.txt:1: 'id' must be a string, got int"),
        ('ok\nok\n{"id": "x"}\n', "goals.txt:3: the line has no goal"),
        ('{"goal": "  "}\n', "goals.txt:1: the goal is empty"),
        ("one\n\ntwo\n", "goals.txt:2: the line is blank"),
        ("one\n   \n", "goals.txt:2: the line is blank"),
        (
            '{"goal": "a", "id": "x"}\nb\n{"goal": "c", "id": "x"}\n',
            "goals.txt:3: id 'x' is given twice: goals.txt:1 gives it too",
        ),
        ('{"goal": "a", "id": "eff-1"}\n', "goals.txt:1: invocation id 'eff-1' starts with"),
        ("", "goals.txt: the file holds no goal"),
        (b"ok\n\xff\xfe\n", "goals.txt:2: cannot read the goals: not UTF-8 text"),
    ],
)
def test_a_bad_line_is_one_line_naming_it_exit_2_and_nothing_is_written(
    project: Path, content: str | bytes, says: str
) -> None:
    path = project / "goals.txt"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    done = submit(project, "--goals", "goals.txt")
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith(f"loop-actors: error: {says}"), done.stderr
    assert len(done.stderr.splitlines()) == 1
    assert done.stdout == ""
    assert not (project / "run.db").exists()


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--goals", "missing.txt"], "missing.txt: cannot read the goals: no such file"),
        (["--goals", "."], ".: cannot read the goals: it is a directory, not a file"),
        (["--goals", "goals.txt", "--id", "x"], "--id names one invocation"),
        (["--goals", "goals.txt", "--goal", "g"], "not allowed with argument"),
    ],
)
def test_a_file_that_cannot_be_read_or_a_wrong_option_is_exit_2_and_writes_nothing(
    project: Path, args: list[str], says: str
) -> None:
    (project / "goals.txt").write_text("ok\n", encoding="utf-8")
    done = submit(project, *args)
    assert done.returncode == 2, done.stderr
    assert says in done.stderr
    assert len(done.stderr.splitlines()) == 1
    assert not (project / "run.db").exists()


def test_an_id_of_another_goal_stops_the_file_before_anything_is_written(project: Path) -> None:
    assert submit(project, "--goal", "pay bob 10", "--id", "taken").returncode == 0
    (project / "goals.txt").write_text(
        'first\n{"goal": "second", "id": "fresh"}\n{"goal": "pay bob 99", "id": "taken"}\n',
        encoding="utf-8",
    )
    done = submit(project, "--goals", "goals.txt")
    assert done.returncode == 2
    assert done.stderr == (
        "loop-actors: error: goals.txt:3: id 'taken' names an invocation of another goal or "
        "agent (payments: 'pay bob 10')\n"
    )
    assert done.stdout == ""
    assert stored_ids(f"sqlite:///{project / 'run.db'}") == ["taken"]


@pytest.mark.parametrize("kind", ["sqlite", "postgresql"])
def test_ten_thousand_goals_killed_after_a_chunk_and_submitted_again_are_ten_thousand(
    project: Path, kind: str, request: pytest.FixtureRequest
) -> None:
    """SIGKILLed after its 7th chunk's commit: each chunk is whole, with its queue rows; the
    second run submits the chunks never reached and records no goal twice."""
    db = (
        f"sqlite:///{project / 'big.db'}"
        if kind == "sqlite"
        else request.getfixturevalue("postgres_url")
    )
    lines = [json.dumps({"goal": f"pay {n}", "id": f"big-{n:05d}"}) for n in range(10_000)]
    (project / "goals.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    killed = run_cli(
        "submit", "payments_app:agent", "--goals", "goals.jsonl",
        cwd=project, db=db, env={"LOOP_ACTORS_CRASH_AT": "after_submit_chunk_commit:7"},
        timeout=300,
    )  # fmt: skip
    assert killed.returncode == -9, killed.stderr
    assert len(stored_ids(db)) == 3_500  # 7 chunks of 500, each whole
    assert len(queue_rows(db)) == 3_500  # with its rows
    again = submit(project, "--goals", "goals.jsonl", db=db)
    assert again.returncode == 0, again.stderr
    assert again.stdout.splitlines() == [f"big-{n:05d}" for n in range(10_000)]
    assert "6500 submitted, 3500 already submitted" in again.stderr
    assert stored_ids(db) == [f"big-{n:05d}" for n in range(10_000)]
    rows = queue_rows(db)
    assert len(rows) == 10_000
    assert {row.status for row in rows.values()} == {QueueStatus.RUNNABLE}
