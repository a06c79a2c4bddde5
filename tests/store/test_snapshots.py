"""Loading from a snapshot gives the state a full replay gives, for old and new snapshots.

Snapshots store each turn as its own JSON text, and a load keeps them so until a
turn is read (``aggregates.invocation.Turns``). ``tests/fixtures/snapshots-main.sql``
holds snapshots written before (each turn a JSON object), by ``tests.support.snapshots``.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from aggregates.audit_coverage import snapshot_problems
from aggregates.errors import IllegalTransitionError
from aggregates.events import fold
from aggregates.invocation import LAZY_TURNS, Invocation, InvocationSnapshot, Turns
from loop_actors import Agent, InconsistentHistoryError, ModelRequest, Runtime, ScriptedModel
from loop_actors.store.store import EventStore
from tests.support.invocations import RICH_COMMANDS, apply_rich, new
from tests.support.snapshots import SNAPSHOT_EVERY, decide, fail, lookup, main, refund, restore

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "snapshots-main.sql"
IDS = ("snap-done", "snap-paused")


def watched_agent(seen: list[list[int]]) -> Agent:
    """The fixture's agent, whose model notes the steps of the turns each request holds."""

    def watching(request: ModelRequest) -> dict[str, Any]:
        seen.append([turn.step for turn in request.turns])
        return decide(request)

    return Agent("snapshots", ScriptedModel(watching), [lookup, fail, refund])


@pytest.fixture
def old_store(tmp_path: Path) -> Path:
    """The store of snapshots the code before turns were stored as text wrote."""
    return restore(FIXTURE, tmp_path / "old.db")


@pytest.fixture
def new_store(tmp_path: Path) -> Path:
    """The same runs and snapshots, written by this code."""
    path = tmp_path / "new.db"
    main(path)
    return path


def stored_turns(path: Path, invocation_id: str) -> list[Any]:
    """The turns of the invocation's newest snapshot, as its row holds them."""
    connection = sqlite3.connect(path)
    (state,) = connection.execute(
        "SELECT state FROM stored_snapshots WHERE originator_id = ? "
        "ORDER BY originator_version DESC LIMIT 1",
        (invocation_id,),
    ).fetchone()
    connection.close()
    turns: list[Any] = json.loads(bytes(state))["state"]["turns"]
    return turns


def loaded_at_every_version(store: EventStore, invocation_id: str) -> None:
    """At every version, loading (newest snapshot at or before it, then events) is the replay."""
    events = store.events(invocation_id)
    for version in range(1, len(events) + 1):
        loaded = store.app.repository.get(invocation_id, version=version, projector_func=fold)
        assert vars(loaded) == vars(fold(None, events[:version])), version


def test_snapshots_written_before_turns_were_stored_as_text_load_as_the_replay(
    old_store: Path,
) -> None:
    """Old snapshots (turns as JSON objects) load, at every version, to the state of a full
    replay, and each one still matches the replay of the events up to its version."""
    assert all(isinstance(turn, dict) for turn in stored_turns(old_store, "snap-done"))
    store = EventStore(f"sqlite:///{old_store}")
    try:
        for invocation_id in IDS:
            loaded_at_every_version(store, invocation_id)
            snapshots = store.stored_snapshots(invocation_id)[invocation_id]
            assert len(snapshots) == len(store.events(invocation_id)) // SNAPSHOT_EVERY
            assert snapshot_problems(store.events(invocation_id), snapshots) == []
    finally:
        store.close()


def test_new_snapshots_store_each_turn_as_text_and_load_as_the_replay(new_store: Path) -> None:
    """A snapshot written now holds each turn as its JSON text; it loads, at every version,
    to the state of a full replay, and it matches the replay of the events up to it."""
    texts = stored_turns(new_store, "snap-done")
    assert texts
    assert all(isinstance(text, str) for text in texts)
    assert [json.loads(text)["step"] for text in texts] == list(range(1, len(texts) + 1))
    store = EventStore(f"sqlite:///{new_store}")
    try:
        for invocation_id in IDS:
            loaded_at_every_version(store, invocation_id)
            snapshots = store.stored_snapshots(invocation_id)[invocation_id]
            assert snapshot_problems(store.events(invocation_id), snapshots) == []
    finally:
        store.close()


@pytest.mark.parametrize("which", ["old", "new"])
def test_a_paused_invocation_resumes_from_its_snapshot_and_the_model_sees_every_turn(
    which: str, old_store: Path, new_store: Path
) -> None:
    """Resume from an old or a new snapshot: the clarified invocation completes, and the
    model's request holds every committed turn, the answer included."""
    path = old_store if which == "old" else new_store
    seen: list[list[int]] = []

    async def go() -> Any:
        with trio.fail_after(30):
            async with Runtime(f"sqlite:///{path}") as runtime:
                await runtime.clarify("snap-paused", answer="the second", by="ops")
                return await runtime.resume("snap-paused", watched_agent(seen))

    outcome = trio.run(go)
    assert (outcome.reason, outcome.answer) == ("completed", "done after 6 steps")
    assert seen == [[1, 2, 3, 4, 5, 6]]
    store = EventStore(f"sqlite:///{path}")
    try:
        loaded = store.get("snap-paused")
        assert loaded.turns[5].reply == "the second"
        assert vars(loaded) == vars(fold(None, store.events("snap-paused")))
    finally:
        store.close()


def forge_newest_turn(path: Path, invocation_id: str, text: str) -> None:
    """Replace the first turn of the invocation's newest snapshot with ``text``."""
    connection = sqlite3.connect(path)
    (version, state) = connection.execute(
        "SELECT originator_version, state FROM stored_snapshots WHERE originator_id = ? "
        "ORDER BY originator_version DESC LIMIT 1",
        (invocation_id,),
    ).fetchone()
    snapshot = json.loads(bytes(state))
    snapshot["state"]["turns"][0] = text
    with connection:
        connection.execute(
            "UPDATE stored_snapshots SET state = ? WHERE originator_id = ? "
            "AND originator_version = ?",
            (json.dumps(snapshot).encode(), invocation_id, version),
        )
    connection.close()


@pytest.mark.parametrize(
    "text",
    [
        '{"step":1,"decision":{"kind":"final","answer":"forged"}}',  # valid, but not the history
        '{"step":"one"}',  # not a turn at all
    ],
)
def test_a_forged_turn_in_a_snapshot_makes_resume_refuse_before_anything_runs(
    new_store: Path, text: str
) -> None:
    """Bad input: the first turn of the newest snapshot replaced, by another valid turn or by
    one that is not a turn. The load reads it only when asked; resume compares the snapshot
    with the replay of the events first and refuses with InconsistentHistoryError."""
    forge_newest_turn(new_store, "snap-paused", text)
    seen: list[list[int]] = []

    async def go() -> None:
        with trio.fail_after(30):
            async with Runtime(f"sqlite:///{new_store}") as runtime:
                await runtime.clarify("snap-paused", answer="the second", by="ops")
                await runtime.resume("snap-paused", watched_agent(seen))

    with pytest.raises(InconsistentHistoryError, match="snapshot at version"):
        trio.run(go)
    assert seen == []
    store = EventStore(f"sqlite:///{new_store}")
    try:
        turns = store.get("snap-paused").turns
        if text.startswith('{"step":"one"'):
            with pytest.raises(ValidationError):
                turns[0]
        else:
            assert turns[0].decision is not None
    finally:
        store.close()


# --------------------------------------------------------------------------- pure


def stored_and_read(snapshot: InvocationSnapshot, *, lazy: bool) -> InvocationSnapshot:
    """A snapshot through its stored JSON (as the store writes it) and back."""
    text = snapshot.model_dump_json(exclude_none=True)
    return InvocationSnapshot.model_validate_json(text, context=LAZY_TURNS if lazy else None)


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.tuples(st.sampled_from(RICH_COMMANDS), st.integers(0, 5)), max_size=30),
    st.data(),
)
def test_any_history_loaded_from_a_snapshot_at_any_version_is_its_replay(
    commands: list[tuple[str, int]], data: st.DataObject
) -> None:
    """Random legal histories of every kind of event: a snapshot taken at any version, stored,
    read back (turns kept as stored, or all validated), then the rest of the events: the
    same state as folding every event; and a snapshot of it is the snapshot again."""
    inv = new()
    for command, n in commands:
        with contextlib.suppress(IllegalTransitionError):  # refused: nothing changed
            apply_rich(inv, command, n)
    # As a store gives them back (a new event also keeps the body it was hashed over).
    events = [
        type(event).model_validate_json(event.model_dump_json()) for event in inv.take_events()
    ]
    version = data.draw(st.integers(1, len(events)))
    lazy = data.draw(st.booleans())
    snapshot = InvocationSnapshot.take(fold(None, events[:version]))
    read = stored_and_read(snapshot, lazy=lazy)
    assert read == snapshot
    loaded: Invocation = fold(read.mutate(None), events[version:])
    replayed: Invocation = fold(None, events)
    assert vars(loaded) == vars(replayed)
    again = stored_and_read(InvocationSnapshot.take(loaded), lazy=True)
    assert again == InvocationSnapshot.take(replayed)


def test_turns_kept_as_stored_are_validated_when_first_read() -> None:
    """A snapshot read with LAZY_TURNS holds its turns as text until one is read; reading
    turns a text into a Turn (once), and a turn that was read is written back unchanged."""
    inv = new()
    for command in ("propose_calls", "dispatch", "results", "propose_final"):
        apply_rich(inv, command, 1)
    snapshot = InvocationSnapshot.take(inv)
    read = stored_and_read(snapshot, lazy=True)
    turns = read.state.turns
    assert isinstance(turns, Turns)
    assert [type(item) for item in turns._items] == [str, str]
    assert turns[-1] is turns[-1]
    assert [type(item).__name__ for item in turns._items] == ["str", "Turn"]
    assert turns == list(inv.turns)
    assert read.model_dump_json(exclude_none=True) == snapshot.model_dump_json(exclude_none=True)


def test_a_snapshot_claiming_a_version_before_the_first_event_spoils_no_other_report(
    new_store: Path,
) -> None:
    """Bad input: a snapshot row whose version is 0 (or negative) is reported as such,
    and the good snapshots after it are still checked (and found good)."""
    store = EventStore(f"sqlite:///{new_store}")
    try:
        events = store.events("snap-done")
        snapshots = store.stored_snapshots("snap-done")["snap-done"]
        assert snapshots
        some = snapshots[0][1]
        problems = snapshot_problems(events, [(0, some), (-3, some), *snapshots])
    finally:
        store.close()
    assert problems == [
        (-3, "it is of version -3, before the first event"),
        (0, "it is of version 0, before the first event"),
    ]
