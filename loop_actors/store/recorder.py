"""What the store needs of its recorder, and the store's own tables, written once over the dialect.

A store's recorder is eventsourcing's application recorder for its engine
(``LeanSQLiteRecorder``, ``LeanPostgresRecorder``): eventsourcing's inserts and reads of
events and notifications, with what the store needs besides. What those two recorders
do alike (the store's identity, the audit's row queries, the sealed secrets' rows) is
:class:`StoreTables`, each statement written once in the ``?`` style; a recorder gives
it a read transaction, a write transaction and the names of its tables.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, ClassVar, Protocol
from uuid import uuid4

from eventsourcing.persistence import Notification, StoredEvent

from loop_actors.store.schema import (
    HOLDERS_TABLE,
    SECRETS_TABLE,
    STORE_TABLE,
    queue_definitions,
    store_table_definition,
)
from loop_actors.store.sql import Cursor
from projections.dialect import Dialect

if TYPE_CHECKING:  # the queue's module is imported where its rows are written (issue 32)
    from loop_actors.store.queue import NewRow

ROWS_OF_CHUNK = 500
"""Aggregate ids a statement of ``select_rows_of`` names (well under SQLite's bound parameters)."""

StoredRow = tuple[str, int, str, bytes]
"""(originator id, version, topic, state as stored)."""

CopiedRow = tuple[int, str, int, str, bytes]
"""(notification id, originator id, version, topic, state as stored)."""

SealedRow = tuple[str, int, str, str, bytes]
"""(invocation id, step, call id, kind, sealed value)."""


class StoreRecorder(Protocol):
    """What the store needs of its recorder: ``LeanSQLiteRecorder`` or ``LeanPostgresRecorder``."""

    events_table_name: str

    def insert_events(
        self,
        stored_events: Sequence[StoredEvent],
        *,
        lock_wait_s: float | None = None,
        queue_rows: Sequence[NewRow] = (),
    ) -> Sequence[int] | None:
        """Insert rows (and the work queue's ``queue_rows``) in one transaction; their ids."""

    def create_queue_tables(self) -> None:
        """Create the work queue's tables, if the store has none yet."""

    def select_events(
        self,
        originator_id: str,
        *,
        gt: int | None = None,
        lte: int | None = None,
        desc: bool = False,
        limit: int | None = None,
    ) -> Sequence[StoredEvent]:
        """An aggregate's rows (those after ``gt``, up to ``lte``), in version order."""

    def select_notifications(
        self,
        start: int | None,
        limit: int,
        stop: int | None = None,
        topics: Sequence[str] = (),
        *,
        inclusive_of_start: bool = True,
    ) -> Sequence[Notification]:
        """Rows in notification order."""

    def max_notification_id(self) -> int | None:
        """The last notification id."""

    def store_identity(self, *, create: bool) -> str | None:
        """The store's identity (created first with ``create``)."""

    def first_position_of(self, originator_id: str) -> int | None:
        """The notification id of an aggregate's first row."""

    def has_events_table(self) -> bool:
        """Whether the events table exists."""

    def has_table(self, name: str) -> bool:
        """Whether a table exists."""

    def aggregate_ids_in_first_row_order(self) -> list[str]:
        """Every aggregate id, in the order of its first row."""

    def count_rows(self, table: str) -> int:
        """How many rows a table holds."""

    def count_versions_to(self, originator_id: str, version: int) -> int:
        """How many rows an aggregate has up to a version."""

    def select_rows(self, table: str, originator_id: str | None) -> list[StoredRow]:
        """A snapshots table's rows."""

    def select_rows_of(self, table: str, originator_ids: Sequence[str]) -> list[StoredRow]:
        """The rows of these aggregates in a table (events or snapshots), by id and version."""

    def insert_copied_rows(self, rows: Sequence[CopiedRow]) -> None:
        """Write rows copied from another store, keeping their notification ids."""

    def replace_identity(self, store_id: str) -> None:
        """Take another store's identity."""

    def select_sealed_rows(self) -> list[SealedRow]:
        """Every row of the sealed secrets' table, as stored."""

    def close(self) -> None:
        """Close what the recorder opened itself."""


class StoreTables:
    """The store's own reads and writes of its database, the same on both engines (a mixin).

    A recorder that mixes it in gives :attr:`dialect`, ``events_table_name``,
    :meth:`_reading` and :meth:`_writing` (transactions whose cursors take ``?``
    statements and raise eventsourcing's errors), and :meth:`_table` (a table's name as
    a statement writes it: schema-qualified and quoted on PostgreSQL).

    Table names in these statements are the runtime's constants or eventsourcing's
    names, never user text.
    """

    dialect: ClassVar[Dialect]
    events_table_name: str

    def _reading(self) -> contextlib.AbstractContextManager[Cursor]:
        """A read-only transaction (rolled back at the end)."""
        raise NotImplementedError

    def _writing(self, *, creates: bool = False) -> contextlib.AbstractContextManager[Cursor]:
        """A transaction that writes (``creates``: it creates tables, under the schema lock)."""
        raise NotImplementedError

    def _table(self, name: str) -> str:
        """``name`` as a statement writes it."""
        return name

    # ----------------------------------------------------------------- catalogue

    def has_table(self, name: str) -> bool:
        """Whether the store's database (its schema on PostgreSQL) has a table of that name.

        Raises:
            eventsourcing.persistence.OperationalError: the database is locked or broken.
        """
        with self._reading() as cursor:
            cursor.execute(self.dialect.has_table_sql(), (self._catalogue_name(name),))
            return cursor.fetchone() is not None

    def _catalogue_name(self, name: str) -> str:
        """``name`` as :meth:`Dialect.has_table_sql` takes it."""
        return self._table(name)

    def has_events_table(self) -> bool:
        """Whether the database has the events table (a read-only open cannot create it)."""
        return self.has_table(self.events_table_name)

    # ----------------------------------------------------------------- the store's identity

    def store_identity(self, *, create: bool) -> str | None:
        """The store's identity, created first when ``create`` and there is none yet.

        The identity is a UUID in a one-row table of the store's own database,
        written once: processes that race to create it all read the one that
        was inserted first (the row's key admits one row). Without ``create``
        (a read-only store), a store older than identities has none: None.

        Raises:
            eventsourcing.persistence.OperationalError: the database is locked,
                broken or unreachable.
        """
        found = self._select_identity()
        if found is not None or not create:
            return found
        table = self._table(STORE_TABLE)
        with self._writing(creates=True) as cursor:
            cursor.execute(store_table_definition(table))
            cursor.execute(
                f"INSERT INTO {table} (singleton, store_id, created_at) "  # noqa: S608 (our table)
                "VALUES (1, ?, ?) ON CONFLICT (singleton) DO NOTHING",
                (str(uuid4()), datetime.now(UTC).isoformat()),
            )
        found = self._select_identity()
        assert found is not None  # the insert above, or another process's, made the row
        return found

    def _select_identity(self) -> str | None:
        if not self.has_table(STORE_TABLE):
            return None
        with self._reading() as cursor:
            cursor.execute(f"SELECT store_id FROM {self._table(STORE_TABLE)}")  # noqa: S608
            row = cursor.fetchone()
        return None if row is None else str(row[0])

    def replace_identity(self, store_id: str) -> None:
        """Give the store another's identity (a copy of that store takes it over)."""
        with self._writing() as cursor:
            cursor.execute(f"UPDATE {self._table(STORE_TABLE)} SET store_id = ?", (store_id,))  # noqa: S608

    # ----------------------------------------------------------------- the work queue

    def create_queue_tables(self) -> None:
        """Create the work queue's tables (and indexes), unless the store has them.

        When the store is opened: a start's queue row is written in the transaction of
        its ``InvocationStarted`` (``insert_events``), so the table must exist before
        any invocation does. The last table created is looked for first: creating what
        exists would wait, on PostgreSQL, for a writer's lock on the table.

        Raises:
            eventsourcing.persistence.OperationalError: the database is locked or broken.
        """
        if self.has_table(HOLDERS_TABLE):
            return
        with self._writing(creates=True) as cursor:
            for statement in queue_definitions(self._table):
                cursor.execute(statement)

    # ----------------------------------------------------------------- the audit's rows

    def first_position_of(self, originator_id: str) -> int | None:
        """The notification id of an aggregate's first stored row (None when it has none).

        Raises:
            eventsourcing.persistence.OperationalError: the database is locked or broken.
        """
        with self._reading() as cursor:
            cursor.execute(
                f"SELECT MIN({self.dialect.row_id}) FROM {self._table(self.events_table_name)} "  # noqa: S608
                "WHERE originator_id = ?",
                (originator_id,),
            )
            row = cursor.fetchone()
        return None if row is None or row[0] is None else int(row[0])

    def aggregate_ids_in_first_row_order(self) -> list[str]:
        """The id of every aggregate with a stored row, in the order of its first row."""
        with self._reading() as cursor:
            cursor.execute(
                f"SELECT originator_id FROM {self._table(self.events_table_name)} "  # noqa: S608
                f"GROUP BY originator_id ORDER BY MIN({self.dialect.row_id})"
            )
            return [str(row[0]) for row in cursor.fetchall()]

    def count_rows(self, table: str) -> int:
        """How many rows a table of the store holds."""
        with self._reading() as cursor:
            cursor.execute(f"SELECT COUNT(*) FROM {self._table(table)}")  # noqa: S608
            return int(cursor.fetchone()[0])

    def count_versions_to(self, originator_id: str, version: int) -> int:
        """How many rows an aggregate has in the events table up to ``version`` (by its index)."""
        with self._reading() as cursor:
            cursor.execute(
                f"SELECT COUNT(*) FROM {self._table(self.events_table_name)} "  # noqa: S608
                "WHERE originator_id = ? AND originator_version <= ?",
                (originator_id, version),
            )
            return int(cursor.fetchone()[0])

    def select_rows(self, table: str, originator_id: str | None) -> list[StoredRow]:
        """(id, version, topic, state) of a snapshots table's rows (one aggregate's, or all)."""
        where = "" if originator_id is None else "WHERE originator_id = ? "
        with self._reading() as cursor:
            cursor.execute(
                "SELECT originator_id, originator_version, topic, state "  # noqa: S608
                f"FROM {self._table(table)} {where}ORDER BY originator_id, originator_version",
                () if originator_id is None else (originator_id,),
            )
            rows = cursor.fetchall()
        return [(str(a), int(b), str(c), bytes(d)) for a, b, c, d in rows]

    def select_rows_of(self, table: str, originator_ids: Sequence[str]) -> list[StoredRow]:
        """(id, version, topic, state) of the rows of these aggregates, in one read transaction.

        By id, then version; a few hundred ids a statement.
        """
        found: list[StoredRow] = []
        with self._reading() as cursor:
            for start in range(0, len(originator_ids), ROWS_OF_CHUNK):
                chunk = list(originator_ids[start : start + ROWS_OF_CHUNK])
                cursor.execute(
                    "SELECT originator_id, originator_version, topic, state "  # noqa: S608
                    f"FROM {self._table(table)} "
                    f"WHERE originator_id {self.dialect.any_of(len(chunk))} "
                    "ORDER BY originator_id, originator_version",
                    self.dialect.any_of_parameters(chunk),
                )
                found += [(str(a), int(b), str(c), bytes(d)) for a, b, c, d in cursor.fetchall()]
        return found

    def select_sealed_rows(self) -> list[SealedRow]:
        """Every row of the sealed secrets' table, as stored (none when it has no such table)."""
        if not self.has_table(SECRETS_TABLE):
            return []
        with self._reading() as cursor:
            cursor.execute(
                "SELECT invocation_id, step, call_id, kind, sealed "  # noqa: S608
                f"FROM {self._table(SECRETS_TABLE)} ORDER BY invocation_id, step, call_id, kind"
            )
            rows = cursor.fetchall()
        return [(str(a), int(b), str(c), str(d), bytes(e)) for a, b, c, d, e in rows]
