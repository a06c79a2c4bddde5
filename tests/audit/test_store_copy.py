"""``loop-actors store copy``: a SQLite store's events moved into PostgreSQL (and back), checked.

Bad inputs tried: the same store as source and target (also spelled two ways),
a target that holds other rows, a source that does not exist; and an
interrupted copy, which goes on where it stopped.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import trio

from loop_actors import Runtime, TerminalReason
from loop_actors.audit.store_copy import StoreCopyError, copy_store
from loop_actors.store.store import EventStore
from tests.support.audit import AGENT
from tests.support.cli import run_cli
from tests.support.events import started


@pytest.fixture
def source(tmp_path: Path) -> str:
    """A SQLite store of two finished invocations (each with a read and a write)."""
    url = f"sqlite:///{tmp_path / 'source.db'}"

    async def run() -> None:
        with trio.fail_after(60):
            async with Runtime(url) as runtime:
                await runtime.run(AGENT, "refund", invocation_id="inv-a")
                await runtime.run(AGENT, "refund", invocation_id="inv-b")

    trio.run(run)
    return url


def copied(source: str, target: str, cwd: Path, *extra: str) -> tuple[int, dict[str, Any]]:
    done = run_cli("store", "copy", "--from", source, "--to", target, "--json", *extra, cwd=cwd)
    assert done.returncode in (0, 4), done.stderr
    report: dict[str, Any] = json.loads(done.stdout)
    return done.returncode, report


def rows(url: str) -> list[tuple[int, str, int, str, bytes]]:
    store = EventStore(url, create=False, read_only=True)
    try:
        return list(store.log_rows())
    finally:
        store.close()


def test_a_sqlite_store_copied_into_postgresql_has_the_same_log_ids_and_identity(
    source: str, postgres_url: str, tmp_path: Path
) -> None:
    checkpoint = run_cli("audit", "checkpoint", "--out", "cp.txt", cwd=tmp_path, db=source)
    assert checkpoint.returncode == 0, checkpoint.stderr

    code, report = copied(source, postgres_url, tmp_path)

    assert code == 0
    assert (report["copied"], report["already"], report["same_as_source"]) == (
        len(rows(source)),
        0,
        True,
    )
    assert (report["intact"], report["broken"]) == (4, 0)
    assert rows(postgres_url) == rows(source)
    assert EventStore(postgres_url).store_id == EventStore(source).store_id
    # A checkpoint of the source verifies against the copy.
    against = run_cli("audit", "verify", "--against", "cp.txt", cwd=tmp_path, db=postgres_url)
    assert against.returncode == 0, against.stdout + against.stderr
    (line,) = [line for line in against.stdout.splitlines() if "checkpoint cp.txt" in line]
    assert line.startswith("ok ")


async def test_the_copy_goes_on_working_new_runs_take_ids_after_the_copied_ones(
    source: str, postgres_url: str
) -> None:
    report = await trio.to_thread.run_sync(copy_store, source, postgres_url)
    assert report.ok
    outcome = await Runtime(postgres_url).run(AGENT, "refund", invocation_id="inv-c")
    again = await Runtime(postgres_url).resume("inv-a", AGENT)
    assert outcome.reason is again.reason is TerminalReason.COMPLETED
    ids = [row[0] for row in rows(postgres_url)]
    assert ids == sorted(ids)
    assert ids[report.size] > ids[report.size - 1]


def test_a_postgresql_store_with_holes_in_its_ids_copies_back_to_sqlite_exactly(
    postgres_url: str, tmp_path: Path
) -> None:
    from eventsourcing.persistence import IntegrityError

    store = EventStore(postgres_url)
    store.append(started("a"))
    with pytest.raises(IntegrityError):
        store.append(started("a"))  # a rolled-back insert: a hole in the ids
    store.append(started("b"))
    store.close()
    back = f"sqlite:///{tmp_path / 'back.db'}"

    code, report = copied(postgres_url, back, tmp_path)

    assert code == 0
    assert report["same_as_source"]
    assert [row[0] for row in rows(back)] == [row[0] for row in rows(postgres_url)] == [1, 3]


def test_an_interrupted_copy_goes_on_after_the_rows_already_there(
    source: str, postgres_url: str, tmp_path: Path
) -> None:
    first = rows(source)[:5]
    target = EventStore(postgres_url)
    target.adopt_identity(str(EventStore(source).store_id))
    target.copy_in(first)  # as if the copy had stopped after one transaction
    target.close()

    code, report = copied(source, postgres_url, tmp_path)

    assert code == 0
    assert (report["already"], report["copied"]) == (5, len(rows(source)) - 5)
    assert rows(postgres_url) == rows(source)


def test_a_target_holding_other_rows_is_refused_and_left_as_it_was(
    source: str, postgres_url: str, tmp_path: Path
) -> None:
    other = EventStore(postgres_url)
    other.append(started("someone-else"))
    other.close()
    done = run_cli("store", "copy", "--from", source, "--to", postgres_url, cwd=tmp_path)
    assert done.returncode == 2
    assert "a store is copied only into an empty one" in done.stderr
    assert [row[1] for row in rows(postgres_url)] == ["someone-else"]


@pytest.mark.parametrize(
    "target", ["sqlite:///{folder}/source.db", "sqlite:///{folder}/./source.db"]
)
def test_copying_a_store_onto_itself_is_refused(source: str, tmp_path: Path, target: str) -> None:
    with pytest.raises(StoreCopyError, match="the same store"):
        copy_store(source, target.format(folder=tmp_path))


def test_a_missing_source_is_refused_and_creates_no_target(tmp_path: Path) -> None:
    done = run_cli(
        "store", "copy", "--from", f"sqlite:///{tmp_path / 'none.db'}",
        "--to", f"sqlite:///{tmp_path / 'target.db'}", cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 2
    assert "no database at" in done.stderr
    assert not (tmp_path / "target.db").exists()
