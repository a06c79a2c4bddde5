"""Resume's history check reads what it must: from a snapshot the store vouches for, the tail.

A snapshot is sealed when it is written (``InvocationSnapshot.take``): its hash covers
the chain hash of the event at its version and its body as stored. The store vouches for
it when that seal holds against the stored event and no event before it is missing; the
check then reads the snapshot's row, the events after it and the effect ledger, not the
history before it (issue 32: 78 ms for 1,000 turns before). Whatever the store cannot
vouch for is checked as a whole, as before, and refused with the same reasons. Resume's
own load (``EventStore.get_to_resume``) notes what the store vouched for then, and the
check of that object reads again only what could have changed since: each case runs with
both loads.

Bad inputs tried, on ``tests.support.snapshots``' paused history (16 events, a write at
step 4, a snapshot every 3 events): its newest snapshot's turn replaced, an event before
it deleted, the tail from the write's batch on deleted (the snapshot before it kept), an
event before the snapshot edited in place, a store whose snapshots were written before
seals; after resume's load, an event before the snapshot deleted, the event at its
version deleted.
"""

from __future__ import annotations

import gc
import hashlib
import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from aggregates.audit import event_body, stored_state, topic_of
from aggregates.audit_coverage import snapshot_seal_holds
from aggregates.events import fold
from aggregates.invocation import Invocation, InvocationSnapshot
from loop_actors.audit.verify import verify_invocation
from loop_actors.store.reader import StoreReader
from loop_actors.store.store import EventStore
from tests.support.audit import tamperable
from tests.support.invocations import new
from tests.support.snapshots import _write as write_fixture_runs
from tests.support.snapshots import main, restore

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "snapshots-main.sql"
PAUSED = "snap-paused"
WRITE_BATCH = 10
"""The version of the paused history's write batch (step 4)."""


@pytest.fixture
def store_path(tmp_path: Path) -> Path:
    path = tmp_path / "new.db"
    main(path)
    return path


@pytest.fixture
def store(store_path: Path) -> Iterator[EventStore]:
    opened = EventStore(f"sqlite:///{store_path}")
    yield opened
    opened.close()


LOADERS = ("get", "get_to_resume")
"""The two loads the check is given the invocation of: any reader's, and resume's own
(``EventStore.get_to_resume``: its note spares the check a second read of the snapshot)."""


@pytest.fixture(params=LOADERS)
def loader(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    return name


def check(store: EventStore, loader: str = "get") -> str | None:
    """What resume's check finds, given the invocation as ``store.<loader>`` loaded it."""
    loaded = getattr(store, loader)(PAUSED)

    async def go() -> str | None:
        with trio.fail_after(30):
            return await StoreReader(store).history_problem(PAUSED, loaded)

    return trio.run(go)


def reading_no_whole_history(store: EventStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """Make every read of a whole history fail: the check must do without it."""

    def refused(*_: object) -> None:
        raise AssertionError("the check read the whole history")

    monkeypatch.setattr(store, "events", refused)
    monkeypatch.setattr(store, "newest_snapshot", refused)


def whole_check_of(path: Path, loader: str = "get") -> str | None:
    """What the check finds in a store that cannot vouch for its newest snapshot."""
    store = EventStore(f"sqlite:///{path}")
    try:
        snapshot = store.newest_snapshot_row(PAUSED)
        assert snapshot is not None
        assert not store.vouches_for(snapshot)
        return check(store, loader)
    finally:
        store.close()


def sql(path: Path, statement: str, *args: object) -> None:
    connection = sqlite3.connect(path)
    with connection:
        connection.execute(statement, args)
    connection.close()


# --------------------------------------------------------------------------- pure


def test_a_snapshot_is_sealed_over_its_body_and_the_chain_hash_of_its_event() -> None:
    invocation = new()
    snapshot = InvocationSnapshot.take(invocation)
    stored = stored_state(snapshot.chain_hash, event_body(snapshot))  # as the store writes it
    topic = topic_of(InvocationSnapshot)
    holds = snapshot_seal_holds(snapshot.originator_id, 1, topic, stored, invocation.last_hash)
    assert holds
    assert not snapshot_seal_holds(snapshot.originator_id, 1, topic, stored, "0" * 64)
    forged = stored.replace(b'"phase":"ready"', b'"phase":"decided"')
    assert forged != stored
    assert not snapshot_seal_holds(snapshot.originator_id, 1, topic, forged, invocation.last_hash)
    assert not snapshot_seal_holds(snapshot.originator_id, 1, topic, stored, None)
    # As docs/reference/audit-format.md ("A snapshot's seal") writes it.
    assert stored.startswith(b'{"chain_hash":"' + snapshot.chain_hash.encode() + b'",')
    header = json.dumps(
        [snapshot.originator_id, 1, "aggregates.invocation:InvocationSnapshot"],
        separators=(",", ":"),
        ensure_ascii=True,
    )
    body = b"{" + stored[len(b'{"chain_hash":"",') + 64 :]
    expected = hashlib.sha256(f"{invocation.last_hash}\n{header}\n".encode() + body)
    assert expected.hexdigest() == snapshot.chain_hash


# --------------------------------------------------------------------------- the store


def test_the_check_reads_no_event_before_a_vouched_snapshot(
    store: EventStore, monkeypatch: pytest.MonkeyPatch, loader: str
) -> None:
    """The write at step 4 is before the snapshot (version 15): checked against its turn."""
    snapshot = store.newest_snapshot_row(PAUSED)
    assert snapshot is not None
    assert snapshot.originator_version == 15
    assert store.vouches_for(snapshot)
    assert [effect.step for effect in store.effects_of(PAUSED)] == [4]
    reading_no_whole_history(store, monkeypatch)
    assert check(store, loader) is None


def test_a_write_whose_batch_was_cut_after_the_snapshot_is_refused_from_the_tail(
    store_path: Path, monkeypatch: pytest.MonkeyPatch, loader: str
) -> None:
    """The history cut from the write's batch on; the snapshot before it (version 9) stays."""
    sql(store_path, "DELETE FROM stored_snapshots WHERE originator_version > ?", WRITE_BATCH - 1)
    sql(
        store_path,
        "DELETE FROM stored_events WHERE originator_id = ? AND originator_version >= ?",
        PAUSED,
        WRITE_BATCH,
    )
    store = EventStore(f"sqlite:///{store_path}")
    try:
        snapshot = store.newest_snapshot_row(PAUSED)
        assert snapshot is not None
        assert store.vouches_for(snapshot)
        reading_no_whole_history(store, monkeypatch)
        problem = check(store, loader)
    finally:
        store.close()
    assert problem is not None
    assert "history was cut" in problem
    assert "step 4" in problem


def test_a_forged_snapshot_is_not_vouched_for_and_the_replay_refuses_it(
    store_path: Path, loader: str
) -> None:
    connection = sqlite3.connect(store_path)
    with connection:
        (state,) = connection.execute(
            "SELECT state FROM stored_snapshots WHERE originator_id = ? "
            "ORDER BY originator_version DESC LIMIT 1",
            (PAUSED,),
        ).fetchone()
        forged = bytes(state).replace(b"which account?", b"which cards?")
        assert forged != bytes(state)
        connection.execute(
            "UPDATE stored_snapshots SET state = ? WHERE originator_id = ? AND "
            "originator_version = 15",
            (forged, PAUSED),
        )
    connection.close()
    problem = whole_check_of(store_path, loader)
    assert problem is not None
    assert "snapshot at version 15 does not match its events" in problem


def test_an_event_deleted_before_the_snapshot_makes_the_whole_check_refuse(
    store_path: Path, loader: str
) -> None:
    sql(
        store_path,
        "DELETE FROM stored_events WHERE originator_id = ? AND originator_version = 5",
        PAUSED,
    )
    problem = whole_check_of(store_path, loader)
    assert problem is not None
    assert "cannot be replayed" in problem


def test_snapshots_written_before_seals_are_checked_against_the_whole_replay(
    tmp_path: Path, loader: str
) -> None:
    path = restore(FIXTURE, tmp_path / "old.db")
    assert whole_check_of(path, loader) is None  # the whole replay agrees with it


def test_an_event_edited_in_place_before_a_vouched_snapshot_is_left_to_audit_verify(
    store_path: Path, loader: str
) -> None:
    """The boundary of the check: the resume goes on from the snapshot, the audit finds it."""
    connection = tamperable(store_path)
    with connection:
        connection.execute(
            "UPDATE stored_events SET state = repacked(state, CAST(replace(CAST(plain(state) "
            'AS TEXT), \'"key":"b"\', \'"key":"z"\') AS BLOB)) '
            "WHERE originator_id = ? AND originator_version = 12",
            (PAUSED,),
        )
        assert connection.total_changes == 1
    connection.close()
    store = EventStore(f"sqlite:///{store_path}")
    try:
        snapshot = store.newest_snapshot_row(PAUSED)
        assert snapshot is not None
        assert store.vouches_for(snapshot)
        assert check(store, loader) is None
        reports = verify_invocation(store, PAUSED)
    finally:
        store.close()
    assert [report.broken_at for report in reports if report.kind == "invocation"] == [12]


def checked_from(store: EventStore, loaded: Invocation) -> str | None:
    """What resume's check finds of an invocation already loaded."""

    async def go() -> str | None:
        with trio.fail_after(30):
            return await StoreReader(store).history_problem(PAUSED, loaded)

    return trio.run(go)


def test_resume_s_load_is_checked_without_reading_its_snapshot_again(
    store: EventStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    loaded = store.get_to_resume(PAUSED)
    reading_no_whole_history(store, monkeypatch)

    def refused(*_: object) -> None:
        raise AssertionError("the check read the snapshot again")

    monkeypatch.setattr(store, "newest_snapshot_row", refused)
    monkeypatch.setattr(store, "vouches_for", refused)
    assert checked_from(store, loaded) is None


@pytest.mark.parametrize(
    ("version", "refusal"),
    [
        (5, "cannot be replayed"),  # before the snapshot: the count of events up to it
        (15, "does not match its events"),  # the event the seal was checked against
    ],
)
def test_an_event_deleted_after_resume_s_load_is_refused_at_its_check(
    store_path: Path, version: int, refusal: str
) -> None:
    """What the load vouched for is checked again at the check: a row deleted meanwhile."""
    store = EventStore(f"sqlite:///{store_path}")
    try:
        loaded = store.get_to_resume(PAUSED)
        sql(
            store_path,
            "DELETE FROM stored_events WHERE originator_id = ? AND originator_version = ?",
            PAUSED,
            version,
        )
        problem = checked_from(store, loaded)
    finally:
        store.close()
    assert problem is not None
    assert refusal in problem


def test_resume_s_note_of_a_load_goes_with_the_invocation_it_describes(
    store: EventStore,
) -> None:
    """A note per loaded object, while it lives: loading again and again keeps none."""
    for _ in range(20):
        store.get_to_resume(PAUSED)
    gc.collect()
    assert store._vouched == {}
    kept = store.get_to_resume(PAUSED)
    assert list(store._vouched) == [PAUSED]
    other = store.get(PAUSED)  # another object, not noted: the check takes the long way
    assert store.vouched_tail(other) is None
    assert store.vouched_tail(kept) is not None


# --------------------------------------------------------------------------- both engines


def delete_event(store: EventStore, url: str, version: int) -> None:
    """Delete one stored event of the paused invocation, as someone with SQL would."""
    table = store._recorder.events_table_name
    statement = f"DELETE FROM {table} WHERE originator_id = %s AND originator_version = %s"  # noqa: S608
    if url.startswith("sqlite"):
        sql(Path(url.removeprefix("sqlite:///")), statement.replace("%s", "?"), PAUSED, version)
        return
    import psycopg

    with psycopg.connect(url.split("?", maxsplit=1)[0], autocommit=True) as connection:
        connection.execute(statement, (PAUSED, version))


def test_a_vouched_snapshot_spares_the_whole_check_on_each_engine(
    store_url: str, monkeypatch: pytest.MonkeyPatch, loader: str
) -> None:
    trio.run(write_fixture_runs, store_url)
    store = EventStore(store_url)
    try:
        for version in (6, 12):
            store.app.take_snapshot(PAUSED, version=version, projector_func=fold)
        snapshot = store.newest_snapshot_row(PAUSED)
        assert snapshot is not None
        assert snapshot.originator_version == 12
        assert store.vouches_for(snapshot)
        with monkeypatch.context() as patch:
            reading_no_whole_history(store, patch)
            assert check(store, loader) is None
        delete_event(store, store_url, 3)
        assert not store.vouches_for(snapshot)
        problem = check(store, loader)
    finally:
        store.close()
    assert problem is not None
    assert "cannot be replayed" in problem
