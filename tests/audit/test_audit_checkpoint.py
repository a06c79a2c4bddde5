"""Checkpoints of the global log chain: truncation, forks, edits and gaps against a saved note."""

from __future__ import annotations

import json
import os
import random
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import trio

from loop_actors import Runtime
from tests.support.audit import AGENT, EXAMPLE, rows
from tests.support.cli import run_cli

pytestmark = pytest.mark.slow


def run(path: Path, *ids: str) -> None:
    async def go() -> None:
        with trio.fail_after(60):
            async with Runtime(f"sqlite:///{path}") as runtime:
                for invocation_id in ids:
                    await runtime.run(AGENT, "refund", invocation_id=invocation_id)

    trio.run(go)


def cli(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return run_cli(*args, cwd=folder, db="sqlite:///audit.db", timeout=60)


def keygen(folder: Path) -> None:
    made = run_cli("audit", "keygen", "--out", "ops.key", cwd=folder, timeout=60)
    assert made.returncode == 0, made.stderr


def checkpoint(folder: Path, out: str = "cp.txt", *, signed: bool = True) -> None:
    args = ["audit", "checkpoint", "--out", out, *(["--key", "ops.key"] if signed else [])]
    made = cli(folder, *args)
    assert made.returncode == 0, made.stderr


def against(folder: Path, note: str = "cp.txt", *, key: bool = True) -> tuple[int, dict[str, Any]]:
    args = [
        "audit",
        "verify",
        "--against",
        note,
        "--json",
        *(["--key", "ops.key.pub"] if key else []),
    ]
    result = cli(folder, *args)
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    (report,) = [line for line in lines if line.get("source") == note]
    return result.returncode, report


def log_findings(folder: Path, *args: str) -> list[dict[str, Any]]:
    """The log's own findings (``kind`` ``log``, not ``ok``) of a whole-store verify."""
    result = cli(folder, "audit", "verify", "--json", "--no-state", *args)
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    return [line for line in lines if line["kind"] == "log" and line["verdict"] != "ok"]


def sql(db: Path, statement: str, *params: Any) -> None:
    connection = sqlite3.connect(db)
    with connection:
        assert connection.execute(statement, params).rowcount >= 1
    connection.close()


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    """A store of two invocations with a signed checkpoint of it, and the key pair."""
    run(tmp_path / "audit.db", "inv-a", "inv-b")
    keygen(tmp_path)
    checkpoint(tmp_path)
    return tmp_path


def test_an_untouched_store_verifies_against_its_checkpoint(folder: Path) -> None:
    """Bad input: none. Signed and verified; the standalone script agrees; the key is 0600."""
    code, report = against(folder)
    assert (code, report["verdict"], report["signed"]) == (0, "ok", "verified")
    assert report["size"] == report["store_size"] == rows(folder / "audit.db")
    assert os.stat(folder / "ops.key").st_mode & 0o777 == 0o600
    text = cli(folder, "audit", "verify", "--against", "cp.txt", "--key", "ops.key.pub")
    assert text.returncode == 0
    (line,) = [line for line in text.stdout.splitlines() if "cp.txt" in line]
    assert line.startswith("ok ")
    assert "signature verified" in line
    script = [sys.executable, str(EXAMPLE), "audit.db", "cp.txt", "ops.key.pub"]
    standalone = subprocess.run(script, cwd=folder, capture_output=True, text=True, check=False)
    assert standalone.returncode == 0, standalone.stdout + standalone.stderr
    assert standalone.stdout.startswith("OK loop-actors/")


@pytest.mark.parametrize("k", [1, 3, 9])
def test_deleting_the_last_k_rows_is_truncated(folder: Path, k: int) -> None:
    """Bad input: the last k rows of the log (the end of inv-b) deleted with a DELETE: the
    per-invocation chains stay whole, the checkpoint says truncated; the script agrees."""
    sql(
        folder / "audit.db",
        "DELETE FROM stored_events WHERE rowid > (SELECT MAX(rowid) FROM stored_events) - ?",
        k,
    )
    code, report = against(folder)
    assert (code, report["verdict"]) == (4, "truncated")
    assert report["store_size"] == report["size"] - k
    assert report["position"] == report["store_size"] + 1  # the first row missing
    assert log_findings(folder) == []  # no gap: the end was cut, not the middle
    script = [sys.executable, str(EXAMPLE), "audit.db", "cp.txt", "ops.key.pub"]
    standalone = subprocess.run(script, cwd=folder, capture_output=True, text=True, check=False)
    assert (standalone.returncode, standalone.stdout.split()[0]) == (4, "TRUNCATED")


def test_deleting_a_whole_invocation_is_a_gap_at_its_first_row(folder: Path) -> None:
    """Bad input: every row of inv-a (the first invocation, so rows follow it) deleted: the
    log has a gap at its first row, and fewer rows than the checkpoint commits to."""
    connection = sqlite3.connect(folder / "audit.db")
    (first,) = connection.execute(
        "SELECT MIN(rowid) FROM stored_events WHERE originator_id = 'inv-a'"
    ).fetchone()
    connection.close()
    sql(folder / "audit.db", "DELETE FROM stored_events WHERE originator_id = 'inv-a'")
    code, report = against(folder)
    assert (code, report["verdict"]) == (4, "truncated")
    gaps = log_findings(folder)  # one per run of missing rows (its effect's rows remain)
    assert {gap["verdict"] for gap in gaps} == {"gap"}
    assert gaps[0]["position"] == first


@pytest.mark.parametrize("seed", range(6))
def test_a_flipped_byte_anywhere_is_found(folder: Path, seed: int) -> None:
    """Bad input: one byte of a random row's state (or topic) changed, at a random offset."""
    chooser = random.Random(seed)  # noqa: S311 (a reproducible choice of what to tamper with)
    db = folder / "audit.db"
    connection = sqlite3.connect(db)
    rowid = chooser.randint(1, rows(db))
    column = chooser.choice(["state", "topic"])
    (value,) = connection.execute(
        f"SELECT {column} FROM stored_events WHERE rowid = ?",  # noqa: S608
        (rowid,),
    ).fetchone()
    data = bytearray(value if isinstance(value, bytes) else value.encode())
    offset = chooser.randrange(len(data))
    data[offset] = (data[offset] + 1 + chooser.randrange(254)) % 256
    stored: Any = bytes(data) if column == "state" else bytes(data).decode("latin-1")
    with connection:
        connection.execute(
            f"UPDATE stored_events SET {column} = ? WHERE rowid = ?",  # noqa: S608
            (stored, rowid),
        )
    connection.close()
    code, report = against(folder)
    assert (code, report["verdict"]) == (4, "forked")  # same size, another head


def test_a_store_rolled_back_to_an_older_copy_is_truncated_then_forked(folder: Path) -> None:
    """Bad input: the store replaced by a copy taken before inv-c ran; then the same copy
    grown by another run to the checkpoint's size and past it."""
    db = folder / "audit.db"
    shutil.copy(db, folder / "older.db")
    run(db, "inv-c")
    checkpoint(folder, "later.txt")
    shutil.copy(folder / "older.db", db)
    code, report = against(folder, "later.txt")
    assert (code, report["verdict"]) == (4, "truncated")
    run(db, "inv-d")  # as many rows as inv-c, other ones
    code, report = against(folder, "later.txt")
    assert (code, report["verdict"]) == (4, "forked")
    run(db, "inv-e")
    code, report = against(folder, "later.txt")
    assert (code, report["verdict"]) == (4, "edited")


def test_a_changed_note_or_another_key_fails_the_signature(folder: Path) -> None:
    """Bad input: the note's size lowered to hide a truncation; a note signed by another key;
    an unsigned note when a key is required; the key given without --against."""
    note = (folder / "cp.txt").read_text().split("\n")
    note[1] = str(int(note[1]) - 2)
    (folder / "lowered.txt").write_text("\n".join(note))
    code, report = against(folder, "lowered.txt")
    assert (code, report["verdict"]) == (4, "bad_signature")
    checkpoint(folder, "plain.txt", signed=False)
    code, report = against(folder, "plain.txt")
    assert (code, report["verdict"]) == (4, "unsigned")
    code, report = against(folder, "plain.txt", key=False)
    assert (code, report["verdict"], report["signed"]) == (0, "ok", "unsigned")
    (folder / "ops.key").rename(folder / "old.key")
    (folder / "ops.key.pub").rename(folder / "old.key.pub")
    keygen(folder)
    code, report = against(folder)
    assert (code, report["verdict"]) == (4, "bad_signature")
    lone = cli(folder, "audit", "verify", "--key", "ops.key.pub")
    assert lone.returncode == 2
    assert "--key goes with --against" in lone.stderr


def test_bad_key_and_checkpoint_files_are_refused_with_exit_2(folder: Path) -> None:
    """Bad input: keygen over an existing key; a checkpoint that is not a note; the private
    key given as the verifier key; a missing checkpoint file. Nothing is written."""
    again = run_cli("audit", "keygen", "--out", "ops.key", cwd=folder, timeout=60)
    assert again.returncode == 2
    assert "never overwritten" in again.stderr
    (folder / "junk.txt").write_text("not a note\n")
    for args in (
        ("--against", "junk.txt"),
        ("--against", "cp.txt", "--key", "ops.key"),
        ("--against", "missing.txt"),
    ):
        result = cli(folder, "audit", "verify", *args)
        assert result.returncode == 2, (args, result.stderr)
        assert result.stderr.startswith("loop-actors: error:")
