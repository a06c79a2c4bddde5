"""`audit verify` covers every stored row: whole aggregates, first events, topics, snapshots.

Each test tampers with the SQLite rows by hand, as someone with the sqlite3 shell
would, and checks the verdict and its position; an untouched store verifies.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import trio
from eventsourcing.persistence import StoredEvent

from aggregates.audit import GENESIS, chain_hash_of
from aggregates.audit_coverage import event_classes
from aggregates.effect import EffectCommitted
from aggregates.events import fold
from loop_actors import (
    Agent,
    InconsistentHistoryError,
    Runtime,
    ScriptedModel,
)
from loop_actors.store.store import EventStore
from tests.support.audit import AGENT, RUNS, tamperable
from tests.support.cli import run_cli

pytestmark = pytest.mark.slow

ASKER = Agent("asker", ScriptedModel([{"kind": "clarification", "question": "Which one?"}]))


@pytest.fixture
def store(tmp_path: Path) -> Path:
    """Two completed invocations, inv-c paused then cancelled by a request, and a snapshot of
    inv-a at its last event (taken as the store takes one every 100 events)."""
    path = tmp_path / "audit.db"

    async def run_two() -> None:
        async with Runtime(f"sqlite:///{path}") as runtime:
            await runtime.run(AGENT, "refund", invocation_id="inv-a")
            await runtime.run(AGENT, "refund", invocation_id="inv-b")
            await runtime.run(ASKER, "which?", invocation_id="inv-c")
            await runtime.request_cancel("inv-c", by="ops", reason="no answer coming")

    trio.run(run_two)
    events = EventStore(f"sqlite:///{path}")
    try:
        version = len(events.events("inv-a"))
        events.app.take_snapshot("inv-a", version=version, projector_func=fold)
    finally:
        events.close()
    return path


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return run_cli(*args, cwd=cwd, db="sqlite:///audit.db", timeout=60)


def verify(store: Path, *ids: str) -> tuple[int, list[dict[str, Any]], dict[str, Any] | None]:
    result = cli("audit", "verify", *ids, "--json", cwd=store.parent)
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    coverage = [line for line in lines if line["kind"] == "coverage"]
    return (
        result.returncode,
        [line for line in lines if "id" in line],  # not the log's or the coverage line
        coverage[0] if coverage else None,
    )


def sql(store: Path, statement: str, *params: Any) -> int:
    connection = tamperable(store)
    with connection:
        changed = connection.execute(statement, params).rowcount
    connection.close()
    assert changed >= 1
    return changed


def findings(reports: list[dict[str, Any]]) -> list[tuple[str, str, int | None]]:
    return [(r["kind"], r["id"], r["broken_at"]) for r in reports if not r["intact"]]


def effect_key_of(store: Path, invocation_id: str) -> str:
    connection = sqlite3.connect(store)
    rows = connection.execute(
        "SELECT originator_id, state FROM stored_events WHERE originator_id LIKE 'eff-%' "
        "AND originator_version = 1"
    ).fetchall()
    connection.close()
    (key,) = [
        k for k, state in rows if f'"invocation_id":"{invocation_id}"' in bytes(state).decode()
    ]
    return str(key)


def test_an_untouched_store_verifies_every_row_and_says_so(store: Path) -> None:
    """Bad input: none. Every aggregate kind (3 invocations, 2 effects, 1 cancel request) and
    the snapshot are reported ok, and the rows checked are all the rows the store holds."""
    code, reports, coverage = verify(store)
    assert code == 0, reports
    assert findings(reports) == []
    kinds = sorted(r["kind"] for r in reports)
    assert kinds == [
        "cancel_request", "effect", "effect", "invocation", "invocation", "invocation", "snapshot"
    ]  # fmt: skip
    assert coverage is not None
    connection = sqlite3.connect(store)
    (rows,) = connection.execute("SELECT COUNT(*) FROM stored_events").fetchone()
    (snapshots,) = connection.execute("SELECT COUNT(*) FROM stored_snapshots").fetchone()
    connection.close()
    assert (coverage["rows"], coverage["snapshots"]) == (rows, snapshots) == (rows, 1)
    assert coverage["store_rows"] == rows + 1
    assert (coverage["invocations"], coverage["effects"], coverage["cancel_requests"]) == (3, 2, 1)
    text = cli("audit", "verify", cwd=store.parent)
    assert text.returncode == 0
    assert "7 intact, 0 broken" in text.stdout
    assert (
        f"every stored row checked: {rows} events of 3 invocations, 2 effects and 1 cancel requests; 1 snapshots"
        in text.stdout
    )


def test_deleting_only_invocation_started_is_reported_at_position_1(store: Path) -> None:
    """Bad input: the InvocationStarted row of inv-b deleted, the rest of its stream kept
    (it used to vanish from the listing and verify ok)."""
    sql(store, "DELETE FROM stored_events WHERE originator_id = 'inv-b' AND originator_version = 1")
    code, reports, _ = verify(store)
    assert code == 4
    (invocation,) = [r for r in reports if r["id"] == "inv-b" and r["kind"] == "invocation"]
    assert invocation["broken_at"] == 1
    assert "position 1 is missing" in invocation["problem"]
    code_one, reports_one, _ = verify(store, "inv-b")
    assert code_one == 4
    assert findings(reports_one)[0] == ("invocation", "inv-b", 1)


def test_deleting_a_whole_invocation_leaves_its_effect_and_cancel_request_reported(
    store: Path,
) -> None:
    """Bad input: every row of inv-b deleted (its effect remains), and every row of inv-c
    (its cancel request remains). Both orphans are reported with the reason; inv-a is ok."""
    sql(store, "DELETE FROM stored_events WHERE originator_id IN ('inv-b', 'inv-c')")
    code, reports, _ = verify(store)
    assert code == 4
    found = findings(reports)
    key = effect_key_of(store, "inv-b")
    assert sorted(found) == [("cancel_request", "cancel:inv-c", None), ("effect", key, None)]
    problems = {r["id"]: r["problem"] for r in reports if not r["intact"]}
    assert "its invocation inv-b has no stored events" in problems[key]
    assert "its invocation inv-c has no stored events" in problems["cancel:inv-c"]


@pytest.mark.parametrize("k", [1, 2, 4])
def test_deleting_the_last_k_events_is_reported_where_a_write_is_cut_off(
    store: Path, k: int
) -> None:
    """Bad input: the last k rows of inv-b deleted. A cut that removes the batch of its
    write (k=4: back past BatchDispatched of step 2) leaves the write's effect named by no
    batch, reported; a shorter cut (k=1, 2: Terminated, the final decision) leaves a chain
    that is whole and consistent; inv-c's rows follow, so the log shows the hole (``gap``).
    Cut from the end of the log, it is out of reach without a checkpoint (documented, and
    tested in test_audit_checkpoint)."""
    sql(
        store,
        "DELETE FROM stored_events WHERE originator_id = 'inv-b' AND originator_version > "
        "(SELECT MAX(originator_version) FROM stored_events WHERE originator_id = 'inv-b') - ?",
        k,
    )
    code, reports, _ = verify(store)
    key = effect_key_of(store, "inv-b")
    if k < 4:
        assert (code, findings(reports)) == (4, [])
        result = cli("audit", "verify", "--json", cwd=store.parent)
        lines = [json.loads(line) for line in result.stdout.splitlines()]
        assert [line["verdict"] for line in lines if line["kind"] == "log"] == ["gap"]
    else:
        assert code == 4
        assert findings(reports) == [("effect", key, None)]
        (effect,) = [r for r in reports if r["id"] == key]
        assert "history was cut" in effect["problem"]


def test_a_forged_snapshot_is_reported_and_resume_refuses_to_use_it(store: Path) -> None:
    """Bad input: inv-a's snapshot edited to say the invocation never ended (its phase and
    terminated event removed) and to change the goal. `audit verify` reports the snapshot
    at its version; a resume, which reads the invocation from that snapshot, refuses with
    InconsistentHistoryError and runs nothing (the lookup tool is not called)."""
    connection = sqlite3.connect(store)
    ((version, state),) = connection.execute(
        "SELECT originator_version, state FROM stored_snapshots WHERE originator_id = 'inv-a'"
    ).fetchall()
    snapshot = json.loads(bytes(state))
    snapshot["state"]["goal"] = "steal"
    snapshot["state"]["phase"] = "ready"
    snapshot["state"].pop("terminated")
    with connection:
        connection.execute(
            "UPDATE stored_snapshots SET state = ? WHERE originator_id = 'inv-a'",
            (json.dumps(snapshot).encode(),),
        )
    connection.close()
    code, reports, _ = verify(store)
    assert code == 4
    assert findings(reports) == [("snapshot", "inv-a", version)]
    (report,) = [r for r in reports if r["kind"] == "snapshot"]
    assert "differs from the replay" in report["problem"]
    assert findings(verify(store, "inv-a")[1]) == [("snapshot", "inv-a", version)]

    RUNS.clear()

    async def resume() -> None:
        with trio.fail_after(30):
            async with Runtime(f"sqlite:///{store}") as runtime:
                await runtime.resume("inv-a", AGENT)

    with pytest.raises(InconsistentHistoryError, match="snapshot at version"):
        trio.run(resume)
    assert RUNS == []


def test_an_unreadable_snapshot_row_is_reported(store: Path) -> None:
    """Bad input: the snapshot's stored topic changed to a module loop-actors does not have;
    it is reported (not imported) at its version."""
    sql(store, "UPDATE stored_snapshots SET topic = 'os:system' WHERE originator_id = 'inv-a'")
    code, reports, _ = verify(store)
    assert code == 4
    (report,) = [r for r in reports if not r["intact"]]
    assert (report["kind"], report["id"]) == ("snapshot", "inv-a")
    assert "not an invocation snapshot" in report["problem"]


@pytest.mark.parametrize(
    ("topic", "expected"),
    [
        ("aggregates.invocation:Paused", "cannot be read"),
        ("aggregates.effect:EffectCommitted", "stream of invocation"),
        ("evil_module:Terminated", "names no loop-actors event class"),
    ],
)
def test_a_changed_topic_is_reported_at_its_position(
    store: Path, topic: str, expected: str
) -> None:
    """Bad input: the stored topic of inv-a's Terminated row (its last) changed to another
    invocation event (the row no longer decodes), to an effect event forged with a
    recomputed chain hash (the hash is right, the kind is not), or to a module that is not
    loop-actors' (which the audit must not import). Each is reported at that position."""
    connection = sqlite3.connect(store)
    (last,) = connection.execute(
        "SELECT MAX(originator_version) FROM stored_events WHERE originator_id = 'inv-a'"
    ).fetchone()
    connection.close()
    if topic.endswith("EffectCommitted"):
        # A forged effect event in the invocation's stream, with a recomputed chain hash.
        events = EventStore(f"sqlite:///{store}", read_only=True)
        try:
            previous = events.events("inv-a")[last - 2].chain_hash
        finally:
            events.close()
        forged = EffectCommitted(
            originator_id="inv-a",
            originator_version=last,
            timestamp=datetime(2026, 11, 30, 18, 23, tzinfo=UTC),
            receipt={"forged": True},
        )
        state = forged.model_copy(update={"chain_hash": chain_hash_of(previous, forged)})
        sql(
            store,
            "UPDATE stored_events SET topic = ?, state = ? WHERE originator_id = 'inv-a' "
            "AND originator_version = ?",
            topic,
            state.model_dump_json(exclude={"originator_id", "originator_version"}).encode(),
            last,
        )
    else:
        sql(
            store,
            "UPDATE stored_events SET topic = ? WHERE originator_id = 'inv-a' "
            "AND originator_version = ?",
            topic,
            last,
        )
    code, reports, _ = verify(store)
    assert code == 4
    (report,) = [r for r in reports if r["kind"] == "invocation" and not r["intact"]]
    assert (report["id"], report["broken_at"]) == ("inv-a", last)
    assert expected in report["problem"]


def test_a_forged_originator_topic_of_a_first_event_is_reported(store: Path) -> None:
    """Bad input: the originator_topic inside inv-a's InvocationStarted changed to another
    aggregate class, as it is stored (the hash covers it now: a hash mismatch), then with
    its hash recomputed (the hash is right, the aggregate class is not). Each is reported at
    position 1, and the snapshot as uncheckable."""
    sql(
        store,
        "UPDATE stored_events SET state = repacked(state, CAST(replace(CAST(plain(state) AS TEXT), "
        "'aggregates.invocation:Invocation', 'aggregates.effect:Effect') AS BLOB)) "
        "WHERE originator_id = 'inv-a' AND originator_version = 1",
    )
    _, reports, _ = verify(store)
    (report,) = [r for r in reports if r["kind"] == "invocation" and not r["intact"]]
    assert (report["id"], report["broken_at"]) == ("inv-a", 1)
    assert "stored bytes" in report["problem"]
    events = EventStore(f"sqlite:///{store}")
    try:
        # The first event forged, and every hash after it recomputed: a whole chain.
        stored: list[StoredEvent] = []
        previous = GENESIS
        for event in events.events("inv-a"):
            update = {"originator_topic": "aggregates.effect:Effect"} if not stored else {}
            forged = event.model_copy(update=update)
            previous = chain_hash_of(previous, forged)
            forged = forged.model_copy(update={"chain_hash": previous})
            stored.append(events.app.mapper.to_stored_event(forged))
    finally:
        events.close()
    for row in stored:
        sql(
            store,
            "UPDATE stored_events SET state = ? WHERE originator_id = 'inv-a' "
            "AND originator_version = ?",
            row.state,
            row.originator_version,
        )
    code, reports, _ = verify(store)
    assert code == 4
    report, snapshot = [r for r in reports if not r["intact"]]
    assert (report["kind"], report["id"], report["broken_at"]) == ("invocation", "inv-a", 1)
    assert "originator_topic" in report["problem"]
    # Its snapshot cannot be checked against a broken stream, and says so.
    assert (snapshot["kind"], snapshot["id"]) == ("snapshot", "inv-a")
    assert "chain is broken" in snapshot["problem"]


def test_no_two_event_classes_share_a_name() -> None:
    """The hash covers the class name, not the topic: with unique names, a topic that names
    another class always changes what is hashed."""
    names = [cls.__name__ for cls in event_classes()]
    assert len(names) == len(set(names)) > 10
