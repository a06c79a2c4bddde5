"""The lean recorders keep eventsourcing's recorder contract: SQLite file, memory, PostgreSQL.

eventsourcing's own recorder test cases run against ``LeanSQLiteRecorder`` as the
store builds it (from ``StoreUrl.environment()``), for a file and for
``memory://``, and against ``LeanPostgresRecorder`` on a real PostgreSQL server
(plus eventsourcing's check that two concurrent inserts' notification ids do not
interleave: the table lock), with the store's text ids and with eventsourcing's UUIDs.

Bad inputs they try: a position already taken, alone and before a new row in the
same insert, and one row twice in one insert (``IntegrityError``, nothing
written, the recorder still usable); ten threads inserting while two read.
"""

from __future__ import annotations

import tempfile
import threading
import unittest
from collections.abc import Iterator
from itertools import count
from pathlib import Path
from typing import Any, ClassVar
from uuid import UUID, uuid4

import pytest
from eventsourcing.persistence import InfrastructureFactory, IntegrityError, StoredEvent
from eventsourcing.sqlite import SQLiteFactory
from eventsourcing.tests import persistence as contract
from eventsourcing.utils import Environment, get_topic

from loop_actors.store.postgres import LeanPostgresRecorder, PostgresStoreFactory
from loop_actors.store.sqlite_recorder import LeanSQLiteRecorder
from loop_actors.store.store import EventStore
from loop_actors.store.url import StoreUrl


class _RecorderAsAggregateRecorder(LeanSQLiteRecorder):
    """The lean insert under an aggregate recorder's contract, which returns no ids."""

    def insert_events(self, stored_events: Any, **kwargs: Any) -> None:
        super().insert_events(stored_events, **kwargs)


class _Recorders(unittest.TestCase):
    """Each ``create_recorder`` opens a new, empty database of ``kind``, closed after the test."""

    kind: ClassVar[str]
    originator_id_type: ClassVar[str] = "text"
    recorder_class: ClassVar[type[LeanSQLiteRecorder]] = LeanSQLiteRecorder
    _numbers = count()

    def new_originator_id(self) -> UUID | str:
        return uuid4() if self.originator_id_type == "uuid" else str(uuid4())

    def create_recorder(self) -> LeanSQLiteRecorder:
        if self.kind == "memory":
            url = "memory://"
        else:
            folder = tempfile.TemporaryDirectory()
            self.addCleanup(folder.cleanup)
            url = f"sqlite:///{folder.name}/{next(self._numbers)}.db"
        env = StoreUrl.parse(url).environment()
        env["APPLICATION_RECORDER_TOPIC"] = get_topic(self.recorder_class)
        env["ORIGINATOR_ID_TYPE"] = self.originator_id_type
        factory = InfrastructureFactory.construct(Environment("Contract", env))
        self.addCleanup(factory.close)
        assert isinstance(factory, SQLiteFactory)
        recorder = factory.application_recorder()
        assert type(recorder) is self.recorder_class
        self.addCleanup(recorder.close)
        # Cleanups run last first: this one runs before the closes above.
        self.addCleanup(self._join_threads_started_since, set(threading.enumerate()))
        return recorder

    def _join_threads_started_since(self, before: set[threading.Thread]) -> None:
        # test_concurrent_no_conflicts stops its reader threads but does not join
        # them; closing the connections under a read in flight crashes sqlite3.
        for thread in set(threading.enumerate()) - before:
            if not thread.daemon:
                thread.join(timeout=10)
                assert not thread.is_alive(), f"{thread.name} still running after its test"


class TestFileAggregateRecorder(_Recorders, contract.AggregateRecorderTestCase):
    kind = "file"
    recorder_class = _RecorderAsAggregateRecorder


class TestMemoryAggregateRecorder(_Recorders, contract.AggregateRecorderTestCase):
    kind = "memory"
    recorder_class = _RecorderAsAggregateRecorder


class TestFileApplicationRecorder(
    _Recorders, contract.ApplicationRecorderTestCase[LeanSQLiteRecorder]
):
    kind = "file"


class TestMemoryApplicationRecorder(
    _Recorders, contract.ApplicationRecorderTestCase[LeanSQLiteRecorder]
):
    kind = "memory"


class TestFileApplicationRecorderWithUuids(
    _Recorders, contract.ApplicationRecorderTestCase[LeanSQLiteRecorder]
):
    kind = "file"
    originator_id_type = "uuid"


class TestMemoryApplicationRecorderWithUuids(
    _Recorders, contract.ApplicationRecorderTestCase[LeanSQLiteRecorder]
):
    kind = "memory"
    originator_id_type = "uuid"


# --------------------------------------------------------------------------- PostgreSQL


class _PostgresAsAggregateRecorder(LeanPostgresRecorder):
    """The PostgreSQL insert under an aggregate recorder's contract, which returns no ids."""

    def insert_events(self, stored_events: Any, **kwargs: Any) -> None:
        super().insert_events(stored_events, **kwargs)


class _PostgresRecorders(unittest.TestCase):
    """Each ``create_recorder`` makes new, empty tables in one database per class."""

    originator_id_type: ClassVar[str] = "text"
    recorder_class: ClassVar[type[LeanPostgresRecorder]] = LeanPostgresRecorder
    database_url: ClassVar[str]
    admin_url: ClassVar[str]
    database_name: ClassVar[str]
    _numbers = count()

    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()
        import psycopg

        from tests.conftest import postgres_admin_url

        admin = postgres_admin_url()
        name = f"la_contract_{uuid4().hex[:12]}"
        with psycopg.connect(admin, autocommit=True, connect_timeout=5) as connection:
            connection.execute(f'CREATE DATABASE "{name}"')
        cls.admin_url = admin
        cls.database_name = name
        cls.database_url = admin.rsplit("/", 1)[0] + f"/{name}"

    @classmethod
    def tearDownClass(cls) -> None:
        import psycopg

        with psycopg.connect(cls.admin_url, autocommit=True, connect_timeout=5) as connection:
            connection.execute(f'DROP DATABASE IF EXISTS "{cls.database_name}" WITH (FORCE)')
        super().tearDownClass()

    def new_originator_id(self) -> UUID | str:
        return uuid4() if self.originator_id_type == "uuid" else str(uuid4())

    def create_recorder(self) -> LeanPostgresRecorder:
        env = StoreUrl.parse(self.database_url).environment()
        env["APPLICATION_RECORDER_TOPIC"] = get_topic(self.recorder_class)
        env["ORIGINATOR_ID_TYPE"] = self.originator_id_type
        # Only the unprefixed keys: the tables are named after this environment.
        env = {key: value for key, value in env.items() if not key.startswith("LOOPACTORS_")}
        factory = InfrastructureFactory.construct(
            Environment(f"Contract{next(self._numbers)}", env)
        )
        self.addCleanup(factory.close)
        assert isinstance(factory, PostgresStoreFactory)
        recorder = factory.application_recorder()
        assert type(recorder) is self.recorder_class
        return recorder


class TestPostgresAggregateRecorder(_PostgresRecorders, contract.AggregateRecorderTestCase):
    recorder_class = _PostgresAsAggregateRecorder


class TestPostgresApplicationRecorder(
    _PostgresRecorders, contract.ApplicationRecorderTestCase[LeanPostgresRecorder]
):
    pass


class TestPostgresApplicationRecorderWithUuids(
    _PostgresRecorders, contract.ApplicationRecorderTestCase[LeanPostgresRecorder]
):
    originator_id_type = "uuid"


class TestPostgresNotificationIdsDoNotInterleave(
    _PostgresRecorders, contract.NonInterleavingNotificationIDsBaseCase
):
    pass


def _rows(originator_id: str, versions: range) -> list[StoredEvent]:
    return [StoredEvent(originator_id, version, "topic", b"{}") for version in versions]


@pytest.fixture(params=["file", "memory"])
def recorder(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[LeanSQLiteRecorder]:
    url = f"sqlite:///{tmp_path / 'test.db'}" if request.param == "file" else "memory://"
    store = EventStore(url)
    assert isinstance(store.app.recorder, LeanSQLiteRecorder)
    yield store.app.recorder
    store.close()


# The contract's inserts fit in one statement; these are longer.


def test_an_insert_of_several_statements_returns_every_id_in_order(
    recorder: LeanSQLiteRecorder,
) -> None:
    recorder.insert_events(_rows("a", range(3)))
    rows = 2 * recorder.rows_per_insert + 1
    assert recorder.insert_events(_rows("b", range(rows))) == list(range(4, rows + 4))
    assert recorder.max_notification_id() == rows + 3


def test_a_taken_position_in_the_last_statement_of_an_insert_writes_nothing(
    recorder: LeanSQLiteRecorder,
) -> None:
    """Bad input: an insert of three statements whose very last row is a position already taken."""
    recorder.insert_events(_rows("a", range(1)))
    rows = [*_rows("b", range(2 * recorder.rows_per_insert)), *_rows("a", range(1))]
    with pytest.raises(IntegrityError):
        recorder.insert_events(rows)
    assert recorder.select_events("b") == []
    assert recorder.insert_events(_rows("c", range(1))) == [2]
