"""One stored row that cannot be decoded never takes the read models down.

A catch-up goes past it, keeps it (by read model and notification id, with its aggregate,
position, topic and why) in the read models' ``read_model_skipped`` table in the batch's
transaction, leaves out the rest of that aggregate's history, and applies everything
else; ``status`` reports it from then on, a rebuild decodes it again. ``list``, ``show``
and ``projections status`` name it by notification id and position; the other
invocations answer as before.

Bad inputs tried, each on invocation q's second row (its first decision) of a store
holding the paying runs p, q and r, and for the CLI on q's first row too: the stored
topic changed to a module that does not exist; the state replaced by a JSON object of
the wrong shape; a packed state whose compressed body is garbage; the state cut in half.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from aggregates.audit import PACKED_DEFLATE
from loop_actors import Agent, ModelRequest, Reconciled, Runtime, ScriptedModel, ToolContext, tool
from loop_actors.store.store import EventStore
from projections import (
    ProjectionRunner,
    ReadModel,
    default_projections,
    list_invocations,
    load_trajectory,
)
from tests.conftest import postgres_admin_url
from tests.support.cli import run_in_process
from tests.support.read_model_stores import BACKENDS, ReadModelDatabases


@tool(effect="write", reconcile=lambda amount: Reconciled(status="not_found"))
async def charge(amount: int, context: ToolContext) -> dict[str, Any]:
    """Charge an amount."""
    return {"receipt": f"r-{context.effect_key}", "amount": amount}


def decide(request: ModelRequest) -> dict[str, Any]:
    if request.step == 1:
        call = {"id": "c1", "name": "charge", "arguments": {"amount": 40}}
        return {"kind": "tool_calls", "calls": [call]}
    return {"kind": "final", "answer": "charged"}


AGENT = Agent("payer", ScriptedModel(decide), [charge])


def run(url: str, *ids: str) -> None:
    async def go() -> None:
        with trio.fail_after(60):
            async with Runtime(url) as runtime:
                for invocation_id in ids:
                    outcome = await runtime.run(AGENT, "pay", invocation_id=invocation_id)
                    assert outcome.reason == "completed"

    trio.run(go)


@pytest.fixture(scope="module")
def three_runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A store with the completed paying runs p, q and r (built once)."""
    path = tmp_path_factory.mktemp("three-runs") / "events.db"
    run(f"sqlite:///{path}", "p", "q", "r")
    return path


@pytest.fixture
def db(three_runs: Path, tmp_path: Path) -> Path:
    path = tmp_path / "events.db"
    shutil.copyfile(three_runs, path)
    return path


@pytest.fixture(params=BACKENDS)
def views(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ReadModelDatabases]:
    """The read models on SQLite, then on PostgreSQL (in the store's own database)."""
    admin = postgres_admin_url() if request.param == "postgresql" else None
    databases = ReadModelDatabases(request.param, tmp_path, admin)
    yield databases
    databases.close()


DAMAGES = ["foreign topic", "wrong shape", "garbled packed body", "cut in half"]


def damage(db: Path, invocation_id: str, version: int, how: str) -> tuple[int, str, bytes]:
    """Damage one stored row by hand, as the sqlite3 shell would; its id, topic and state."""
    connection = sqlite3.connect(db)
    with connection:
        rowid, topic, state = connection.execute(
            "SELECT rowid, topic, state FROM stored_events "
            "WHERE originator_id = ? AND originator_version = ?",
            (invocation_id, version),
        ).fetchone()
        if how == "foreign topic":
            connection.execute(
                "UPDATE stored_events SET topic = 'no_such_module:Gone' WHERE rowid = ?", (rowid,)
            )
            return rowid, topic, state
        if how == "wrong shape":
            edited = b'{"not":"an event"}'
        elif how == "garbled packed body":
            edited = bytes([PACKED_DEFLATE]) + b"\x11" * 32 + b"this is not deflate data"
        else:
            edited = state[: len(state) // 2]
        connection.execute("UPDATE stored_events SET state = ? WHERE rowid = ?", (edited, rowid))
    connection.close()
    return rowid, topic, state


def restore(db: Path, rowid: int, topic: str, state: bytes) -> None:
    connection = sqlite3.connect(db)
    with connection:
        connection.execute(
            "UPDATE stored_events SET topic = ?, state = ? WHERE rowid = ?", (topic, state, rowid)
        )
    connection.close()


def opened(views: ReadModelDatabases, store: EventStore) -> ProjectionRunner:
    return views.open(store, "views")


@pytest.mark.parametrize("how", DAMAGES)
def test_the_catch_up_goes_past_the_row_and_the_others_answer(
    db: Path, views: ReadModelDatabases, how: str
) -> None:
    rowid, _, _ = damage(db, "q", 2, how)
    store = EventStore(f"sqlite:///{db}", create=False)
    runner = opened(views, store)
    try:
        reports = runner.catch_up()
        statuses = runner.status()
        p, q, r = (load_trajectory(runner, i) for i in "pqr")
        listed = {row["invocation_id"] for row in list_invocations(runner)}
    finally:
        runner.close()
        store.close()
    assert [report.skipped for report in reports] == [1, 1, 1]
    for status in statuses:
        assert status.position == status.head  # its position went past the row
        (skipped,) = status.skipped
        assert (skipped.notification_id, skipped.originator_id) == (rowid, "q")
        assert skipped.originator_version == 2
        assert skipped.problem
    assert p is not None
    assert r is not None
    assert (p.reason, len(p.steps), r.reason, len(r.steps)) == ("completed", 2, "completed", 2)
    assert q is not None
    assert (q.reason, q.steps) == (None, [])  # the rest of q's history is left out
    assert listed == {"p", "q", "r"}


def test_the_skipped_row_is_kept_and_later_events_are_applied(db: Path, tmp_path: Path) -> None:
    """Kept durably: a new runner still reports it, and does not decode it again; the
    invocations recorded after it are applied."""
    rowid, _, _ = damage(db, "q", 2, "wrong shape")
    views = str(tmp_path / "events.views.db")
    store = EventStore(f"sqlite:///{db}", create=False)
    try:
        first = ProjectionRunner(store.app, views, _default(), store_id=store.store_id)
        first.catch_up()
        first.close()
    finally:
        store.close()
    run(f"sqlite:///{db}", "s")
    store = EventStore(f"sqlite:///{db}", create=False)
    try:
        again = ProjectionRunner(store.app, views, _default(), store_id=store.store_id)
        reports = again.catch_up()
        kept = again.skipped()
        s = load_trajectory(again, "s")
        again.close()
    finally:
        store.close()
    assert [report.skipped for report in reports] == [0, 0, 0]
    assert all(report.events > 0 for report in reports)
    assert {(row.name, row.notification_id) for row in kept} == {
        ("trajectory", rowid),
        ("metrics", rowid),
        ("open_effects", rowid),
    }
    assert s is not None
    assert s.reason == "completed"


def test_a_rebuild_decodes_a_skipped_row_again(db: Path, tmp_path: Path) -> None:
    """Restored in the store, the row is applied by a rebuild, and reported no more."""
    rowid, topic, state = damage(db, "q", 2, "foreign topic")
    store = EventStore(f"sqlite:///{db}", create=False)
    try:
        runner = ProjectionRunner(
            store.app, str(tmp_path / "v.db"), _default(), store_id=store.store_id
        )
        runner.catch_up()
        assert len(runner.skipped()) == 3
        restore(db, rowid, topic, state)
        runner.catch_up()
        assert len(runner.skipped()) == 3  # a catch-up goes on from its position
        reports = runner.rebuild()
        q = load_trajectory(runner, "q")
        left = runner.skipped()
        runner.close()
    finally:
        store.close()
    assert [report.skipped for report in reports] == [0, 0, 0]
    assert left == []
    assert q is not None
    assert (q.reason, len(q.steps)) == ("completed", 2)


def _default() -> list[ReadModel]:
    return default_projections()


@pytest.fixture
def cli_folder(db: Path) -> Path:
    """Where the CLI runs: the folder of the store (events.db)."""
    return db.parent


def test_the_cli_names_the_row_by_id_and_position(
    db: Path, cli_folder: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    rowid, _, _ = damage(db, "q", 2, "garbled packed body")

    def cli(*args: str) -> Any:
        return run_in_process(
            *args, cwd=cli_folder, db="sqlite:///events.db", capsys=capsys, monkeypatch=monkeypatch
        )

    named = f"stored row {rowid} (q at position 2, topic 'aggregates.invocation:DecisionProposed')"
    listed = cli("list", "--json")
    assert listed.returncode == 0, listed.stderr
    assert {json.loads(line)["invocation_id"] for line in listed.stdout.splitlines()} == {
        "p",
        "q",
        "r",
    }
    assert named in listed.stderr
    assert "audit verify" in listed.stderr

    shown = cli("show", "p")
    assert (shown.returncode, shown.stderr) == (0, "")
    lacking = cli("show", "q")
    assert lacking.returncode == 4
    assert named in lacking.stderr

    status = cli("projections", "status")
    assert status.returncode == 0, status.stderr
    assert status.stdout.splitlines()[0].endswith("lag=0 skipped=1")
    assert f"  {named} cannot be read" in status.stdout
    as_json = [
        json.loads(line) for line in cli("projections", "status", "--json").stdout.splitlines()
    ]
    assert [(s["name"], [k["notification_id"] for k in s["skipped"]]) for s in as_json] == [
        ("trajectory", [rowid]),
        ("metrics", [rowid]),
        ("open_effects", [rowid]),
    ]

    counted = cli("metrics", "--json")
    assert counted.returncode == 0, counted.stderr
    assert "1 stored row(s) cannot be read" in counted.stderr


def test_show_of_an_invocation_whose_first_row_is_unreadable_is_refused_typed(
    db: Path, cli_folder: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its trajectory has nothing: not "no such invocation" (exit 2) but the row, exit 4."""
    damage(db, "q", 1, "cut in half")
    shown = run_in_process(
        "show",
        "q",
        cwd=cli_folder,
        db="sqlite:///events.db",
        capsys=capsys,
        monkeypatch=monkeypatch,
    )
    assert shown.returncode == 4
    assert "position 1 of q cannot be read" in shown.stderr


async def test_a_following_runtime_goes_past_the_row_and_stays_fresh(db: Path) -> None:
    """The live follower is not stale for it: runs go on, and their events are applied."""
    damage(db, "q", 2, "wrong shape")
    with trio.fail_after(30):
        async with Runtime(f"sqlite:///{db}", follow_projections=True) as runtime:
            await runtime.run(AGENT, "pay", invocation_id="s")
            views = runtime.projections
            assert views is not None
            while any(s.lag for s in views.status()):  # noqa: ASYNC110 - polls a database
                await trio.sleep(0.01)
            status = runtime.read_models_status()
            s = load_trajectory(views, "s")
    assert status is not None
    assert (status.stale, status.skipped) == (False, 1)
    assert s is not None
    assert s.reason == "completed"
