"""A read-only store (an auditor's evidence copy) can be inspected, and nothing is written to it.

Root ignores file permissions, and tests run as root in CI: the commands here run
through ``tests/support/unprivileged.py``, which gives up the capabilities that let root
do so, so that ``chmod 0444`` and ``chmod 0555`` mean for them what they mean
for anyone (``test_the_launcher_cannot_write_a_write_protected_file`` checks it).
Every test compares the folder's files (names, bytes, modification times)
before and after.
"""

from __future__ import annotations

import json
import re
import shutil
import sqlite3
import stat
import subprocess
import sys
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from aggregates.invocation import Invocation
from loop_actors import Budget
from loop_actors._errors import StoreReadOnlyError, StoreUnavailableError
from loop_actors.store.store import EventStore
from tests.support.cli import cli_env, run_cli
from tests.support.project_agents import AGENTS

pytestmark = pytest.mark.slow

LAUNCHER = str(Path(__file__).parents[1] / "support" / "unprivileged.py")

READS: list[tuple[str, ...]] = [
    ("history", "first", "--json"),
    ("history", "second"),
    ("audit", "verify", "--json"),
    ("list", "--json"),
    ("show", "first", "--json"),
    ("metrics", "--json"),
    ("effects", "--json"),
]
"""The read commands, each with an output that the writable store gives too."""

Snapshot = dict[str, tuple[bytes, int, int]]


def unprivileged(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``loop-actors ARGS`` in ``cwd``, without root's power to ignore file permissions."""
    return subprocess.run(
        [sys.executable, LAUNCHER, "-m", "loop_actors.cli.main", *args],
        cwd=cwd,
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def snapshot(folder: Path) -> Snapshot:
    """Every file of the folder: its bytes, modification time and mode."""
    return {
        path.name: (path.read_bytes(), path.stat().st_mtime_ns, path.stat().st_mode)
        for path in sorted(folder.iterdir())
    }


@pytest.fixture(scope="module")
def original(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A project that ran a completed and a paused invocation (made once for the module)."""
    folder = tmp_path_factory.mktemp("original")
    (folder / "agents.py").write_text(AGENTS)
    for agent, invocation_id in (("answering", "first"), ("asking", "second")):
        ran = run_cli("run", f"agents:{agent}", "--goal", "g", "--id", invocation_id, cwd=folder)
        assert ran.returncode in (0, 3), ran.stderr
    assert sorted(p.name for p in folder.iterdir()) == ["agents.py", "loop-actors.db"]
    return folder


@pytest.fixture(scope="module")
def expected(original: Path) -> dict[tuple[str, ...], str]:
    """What each read command prints on the store while it may be written."""
    outputs = {}
    for command in READS:
        result = run_cli(*command, cwd=original)
        assert result.returncode == 0, result.stderr
        outputs[command] = result.stdout
    return outputs


@pytest.fixture
def project(tmp_path: Path, original: Path) -> Iterator[Path]:
    """A copy of the original project, with the store alone in its folder ``evidence``."""
    (tmp_path / "agents.py").write_text(AGENTS)
    evidence = tmp_path / "evidence"
    evidence.mkdir()
    (evidence / "loop-actors.db").write_bytes((original / "loop-actors.db").read_bytes())
    yield tmp_path
    evidence.chmod(0o755)  # let pytest remove it


def assert_reads_answer(evidence: Path, expected: dict[tuple[str, ...], str]) -> list[str]:
    """Run every read command unprivileged in ``evidence``; return their stderr."""
    errors = []
    for command in READS:
        result = unprivileged(*command, cwd=evidence)
        assert result.returncode == 0, (command, result.stderr)
        assert result.stdout == expected[command], command
        errors.append(result.stderr)
    return errors


def test_the_launcher_cannot_write_a_write_protected_file(tmp_path: Path) -> None:
    """The premise of this module: a 0444 file and a 0555 folder stop the launched process."""
    protected = tmp_path / "protected.db"
    protected.write_bytes(b"x")
    protected.chmod(0o444)
    folder = tmp_path / "folder"
    folder.mkdir()
    folder.chmod(0o555)
    code = (
        "import os, sys\n"
        "for attempt in (lambda: open(sys.argv[1], 'ab'), lambda: open(sys.argv[2] + '/new', 'w')):\n"
        "    try:\n"
        "        attempt()\n"
        "    except PermissionError:\n"
        "        continue\n"
        "    raise SystemExit('wrote')\n"
        "print(os.access(sys.argv[1], os.W_OK), os.access(sys.argv[2], os.W_OK))\n"
    )
    result = subprocess.run(
        [sys.executable, LAUNCHER, "-c", code, str(protected), str(folder)],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    folder.chmod(0o755)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.split() == ["False", "False"]


def test_read_commands_answer_on_a_write_protected_store_file_and_change_nothing(
    project: Path, expected: dict[tuple[str, ...], str]
) -> None:
    """Bad input: a store file of mode 0444 (the folder may be written)."""
    evidence = project / "evidence"
    (evidence / "loop-actors.db").chmod(0o444)
    before = snapshot(evidence)
    errors = assert_reads_answer(evidence, expected)
    assert snapshot(evidence) == before  # no views file, no -wal or -shm, same bytes
    list_errors = errors[READS.index(("list", "--json"))]
    assert "is read-only (mode 0444)" in list_errors
    assert "building the read models in memory for this command" in list_errors


def test_read_commands_answer_in_a_read_only_folder_and_create_nothing(
    project: Path, expected: dict[tuple[str, ...], str]
) -> None:
    """Bad input: a store in a folder of mode 0555 (the file itself may be written)."""
    evidence = project / "evidence"
    evidence.chmod(0o555)
    before = snapshot(evidence)
    errors = assert_reads_answer(evidence, expected)
    assert snapshot(evidence) == before
    assert "its folder" in errors[READS.index(("show", "first", "--json"))]


def test_an_evidence_copy_with_a_write_ahead_log_is_read_whole_and_left_as_it_was(
    project: Path,
) -> None:
    """Bad input: a copy taken while a writer was open: ``x.db`` and a non-empty ``x.db-wal``, read-only."""
    live = project / "live"
    live.mkdir()
    (live / "loop-actors.db").write_bytes((project / "evidence" / "loop-actors.db").read_bytes())
    holder = sqlite3.connect(live / "loop-actors.db")  # keeps the log from being folded in on close
    holder.execute("SELECT count(*) FROM stored_events").fetchone()
    ran = run_cli("run", "agents:answering", "--goal", "g", "--id", "third", cwd=project,
                  db="sqlite:///live/loop-actors.db")  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    wal = live / "loop-actors.db-wal"
    assert wal.stat().st_size > 0
    evidence = project / "copy"
    evidence.mkdir()
    for name in ("loop-actors.db", "loop-actors.db-wal"):
        (evidence / name).write_bytes((live / name).read_bytes())
        (evidence / name).chmod(0o444)
    holder.close()
    evidence.chmod(0o555)
    before = snapshot(evidence)
    try:
        listed = unprivileged("list", "--json", cwd=evidence)
        verified = unprivileged("audit", "verify", cwd=evidence)
    finally:
        evidence.chmod(0o755)
    assert listed.returncode == 0, listed.stderr
    ids = [json.loads(line)["invocation_id"] for line in listed.stdout.splitlines()]
    assert ids == ["third", "second", "first"]  # "third" is only in the log
    assert verified.returncode == 0, verified.stderr
    assert "3 intact, 0 broken" in verified.stdout
    match = re.search(r"reading a copy in (\S+)", listed.stderr)
    assert match is not None, listed.stderr
    assert not Path(match.group(1)).exists()  # the copy is removed afterwards
    evidence.chmod(0o555)
    assert snapshot(evidence) == before


def test_a_mode_ro_url_is_only_read_even_by_root(
    project: Path, expected: dict[tuple[str, ...], str]
) -> None:
    """Bad input: ``?mode=ro`` on a store that could be written, read by whoever runs the tests."""
    evidence = project / "evidence"
    before = snapshot(evidence)
    for command in READS:
        result = run_cli(*command, "--db", "sqlite:///loop-actors.db?mode=ro", cwd=evidence)
        assert result.returncode == 0, (command, result.stderr)
        assert result.stdout == expected[command], command
    assert snapshot(evidence) == before


@pytest.mark.parametrize(
    ("protection", "command"),
    [
        ("file", ("run", "agents:answering", "--goal", "g")),
        ("folder", ("run", "agents:answering", "--goal", "g")),
        ("url", ("run", "agents:answering", "--goal", "g")),
        ("file", ("cancel", "first")),
        ("url", ("cancel", "first")),
        ("folder", ("clarify", "second", "--answer", "this one")),
        ("file", ("projections", "rebuild")),
        ("folder", ("projections", "status")),
    ],
)
def test_write_commands_on_a_read_only_store_exit_2_and_write_nothing(
    project: Path, protection: str, command: tuple[str, ...]
) -> None:
    """Bad input: commands that write, on a 0444 file, in a 0555 folder, or with ``mode=ro``."""
    evidence = project / "evidence"
    db = "sqlite:///evidence/loop-actors.db"
    if protection == "file":
        (evidence / "loop-actors.db").chmod(0o444)
    elif protection == "folder":
        evidence.chmod(0o555)
    else:
        db += "?mode=ro"
    before = snapshot(evidence)
    result = unprivileged(*command, "--db", db, cwd=project)
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr.startswith("loop-actors: error: ")
    assert len(result.stderr.splitlines()) == 1
    assert re.search(r"read-only|mode=ro", result.stderr), result.stderr
    assert snapshot(evidence) == before


def test_a_store_opened_read_only_refuses_to_append(project: Path) -> None:
    """Bad input: an append through a store opened read-only."""
    store = EventStore("sqlite:///" + str(project / "evidence" / "loop-actors.db"), read_only=True)
    try:
        invocation = Invocation.start(
            invocation_id="x",
            goal="g",
            agent_name="a",
            agent_version="1",
            catalogue_digest="d",
            tools=[],
            budget=Budget(),
            at=datetime(2026, 11, 30, tzinfo=UTC),
        )
        with pytest.raises(StoreReadOnlyError):
            store.append(invocation.take_events())
        assert store.invocation_ids() == ["first", "second"]
    finally:
        store.close()


def test_opening_read_only_what_is_not_a_store_is_a_clear_error(tmp_path: Path) -> None:
    """Bad input: a missing file, and a SQLite file without the events table."""
    with pytest.raises(StoreUnavailableError, match="no database at"):
        EventStore(f"sqlite:///{tmp_path / 'missing.db'}", read_only=True)
    other = tmp_path / "other.db"
    connection = sqlite3.connect(other)
    connection.execute("CREATE TABLE t (x)")
    connection.close()
    with pytest.raises(StoreUnavailableError, match="not a loop-actors store"):
        EventStore(f"sqlite:///{other}", read_only=True)
    assert stat.S_IMODE(other.stat().st_mode)  # still there, untouched by the refusal


def _vacuum_into(source: Path, copy: Path) -> None:
    """SQLite's ``VACUUM INTO``: a compacted copy, in rollback-journal mode."""
    connection = sqlite3.connect(source)
    try:
        connection.execute("VACUUM INTO ?", (str(copy),))
    finally:
        connection.close()


def _dot_backup(source: Path, copy: Path) -> None:
    """The ``sqlite3`` shell's ``.backup`` (SQLite's online backup), as an operator runs it."""
    shell = shutil.which("sqlite3")
    if shell is None:
        pytest.skip("the sqlite3 shell is not installed")
    subprocess.run([shell, str(source), f".backup '{copy}'"], check=True, timeout=60)


@pytest.mark.parametrize("backup", [_vacuum_into, _dot_backup], ids=["vacuum-into", "dot-backup"])
@pytest.mark.parametrize("protection", ["none", "file", "folder"])
def test_read_commands_answer_on_a_backup_copy_and_leave_its_journal_mode(
    project: Path,
    expected: dict[tuple[str, ...], str],
    backup: Callable[[Path, Path], None],
    protection: str,
) -> None:
    """Bad input: a backup copy (``VACUUM INTO``: a rollback-journal file; ``.backup``), writable, 0444, or in a 0555 folder.

    Before the fix the writable ``VACUUM INTO`` copy failed every read with "attempt
    to write a readonly database": eventsourcing's pool switched its journal mode to
    WAL on a ``mode=ro`` connection. The protected copies are read ``immutable``.
    """
    copy = project / "copy"
    copy.mkdir()
    store = copy / "loop-actors.db"
    backup(project / "evidence" / "loop-actors.db", store)
    journal_mode = _journal_mode(store)
    if protection == "file":
        store.chmod(0o444)
    elif protection == "folder":
        copy.chmod(0o555)
    before = snapshot(copy)
    try:
        assert_reads_answer(copy, expected)
        protected_after = snapshot(copy)
    finally:
        copy.chmod(0o755)
    assert _journal_mode(store) == journal_mode
    if protection != "none":
        assert protected_after == before


def _journal_mode(store: Path) -> str:
    """The journal mode written in a database file's header (read without opening it for writing)."""
    connection = sqlite3.connect(f"{store.as_uri()}?mode=ro&immutable=1", uri=True)
    try:
        mode: str = connection.execute("PRAGMA journal_mode").fetchone()[0]
    finally:
        connection.close()
    return mode if mode == "wal" else "rollback"


def test_a_write_command_on_a_read_only_backup_copy_is_refused_typed(project: Path) -> None:
    """Bad input: ``run`` on a 0444 ``VACUUM INTO`` copy: refused as read-only, nothing written."""
    copy = project / "copy"
    copy.mkdir()
    _vacuum_into(project / "evidence" / "loop-actors.db", copy / "loop-actors.db")
    (copy / "loop-actors.db").chmod(0o444)
    before = snapshot(copy)
    result = unprivileged(
        "run", "agents:answering", "--goal", "g", "--db", "sqlite:///copy/loop-actors.db",
        cwd=project,
    )  # fmt: skip
    assert result.returncode == 2, result.stdout + result.stderr
    assert "is read-only (mode 0444)" in result.stderr
    assert snapshot(copy) == before
    with pytest.raises(StoreReadOnlyError, match="is read-only"):
        EventStore(f"sqlite:///{copy / 'loop-actors.db'}")
