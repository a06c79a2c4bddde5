"""The SQLite recorder of every store on SQLite (a file, or ``memory://``): one write path.

eventsourcing's SQLite application recorder with a lean insert and a lean read of
notifications, the effect index, and (from :class:`StoreTables`) the store's own tables.
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
import time
from collections.abc import Iterator, Sequence
from functools import lru_cache
from typing import TYPE_CHECKING, Any, cast
from uuid import UUID

from eventsourcing.persistence import (
    DatabaseError,
    IntegrityError,
    InterfaceError,
    Notification,
    NotSupportedError,
    OperationalError,
    StoredEvent,
)
from eventsourcing.sqlite import (
    SQLITE3_DEFAULT_LOCK_TIMEOUT,
    SQLiteApplicationRecorder,
    SQLiteDatastore,
)

from loop_actors.store._eventsourcing_internals import (
    NOTIFICATIONS_SET_AT_ONCE,
    is_read_only_uri,
    keep_journal_mode,
    notification,
)
from loop_actors.store.recorder import ROWS_OF_CHUNK, CopiedRow, StoreTables
from loop_actors.store.schema import EFFECT_INDEX
from loop_actors.store.sql import Cursor
from projections.dialect import Dialect

if TYPE_CHECKING:  # imported where used: a reading command opens no queue (issue 32)
    from loop_actors.store.queue import NewRow, SQLiteQueue


class LeanSQLiteRecorder(StoreTables, SQLiteApplicationRecorder):
    """eventsourcing's SQLite application recorder with a lean insert: every store's write path.

    Both kinds of store are SQLite databases (``memory://`` is an in-memory one),
    and this is their recorder, so there is one write path, the one production
    uses. It is the only place this runtime goes around eventsourcing: the reads
    ``select_events`` and ``max_notification_id`` are eventsourcing's own, inherited
    unchanged; ``select_notifications`` runs eventsourcing's statement and makes the same
    notifications more cheaply; ``insert_events`` is replaced. The
    class is checked with eventsourcing's own recorder test cases
    (``tests/store/test_store_recorder_contract.py``), on a file and in memory.

    The insert writes the rows eventsourcing's recorder writes (its table, its
    insert statement; the row id is the notification id), with the same
    durability (WAL, ``synchronous=FULL``), on a connection of its own, without
    the recorder's per-transaction overhead: a new cursor per transaction, and a
    statement cache of one statement (the pool passes ``cached_statements=True``),
    so that ``BEGIN`` and ``INSERT`` evict each other and the insert is parsed
    again on every commit. Measured with ``bench/turn_overhead.py``: see
    docs/performance.md.

    A transaction is one multi-row ``INSERT`` when its rows fit in one statement
    (SQLite makes a single statement atomic and durable on its own), else
    ``BEGIN IMMEDIATE``, statements of ``rows_per_insert`` rows, ``COMMIT``. Two
    costs pull in opposite directions under load, both because of the GIL
    (docs/performance.md, section 4):

    - the sqlite3 module lets go of the GIL around every statement, and while the
      trio thread is busy, taking it back can take milliseconds: one statement a
      row made a transaction of a few hundred rows take hundreds of milliseconds;
    - binding a statement's parameters holds the GIL in C, where the trio thread
      cannot take it back: statements of up to 1,024 rows cut the time of a
      transaction further but cost about a tenth of the turns per second.

    ``MAX_ROWS_PER_INSERT`` rows a statement keeps both the number of waits and
    the length of each hold small.

    In memory, each insert holds the datastore pool's writer slot, the lock
    eventsourcing's own writes (snapshots) take: there the pool also makes readers
    and the writer exclude each other, and that is what the insert needs:
    connections to one in-memory database share its cache, and a write while a
    read is open fails at once with "database table is locked" (SQLite's busy
    timeout does not retry those; the contract's concurrent test fails so without
    the slot). On a file, WAL lets reads go on during a write and SQLite's lock
    (with its busy timeout) orders this connection's writes with every other
    connection's, eventsourcing's included; an insert holds a lock of this
    recorder only, which keeps its one connection to one thread at a time (the
    pool's slot cost about 4 us a commit, on the Journal's thread).

    Errors are eventsourcing's: ``IntegrityError`` for a position already taken
    (another writer appended first), ``OperationalError`` for a locked or broken
    database. A failed transaction is rolled back: nothing of it is written.
    """

    dialect = Dialect.sqlite

    MAX_ROWS_PER_INSERT = 128
    """The most rows in one ``INSERT`` (also bounded by SQLite's limit on parameters)."""

    def __init__(
        self, datastore: SQLiteDatastore, events_table_name: str = "stored_events"
    ) -> None:
        """Check eventsourcing's insert statement and open the insert's own connection.

        The multi-row statements repeat the row of eventsourcing's one-row insert,
        ``INSERT INTO <table> VALUES (?,?,?,?)``.

        Raises:
            eventsourcing.persistence.NotSupportedError: eventsourcing's insert
                statement has another shape (an upgrade changed it).
            eventsourcing.persistence.InterfaceError: the database cannot be opened.
        """
        super().__init__(datastore, events_table_name)
        row = "(?,?,?,?)"
        statement = self.insert_events_statement
        if not statement.replace(" ", "").endswith("VALUES" + row):
            raise NotSupportedError(f"unexpected insert statement: {statement!r}")
        prefix = statement[: statement.rindex("(")]
        self._insert_for = lru_cache(maxsize=self.MAX_ROWS_PER_INSERT)(
            lambda rows: prefix + ",".join([row] * rows)
        )
        pool = datastore.pool
        if is_read_only_uri(pool.db_name):
            # A read-only open reads the file as it is, whatever its journal mode.
            keep_journal_mode(pool)
        try:
            # The pool's database name, opened as the pool opens it (a URI for
            # memory), so that both connections reach the same database.
            self._connection = sqlite3.connect(
                pool.db_name,
                uri=True,
                isolation_level=None,  # autocommit: one statement is one transaction
                check_same_thread=False,  # opened on one thread, used by the writer thread
                cached_statements=self.MAX_ROWS_PER_INSERT + 8,  # every size, BEGIN, COMMIT
                timeout=pool.lock_timeout or SQLITE3_DEFAULT_LOCK_TIMEOUT,
            )
            self._connection.execute("PRAGMA synchronous=FULL")
            parameters = self._connection.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER)
        except sqlite3.Error as error:
            raise InterfaceError(error) from error
        self.rows_per_insert = max(1, min(self.MAX_ROWS_PER_INSERT, parameters // 4))
        self._busy_timeout_ms = int((pool.lock_timeout or SQLITE3_DEFAULT_LOCK_TIMEOUT) * 1000)
        self._cursor = self._connection.cursor()
        self._memory = bool(pool.is_sqlite_memory_mode)
        self._lock = threading.Lock()

    def insert_events(
        self,
        stored_events: Sequence[StoredEvent],
        *,
        lock_wait_s: float | None = None,
        queue_rows: Sequence[NewRow] = (),
        **kwargs: Any,
    ) -> Sequence[int] | None:
        """Insert the rows in one transaction; return their notification ids, in order.

        ``lock_wait_s`` shortens the wait for SQLite's write lock for this insert
        (default: the connection's busy timeout, the URL's ``lock_timeout``); the
        Journal uses it so that its retries end when its retry window does.

        ``queue_rows`` (the work queue's rows of the invocations these rows start, with
        their holders' registrations) are written in the same transaction, at this
        machine's time (the queue's clock on SQLite); a row whose invocation has one
        already is left as it is.

        Raises:
            eventsourcing.persistence.IntegrityError: a position is already taken.
            eventsourcing.persistence.OperationalError: the database is locked or broken.
            eventsourcing.persistence.DatabaseError: any other failure of the database.
        """
        if not stored_events:
            return []
        with self._writer_slot():
            if lock_wait_s is None:
                last = self._append(stored_events, queue_rows)
            else:
                self._set_busy_timeout(min(self._busy_timeout_ms, int(lock_wait_s * 1000)))
                try:
                    last = self._append(stored_events, queue_rows)
                finally:
                    self._set_busy_timeout(self._busy_timeout_ms)
        # SQLite writes one transaction at a time and gives each new row the
        # largest row id so far plus one: the rows' ids are consecutive.
        return list(range(last - len(stored_events) + 1, last + 1))

    def select_notifications(
        self,
        start: int | None,
        limit: int,
        stop: int | None = None,
        topics: Sequence[str] = (),
        *,
        inclusive_of_start: bool = True,
    ) -> Sequence[Notification]:
        """The notifications eventsourcing's ``select_notifications`` reads, by its statement.

        Read as plain tuples, each notification made with its fields at once
        (``_eventsourcing_internals.notification``): eventsourcing reads each row as a
        ``sqlite3.Row`` by column name and builds each frozen dataclass through its
        ``__init__``, about 0.65 us a row (a read model's catch-up reads every row).
        """
        if not NOTIFICATIONS_SET_AT_ONCE:  # pragma: no cover - an eventsourcing that changed them
            return super().select_notifications(
                start, limit, stop, topics, inclusive_of_start=inclusive_of_start
            )
        params: list[int | str] = []
        clauses: list[str] = []
        if start is not None:
            params.append(start)
            clauses.append("rowid>=? " if inclusive_of_start else "rowid>? ")
        if stop is not None:
            params.append(stop)
            clauses.append("rowid<=? ")
        if topics:
            params += list(topics)
            clauses.append(f"topic IN ({','.join('?' * len(topics))}) ")
        params.append(limit)
        where = "WHERE " + "AND ".join(clauses) if clauses else ""
        table = self.events_table_name  # eventsourcing's name, never user text
        statement = f"SELECT rowid, * FROM {table} {where}ORDER BY rowid LIMIT ?"  # noqa: S608
        uuids = self.datastore.originator_id_type == "uuid"
        with self.datastore.transaction(commit=False) as cursor:
            cursor.sqlite_cursor.row_factory = None  # this cursor's rows: tuples
            cursor.execute(statement, params)
            rows = cursor.fetchall()
        if uuids:
            return [notification(i, UUID(o), v, t, state) for i, o, v, t, state in rows]
        return [notification(i, o, v, t, state) for i, o, v, t, state in rows]

    def _writer_slot(self) -> contextlib.AbstractContextManager[object]:
        """What an insert holds: the pool's writer slot in memory, this connection's lock on a file.

        In memory the pool's slot is what keeps readers out (class docstring). On a
        file, WAL lets reads go on and SQLite's own lock orders this connection's
        writes with any other connection's (eventsourcing's snapshots included); what
        is left to hold is the insert's one connection to one thread at a time, a
        plain lock (the pool's slot cost about 4 us a commit: docs/performance.md).
        """
        if self._memory:
            return self.datastore.get_connection(commit=True)
        return self._lock

    def _reading(self) -> contextlib.AbstractContextManager[Cursor]:
        """A read transaction of the datastore's pool (eventsourcing's errors)."""
        return cast(
            "contextlib.AbstractContextManager[Cursor]",
            self.datastore.transaction(commit=False),
        )

    @contextlib.contextmanager
    def _writing(self, *, creates: bool = False) -> Iterator[Cursor]:
        """The insert's own connection, in autocommit (each statement its own transaction).

        ``creates``: the statements are one transaction (``BEGIN IMMEDIATE``: SQLite's
        write lock orders processes that create tables at once), so that tables and
        indexes made together are there together, with one write to the disk.
        """
        with self._writer_slot():
            cursor = self._connection.cursor()
            try:
                if creates:
                    with self._immediate_transaction():
                        yield cursor
                else:
                    yield cursor
            except sqlite3.IntegrityError as error:
                raise IntegrityError(error) from error
            except sqlite3.OperationalError as error:
                raise OperationalError(error) from error
            except sqlite3.Error as error:
                raise DatabaseError(error) from error
            finally:
                cursor.close()

    def _set_busy_timeout(self, milliseconds: int) -> None:
        try:
            self._connection.execute(f"PRAGMA busy_timeout = {max(0, milliseconds)}")
        except sqlite3.Error as error:
            raise OperationalError(error) from error

    def _append(self, stored: Sequence[StoredEvent], queue_rows: Sequence[NewRow]) -> int:
        cursor = self._cursor
        try:
            if len(stored) <= self.rows_per_insert and not queue_rows:
                self._insert(stored)
                position = cursor.lastrowid
            else:
                with self._immediate_transaction():
                    for start in range(0, len(stored), self.rows_per_insert):
                        self._insert(stored[start : start + self.rows_per_insert])
                    position = cursor.lastrowid  # the events' last (not the queue's)
                    if queue_rows:
                        self._insert_queue_rows(queue_rows)
        except sqlite3.IntegrityError as error:
            raise IntegrityError(error) from error
        except sqlite3.OperationalError as error:
            raise OperationalError(error) from error
        except sqlite3.Error as error:
            raise DatabaseError(error) from error
        assert position is not None  # an INSERT that succeeded sets it
        return position

    def _insert_queue_rows(self, rows: Sequence[NewRow]) -> None:
        """Write the queue's rows of the invocations being inserted, in their transaction.

        Raises:
            eventsourcing.persistence.DatabaseError: the queue refused them (a constraint
                of its table: not a position taken, which only the events' rows can be).
        """
        from loop_actors.store.queue import SQLiteQueue, write_start_rows  # noqa: PLC0415

        try:
            write_start_rows(self._cursor, rows, time.time(), can_return=SQLiteQueue.returning)
        except sqlite3.IntegrityError as error:
            raise DatabaseError(
                f"the work queue refused the rows of new invocations: {error}"
            ) from error

    @contextlib.contextmanager
    def _immediate_transaction(self) -> Iterator[None]:
        """``BEGIN IMMEDIATE`` ... ``COMMIT`` on the insert's connection; rolled back on error."""
        self._cursor.execute("BEGIN IMMEDIATE")
        try:
            yield
            self._cursor.execute("COMMIT")
        except BaseException:
            if self._connection.in_transaction:
                self._connection.rollback()
            raise

    def _insert(self, rows: Sequence[StoredEvent]) -> None:
        parameters: list[object] = []
        for record in rows:
            originator_id = record.originator_id
            parameters += (
                originator_id.hex if isinstance(originator_id, UUID) else originator_id,
                record.originator_version,
                record.topic,
                record.state,
            )
        self._cursor.execute(self._insert_for(len(rows)), parameters)

    EFFECT_INDEX = EFFECT_INDEX
    """The index of ``EffectPrepared`` rows by the invocation they belong to."""

    _INVOCATION_OF_ROW = (
        "(CASE WHEN json_valid(CAST(state AS TEXT)) "
        "THEN json_extract(CAST(state AS TEXT), '$.invocation_id') END)"
    )
    """The invocation id inside a row's JSON state (NULL for a state that is not JSON)."""

    def create_effect_index(self, topic: str) -> None:
        """Index the rows of ``topic`` (``EffectPrepared``) by their invocation, if not yet.

        A partial index on an expression: SQLite keeps it in the insert's own
        statement (for the rows of that topic only), and builds it once over an
        existing store. The topic is written into the statement (a partial index is
        used only by a query that names the same literal).

        Raises:
            eventsourcing.persistence.OperationalError: the database is locked or broken.
        """
        if "'" in topic:  # pragma: no cover - an eventsourcing topic never has one
            raise ValueError(f"unexpected topic {topic!r}")
        statement = (
            f"CREATE INDEX IF NOT EXISTS {self.EFFECT_INDEX} ON {self.events_table_name} "
            f"({self._INVOCATION_OF_ROW}) WHERE topic = '{topic}'"
        )
        try:
            with self._writer_slot():
                self._connection.execute(statement)
        except sqlite3.OperationalError as error:
            raise OperationalError(error) from error

    def effect_keys_of(self, invocation_id: str, topic: str) -> list[str] | None:
        """The ids of the ``topic`` rows that name ``invocation_id``, oldest first, by the index.

        None when the store has no such index (a read-only store made before it):
        the caller reads the rows instead.

        Raises:
            eventsourcing.persistence.OperationalError: the database is locked or broken.
        """
        keys_of = self.effect_keys_of_many([invocation_id], topic)
        return None if keys_of is None else keys_of[invocation_id]

    def effect_keys_of_many(
        self, invocation_ids: Sequence[str], topic: str
    ) -> dict[str, list[str]] | None:
        """:meth:`effect_keys_of` for each of these invocations, in one read transaction."""
        found: dict[str, list[str]] = {i: [] for i in invocation_ids}
        with self.datastore.transaction(commit=False) as cursor:
            cursor.execute(
                "SELECT 1 FROM sqlite_master WHERE type = 'index' AND name = ?",
                (self.EFFECT_INDEX,),
            )
            if cursor.fetchone() is None:
                return None
            for start in range(0, len(invocation_ids), ROWS_OF_CHUNK):
                chunk = invocation_ids[start : start + ROWS_OF_CHUNK]
                cursor.execute(
                    f"SELECT {self._INVOCATION_OF_ROW}, originator_id "  # noqa: S608 (eventsourcing's table, a constant topic)
                    f"FROM {self.events_table_name} WHERE topic = '{topic}' AND "
                    f"{self._INVOCATION_OF_ROW} IN ({','.join('?' * len(chunk))}) ORDER BY rowid",
                    tuple(chunk),
                )
                for invocation_id, key in cursor.fetchall():
                    found[str(invocation_id)].append(str(key))
        return found

    def insert_copied_rows(self, rows: Sequence[CopiedRow]) -> None:
        """Write rows copied from another store, keeping their notification ids (one transaction).

        Rows are (notification id, originator id, version, topic, state as stored).

        Raises:
            eventsourcing.persistence.IntegrityError: a position or an id is taken.
            eventsourcing.persistence.OperationalError: the database is locked or broken.
        """
        statement = (
            f"INSERT INTO {self.events_table_name} "  # noqa: S608 (eventsourcing's table)
            "(rowid, originator_id, originator_version, topic, state) VALUES (?, ?, ?, ?, ?)"
        )
        with self._writing(), self._immediate_transaction():
            self._cursor.executemany(statement, rows)

    def memory_queue(self) -> SQLiteQueue:
        """The work queue of an in-memory store: in its own database, on the insert's connection.

        Its transactions hold the insert's slot (the pool's writer slot, in memory),
        which keeps the store's readers and writers out of the shared database meanwhile.
        """
        from loop_actors.store.queue import SQLiteQueue  # noqa: PLC0415 - as in _insert_queue_rows

        assert self._memory  # a file's queue opens the file itself (``SQLiteQueue``)
        return SQLiteQueue.sharing(self._connection, self._writer_slot)

    def close(self) -> None:
        """Close the insert's connection (the pool's close with eventsourcing's factory)."""
        self._connection.close()
