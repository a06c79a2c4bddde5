"""The projection runner on SQLite and PostgreSQL: one decode per event, one transaction per batch."""

from __future__ import annotations

import gc
import json
import sqlite3
import subprocess
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import trio
from eventsourcing.sqlite import SQLiteCursor

from aggregates.events import DomainEvent
from aggregates.invocation import BatchDispatched, ResultsCommitted
from loop_actors.store.store import EventStore
from projections import (
    MetricsProjection,
    OpenEffectsProjection,
    Projection,
    ProjectionRunner,
    TrajectoryProjection,
    default_projections,
)
from projections import runner as runner_module
from projections.dialect import POSTGRESQL, SQLITE
from projections.runner import DEFAULT_BATCH_SIZE, collector_paused
from tests.conftest import postgres_admin_url
from tests.support.cli import run_cli
from tests.support.read_model_runs import TABLES, populate
from tests.support.read_model_stores import ReadModelDatabases, dump_tables

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def store_of_60(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EventStore]:
    """60 invocations of the six kinds (about 350 events)."""
    url = f"sqlite:///{tmp_path_factory.mktemp('store') / 'events.db'}"
    trio.run(populate, url, 0, 60)
    store = EventStore(url)
    yield store
    store.close()


def test_the_read_models_decode_each_event_once(
    store_of_60: EventStore, views: ReadModelDatabases
) -> None:
    runner = views.open(store_of_60, "views", batch_size=50)
    mapper = runner.application.mapper
    decoded = 0
    decode = mapper.to_domain_event

    def counted(stored: Any) -> Any:
        nonlocal decoded
        decoded += 1
        return decode(stored)

    mapper.to_domain_event = counted  # type: ignore[method-assign,assignment]
    try:
        reports = runner.catch_up()
    finally:
        runner.close()
    head = reports[0].position
    assert [r.events for r in reports] == [head, head, head]
    assert decoded == head


class Boom(Exception):
    """Raised by a test inside a batch's transaction."""


def test_a_batch_that_fails_commits_no_row_and_no_position(
    store_of_60: EventStore, views: ReadModelDatabases
) -> None:
    """The third batch raises after every read model applied it: all three roll back."""
    batches = 0

    def fail_third(name: str, position: int) -> None:
        nonlocal batches
        if name == "open_effects":  # the last of the three in the batch's transaction
            batches += 1
            if batches == 3:
                raise Boom

    runner = views.open(store_of_60, "views", batch_size=50, after_batch=fail_third)
    with pytest.raises(Boom):
        runner.catch_up()
    assert [s.position for s in runner.status()] == [100, 100, 100]
    runner.close()
    resumed = views.open(store_of_60, "views", batch_size=50)
    resumed.catch_up()
    caught_up = dump_tables(resumed, TABLES)
    resumed.rebuild()
    assert dump_tables(resumed, TABLES) == caught_up
    resumed.close()


def test_a_runner_forgets_its_cache_when_another_runner_commits(
    tmp_path: Path, views: ReadModelDatabases
) -> None:
    """Runner A caches the trajectories it folded; B moves the tables on; A reads them again."""
    url = f"sqlite:///{tmp_path / 'events.db'}"
    store = EventStore(url)
    trio.run(populate, url, 0, 30)
    first = views.open(store, "views")
    first.catch_up()
    trio.run(populate, url, 30, 30)  # the same ids' later events need the rows as B left them
    second = views.open(store, "views")
    second.catch_up()
    second.close()
    trio.run(populate, url, 60, 30)
    views.sync(store)
    (trajectory, *_) = first.catch_up()
    assert trajectory.events > 0
    by_first = dump_tables(first, TABLES)
    first.rebuild()
    assert dump_tables(first, TABLES) == by_first
    first.close()
    store.close()


def test_two_runners_catching_up_at_once_apply_each_event_once(
    store_of_60: EventStore, views: ReadModelDatabases
) -> None:
    runners = [views.open(store_of_60, "views", batch_size=20) for _ in range(2)]
    start = threading.Barrier(2)
    failures: list[BaseException] = []

    def catch_up(runner: ProjectionRunner) -> None:
        start.wait(timeout=10)
        try:
            runner.catch_up()
        except BaseException as error:  # reported below, in the test's thread
            failures.append(error)

    threads = [threading.Thread(target=catch_up, args=(r,)) for r in runners]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not failures
    raced = dump_tables(runners[0], TABLES)
    runners[0].rebuild()
    assert dump_tables(runners[0], TABLES) == raced
    for runner in runners:
        runner.close()


class ToolCallCounts(Projection):
    """A read model written for the SQLite-only API: a SQLiteCursor, ``?``, ``row[0]``."""

    name = "tool_calls"
    version = 1

    def create(self) -> list[str]:
        return [
            "CREATE TABLE IF NOT EXISTS tool_call_counts ("
            "tool TEXT PRIMARY KEY, calls INTEGER NOT NULL, failed INTEGER NOT NULL)"
        ]

    def tables(self) -> list[str]:
        return ["tool_call_counts"]

    def apply(self, cursor: SQLiteCursor, event: DomainEvent, position: int) -> None:
        if isinstance(event, BatchDispatched):
            for call in event.calls:
                cursor.execute(
                    "INSERT INTO tool_call_counts VALUES (?, 1, 0) "
                    "ON CONFLICT (tool) DO UPDATE SET calls = tool_call_counts.calls + 1",
                    (call.name,),
                )
        elif isinstance(event, ResultsCommitted):
            for result in event.results:
                if result.error is not None:
                    cursor.execute(
                        "SELECT failed FROM tool_call_counts WHERE tool = ?", (result.name,)
                    )
                    failed = cursor.fetchone()[0]
                    cursor.execute(
                        "UPDATE tool_call_counts SET failed = ? WHERE tool = ?",
                        (failed + 1, result.name),
                    )


def test_a_read_model_written_for_the_sqlite_cursor_runs_on_both_stores(
    store_of_60: EventStore, views: ReadModelDatabases
) -> None:
    runner = views.open(store_of_60, "views", [*default_projections(), ToolCallCounts()])
    try:
        runner.catch_up()
        rows = runner.query("SELECT tool, calls, failed FROM tool_call_counts ORDER BY tool")
    finally:
        runner.close()
    # Kinds 0 (two lookups, one failing), 1 (one lookup), 4 and 5 (one pay each; the lost
    # reply of kind 5 pauses its invocation for a reconciliation: no result is committed).
    assert [(r["tool"], r["calls"], r["failed"]) for r in rows] == [
        ("lookup", 30, 10),
        ("pay", 20, 0),
    ]


def test_runners_opening_new_read_models_at_once_both_create_them(tmp_path: Path) -> None:
    """PostgreSQL: CREATE TABLE IF NOT EXISTS races; the runner creates under an advisory lock."""
    views = ReadModelDatabases("postgresql", tmp_path, postgres_admin_url())
    url = f"sqlite:///{tmp_path / 'events.db'}"
    store = EventStore(url)
    try:
        views.open(store, "views").close()  # the database and its copy of the (empty) store
        database, application, _ = views.copies["views"]
        for _ in range(3):
            for table in [
                *TABLES,
                "open_effects_invocations",
                "read_model_store",
                "read_model_tracking",
            ]:
                with views.raw(database) as connection:
                    connection.execute(f"DROP TABLE IF EXISTS {table}")
            start = threading.Barrier(4)
            failures: list[BaseException] = []

            def open_views(
                start: threading.Barrier = start, failures: list[Any] = failures
            ) -> None:
                start.wait(timeout=10)
                try:
                    ProjectionRunner(application, database, default_projections()).close()
                except BaseException as error:  # reported below
                    failures.append(error)

            threads = [threading.Thread(target=open_views) for _ in range(4)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(timeout=60)
            assert not failures
    finally:
        views.close()
        store.close()


@pytest.mark.parametrize(
    ("written", "on_postgresql"),
    [
        ("SELECT * FROM t WHERE a = ? AND b = ?", "SELECT * FROM t WHERE a = %s AND b = %s"),
        (
            "SELECT '?' , \"a?\" FROM t WHERE c LIKE 'x%' AND d = ?",
            "SELECT '?' , \"a?\" FROM t WHERE c LIKE 'x%%' AND d = %s",
        ),
        ("SELECT 5 % 2", "SELECT 5 %% 2"),
        ("SELECT 'it''s ?' , ?", "SELECT 'it''s ?' , %s"),
    ],
)
def test_placeholders_are_translated_outside_quoted_text(written: str, on_postgresql: str) -> None:
    assert SQLITE.sql(written) == written
    assert POSTGRESQL.sql(written) == on_postgresql


class ForgetfulTrajectory(TrajectoryProjection):
    """The trajectory read model with room for a few steps only: it reads the others back."""

    CACHE_STEPS = 5


class ForgetfulMetrics(MetricsProjection):
    """The metrics read model with room for two invocations' rows."""

    CACHE_ROWS = 2


def test_read_models_whose_cache_overflows_write_the_same_rows(
    store_of_60: EventStore, views: ReadModelDatabases
) -> None:
    runner = views.open(store_of_60, "roomy", batch_size=40)
    runner.catch_up()
    roomy = dump_tables(runner, TABLES)
    runner.close()
    forgetful = [ForgetfulTrajectory(), ForgetfulMetrics(), OpenEffectsProjection()]
    runner = views.open(store_of_60, "forgetful", forgetful, batch_size=40)
    runner.catch_up()
    assert dump_tables(runner, TABLES) == roomy
    runner.close()


def test_the_cli_keeps_read_models_in_a_postgresql_database_given_as_views(
    tmp_path: Path, postgres_url: str
) -> None:
    """``--views postgresql://...``: the read models there, their tables and positions."""
    trio.run(populate, f"sqlite:///{tmp_path / 'events.db'}", 0, 12)

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return run_cli(*args, "--views", postgres_url, cwd=tmp_path, db="sqlite:///events.db")

    rebuilt = cli("projections", "rebuild", "--json")
    assert rebuilt.returncode == 0, rebuilt.stderr
    head = {json.loads(line)["position"] for line in rebuilt.stdout.splitlines()}
    listed = cli("list", "--reason", "completed", "--json")
    assert listed.returncode == 0, listed.stderr
    assert len(listed.stdout.splitlines()) == 4  # kinds 0 and 4 of 12
    with psycopg.connect(postgres_url) as connection:
        positions = connection.execute(
            "SELECT notification_id FROM read_model_tracking WHERE application_name LIKE %s",
            ["%:LoopActors"],
        ).fetchall()
    assert [p for (p,) in positions] == [*head] * 3
    assert not (tmp_path / "events.views.db").exists()


def test_read_models_on_an_unreachable_postgresql_are_a_one_line_error(tmp_path: Path) -> None:
    """Bad input: a --views URL whose server does not answer (a closed port)."""
    trio.run(populate, f"sqlite:///{tmp_path / 'events.db'}", 0, 1)
    result = run_cli(
        "list", "--views", "postgresql://nobody:secret@127.0.0.1:9/none",
        cwd=tmp_path, db="sqlite:///events.db", timeout=60,
    )  # fmt: skip
    assert result.returncode == 2
    assert "cannot open read models at postgresql://nobody@127.0.0.1:9/none: cannot connect" in (
        result.stderr
    )
    assert "Connection refused" in result.stderr
    assert "secret" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


# ------------------------------------------------------- the rows stay what the earlier code wrote
# ``fixtures/mixed-histories.sql`` is a store of every kind of history (``every_kind_of_history``:
# 108 events of every type the fold shows), and ``fixtures/mixed-histories.views.json`` the rows
# of the three read models that the code at ``cd3e3e6`` (before issue 17's catch-up work on the
# collector) built from it. Whatever a faster catch-up changes, the rows must not change.

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


@pytest.fixture
def fixed_store(tmp_path: Path) -> Iterator[EventStore]:
    path = tmp_path / "mixed.db"
    connection = sqlite3.connect(path)
    connection.executescript((FIXTURES / "mixed-histories.sql").read_text())
    connection.execute("PRAGMA journal_mode=WAL")  # as every store is
    connection.close()
    store = EventStore(f"sqlite:///{path}", create=False)
    yield store
    store.close()


def rows_of(tables: dict[str, list[Any]]) -> dict[str, Counter[tuple[Any, ...]]]:
    """Each table's rows, as a multiset (0 and 0.0 alike, as the two engines return them)."""
    return {table: Counter(tuple(row) for row in rows) for table, rows in tables.items()}


def as_earlier(
    tables: dict[str, list[Any]], expected: dict[str, list[Any]]
) -> dict[str, list[Any]]:
    """The rows with only the columns the earlier code wrote.

    Columns added since are at the end of a table (the trajectory's ``parent_id`` and
    ``forked_from``, version 6; a call's ``plan_step``, version 7): a store the earlier
    code read holds no child, no fork and no plan, so they must be empty. A step's
    ``approval`` (version 7) says who decided on its batch, which the earlier events
    say as well: it is left out.
    """
    found: dict[str, list[Any]] = {}
    for table, rows in tables.items():
        width = len(expected[table][0]) if expected[table] else None
        kept = []
        for row in rows:
            added = [] if table == "trajectory_steps" or width is None else row[width:]
            assert all(value is None for value in added), (table, row)
            kept.append(row[:width] if width is not None else row)
        found[table] = kept
    return found


@pytest.mark.parametrize("batch_size", [1, 500, DEFAULT_BATCH_SIZE])
def test_the_read_models_of_a_fixed_store_hold_the_rows_the_earlier_code_wrote(
    fixed_store: EventStore, views: ReadModelDatabases, batch_size: int
) -> None:
    expected = json.loads((FIXTURES / "mixed-histories.views.json").read_text())
    runner = views.open(fixed_store, f"views-{batch_size}", batch_size=batch_size)
    try:
        runner.catch_up()
        assert rows_of(as_earlier(dump_tables(runner, list(expected)), expected)) == rows_of(
            expected
        )
    finally:
        runner.close()


def test_a_batch_ends_once_its_stored_events_add_up_to_the_bound(
    fixed_store: EventStore, views: ReadModelDatabases, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Read a few rows at a time, a batch stops at ``BATCH_BYTES``: the same rows, more batches."""
    monkeypatch.setattr(runner_module, "READ_ROWS", 7)
    monkeypatch.setattr(runner_module, "BATCH_BYTES", 3_000)
    expected = json.loads((FIXTURES / "mixed-histories.views.json").read_text())
    runner = views.open(fixed_store, "views")
    reached: list[int] = []
    runner.after_batch = lambda name, position: reached.append(position)
    try:
        reports = runner.catch_up()
        assert rows_of(as_earlier(dump_tables(runner, list(expected)), expected)) == rows_of(
            expected
        )
        head = runner.head()
        assert [r.position for r in reports] == [head] * 3
        assert [r.events for r in reports] == [head] * 3
        positions = sorted(set(reached))
        assert len(positions) > 3  # the bound cut the batches, not batch_size
        assert positions[-1] == head
        assert runner.catch_up()[0].events == 0
    finally:
        runner.close()


def test_a_catch_up_leaves_the_collector_as_it_found_it(
    fixed_store: EventStore, views: ReadModelDatabases
) -> None:
    """Paused during each batch, running after; left off when the host had turned it off."""
    runner = views.open(fixed_store, "views", batch_size=10)
    seen: list[bool] = []
    runner.after_batch = lambda name, position: seen.append(gc.isenabled())
    try:
        assert gc.isenabled()
        runner.catch_up()
        assert seen
        assert not any(seen)
        assert gc.isenabled()
        gc.disable()
        try:
            with collector_paused():
                pass
            assert not gc.isenabled()
        finally:
            gc.enable()
    finally:
        runner.close()


def test_a_batch_that_fails_resumes_the_collector(
    fixed_store: EventStore, views: ReadModelDatabases
) -> None:
    runner = views.open(fixed_store, "views", batch_size=10)

    def fail(name: str, position: int) -> None:
        raise RuntimeError("killed in the batch")

    runner.after_batch = fail
    try:
        with pytest.raises(RuntimeError, match="killed in the batch"):
            runner.catch_up()
        assert gc.isenabled()
    finally:
        runner.close()


def test_overlapping_pauses_resume_the_collector_when_the_last_one_ends() -> None:
    """Two runners' batches in two threads: the first to end does not resume it early."""
    inside, release = threading.Event(), threading.Event()

    def other_batch() -> None:
        with collector_paused():
            inside.set()
            release.wait(10)

    thread = threading.Thread(target=other_batch)
    with collector_paused():
        thread.start()
        assert inside.wait(10)
    assert not gc.isenabled()  # the other batch still runs
    release.set()
    thread.join(10)
    assert gc.isenabled()
