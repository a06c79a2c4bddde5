"""The event store's encoding: compact, lossless, and readable back into the same events."""

from __future__ import annotations

import types
import typing
from typing import Any

import pytest
from pydantic import BaseModel

from aggregates.effect import EFFECT_EVENT_TYPES
from aggregates.invocation import EVENT_TYPES, InvocationSnapshot
from loop_actors import Agent, ModelRequest, Runtime, ScriptedModel, tool
from loop_actors.store.store import EventStore
from tests.support.events import started


def _admits_none(annotation: Any) -> bool:
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        return type(None) in typing.get_args(annotation)
    return annotation is type(None) or annotation is Any


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    found: list[type[BaseModel]] = []
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        found.append(annotation)
    for argument in typing.get_args(annotation):
        found.extend(_models_in(argument))
    return found


@pytest.mark.parametrize(
    "event_type",
    [*EVENT_TYPES, *EFFECT_EVENT_TYPES, InvocationSnapshot],
    ids=lambda t: t.__name__,
)
def test_every_optional_field_defaults_to_none_so_leaving_nones_out_is_lossless(
    event_type: type[BaseModel],
) -> None:
    seen: set[type[BaseModel]] = set()
    pending: list[type[BaseModel]] = [event_type]
    while pending:
        model = pending.pop()
        if model in seen:
            continue
        seen.add(model)
        for name, field in model.model_fields.items():
            if _admits_none(field.annotation) and field.annotation is not Any:
                assert field.default is None, f"{model.__name__}.{name}"
            pending.extend(_models_in(field.annotation))


async def test_events_read_back_equal_to_what_was_written(db_url: str) -> None:
    @tool
    def echo(text: str) -> dict[str, Any]:
        """Echo with awkward values."""
        return {"text": text, "none": None, "nested": [1, 2.5, {"ü": True}]}

    def decide(request: ModelRequest) -> dict[str, Any]:
        if request.step == 1:
            return {
                "kind": "tool_calls",
                "calls": [{"id": "c1", "name": "echo", "arguments": {"text": 'héllo\n"quoted"'}}],
            }
        return {"kind": "final", "answer": "✓"}

    async with Runtime(db_url) as runtime:
        outcome = await runtime.run(Agent("a", ScriptedModel(decide), [echo]), "goal ✓")
        written = await runtime.history(outcome.invocation_id)
    async with Runtime(db_url) as reopened:
        read = await reopened.history(outcome.invocation_id)
        invocation = await reopened.load(outcome.invocation_id)
    assert read == written
    assert invocation.turns[0].results[0].output == {
        "text": 'héllo\n"quoted"',
        "none": None,
        "nested": [1, 2.5, {"ü": True}],
    }


async def test_a_tool_output_that_is_not_json_becomes_an_output_invalid_result() -> None:
    @tool
    def opaque() -> object:
        """Return something JSON cannot hold."""
        return object()

    seen: list[Any] = []

    def decide(request: ModelRequest) -> dict[str, Any]:
        if request.step == 1:
            return {
                "kind": "tool_calls",
                "calls": [{"id": "c1", "name": "opaque", "arguments": {}}],
            }
        seen.extend(request.results)
        return {"kind": "final", "answer": "ok"}

    outcome = await Runtime("memory://").run(Agent("a", ScriptedModel(decide), [opaque]), "g")
    assert outcome.reason == "completed"
    assert seen[0].error.error_class == "output_invalid"


async def test_a_long_history_is_snapshotted_and_reads_back_the_same(db_url: str) -> None:
    from aggregates.events import fold
    from loop_actors import Budget

    @tool
    async def step(n: int) -> int:
        """Count."""
        return n

    def decide(request: ModelRequest) -> dict[str, Any]:
        if request.step <= 80:
            return {
                "kind": "tool_calls",
                "calls": [{"id": "c", "name": "step", "arguments": {"n": request.step}}],
            }
        return {"kind": "final", "answer": "counted"}

    agent = Agent("long", ScriptedModel(decide), [step], Budget(max_steps=100, max_tool_calls=100))
    async with Runtime(db_url) as runtime:
        outcome = await runtime.run(agent, "count", invocation_id="long")
        events = await runtime.history("long")
    assert outcome.reason == "completed"
    assert len(events) > 200
    store = EventStore(db_url)
    snapshots = list(store.app.snapshots.get("long")) if store.app.snapshots else []
    assert [s.originator_version for s in snapshots] == [100, 200]
    assert all(isinstance(s, InvocationSnapshot) for s in snapshots)
    from_snapshot = store.get("long")
    from_events = fold(None, events)
    assert vars(from_snapshot) == vars(from_events)
    mid = store.app.repository.get("long", version=150, projector_func=fold)
    assert mid.version == 150
    assert vars(mid) == vars(fold(None, events[:150]))


# --------------------------------------------------------------------------- appends
# Every SQLite store, a file or memory://, appends through one recorder, LeanSQLiteRecorder;
# a PostgreSQL store through LeanPostgresRecorder (their eventsourcing contract:
# tests/store/test_store_recorder_contract.py). The tests on `store_url` run on all three.
# Bad inputs tried, on a file, in memory and on PostgreSQL: a position already taken (alone, inside a
# group, in the last rows of an append longer than one INSERT statement), a commit handed
# to a Journal that has closed; on a file: a database locked by another connection.


@pytest.fixture(params=["file", "memory", "postgresql"])
def store_url(request: pytest.FixtureRequest, db_url: str) -> str:
    """A new, empty store: a SQLite file, an in-memory database, or a PostgreSQL database."""
    if request.param == "postgresql":
        url: str = request.getfixturevalue("postgres_url")
        return url
    return db_url if request.param == "file" else "memory://"


def test_an_append_is_a_notification_eventsourcing_reads_back(store_url: str) -> None:
    store = EventStore(store_url)
    first = store.append(started("a"))
    second = store.append(started("b"))
    assert (first, second) == (1, 2)
    assert store.head() == 2
    notifications = store.app.recorder.select_notifications(start=1, limit=10)
    assert [n.originator_id for n in notifications] == ["a", "b"]
    assert store.get("b").goal == "g"
    assert store.invocation_ids() == ["a", "b"]
    store.close()


def test_an_append_to_a_taken_position_raises_integrity_error_and_writes_nothing(
    store_url: str,
) -> None:
    """Bad input: an append at a position already taken, alone and after a new invocation."""
    from eventsourcing.persistence import IntegrityError

    store = EventStore(store_url)
    store.append(started("a"))
    with pytest.raises(IntegrityError):
        store.append(started("a"))
    # One transaction: the new invocation in the same group is not written either.
    with pytest.raises(IntegrityError):
        store.append([*started("b"), *started("a")])
    assert store.invocation_ids() == ["a"]
    assert store.head() == 1
    # The connection is usable after the failures.
    assert store.append(started("c")) == store.head()
    store.close()


def _rows_per_insert(store: EventStore) -> int:
    from loop_actors.store.sqlite_recorder import LeanSQLiteRecorder

    recorder = store.app.recorder  # how many rows one of its INSERT statements takes
    if not isinstance(recorder, LeanSQLiteRecorder):
        return 128  # PostgreSQL inserts every row in one statement: any size will do
    return recorder.rows_per_insert


@pytest.mark.parametrize("statements", [1, 3], ids=["one-statement", "three-statements"])
def test_a_large_append_is_written_whole_and_in_order(store_url: str, statements: int) -> None:
    store = EventStore(store_url)
    # A full single INSERT, or two full ones and a shorter third in one transaction.
    count = _rows_per_insert(store) * statements - (0 if statements == 1 else 17)
    ids = [f"inv-{n:05d}" for n in range(count)]
    assert store.append([event for i in ids for event in started(i)]) == count
    notifications = store.app.recorder.select_notifications(start=1, limit=count + 10)
    assert [n.id for n in notifications] == list(range(1, count + 1))
    assert [n.originator_id for n in notifications] == ids
    assert store.get(ids[-1]).goal == "g"
    store.close()


@pytest.mark.parametrize("statements", [1, 3], ids=["one-statement", "three-statements"])
def test_a_large_append_with_a_taken_position_in_its_last_rows_writes_nothing(
    store_url: str, statements: int
) -> None:
    """Bad input: a position already taken in the last row of one or of three statements."""
    from eventsourcing.persistence import IntegrityError

    store = EventStore(store_url)
    store.append(started("taken"))
    count = _rows_per_insert(store) * statements - 1
    fresh = [event for n in range(count) for event in started(f"inv-{n:05d}")]
    with pytest.raises(IntegrityError):
        store.append([*fresh, *started("taken")])
    assert store.invocation_ids() == ["taken"]
    assert store.head() == 1
    assert store.append(started("after")) == store.head()  # the connection still works
    store.close()


@pytest.mark.parametrize("kind", ["file", "memory"])
def test_an_insert_statement_of_another_shape_is_refused_when_the_store_opens(
    kind: str, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Guards an eventsourcing upgrade that changes its insert: rows are never
    # written with a statement the recorder does not understand.
    from eventsourcing.sqlite import SQLiteAggregateRecorder

    from loop_actors._errors import StoreUnavailableError

    original = SQLiteAggregateRecorder.__init__

    def upgraded(recorder: SQLiteAggregateRecorder, *args: Any, **kwargs: Any) -> None:
        original(recorder, *args, **kwargs)
        recorder.insert_events_statement = "INSERT INTO stored_events VALUES (?,?,?,?,?)"

    monkeypatch.setattr(SQLiteAggregateRecorder, "__init__", upgraded)
    with pytest.raises(StoreUnavailableError, match="unexpected insert statement"):
        EventStore(db_url if kind == "file" else "memory://")


def test_a_memory_store_appends_through_the_same_recorder_as_a_file(db_url: str) -> None:
    from loop_actors.store.sqlite_recorder import LeanSQLiteRecorder

    memory, file = EventStore("memory://"), EventStore(db_url)
    assert type(memory.app.recorder) is type(file.app.recorder) is LeanSQLiteRecorder
    memory.close()
    file.close()


def test_two_memory_stores_share_nothing() -> None:
    first, second = EventStore("memory://"), EventStore("memory://")
    first.append(started("a"))
    assert second.invocation_ids() == []
    assert second.append(started("a")) == 1
    first.close()
    second.close()


def test_reads_on_other_threads_during_appends_in_memory_never_find_the_table_locked() -> None:
    """An in-memory database is one shared cache: a read open during a write would fail."""
    import threading

    store = EventStore("memory://")
    store.append(started("first"))
    appended = threading.Event()
    failures: list[BaseException] = []

    def read_until_appended() -> None:
        try:
            while not appended.is_set():
                assert store.get("first").goal == "g"
                store.invocation_ids()
        except BaseException as error:
            failures.append(error)

    readers = [threading.Thread(target=read_until_appended) for _ in range(2)]
    for reader in readers:
        reader.start()
    try:
        for n in range(300):
            store.append(started(f"inv-{n}"))
    finally:
        appended.set()
        for reader in readers:
            reader.join()
    assert failures == []
    assert len(store.invocation_ids()) == 301
    store.close()


def test_an_append_to_a_locked_database_raises_operational_error_and_writes_nothing(
    tmp_path: Any,
) -> None:
    import sqlite3

    from eventsourcing.persistence import OperationalError

    path = tmp_path / "locked.db"
    store = EventStore(f"sqlite:///{path}?lock_timeout=1")
    blocker = sqlite3.connect(path, isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")
    with pytest.raises(OperationalError, match="locked"):
        store.append(started("a"))
    blocker.rollback()
    blocker.close()
    assert store.invocation_ids() == []
    assert store.append(started("a")) == 1
    store.close()


async def test_the_journal_puts_commits_that_arrive_together_into_one_transaction(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import trio

    import loop_actors.store.journal as journal_module

    groups: list[int] = []
    original = journal_module.commit_group

    def counting(store: EventStore, group: list[Any], **options: Any) -> list[Any]:
        results = original(store, group, **options)
        groups.append(len(group))  # once written (a commit refused inline is written later)
        return results

    monkeypatch.setattr(journal_module, "commit_group", counting)
    agent = Agent("a", ScriptedModel([{"kind": "final", "answer": "x"}], delay_s=0.01))
    async with Runtime(db_url) as runtime, trio.open_nursery() as nursery:
        for n in range(40):
            nursery.start_soon(runtime.run, agent, f"goal {n}")
    # 40 starts and 40 finals were committed, in fewer transactions than commits.
    assert sum(groups) == 80
    assert len(groups) < 80
    assert max(groups) > 1
    assert len(EventStore(db_url).invocation_ids()) == 40


async def test_a_commit_handed_to_a_closed_journal_fails_and_writes_nothing(
    store_url: str,
) -> None:
    from loop_actors._messages import CommitFailed, Committed
    from loop_actors.store.journal import Journal

    store = EventStore(store_url)
    async with Journal(store) as journal:
        assert isinstance(await journal.commit(started("a")), Committed)
    failed = await journal.commit(started("b"))
    assert isinstance(failed, CommitFailed)
    assert failed.conflict is False
    assert store.invocation_ids() == ["a"]
    store.close()
