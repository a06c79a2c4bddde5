"""The projection runner: read models built from the notification log, exactly once.

Each read model (a :class:`Projection`) keeps its tables and its tracking row in
one SQLite database, written with eventsourcing's ``SQLiteTrackingRecorder``:
a batch of events and the position it reached are committed in **one
transaction**. A runner killed mid-batch loses the whole batch and starts again
from the last committed position, so no event is applied twice and none is
skipped. The runner reads the event store's notification log (eventsourcing's
``select_notifications``), which is the SQLite recorder's way in: its
``subscribe()`` is not implemented in eventsourcing 9.5.

Synchronous, like eventsourcing: the runtime calls it from a worker thread.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, ClassVar, cast

from eventsourcing.application import Application
from eventsourcing.persistence import IntegrityError, Tracking
from eventsourcing.sqlite import SQLiteCursor, SQLiteDatastore, SQLiteTrackingRecorder

from aggregates.decisions import Frozen
from aggregates.events import DomainEvent


class Projection:
    """A read model: its tables and how each event changes them.

    Subclasses set ``name`` and ``version``, and implement ``create`` (the
    ``CREATE TABLE`` statements), ``tables`` (their names, for a rebuild) and
    ``apply`` (one event, inside the batch's transaction); they may override
    ``apply_batch`` (all of a batch's events at once). Both must be
    deterministic: a rebuild from position 0 gives the same tables.
    """

    name: ClassVar[str]
    version: ClassVar[int] = 1
    """Bump when the tables change shape: a different version means a rebuild."""

    def create(self) -> list[str]:
        """The statements that create this read model's tables (idempotent)."""
        raise NotImplementedError

    def tables(self) -> list[str]:
        """The tables to drop for a rebuild."""
        raise NotImplementedError

    def apply(self, cursor: SQLiteCursor, event: DomainEvent, position: int) -> None:
        """Change the tables for one event (inside the batch's transaction)."""
        raise NotImplementedError

    def apply_batch(self, cursor: SQLiteCursor, events: Sequence[tuple[DomainEvent, int]]) -> None:
        """Change the tables for a batch of (event, position), in order, in its transaction.

        The runner calls this, once per batch. By default it applies each event in
        turn. A read model may override it to read and write its rows once per
        batch instead of once per event; the tables must end as they would after
        applying the events one by one, whatever the batch size.
        """
        for event, position in events:
            self.apply(cursor, event, position)


class ProjectionStatus(Frozen):
    """Where a read model stands."""

    name: str
    position: int
    """The last notification it has applied."""
    head: int
    """The last notification in the event store."""

    @property
    def lag(self) -> int:
        """Events not yet applied."""
        return max(0, self.head - self.position)


class CatchUpReport(Frozen):
    """What one catch-up did for one read model."""

    name: str
    events: int
    seconds: float
    position: int


class ViewStore(SQLiteTrackingRecorder):
    """The read models' SQLite database, with eventsourcing's single-row tracking table."""

    def __init__(self, datastore: SQLiteDatastore, projections: Sequence[Projection]) -> None:
        """Open (and create) the tracking table and every projection's tables."""
        self.projections = list(projections)
        super().__init__(datastore)

    def construct_create_table_statements(self) -> list[str]:
        """The tracking table, then each read model's tables."""
        statements = super().construct_create_table_statements()
        for projection in self.projections:
            statements.extend(projection.create())
        return statements


BatchHook = Callable[[str, int], None]
"""Called inside a batch's transaction after its events were applied: (name, position)."""


class ProjectionRunner:
    """Catches read models up with an eventsourcing application's notification log."""

    def __init__(
        self,
        application: Application[Any],
        view_db: str,
        projections: Sequence[Projection],
        *,
        batch_size: int = 500,
        after_batch: BatchHook | None = None,
    ) -> None:
        """Open the read models' database ``view_db`` (a SQLite path or URI).

        Args:
            application: the event store (its recorder, mapper and name are used).
            view_db: where the read models live: a file path, or a SQLite URI such
                as ``file:views?mode=memory&cache=shared``.
            projections: the read models to maintain.
            batch_size: events per transaction.
            after_batch: a hook run inside each transaction before it commits
                (tests use it to kill the process there).
        """
        if batch_size < 1:
            raise ValueError("batch_size must be at least 1")
        names = [p.name for p in projections]
        if len(set(names)) != len(names):
            raise ValueError(f"two projections share a name: {names}")
        self.application = application
        self.view_db = view_db
        self.batch_size = batch_size
        self.after_batch = after_batch
        self.datastore = SQLiteDatastore(view_db)
        self.views = ViewStore(self.datastore, projections)
        self.views.create_table()
        self.projections = {p.name: p for p in projections}
        self._lock = threading.Lock()
        for projection in projections:
            self._check_version(projection)

    def close(self) -> None:
        """Close the read models' database."""
        self.datastore.close()

    def _tracking_name(self, projection: Projection) -> str:
        return f"{projection.name}:{self.application.name}"

    def _version_name(self, projection: Projection) -> str:
        return f"{projection.name}:version"

    def _check_version(self, projection: Projection) -> None:
        """A new read model, or one whose tables changed shape, starts again from 0."""
        recorded = self.views.max_tracking_id(self._version_name(projection))
        if recorded != projection.version:
            self._reset(projection)

    def _select(self, names: str | None) -> list[Projection]:
        if names is None:
            return list(self.projections.values())
        if names not in self.projections:
            raise KeyError(f"no read model named {names!r}: {sorted(self.projections)}")
        return [self.projections[names]]

    def position(self, name: str) -> int:
        """The last notification a read model has applied (0 before the first)."""
        tracked = self.views.max_tracking_id(self._tracking_name(self.projections[name]))
        return tracked or 0

    def head(self) -> int:
        """The last notification in the event store."""
        return self.application.recorder.max_notification_id() or 0

    def status(self, name: str | None = None) -> list[ProjectionStatus]:
        """Position, head and lag of each read model (or of one)."""
        head = self.head()
        return [
            ProjectionStatus(name=p.name, position=self.position(p.name), head=head)
            for p in self._select(name)
        ]

    def catch_up(self, name: str | None = None) -> list[CatchUpReport]:
        """Apply every event not yet applied, batch by batch, to each read model (or one)."""
        return [self._catch_up(projection) for projection in self._select(name)]

    def _catch_up(self, projection: Projection) -> CatchUpReport:
        # One catch-up at a time in this process; another process's runner on the
        # same views is caught by the tracking row (see _catch_up_unlocked).
        with self._lock:
            return self._catch_up_unlocked(projection)

    def _catch_up_unlocked(self, projection: Projection) -> CatchUpReport:
        started = time.perf_counter()
        position = self.position(projection.name)
        applied = 0
        recorder = self.application.recorder
        mapper = self.application.mapper
        while True:
            notifications = recorder.select_notifications(
                start=position, limit=self.batch_size, inclusive_of_start=False
            )
            if not notifications:
                break
            last = notifications[-1].id
            events = [
                (cast("DomainEvent", mapper.to_domain_event(notification)), notification.id)
                for notification in notifications
            ]
            try:
                with self.datastore.transaction(commit=True) as cursor:
                    projection.apply_batch(cursor, events)
                    if self.after_batch is not None:
                        self.after_batch(projection.name, last)
                    # The position goes in with the batch: both commit, or neither.
                    self.views._insert_tracking(
                        cursor, Tracking(self._tracking_name(projection), last)
                    )
            except IntegrityError:
                # Another runner (another process) applied these events first: its
                # transaction won, ours rolled back whole. Go on from where it got.
                moved_on = self.position(projection.name)
                if moved_on <= position:
                    raise  # not a race: the projection itself is inconsistent
                position = moved_on
                continue
            applied += len(notifications)
            position = last
            if len(notifications) < self.batch_size:
                break
        return CatchUpReport(
            name=projection.name,
            events=applied,
            seconds=time.perf_counter() - started,
            position=position,
        )

    def rebuild(self, name: str | None = None) -> list[CatchUpReport]:
        """Drop a read model's tables and position, recreate them, and replay from 0."""
        selected = self._select(name)
        with self._lock:
            for projection in selected:
                self._reset(projection)
            return [self._catch_up_unlocked(projection) for projection in selected]

    def _reset(self, projection: Projection) -> None:
        """Empty a read model and its position, in one transaction."""
        with self.datastore.transaction(commit=True) as cursor:
            for table in projection.tables():
                cursor.execute(f"DROP TABLE IF EXISTS {table}")
            for statement in projection.create():
                cursor.execute(statement)
            cursor.execute(
                "DELETE FROM tracking WHERE application_name IN (?, ?)",
                (self._tracking_name(projection), self._version_name(projection)),
            )
            self.views._insert_tracking(
                cursor, Tracking(self._version_name(projection), projection.version)
            )

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[dict[str, Any]]:
        """Run a read-only query on the read models' database."""
        with self.datastore.transaction(commit=False) as cursor:
            cursor.execute(sql, params)
            return [dict(row) for row in cursor.fetchall()]
