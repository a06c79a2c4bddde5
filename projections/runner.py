"""The read model runner: read models built from the notification log, exactly once.

Each read model (a :class:`ReadModel`) keeps its tables and its tracking row in
one database: a SQLite file next to the event store, or, for a store on
PostgreSQL, the store's own database. Its tracking row is eventsourcing's
(``SQLiteTrackingRecorder`` or ``PostgresTrackingRecorder``), and a batch of
events and the position it reached are committed in **one transaction**. A
runner killed mid-batch loses the whole batch and starts again from the last
committed position, so no event is applied twice and none is skipped. The
runner reads the event store's notification log (eventsourcing's
``select_notifications``).

A catch-up reads and decodes each batch of events once and hands it to every
read model that has not applied it yet, in one transaction with every read
model's tracking row.

A stored row that cannot be decoded (edited by hand, damaged, a topic that is
not one of ours) never stops the read models: each read model goes past it,
records it in ``read_model_skipped`` in the same transaction (by name and
notification id, with the row's aggregate, position, topic and why), leaves out
the rest of that aggregate's history (which it would apply without one of its
events), and applies the others. ``status`` reports them; a rebuild decodes them
again.

The read models also record the identity of the store they were built from
(``store_id``): opened for another store (the store was deleted and created
again, the read models' file left behind), they are emptied and replayed from
position 0, never answered from.

Synchronous, like eventsourcing: the runtime calls it from a worker thread.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, ClassVar, cast

from eventsourcing.application import Application
from eventsourcing.persistence import IntegrityError, PersistenceError

from aggregates.decisions import Frozen
from aggregates.events import DomainEvent
from aggregates.values import describe_error
from projections.sql import (
    SKIPPED_COLUMNS,
    SKIPPED_TABLE,
    STORE_TABLE,
    ViewCursor,
    ViewDatabase,
    open_view_database,
)

log = logging.getLogger(__name__)


class ProjectionError(Exception):
    """Raised when read models cannot be kept or read; the root of this package's errors."""


class ForeignReadModelsError(ProjectionError):
    """Raised when read models belong to another store and cannot be rebuilt for this one."""


class ReadModel:
    """A read model: its tables and how each event changes them.

    Subclasses set ``name`` and ``version``, and implement ``create`` (the
    ``CREATE TABLE`` statements), ``tables`` (their names, for a rebuild) and
    ``apply`` (one event, inside the batch's transaction); they may override
    ``apply_batch`` (all of a batch's events at once). Both must be
    deterministic: a rebuild from position 0 gives the same tables.

    The cursor they are given is a :class:`projections.sql.ViewCursor`: ``?``
    placeholders on SQLite and PostgreSQL alike, ``cursor.dialect`` for what the
    two spell differently, and ``cursor.cache``, a dict the runner keeps for this
    read model from one batch to the next and empties whenever the tables may no
    longer be what this runner last committed (a batch rolled back, another
    runner committed, a rebuild): a read model may keep in it what it read or
    wrote, to avoid reading it again.
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

    def apply(self, cursor: ViewCursor, event: DomainEvent, position: int) -> None:
        """Change the tables for one event (inside the batch's transaction)."""
        raise NotImplementedError

    def apply_batch(self, cursor: ViewCursor, events: Sequence[tuple[DomainEvent, int]]) -> None:
        """Change the tables for a batch of (event, position), in order, in its transaction.

        The runner calls this, once per batch. By default it applies each event in
        turn. A read model may override it to read and write its rows once per
        batch instead of once per event; the tables must end as they would after
        applying the events one by one, whatever the batch size.
        """
        for event, position in events:
            self.apply(cursor, event, position)


class SkippedRow(Frozen):
    """A stored row a read model could not decode: it went past it (and keeps it here)."""

    name: str
    """The read model that skipped it."""
    notification_id: int
    """The row's place in the store's notification log."""
    originator_id: str
    """The aggregate it belongs to: an invocation id, an effect key, a cancel request's id."""
    originator_version: int
    """Its position in that aggregate (1 for the first event)."""
    topic: str
    """Its stored topic."""
    problem: str
    """Why it could not be decoded."""


class ProjectionStatus(Frozen):
    """Where a read model stands."""

    name: str
    position: int
    """The last notification it has applied (or skipped)."""
    head: int
    """The last notification in the event store."""
    skipped: tuple[SkippedRow, ...] = ()
    """The stored rows it could not decode and went past, in log order (a rebuild retries)."""

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
    skipped: int = 0
    """Stored rows it could not decode and went past in this catch-up (see ``status``)."""


DEFAULT_BATCH_SIZE = 5_000
"""Events per transaction by default. A batch's fixed costs (its tracking rows, its commit,
the rows it reads back) are shared by more events, and an invocation the batch touches
several times has its rows written once (500 before: 12 % more instructions an event
catching up the benchmark's store, docs/performance.md section 6)."""

BATCH_BYTES = 32 * 1024 * 1024
"""A batch ends early once the stored states it read add up to this: events with large
outputs are read a few at a time (memory is bounded, whatever ``batch_size``)."""

READ_ROWS = 500
"""A batch is read from the notification log this many rows at a time (see ``BATCH_BYTES``)."""

_SKIPPED_TABLE_SQL = (
    f"CREATE TABLE IF NOT EXISTS {SKIPPED_TABLE} (name TEXT NOT NULL, "
    "notification_id BIGINT NOT NULL, originator_id TEXT NOT NULL, "
    "originator_version BIGINT NOT NULL, topic TEXT NOT NULL, problem TEXT NOT NULL, "
    "PRIMARY KEY (name, notification_id))"
)

_Unreadable = tuple[int, str, int, str, str]
"""A row that did not decode: notification id, aggregate, position, topic, why."""


def _problem(error: Exception) -> str:
    """Why a row did not decode: the error's ``why`` when it has one, else type and message.

    (The runtime's ``UnreadableEventError`` keeps its short reason as ``why``.)
    """
    why = getattr(error, "why", None)
    return why if isinstance(why, str) and why else describe_error(error)


BatchHook = Callable[[str, int], None]
"""Called inside a batch's transaction after its events were applied: (name, position)."""


_pause_lock = threading.Lock()
_pausers = 0
_resume_collector = False


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector paused for one batch (in every thread), then resumed.

    A batch decodes hundreds of events into thousands of small objects that live
    until its transaction ends: long enough for the collector's young collections
    to move them to the oldest generation, whose full collections then walk the
    whole heap again and again (about a third of a catch-up's CPU time). Paused,
    they are freed by reference counting when the batch ends, and the ones kept
    (the read models' caches) are examined once, at the next collection. Nothing
    is lost: cyclic garbage made meanwhile, by any thread, waits for that next
    collection, one batch later (milliseconds). The collector is resumed only if
    it was running when the first of the overlapping pauses began.
    """
    global _pausers, _resume_collector  # noqa: PLW0603 - one collector per process
    with _pause_lock:
        if _pausers == 0:
            _resume_collector = gc.isenabled()
            gc.disable()
        _pausers += 1
    try:
        yield
    finally:
        with _pause_lock:
            _pausers -= 1
            if _pausers == 0 and _resume_collector:
                gc.enable()


class ReadModelRunner:
    """Catches read models up with an eventsourcing application's notification log."""

    def __init__(
        self,
        application: Application[Any],
        view_db: str,
        projections: Sequence[ReadModel],
        *,
        batch_size: int = DEFAULT_BATCH_SIZE,
        after_batch: BatchHook | None = None,
        store_id: str | None = None,
    ) -> None:
        """Open the read models' database ``view_db`` and create their tables.

        Args:
            application: the event store (its recorder, mapper and name are used).
            view_db: where the read models live: a SQLite file path, a SQLite URI
                such as ``file:views?mode=memory&cache=shared``, or a PostgreSQL
                URL (``postgresql://user:password@host:port/dbname``).
            projections: the read models to maintain.
            batch_size: events per transaction (at most: a batch also ends once its
                stored states add up to ``BATCH_BYTES``).
            after_batch: a hook run inside each transaction before it commits
                (tests use it to kill the process there).
            store_id: the identity of the event store. The read models record
                it; read models recorded for another store are emptied and
                replayed from position 0 (logged), and a catch-up refuses to
                commit into read models another runner claimed for another store
                meanwhile. None: no check.

        Raises:
            ForeignReadModelsError: the read models belong to another store and
                emptying them failed (a read-only file).
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
        self.db: ViewDatabase = open_view_database(view_db)
        self.dialect = self.db.dialect
        statements = [
            f"CREATE TABLE IF NOT EXISTS {STORE_TABLE} ("
            "singleton INTEGER PRIMARY KEY CHECK (singleton = 1), store_id TEXT NOT NULL)",
            _SKIPPED_TABLE_SQL,
        ]
        for projection in projections:
            statements.extend(projection.create())
        try:
            self.db.create(statements)
        except BaseException:
            self.db.close()
            raise
        self.projections = {p.name: p for p in projections}
        self.store_id = store_id
        self._lock = threading.Lock()
        self._caches: dict[str, dict[str, Any]] = {name: {} for name in names}
        self._known: dict[str, int] = {}
        """Per read model, the position its cache was kept at (absent: the cache is empty)."""
        if store_id is not None:
            self._check_store(store_id)
        for projection in projections:
            self._check_version(projection)

    def close(self) -> None:
        """Close the read models' database."""
        self.db.close()

    def _tracking_name(self, projection: ReadModel) -> str:
        return f"{projection.name}:{self.application.name}"

    def _version_name(self, projection: ReadModel) -> str:
        return f"{projection.name}:version"

    def _check_version(self, projection: ReadModel) -> None:
        """A new read model, or one whose tables changed shape, starts again from 0."""
        recorded = self.db.position(self._version_name(projection))
        if recorded != projection.version:
            self._reset(projection)

    def recorded_store_id(self) -> str | None:
        """The identity of the store these read models were built from (None before any)."""
        with self.db.read() as cursor:
            return self._recorded_store_id(cursor)

    @staticmethod
    def _recorded_store_id(cursor: ViewCursor) -> str | None:
        cursor.execute(f"SELECT store_id FROM {STORE_TABLE} WHERE singleton = 1")
        row = cursor.fetchone()
        return None if row is None else str(row["store_id"])

    def _check_store(self, store_id: str) -> None:
        """Claim new read models for the store; empty another store's, in one transaction.

        Read models with positions but no recorded store (built before stores had
        identities) may be another store's too: they are emptied as well.
        """
        recorded = self.recorded_store_id()
        if recorded == store_id:
            return
        fresh = recorded is None and not any(self.position(name) for name in self.projections)
        if not fresh:
            log.warning(
                "read models in %s were built from store %s, not from this store %s: "
                "emptying them and replaying this store's events from position 0",
                self.db.location,
                recorded or "(not recorded)",
                store_id,
            )
        try:
            with self.db.write() as cursor:
                if self._recorded_store_id(cursor) == store_id:
                    return  # another process just did it
                for projection in self.projections.values():
                    self._reset_in(cursor, projection)
                cursor.execute(f"DELETE FROM {STORE_TABLE}")
                cursor.execute(
                    f"INSERT INTO {STORE_TABLE} (singleton, store_id) VALUES (1, ?)", (store_id,)
                )
        except PersistenceError as error:
            raise ForeignReadModelsError(
                f"the read models in {self.db.location} belong to another store "
                f"({recorded or 'not recorded'}, this store is {store_id}) and cannot be "
                f"emptied ({error}); make the file writable and run "
                "`loop-actors projections rebuild`, or delete it"
            ) from error

    def _select(self, names: str | None) -> list[ReadModel]:
        if names is None:
            return list(self.projections.values())
        if names not in self.projections:
            raise KeyError(f"no read model named {names!r}: {sorted(self.projections)}")
        return [self.projections[names]]

    def position(self, name: str) -> int:
        """The last notification a read model has applied (0 before the first)."""
        tracked = self.db.position(self._tracking_name(self.projections[name]))
        return tracked or 0

    def head(self) -> int:
        """The last notification in the event store."""
        return self.application.recorder.max_notification_id() or 0

    def status(self, name: str | None = None) -> list[ProjectionStatus]:
        """Position, head, lag and skipped rows of each read model (or of one)."""
        head = self.head()
        selected = self._select(name)
        skipped = self.skipped(name)
        return [
            ProjectionStatus(
                name=p.name,
                position=self.position(p.name),
                head=head,
                skipped=tuple(row for row in skipped if row.name == p.name),
            )
            for p in selected
        ]

    def skipped(self, name: str | None = None) -> list[SkippedRow]:
        """The stored rows each read model (or one) could not decode, in log order.

        A read model goes past such a row and keeps it here until it is rebuilt (a
        rebuild decodes it again: a row restored in the store is then applied).
        """
        names = [p.name for p in self._select(name)]
        with self.db.read() as cursor:
            rows = cursor.query(
                f"SELECT {', '.join(SKIPPED_COLUMNS)} FROM {SKIPPED_TABLE} "
                f"WHERE name IN ({', '.join('?' * len(names))}) ORDER BY notification_id, name",
                names,
            )
        return [SkippedRow.model_validate(row) for row in rows]

    def catch_up(self, name: str | None = None) -> list[CatchUpReport]:
        """Apply every event not yet applied to each read model (or one), batch by batch.

        The read models are caught up together: each batch of events is read and
        decoded once, and applied to every read model that has not applied it,
        in one transaction with their tracking rows. Each report's ``seconds`` is
        the time of the whole catch-up.
        """
        # One catch-up at a time in this process; another process's runner on the
        # same views waits for the write lock, and its commits show in the tracking rows.
        with self._lock:
            return self._catch_up_unlocked(self._select(name))

    def _catch_up_unlocked(self, selected: Sequence[ReadModel]) -> list[CatchUpReport]:
        started = time.perf_counter()
        with self.db.read() as cursor:
            self._check_claim(cursor)
        tracking = {p.name: self._tracking_name(p) for p in selected}
        positions = {p.name: self.position(p.name) for p in selected}
        applied = dict.fromkeys(positions, 0)
        skipped = dict.fromkeys(positions, 0)
        while True:
            start = min(positions.values())
            try:
                with collector_paused():
                    done, more = self._read_and_apply(selected, tracking, start)
            except IntegrityError:
                # Another runner (another process) applied these events first: its
                # transaction won, ours rolled back whole. Go on from where it got.
                moved = {p.name: self.position(p.name) for p in selected}
                if all(moved[n] <= positions[n] for n in positions):
                    raise  # not a race: a read model itself is inconsistent
                positions = moved
                continue
            for name, (count, missed, reached) in done.items():
                applied[name] += count
                skipped[name] += missed
                positions[name] = reached
            if not more:
                break
        seconds = time.perf_counter() - started
        return [
            CatchUpReport(
                name=p.name,
                events=applied[p.name],
                seconds=seconds,
                position=positions[p.name],
                skipped=skipped[p.name],
            )
            for p in selected
        ]

    def _read_and_apply(
        self, selected: Sequence[ReadModel], tracking: dict[str, str], start: int
    ) -> tuple[dict[str, tuple[int, int, int]], bool]:
        """Read the batch after ``start``, decode it once, and apply it (see ``_apply``).

        Returns what ``_apply`` returns, and whether the log may hold more events. The
        batch's notifications and events are all gone when it returns (the collector is
        paused around it: they are freed here, never examined by it).
        """
        notifications, more = self._read(start)
        if not notifications:
            return {}, False
        last = notifications[-1].id
        # Decoded once, for every read model.
        decode = cast("Callable[[Any], DomainEvent]", self.application.mapper.to_domain_event)
        unreadable: list[_Unreadable] = []
        try:
            events = [(decode(n), n.id) for n in notifications]
        except Exception:  # a row that does not decode: each row on its own, to find it
            events, unreadable = self._decode_each(notifications, decode)
        del notifications
        return self._apply(selected, tracking, events, unreadable, last), more

    @staticmethod
    def _decode_each(
        notifications: Sequence[Any], decode: Callable[[Any], DomainEvent]
    ) -> tuple[list[tuple[DomainEvent, int]], list[_Unreadable]]:
        """Decode a batch row by row: its events, and the rows that do not decode (logged)."""
        events: list[tuple[DomainEvent, int]] = []
        unreadable: list[_Unreadable] = []
        for n in notifications:
            try:
                events.append((decode(n), n.id))
            except Exception as error:  # a damaged row: skipped, kept, logged; never raised
                row = (n.id, str(n.originator_id), n.originator_version, n.topic, _problem(error))
                unreadable.append(row)
                log.warning(
                    "the read models go past stored row %d (%s at position %d, topic %r), "
                    "which cannot be decoded: %s; it is kept in %s (`projections status`) and "
                    "decoded again by a rebuild",
                    *row[:4],
                    row[4],
                    SKIPPED_TABLE,
                    extra={"notification_id": n.id, "originator_id": row[1]},
                )
        return events, unreadable

    def _read(self, start: int) -> tuple[list[Any], bool]:
        """The next batch's notifications after ``start``, and whether the log may hold more.

        ``batch_size`` of them, or fewer at the log's end or once their stored states add
        up to ``BATCH_BYTES``.
        """
        recorder = self.application.recorder
        batch: list[Any] = []
        size = 0
        while True:
            limit = min(READ_ROWS, self.batch_size - len(batch))
            read = recorder.select_notifications(start=start, limit=limit, inclusive_of_start=False)
            batch += read
            if len(read) < limit:
                return batch, False
            if len(batch) >= self.batch_size:
                return batch, True
            size += sum(len(n.state) for n in read)
            if size >= BATCH_BYTES:
                return batch, True
            start = read[-1].id

    def _apply(
        self,
        selected: Sequence[ReadModel],
        tracking: dict[str, str],
        events: list[tuple[DomainEvent, int]],
        unreadable: list[_Unreadable],
        last: int,
    ) -> dict[str, tuple[int, int, int]]:
        """One batch for every read model behind it, in one transaction.

        The rows of ``unreadable`` (in the batch, not decoded) are recorded as skipped by
        each read model that had not reached them, with its rows and its position.

        Returns, per read model: the events applied, the rows skipped, and the position
        it is at now.
        """
        done: dict[str, tuple[int, int, int]] = {}
        try:
            with self.db.write() as cursor:
                self._check_claim(cursor)
                now = self._locked_positions(cursor, list(tracking.values()))
                for projection in selected:
                    name = projection.name
                    position = now.get(tracking[name], 0)
                    if self._known.get(name) != position:
                        # The tables are not what this runner last committed: forget.
                        self._caches[name].clear()
                        self._known.pop(name, None)
                    if position >= last:
                        done[name] = (0, 0, position)  # another runner got here first
                        continue
                    todo = (
                        events
                        if not events or position < events[0][1]
                        else [item for item in events if item[1] > position]
                    )
                    view = ViewCursor(
                        cursor.raw, self.dialect, self._caches[name], cursor.column_types
                    )
                    todo, missed = self._left_out(view, name, position, todo, unreadable)
                    if todo:
                        projection.apply_batch(view, todo)
                    view.insert_rows(
                        SKIPPED_TABLE, SKIPPED_COLUMNS, missed, key=("name", "notification_id")
                    )
                    if self.after_batch is not None:
                        self.after_batch(name, last)
                    # The position goes in with the batch: both commit, or neither.
                    self.db.record(cursor, tracking[name], last)
                    done[name] = (len(todo), len(missed), last)
        except BaseException:
            for projection in selected:
                self._caches[projection.name].clear()
                self._known.pop(projection.name, None)
            raise
        for name, (_, _, reached) in done.items():
            self._known[name] = reached  # the cache holds that position, or nothing
        return done

    @staticmethod
    def _left_out(
        cursor: ViewCursor,
        name: str,
        position: int,
        todo: list[tuple[DomainEvent, int]],
        unreadable: list[_Unreadable],
    ) -> tuple[list[tuple[DomainEvent, int]], list[tuple[Any, ...]]]:
        """What a read model applies of a batch, and the rows it goes past (to record).

        It goes past the rows that do not decode, and leaves out every later event of
        an aggregate one of whose rows it went past (in this batch or before; they are
        not recorded one by one): applying the rest of a history without one of its
        events would be applying another history.
        """
        missed = [(name, *row) for row in unreadable if row[0] > position]
        cursor.execute(
            f"SELECT DISTINCT originator_id FROM {SKIPPED_TABLE} WHERE name = ?", (name,)
        )
        blocked = {str(row[0]): 0 for row in cursor.fetchall()}
        for row in missed:
            blocked.setdefault(row[2], row[1])
        if not blocked:
            return todo, missed
        kept = []
        for event, at in todo:
            since = blocked.get(event.originator_id)
            if since is None or at < since:
                kept.append((event, at))
        return kept, missed

    def _locked_positions(self, cursor: ViewCursor, names: list[str]) -> dict[str, int]:
        """The recorded positions of ``names``, their rows locked until the transaction ends."""
        cursor.execute(
            f"SELECT application_name, notification_id FROM {self.db.tracking_table} "
            f"WHERE application_name IN ({', '.join('?' * len(names))}){self.dialect.for_update}",
            names,
        )
        return {row[0]: int(row[1]) for row in cursor.fetchall()}

    def _check_claim(self, cursor: ViewCursor) -> None:
        """The read models still belong to this runner's store (checked in each batch too)."""
        if self.store_id is None:
            return
        recorded = self._recorded_store_id(cursor)
        if recorded != self.store_id:
            raise ForeignReadModelsError(
                f"the read models in {self.db.location} were claimed for store {recorded} by "
                f"another process, and this runner follows store {self.store_id}: two stores "
                "share one read models' database; give each its own (--views)"
            )

    def rebuild(self, name: str | None = None) -> list[CatchUpReport]:
        """Drop a read model's tables and position, recreate them, and replay from 0.

        The rows it went past are forgotten with them, and decoded again as it replays.
        """
        selected = self._select(name)
        with self._lock:
            for projection in selected:
                self._reset(projection)
            return self._catch_up_unlocked(selected)

    def _reset(self, projection: ReadModel) -> None:
        """Empty a read model and its position, in one transaction."""
        try:
            with self.db.write() as cursor:
                self._reset_in(cursor, projection)
        finally:
            self._caches[projection.name].clear()
            self._known.pop(projection.name, None)

    def _reset_in(self, cursor: ViewCursor, projection: ReadModel) -> None:
        cursor.column_types.clear()  # the tables are made again: maybe with other columns
        for table in projection.tables():
            cursor.execute(f"DROP TABLE IF EXISTS {table}")
        for statement in projection.create():
            cursor.execute(statement)
        cursor.execute(
            f"DELETE FROM {self.db.tracking_table} WHERE application_name IN (?, ?)",
            (self._tracking_name(projection), self._version_name(projection)),
        )
        # Its skipped rows are decoded again as it replays.
        cursor.execute(f"DELETE FROM {SKIPPED_TABLE} WHERE name = ?", (projection.name,))
        self.db.record(cursor, self._version_name(projection), projection.version)
        # A row at 0, so that a batch can lock it (on PostgreSQL) before it applies.
        self.db.record(cursor, self._tracking_name(projection), 0)
        self._caches[projection.name].clear()
        self._known.pop(projection.name, None)

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[dict[str, Any]]:
        """Run a read-only query on the read models' database (``?`` placeholders)."""
        with self.db.read() as cursor:
            return cursor.query(sql, params)


Projection = ReadModel
"""The old name of :class:`ReadModel` (the same class), kept for existing code.

Renamed so as not to be taken for eventsourcing's own ``Projection``."""

ProjectionRunner = ReadModelRunner
"""The old name of :class:`ReadModelRunner` (the same class), kept for existing code.

Renamed so as not to be taken for eventsourcing's own ``ProjectionRunner``."""
