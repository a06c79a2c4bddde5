"""The read models' rows stay what the code before issue 17's catch-up work wrote.

``fixtures/mixed-histories.sql`` is a store of every kind of history (the tests'
``every_kind_of_history``: 108 events of every type the fold shows), and
``fixtures/mixed-histories.views.json`` the rows of the three read models that the
code at ``cd3e3e6`` built from it. Whatever a faster catch-up changes, the rows
must not change.
"""

from __future__ import annotations

import gc
import json
import sqlite3
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from loop_actors._store import EventStore
from projections.runner import collector_paused
from tests.conftest import postgres_admin_url
from tests.read_model_stores import BACKENDS, ReadModelDatabases, dump_tables

FIXTURES = Path(__file__).resolve().parent / "fixtures"


@pytest.fixture(params=BACKENDS)
def views(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ReadModelDatabases]:
    """The test's read models on SQLite, then on PostgreSQL."""
    admin = postgres_admin_url() if request.param == "postgresql" else None
    databases = ReadModelDatabases(request.param, tmp_path, admin)
    yield databases
    databases.close()


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


@pytest.mark.parametrize("batch_size", [1, 500])
def test_the_read_models_of_a_fixed_store_hold_the_rows_the_earlier_code_wrote(
    fixed_store: EventStore, views: ReadModelDatabases, batch_size: int
) -> None:
    expected = json.loads((FIXTURES / "mixed-histories.views.json").read_text())
    runner = views.open(fixed_store, f"views-{batch_size}", batch_size=batch_size)
    try:
        runner.catch_up()
        assert rows_of(dump_tables(runner, list(expected))) == rows_of(expected)
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
