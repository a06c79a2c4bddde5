"""Each store has an identity created with it; read models of another store are never answered from.

The story of docs/how-to/run-a-batch-of-invocations.md: run invocations, look at
them, ``rm loop-actors.db*`` (which leaves ``loop-actors.views.db``), run new
ones, and look again.
"""

from __future__ import annotations

import json
import logging
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from loop_actors.store.read_models import open_runner, views_location
from loop_actors.store.store import EventStore
from projections import ForeignReadModelsError, ProjectionRunner, default_projections
from tests.support.cli import cli_env, run_cli

pytestmark = pytest.mark.slow

AGENTS = '''
from loop_actors import Agent, ScriptedModel, tool

@tool
def lookup(key: str) -> dict:
    """Look up a key."""
    return {"key": key}

answering = Agent(
    "answering",
    ScriptedModel([
        {"kind": "tool_calls", "calls": [{"id": "c1", "name": "lookup", "arguments": {"key": "k"}}]},
        {"kind": "final", "answer": "done"},
    ]),
    [lookup],
)
'''


def cli(project: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The CLI in ``project``, on its default store ``loop-actors.db``."""
    return run_cli(*args, cwd=project)


def run_ok(project: Path, invocation_id: str) -> None:
    result = cli(project, "run", "agents:answering", "--goal", "g", "--id", invocation_id)
    assert result.returncode == 0, result.stderr


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "agents.py").write_text(AGENTS)
    return tmp_path


@pytest.fixture
def recreated(project: Path) -> Path:
    """Two invocations, read models built, the store deleted as the how-to says, one new run."""
    run_ok(project, "old-1")
    run_ok(project, "old-2")
    listed = cli(project, "list", "--json")
    assert listed.returncode == 0, listed.stderr
    assert {json.loads(line)["invocation_id"] for line in listed.stdout.splitlines()} == {
        "old-1",
        "old-2",
    }
    assert cli(project, "metrics", "--json").returncode == 0
    for file in project.glob("loop-actors.db*"):  # rm loop-actors.db*
        file.unlink()
    assert (project / "loop-actors.views.db").exists()  # what the how-to's rm leaves
    run_ok(project, "new-1")
    return project


def test_list_after_the_how_tos_delete_shows_only_the_new_store_s_invocations(
    recreated: Path,
) -> None:
    """Bad input: a read models' file left behind by a deleted store."""
    listed = cli(recreated, "list", "--json")
    assert listed.returncode == 0, listed.stderr
    assert [json.loads(line)["invocation_id"] for line in listed.stdout.splitlines()] == ["new-1"]
    assert "were built from store" in listed.stderr  # the rebuild is logged
    assert "emptying them and replaying" in listed.stderr


def test_show_of_a_deleted_store_s_invocation_is_not_found(recreated: Path) -> None:
    """Bad input: the id of an invocation that only the deleted store's read models still hold."""
    shown = cli(recreated, "show", "old-1")
    assert shown.returncode == 2
    assert "no invocation with id 'old-1'" in shown.stderr
    assert cli(recreated, "show", "new-1").returncode == 0


def test_projections_status_after_the_delete_counts_the_new_store_s_events_as_lag(
    recreated: Path,
) -> None:
    """Bad input: read models whose position (12 events) is past the new store's head (6)."""
    head = len(cli(recreated, "history", "new-1", "--json").stdout.splitlines())
    status = cli(recreated, "projections", "status", "--json")
    assert status.returncode == 0, status.stderr
    rows = [json.loads(line) for line in status.stdout.splitlines()]
    assert {(row["position"], row["head"], row["lag"]) for row in rows} == {(0, head, head)}
    assert cli(recreated, "projections", "catch-up").returncode == 0
    caught_up = cli(recreated, "projections", "status", "--json")
    rows = [json.loads(line) for line in caught_up.stdout.splitlines()]
    assert {(row["position"], row["head"], row["lag"]) for row in rows} == {(head, head, 0)}


def test_metrics_after_the_delete_count_only_the_new_store_s_invocations(recreated: Path) -> None:
    """Bad input: metrics of two deleted invocations in the read models' file."""
    result = cli(recreated, "metrics", "--json")
    assert result.returncode == 0, result.stderr
    groups = [json.loads(line) for line in result.stdout.splitlines()]
    assert [(g["group"], g["invocations"]) for g in groups] == [("completed", 1)]


def test_a_store_keeps_its_identity_and_another_store_has_another(tmp_path: Path) -> None:
    first_url = f"sqlite:///{tmp_path / 'a.db'}"
    first = EventStore(first_url)
    identity = first.store_id
    first.close()
    again = EventStore(first_url, create=False)
    read_only = EventStore(first_url, read_only=True)
    other = EventStore(f"sqlite:///{tmp_path / 'b.db'}")
    memory_1, memory_2 = EventStore("memory://"), EventStore("memory://")
    try:
        assert identity is not None
        assert again.store_id == read_only.store_id == identity
        assert len({identity, other.store_id, memory_1.store_id, memory_2.store_id}) == 4
    finally:
        for store in (again, read_only, other, memory_1, memory_2):
            store.close()


RACER = """
import sys, time
from pathlib import Path
from loop_actors.store.store import EventStore
go = Path(sys.argv[2])
while not go.exists():
    time.sleep(0.001)
store = EventStore(sys.argv[1])
print(store.store_id)
store.close()
"""


def test_processes_racing_to_create_a_store_end_with_one_identity(tmp_path: Path) -> None:
    """Bad input: eight processes creating the same new store at the same moment."""
    url = f"sqlite:///{tmp_path / 'raced.db'}"
    go = tmp_path / "go"
    racers = [
        subprocess.Popen(
            [sys.executable, "-c", RACER, url, str(go)],
            env=cli_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(8)
    ]
    go.touch()
    identities = set()
    for racer in racers:
        out, err = racer.communicate(timeout=60)
        assert racer.returncode == 0, err
        identities.add(out.strip())
    store = EventStore(url)
    try:
        connection = sqlite3.connect(tmp_path / "raced.db")
        rows = connection.execute("SELECT store_id FROM loop_actors_store").fetchall()
        connection.close()
        assert identities == {store.store_id}
        assert len(rows) == 1
    finally:
        store.close()


def test_a_runner_refuses_to_commit_into_read_models_claimed_for_another_store(
    tmp_path: Path,
) -> None:
    """Bad input: two stores given one read models' file, both followed at once."""
    views = str(tmp_path / "shared.views.db")
    first = EventStore(f"sqlite:///{tmp_path / 'first.db'}")
    second = EventStore(f"sqlite:///{tmp_path / 'second.db'}")
    first_runner = open_runner(first, views)
    second_runner = open_runner(second, views)  # claims the file for the second store
    try:
        assert second_runner.recorded_store_id() == second.store_id
        with pytest.raises(ForeignReadModelsError, match="two stores share one read models"):
            first_runner.catch_up()
    finally:
        for closing in (first_runner, second_runner, first, second):
            closing.close()


def test_read_models_built_before_identities_are_rebuilt_and_the_rebuild_is_logged(
    project: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Bad input: read models with positions but no recorded store (an older version's file)."""
    run_ok(project, "one")
    store = EventStore(f"sqlite:///{project / 'loop-actors.db'}")
    runner = open_runner(store)
    runner.catch_up()
    runner.close()
    legacy = sqlite3.connect(views_location(store))
    with legacy:
        legacy.execute("DELETE FROM read_model_store")
    legacy.close()
    try:
        with caplog.at_level(logging.WARNING, logger="projections.runner"):
            reopened = open_runner(store)
        assert "(not recorded)" in caplog.text
        assert reopened.status()[0].position == 0
        assert reopened.recorded_store_id() == store.store_id
        reopened.close()
    finally:
        store.close()


def test_new_read_models_are_claimed_without_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = EventStore(f"sqlite:///{tmp_path / 'fresh.db'}")
    try:
        with caplog.at_level(logging.WARNING, logger="projections.runner"):
            runner = open_runner(store)
        assert caplog.text == ""
        assert runner.recorded_store_id() == store.store_id
        runner.close()
    finally:
        store.close()


def test_another_store_s_read_models_that_cannot_be_emptied_are_refused_naming_the_rebuild(
    tmp_path: Path,
) -> None:
    """Bad input: another store's read models opened read-only (SQLite ``mode=ro``)."""
    old = EventStore(f"sqlite:///{tmp_path / 'old.db'}")
    views = views_location(old)
    open_runner(old).close()
    new = EventStore(f"sqlite:///{tmp_path / 'new.db'}")
    try:
        with pytest.raises(ForeignReadModelsError, match="loop-actors projections rebuild"):
            ProjectionRunner(
                new.app,
                f"{Path(views).as_uri()}?mode=ro",
                default_projections(),
                store_id=new.store_id,
            )
    finally:
        old.close()
        new.close()
