"""Checkpoints the Runtime writes by itself, verify --checkpoint-dir, and the last-verified state."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import io
import json
import logging
import os
import random
import shutil
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import trio

from aggregates.audit import chain_hash_of
from loop_actors import Agent, InconsistentHistoryError, Runtime, ScriptedModel, UsageError, tool
from loop_actors.audit.checkpoint import Checkpoint, checkpoint_note, generate_key, load_signing_key
from loop_actors.audit.checkpointer import CheckpointDirectory, checkpoint_file_name
from loop_actors.cli import main
from loop_actors.store.store import EventStore
from tests.support import audit as audit_support
from tests.support.audit import AGENT, EXAMPLE, rows
from tests.support.cli import run_cli

GENESIS = "0" * 64


def run(path: Path, *ids: str, key: Path | None = None, every: int | None = None) -> None:
    """Run the audit agent once per id, with checkpoints in ``cps`` beside the store."""

    async def go() -> None:
        with trio.fail_after(60):
            async with Runtime(
                f"sqlite:///{path}",
                checkpoint_dir=path.parent / "cps",
                checkpoint_key=key,
                checkpoint_every=every,
            ) as runtime:
                for invocation_id in ids:
                    await runtime.run(AGENT, "refund", invocation_id=invocation_id)

    trio.run(go)


def notes(folder: Path) -> list[Path]:
    return sorted((folder / "cps").glob("checkpoint-*.txt"))


def size_of(note: Path) -> int:
    return int(note.read_text().split("\n")[1])


def covered(folder: Path, size: int) -> bool:
    """Whether the last checkpoint in ``folder/cps`` covers ``size`` rows."""
    files = notes(folder)
    return bool(files) and size_of(files[-1]) >= size


@dataclass(frozen=True)
class Result:
    returncode: int
    stdout: str
    stderr: str


def cli(folder: Path, *args: str, env: dict[str, str] | None = None) -> Result:
    """``loop-actors ARGS --db sqlite:///audit.db`` run in ``folder``, in this process (fast)."""
    out, err = io.StringIO(), io.StringIO()
    with (
        pytest.MonkeyPatch.context() as patch,
        contextlib.chdir(folder),
        contextlib.redirect_stdout(out),
        contextlib.redirect_stderr(err),
    ):
        for name, value in (env or {}).items():
            patch.setenv(name, value)
        try:
            code = main([*args, "--db", "sqlite:///audit.db"])
        except SystemExit as exit_:  # argparse's usage errors
            code = int(exit_.code or 0)
    return Result(code, out.getvalue(), err.getvalue())


def verify(folder: Path, *args: str) -> tuple[int, list[dict[str, Any]]]:
    """``audit verify --checkpoint-dir cps --json ARGS``: exit code and the non-aggregate lines."""
    result = cli(folder, "audit", "verify", "--checkpoint-dir", "cps", "--json", *args)
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    return result.returncode, [line for line in lines if "id" not in line]


def findings(reports: list[dict[str, Any]]) -> list[tuple[str, str, int | None]]:
    return [
        (r["kind"], r["verdict"], r["position"])
        for r in reports
        if r["kind"] != "coverage" and r["verdict"] != "ok"
    ]


async def eventually(condition: Callable[[], bool]) -> None:
    """Wait (inside the caller's ``fail_after``) until ``condition()`` holds."""
    while not condition():  # noqa: ASYNC110 (another thread writes the files it looks at)
        await trio.sleep(0.01)


def keygen(folder: Path) -> Path:
    (folder / "ops.key").write_text(generate_key("loop-actors").encoded())
    (folder / "ops.key.pub").write_text(load_signing_key(folder / "ops.key").verifier().encoded())
    return folder / "ops.key"


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    """A store of three invocations run with a signing key and a checkpoint directory."""
    run(tmp_path / "audit.db", "inv-a", "inv-b", "inv-c", key=keygen(tmp_path))
    return tmp_path


def test_the_runtime_writes_a_signed_chain_of_checkpoints_that_verifies(folder: Path) -> None:
    """Bad input: none. Each names the hash of the file before it (the first 64 zeros), the
    last covers every row, verify --checkpoint-dir --key agrees, so does the standalone script."""
    files = notes(folder)
    assert files, "no checkpoint written"
    assert [f.name for f in files] == [f"checkpoint-{n:012d}.txt" for n in range(1, len(files) + 1)]
    previous = GENESIS
    for note in files:
        text = note.read_text()
        assert f"\nprevious {previous}\n" in text
        assert "\n\n\u2014 loop-actors " in text  # signed
        previous = hashlib.sha256(note.read_bytes()).hexdigest()
    assert size_of(files[-1]) == rows(folder / "audit.db")
    code, reports = verify(folder, "--key", "ops.key.pub")
    assert (code, findings(reports)) == (0, [])
    script = [sys.executable, str(EXAMPLE), "audit.db", str(files[-1]), "ops.key.pub"]
    standalone = subprocess.run(script, cwd=folder, capture_output=True, text=True, check=False)
    assert standalone.returncode == 0, standalone.stdout + standalone.stderr


async def test_a_checkpoint_follows_each_run_that_ends_before_the_runtime_closes(
    tmp_path: Path,
) -> None:
    """Each run's end is covered by a checkpoint while the runtime is still open."""
    db = tmp_path / "audit.db"
    with trio.fail_after(60):
        async with Runtime(f"sqlite:///{db}", checkpoint_dir=tmp_path / "cps") as runtime:
            for invocation_id in ("inv-a", "inv-b"):
                await runtime.run(AGENT, "refund", invocation_id=invocation_id)
                await eventually(lambda: covered(tmp_path, rows(db)))


RELEASE = trio.Event()


@tool
async def wait_for_release() -> str:
    """Block until the test lets go."""
    await RELEASE.wait()
    return "released"


SLOW = Agent(
    "slow",
    ScriptedModel(
        lambda request: (
            {"kind": "tool_calls", "calls": [{"id": "c1", "name": "wait_for_release"}]}
            if request.step == 1
            else {"kind": "final", "answer": "done"}
        )
    ),
    [wait_for_release],
)


async def test_a_checkpoint_is_written_every_n_commits_while_a_run_goes_on(
    tmp_path: Path,
) -> None:
    """With checkpoint_every=1, the commits before a tool that blocks are checkpointed before
    the run ends; a run that never ends is still covered."""
    global RELEASE  # noqa: PLW0603 (a fresh event for this test's trio run)
    RELEASE = trio.Event()
    db = tmp_path / "audit.db"
    with trio.fail_after(60):
        async with (
            Runtime(
                f"sqlite:///{db}", checkpoint_dir=tmp_path / "cps", checkpoint_every=1
            ) as runtime,
            trio.open_nursery() as nursery,
        ):
            nursery.start_soon(partial(runtime.run, SLOW, "wait", invocation_id="slow-1"))
            # started, decided, dispatched: 3 rows, and no end yet
            await eventually(lambda: covered(tmp_path, 3))
            assert (await runtime.load("slow-1")).phase.value != "terminated"
            RELEASE.set()


def test_a_checkpoint_that_cannot_be_written_is_logged_and_the_runs_go_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Bad input: the directory replaced by a file while the runtime is open. Each run
    completes; the failure is logged; once the directory is back, the next run's end is
    checkpointed again."""
    db = tmp_path / "audit.db"
    folder = tmp_path / "cps"

    async def go() -> list[str]:
        reasons = []
        with trio.fail_after(60):
            async with Runtime(f"sqlite:///{db}", checkpoint_dir=folder) as runtime:
                shutil.rmtree(folder)
                folder.write_text("not a directory")
                outcome = await runtime.run(AGENT, "refund", invocation_id="inv-a")
                reasons.append(outcome.reason.value)
                await eventually(
                    lambda: any("could not write" in r.message for r in caplog.records)
                )
                folder.unlink()
                folder.mkdir()
                outcome = await runtime.run(AGENT, "refund", invocation_id="inv-b")
                reasons.append(outcome.reason.value)
                await eventually(lambda: covered(tmp_path, rows(db)))
        return reasons

    with caplog.at_level(logging.WARNING, logger="loop_actors.audit"):
        assert trio.run(go) == ["completed", "completed"]
    (warning,) = {r.getMessage() for r in caplog.records if "checkpoint" in r.getMessage()}
    assert str(folder) in warning


def test_a_directory_of_another_store_and_bad_settings_are_refused(tmp_path: Path) -> None:
    """Bad input: a checkpoint directory that holds another store's chain; checkpoint_every 0,
    -1, True and "x"; a key without a directory; a key file that does not exist."""
    run(tmp_path / "audit.db", "inv-a")

    async def open_other() -> None:
        async with Runtime(f"sqlite:///{tmp_path / 'other.db'}", checkpoint_dir=tmp_path / "cps"):
            pass

    with pytest.raises(UsageError, match="holds checkpoints of loop-actors/"):
        trio.run(open_other)
    for every in (0, -1, True, "x"):
        with pytest.raises(UsageError, match="whole number"):
            Runtime("memory://", checkpoint_dir=tmp_path / "cps", checkpoint_every=every)  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="needs a checkpoint directory"):
        Runtime("memory://", checkpoint_key=tmp_path / "ops.key")

    async def open_without_key() -> None:
        async with Runtime(
            "memory://", checkpoint_dir=tmp_path / "fresh", checkpoint_key=tmp_path / "nope.key"
        ):
            pass

    with pytest.raises(UsageError, match="cannot read"):
        trio.run(open_without_key)


def test_two_runtimes_on_one_store_write_one_chain(tmp_path: Path) -> None:
    """Two runtimes (two connections, two checkpoint threads) share a store and a directory,
    running at once: the numbers never collide and the chain verifies."""
    db = tmp_path / "audit.db"

    async def go() -> None:
        with trio.fail_after(60):
            async with (
                Runtime(f"sqlite:///{db}", checkpoint_dir=tmp_path / "cps") as first,
                Runtime(f"sqlite:///{db}", checkpoint_dir=tmp_path / "cps") as second,
                trio.open_nursery() as nursery,
            ):
                for n in range(4):
                    nursery.start_soon(partial(first.run, AGENT, "refund", invocation_id=f"a-{n}"))
                    nursery.start_soon(partial(second.run, AGENT, "refund", invocation_id=f"b-{n}"))

    trio.run(go)
    assert size_of(notes(tmp_path)[-1]) == rows(db)
    code, reports = verify(tmp_path)
    assert (code, findings(reports)) == (0, [])


def test_run_writes_checkpoints_with_the_options_or_the_environment(tmp_path: Path) -> None:
    """Bad input: --checkpoint-every 0; a --checkpoint-key file that does not exist (refused
    before the database is made); a key without a directory; LOOP_ACTORS_CHECKPOINT_EVERY=x."""
    agent = ["run", "tests.support.audit:AGENT", "--goal", "refund"]
    made = cli(tmp_path, *agent, "--id", "a", "--checkpoint-dir", "cps", "--checkpoint-every", "5")
    assert made.returncode == 0, made.stderr
    assert size_of(notes(tmp_path)[-1]) == rows(tmp_path / "audit.db")
    from_env = cli(tmp_path, *agent, "--id", "b", env={"LOOP_ACTORS_CHECKPOINT_DIR": "env-cps"})
    assert from_env.returncode == 0, from_env.stderr
    assert list((tmp_path / "env-cps").glob("checkpoint-*.txt"))
    for args, env, message in (
        (["--checkpoint-dir", "cps", "--checkpoint-every", "0"], None, "must be at least 1"),
        (["--checkpoint-dir", "cps", "--checkpoint-key", "nope.key"], None, "cannot read"),
        (["--checkpoint-key", "nope.key"], None, "needs a checkpoint directory"),
        ([], {"LOOP_ACTORS_CHECKPOINT_DIR": "cps", "LOOP_ACTORS_CHECKPOINT_EVERY": "x"}, "whole"),
    ):
        # A subprocess: the agent module is this checkout's tests package.
        here = {**(env or {}), "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
        refused = run_cli(*agent, *args, cwd=tmp_path, db="sqlite:///new.db", env=here)
        assert refused.returncode == 2, (args, refused.stderr)
        assert message in refused.stderr
        assert not (tmp_path / "new.db").exists()


def test_audit_checkpoint_adds_to_a_directory_chain(folder: Path) -> None:
    """`audit checkpoint --checkpoint-dir` writes nothing when the last covers every row, and
    the next number after more rows; --out and --checkpoint-dir are refused together."""
    before = notes(folder)
    same = cli(folder, "audit", "checkpoint", "--checkpoint-dir", "cps", "--key", "ops.key")
    assert same.returncode == 0, same.stderr
    assert "covers every row already" in same.stdout
    assert notes(folder) == before
    run(folder / "audit.db", "inv-d", key=None)  # this runtime's own checkpoints are unsigned
    code, reports = verify(folder)
    assert (code, findings(reports)) == (0, [])
    both = cli(folder, "audit", "checkpoint", "--checkpoint-dir", "cps", "--out", "x.txt")
    assert both.returncode == 2


def test_a_removed_or_edited_checkpoint_breaks_the_chain_where_it_was(folder: Path) -> None:
    """Bad input: a checkpoint in the middle removed; another one's size edited (its
    successor names the old file); one signed by another key."""
    files = notes(folder)
    if len(files) < 3:
        run(folder / "audit.db", "inv-x", "inv-y", key=folder / "ops.key")
        files = notes(folder)
    assert len(files) >= 3
    files[1].unlink()
    code, reports = verify(folder, "--no-state")
    assert (code, findings(reports)) == (4, [("checkpoint_chain", "checkpoint_missing", 2)])
    lines = files[0].read_text().split("\n")
    lines[1] = str(int(lines[1]) - 1)
    files[0].write_text("\n".join(lines))
    code, reports = verify(folder, "--no-state", "--key", "ops.key.pub")
    found = findings(reports)
    assert ("checkpoint", "bad_signature", 1) in found  # the note was changed
    assert ("checkpoint_chain", "checkpoint_missing", 2) in found


def test_an_edited_unsigned_checkpoint_is_found_by_the_one_after_it(tmp_path: Path) -> None:
    """Bad input: an unsigned checkpoint's head changed to another valid head. Nothing
    signs it, but its successor names the file it was."""
    run(tmp_path / "audit.db", "inv-a")
    run(tmp_path / "audit.db", "inv-b")  # a second runtime: a second checkpoint at least
    first = notes(tmp_path)[0]
    lines = first.read_text().split("\n")
    lines[2] = base64.b64encode(bytes(32)).decode()
    first.write_text("\n".join(lines))
    code, reports = verify(tmp_path, "--no-state")
    assert code == 4
    found = findings(reports)
    assert ("checkpoint_chain", "checkpoint_edited", 1) in found
    assert ("checkpoint", "edited", 1) in found  # and the log does not give its head


def test_the_last_verified_state_finds_checkpoints_removed_from_the_end(folder: Path) -> None:
    """Bad input: the last checkpoint removed (the chain alone cannot see it), then the last
    edited, after a verify that saved the state. The state is kept as it was after a finding."""
    code, reports = verify(folder)
    assert (code, findings(reports)) == (0, [])
    (state_file,) = Path(os.environ["XDG_STATE_HOME"]).glob("loop-actors/verified/*.json")
    saved = state_file.read_text()
    assert json.loads(saved)["size"] == rows(folder / "audit.db")
    files = notes(folder)
    last = files[-1].read_bytes()
    files[-1].unlink()
    code, reports = verify(folder)
    assert code == 4
    assert ("checkpoint_chain", "checkpoint_missing", len(files)) in findings(reports)
    assert state_file.read_text() == saved
    files[-1].write_bytes(last.replace(b"\nnotification ", b"\nnotification 0"))
    code, reports = verify(folder)
    assert ("checkpoint_chain", "checkpoint_edited", len(files)) in findings(reports)


def test_the_last_verified_state_finds_a_store_rolled_back_with_its_checkpoints(
    folder: Path,
) -> None:
    """Bad input: the store and its checkpoint directory both replaced by copies taken
    before inv-d ran, after a verify that saw inv-d: only the saved state can tell."""
    db = folder / "audit.db"
    shutil.copy(db, folder / "older.db")
    shutil.copytree(folder / "cps", folder / "older-cps")
    run(db, "inv-d", key=folder / "ops.key")
    code, _ = verify(folder)
    assert code == 0
    shutil.copy(folder / "older.db", db)
    shutil.rmtree(folder / "cps")
    shutil.copytree(folder / "older-cps", folder / "cps")
    code, reports = verify(folder)
    found = findings(reports)
    assert ("checkpoint", "truncated", rows(db) + 1) in found
    assert any(f[1] == "checkpoint_missing" for f in found)
    code, reports = verify(folder, "--no-state")
    assert (code, findings(reports)) == (0, [])  # without the state: out of reach


def test_state_options_and_bad_state_files(folder: Path, tmp_path: Path) -> None:
    """Bad input: a state file that is not JSON; the state of another store. --state FILE is
    used instead of the default; --no-state writes nothing; --state and --no-state clash."""
    state = tmp_path / "mine.json"
    code, _ = verify(folder, "--state", str(state))
    assert code == 0
    assert json.loads(state.read_text())["store_id"]
    assert not list(Path(os.environ["XDG_STATE_HOME"]).glob("loop-actors/verified/*.json"))
    code, _ = verify(folder, "--no-state")
    assert not list(Path(os.environ["XDG_STATE_HOME"]).glob("loop-actors/verified/*.json"))
    other = json.loads(state.read_text())
    other["store_id"] = "another"
    (tmp_path / "other.json").write_text(json.dumps(other))
    (tmp_path / "junk.json").write_text("not json")
    for name, message in (("other.json", "is the state of store another"), ("junk.json", "not a")):
        result = cli(folder, "audit", "verify", "--state", str(tmp_path / name))
        assert result.returncode == 2, result.stderr
        assert message in result.stderr
    clash = cli(folder, "audit", "verify", "--state", str(state), "--no-state")
    assert clash.returncode == 2


def test_two_events_swapped_are_reordered_at_the_later_one(folder: Path) -> None:
    """Bad input: the rows of events 2 and 3 of inv-b swap places in the log (their row ids
    exchanged). Each aggregate's chain is whole (read by position); the log says where."""
    connection = sqlite3.connect(folder / "audit.db")
    ids = dict(
        connection.execute(
            "SELECT originator_version, rowid FROM stored_events WHERE originator_id = 'inv-b'"
        ).fetchall()
    )
    with connection:
        connection.execute("UPDATE stored_events SET rowid = -1 WHERE rowid = ?", (ids[2],))
        connection.execute("UPDATE stored_events SET rowid = ? WHERE rowid = ?", (ids[2], ids[3]))
        connection.execute("UPDATE stored_events SET rowid = ? WHERE rowid = -1", (ids[3],))
    connection.close()
    result = cli(folder, "audit", "verify", "--json", "--no-state")
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    assert all(line["intact"] for line in lines if "id" in line)
    assert result.returncode == 4
    assert findings([line for line in lines if "id" not in line]) == [("log", "reordered", ids[3])]


def forge_last_event(db: Path, invocation_id: str) -> int:
    """Rewrite an invocation's last event with a detail added and a recomputed chain hash,
    as someone who can write the store and knows the format would; return its row id.

    (Another answer would be refused by the invocation's own transitions, which the audit
    replays: a completed end must carry the committed final answer. A detail is not
    checked against anything, so only the checkpoints can tell.)"""
    store = EventStore(f"sqlite:///{db}")
    try:
        events = store.events(invocation_id)
        last = events[-1]
        forged = last.model_copy(update={"detail": "refunded 4000 in the end"})
        forged = forged.model_copy(
            update={"chain_hash": chain_hash_of(events[-2].chain_hash, forged)}
        )
        state = store.app.mapper.to_stored_event(forged).state
    finally:
        store.close()
    connection = sqlite3.connect(db)
    with connection:
        (rowid,) = connection.execute(
            "SELECT rowid FROM stored_events WHERE originator_id = ? AND originator_version = ?",
            (invocation_id, last.originator_version),
        ).fetchone()
        connection.execute("UPDATE stored_events SET state = ? WHERE rowid = ?", (state, rowid))
    connection.close()
    return int(rowid)


def test_a_forged_event_with_a_recomputed_chain_is_found_by_the_checkpoints(
    folder: Path,
) -> None:
    """Bad input: inv-b's Terminated rewritten (a detail added) with its chain hash
    recomputed: every aggregate's chain is whole; the checkpoints covering it disagree, and
    the first that does says after which row."""
    rowid = forge_last_event(folder / "audit.db", "inv-b")
    result = cli(folder, "audit", "verify", "--json", "--no-state", "--checkpoint-dir", "cps")
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    assert all(line["intact"] for line in lines if "id" in line)
    assert result.returncode == 4
    failing = [line for line in lines if line["kind"] == "checkpoint" and line["verdict"] != "ok"]
    assert failing
    assert all(line["size"] >= rowid for line in failing)
    agreeing = [
        line["size"] for line in lines if line["kind"] == "checkpoint" and line["verdict"] == "ok"
    ]
    assert failing[0]["position"] == max([0, *agreeing]) + 1 <= rowid


@pytest.mark.parametrize("seed", range(8))
def test_a_flipped_byte_is_placed_between_two_checkpoints(folder: Path, seed: int) -> None:
    """Bad input: one byte of a random row's state changed. Every checkpoint from that row
    on disagrees (forked at the store's size, edited before it); the position given is one
    after the last checkpoint that agrees, at or before the row changed."""
    chooser = random.Random(seed)  # noqa: S311 (a reproducible choice of what to tamper with)
    db = folder / "audit.db"
    rowid = chooser.randint(1, rows(db))
    connection = sqlite3.connect(db)
    (state,) = connection.execute(
        "SELECT state FROM stored_events WHERE rowid = ?", (rowid,)
    ).fetchone()
    data = bytearray(state)
    offset = chooser.randrange(len(data))
    data[offset] = (data[offset] + 1 + chooser.randrange(254)) % 256
    with connection:
        connection.execute(
            "UPDATE stored_events SET state = ? WHERE rowid = ?", (bytes(data), rowid)
        )
    connection.close()
    code, reports = verify(folder, "--no-state")
    assert code == 4
    checkpoints = [r for r in reports if r["kind"] == "checkpoint"]
    for report in checkpoints:
        if report["size"] < rowid:
            assert report["verdict"] == "ok"
        else:
            expected = "forked" if report["size"] == rows(db) else "edited"
            assert report["verdict"] == expected
            agreeing = [r["size"] for r in checkpoints if r["verdict"] == "ok"]
            assert report["position"] == max([0, *agreeing]) + 1 <= rowid


def test_a_damaged_last_checkpoint_does_not_stop_the_runtime(
    folder: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Bad input: the last checkpoint overwritten with text that is not a note. The next
    runtime logs it, runs, and writes the next checkpoint after it (naming its bytes); verify
    reports the damaged one."""
    files = notes(folder)
    files[-1].write_text("not a checkpoint\n")
    with caplog.at_level(logging.WARNING, logger="loop_actors.audit"):
        run(folder / "audit.db", "inv-d", key=folder / "ops.key")
    assert any("not a checkpoint note" in r.getMessage() for r in caplog.records)
    after = notes(folder)
    assert len(after) == len(files) + 1
    damaged = hashlib.sha256(files[-1].read_bytes()).hexdigest()
    assert f"\nprevious {damaged}\n" in after[-1].read_text()
    assert size_of(after[-1]) == rows(folder / "audit.db")
    code, reports = verify(folder, "--no-state")
    assert code == 4
    assert ("checkpoint_chain", "checkpoint_edited", len(files)) in findings(reports)


def test_a_worker_writes_checkpoints_of_what_it_drives(tmp_path: Path) -> None:
    """A Worker given a checkpoint directory leaves a chain that covers every row it wrote."""
    from loop_actors import Worker

    db = tmp_path / "audit.db"

    async def go() -> None:
        with trio.fail_after(60):
            async with Runtime(f"sqlite:///{db}") as runtime:
                for n in range(3):
                    await runtime.submit(AGENT, "refund", invocation_id=f"w-{n}")
            worker = Worker(AGENT, f"sqlite:///{db}", poll_s=0.05, checkpoint_dir=tmp_path / "cps")
            report = await worker.run(until_idle=True)
            assert report.claimed == 3

    trio.run(go)
    assert size_of(notes(tmp_path)[-1]) == rows(db)
    code, reports = verify(tmp_path)
    assert (code, findings(reports)) == (0, [])


def test_the_worker_command_refuses_a_checkpoint_key_it_cannot_read(tmp_path: Path) -> None:
    """Bad input: ``worker --checkpoint-dir cps --checkpoint-key nope.key`` (exit 2, nothing run)."""
    here = {"PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    refused = run_cli(
        "worker", "--agent", "tests.support.audit:AGENT", "--checkpoint-dir", "cps",
        "--checkpoint-key", "nope.key", cwd=tmp_path, db="sqlite:///new.db", env=here,
    )  # fmt: skip
    assert refused.returncode == 2, refused.stderr
    assert "cannot read" in refused.stderr
    assert not (tmp_path / "cps").exists()


def _note_for(size: int) -> Callable[[Checkpoint | None, str], str | None]:
    """A ``make`` for ``write_next``: a note of ``size`` rows after the file it is given."""

    def make(latest: Checkpoint | None, previous: str) -> str | None:
        if latest is not None and latest.size >= size:
            return None
        head = hashlib.sha256(str(size).encode()).hexdigest()
        return checkpoint_note(
            "loop-actors/test", size, head, None, extensions=[f"previous {previous}"]
        )

    return make


def test_a_writer_lists_the_checkpoint_directory_once_not_once_per_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each checkpoint a writer writes follows the one it wrote last: 40 checkpoints cost
    one listing of the directory (a directory of thousands was listed, and every name
    matched, on every write). Another writer taking the next number makes it list again,
    and the chain stays whole: numbers 1..n, each naming the hash of the file before."""
    listings: list[str] = []
    real_listdir = os.listdir

    def counting_listdir(path: Any) -> list[str]:
        listings.append(str(path))
        return real_listdir(path)

    monkeypatch.setattr("loop_actors.audit.checkpointer.os.listdir", counting_listdir)
    mine, other = CheckpointDirectory(tmp_path), CheckpointDirectory(tmp_path)
    for size in range(1, 41):
        assert mine.write_next(_note_for(size)) == tmp_path / checkpoint_file_name(size)
    assert len(listings) == 1
    assert other.write_next(_note_for(41)) == tmp_path / checkpoint_file_name(41)
    assert len(listings) == 2  # the other writer lists once, to find where the chain ends
    # Mine tries 41, finds it taken, lists the directory and writes 42 after the other's 41.
    assert mine.write_next(_note_for(42)) == tmp_path / checkpoint_file_name(42)
    assert len(listings) == 3
    assert mine.write_next(_note_for(42)) is None  # nothing new: no file, no listing
    assert len(listings) == 3
    files = mine.numbered()
    assert [number for number, _ in files] == list(range(1, 43))
    previous = GENESIS
    for _, path in files:
        assert f"\nprevious {previous}\n" in path.read_text()
        previous = hashlib.sha256(path.read_bytes()).hexdigest()


# --------------------------------------------------------------------------- resume checks them


def resume(folder: Path, invocation_id: str, *options: str) -> Result:
    return cli(folder, "resume", invocation_id, "--agent", "tests.support.audit:AGENT", *options)


def test_a_resume_given_the_checkpoints_checks_against_them_first(folder: Path) -> None:
    """Bad input: inv-b's last event forged with its chain hash recomputed (every
    aggregate's chain is whole): a resume given the checkpoint directory is refused,
    exit 4, one line naming the directory, nothing run; without it, the resume cannot
    tell (and returns inv-c's recorded outcome, as before)."""
    key = ("--checkpoint-dir", "cps", "--checkpoint-key", "ops.key")
    assert resume(folder, "inv-c", *key).returncode == 0  # untouched: nothing to refuse
    forge_last_event(folder / "audit.db", "inv-b")
    before = rows(folder / "audit.db")
    for invocation_id in ("inv-c", "inv-b"):
        refused = resume(folder, invocation_id, *key)
        assert refused.returncode == 4, refused
        assert "does not agree with the checkpoints in cps" in refused.stderr
        assert refused.stderr.count("\n") == 1, refused.stderr
        assert refused.stdout == ""
    assert rows(folder / "audit.db") == before  # nothing was recorded
    assert resume(folder, "inv-c").returncode == 0


def test_a_resume_refuses_a_checkpoint_directory_whose_chain_is_broken(folder: Path) -> None:
    """Bad input: a checkpoint removed from the middle of the directory."""
    files = notes(folder)
    if len(files) < 3:
        run(folder / "audit.db", "inv-x", "inv-y", key=folder / "ops.key")
        files = notes(folder)
    files[1].unlink()
    refused = resume(folder, "inv-a", "--checkpoint-dir", "cps")
    assert refused.returncode == 4, refused
    assert "checkpoint_missing" in refused.stderr


def test_a_resume_refuses_checkpoints_not_signed_by_its_key(folder: Path) -> None:
    """Bad input: the resume signs with another key than the one the checkpoints carry."""
    (folder / "other.key").write_text(generate_key("someone-else").encoded())
    refused = resume(folder, "inv-a", "--checkpoint-dir", "cps", "--checkpoint-key", "other.key")
    assert refused.returncode == 4, refused
    assert "bad_signature" in refused.stderr


def test_a_resume_with_an_empty_checkpoint_directory_goes_on(tmp_path: Path) -> None:
    """Nothing to check the log against yet (checkpoints start with this runtime)."""
    run(tmp_path / "audit.db", "inv-a")
    shutil.rmtree(tmp_path / "cps")
    (tmp_path / "fresh").mkdir()
    resumed = resume(tmp_path, "inv-a", "--checkpoint-dir", "fresh")
    assert resumed.returncode == 0, resumed


def test_runtime_resume_given_the_checkpoints_refuses_before_it_drives_anything(
    folder: Path,
) -> None:
    """The API's form: ``Runtime(checkpoint_dir=...).resume`` of an invocation that would
    run (submitted, never driven) raises ``InconsistentHistoryError`` when another
    invocation's event was forged under the checkpoints: its tools are not called and
    nothing is recorded. Without the checkpoints the same resume drives it."""
    db = folder / "audit.db"

    async def submit() -> None:
        async with Runtime(f"sqlite:///{db}") as runtime:
            await runtime.submit(AGENT, "refund", invocation_id="inv-new")

    async def resume_it(**options: Any) -> str:
        with trio.fail_after(60):
            async with Runtime(f"sqlite:///{db}", **options) as runtime:
                return str((await runtime.resume("inv-new", AGENT)).reason)

    trio.run(submit)
    forge_last_event(db, "inv-b")
    before = rows(db)
    audit_support.RUNS.clear()
    checkpoints = {"checkpoint_dir": folder / "cps", "checkpoint_key": folder / "ops.key"}
    with pytest.raises(InconsistentHistoryError, match="does not agree with the checkpoints"):
        trio.run(partial(resume_it, **checkpoints))
    assert audit_support.RUNS == []  # nothing was driven
    assert rows(db) == before  # nothing was recorded
    assert trio.run(resume_it) == "completed"  # without them, the resume cannot tell
    assert audit_support.RUNS == ["policy"]
