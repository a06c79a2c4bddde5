"""The work queue: which invocations are runnable, who holds a lease on which, who is alive.

Two tables in the store's own database, next to the events:

- ``loop_actors_queue``: one row per invocation (status, holder, epoch, ``due_at``:
  when a runnable row may be claimed, or when a claimed row's lease runs out);
- ``loop_actors_holders``: the processes holding leases (workers and plain runs),
  with host, pid and last heartbeat.

A new invocation's row (and, for a run, its holder's registration) is written in the
transaction of its ``InvocationStarted``, by the store's recorder
(:func:`write_start_rows`): an invocation never exists without its row.

One interface, two implementations: :class:`SQLiteQueue` (claims under SQLite's
write lock, ``BEGIN IMMEDIATE``) and :class:`PostgresQueue` (psycopg 3, sync API;
claims lock a fixed candidate set with ``FOR UPDATE SKIP LOCKED``). Both hand
their rows to the rules of :mod:`aggregates.lease`; times are seconds since the
epoch, from the database's own clock on PostgreSQL (many machines share it) and
from this machine's on SQLite (one machine).

Every method blocks: trio code reaches them through one thread (``_leases``).
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, ClassVar, NamedTuple, TypeVar
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from aggregates.lease import (
    HolderKind,
    HolderRow,
    QueueRow,
    QueueStatus,
    Refuse,
    Release,
    Take,
    claimable,
    decide_acquire,
    effective_status,
)
from aggregates.rate_limits import (
    Granted,
    QuotaRow,
    RateLimit,
    TooLong,
    correct,
    take,
    throttle,
)
from aggregates.schedules import (
    Schedule,
    ScheduleCheck,
    ScheduleState,
    check_schedule,
    submitted,
)
from loop_actors._errors import StoreUnavailableError
from loop_actors.store.schedule_rows import (
    SCHEDULE_COLUMNS,
    SCHEDULE_PROGRESS,
    UPCOMING_SCHEDULES,
    DueRuns,
    SchedulesChecked,
    schedule_progress,
    schedule_row,
    schedule_values,
)
from loop_actors.store.schema import (
    HOLDERS_TABLE,
    QUEUE_DEFINITIONS,
    QUEUE_TABLE,
    RATE_LIMITS_TABLE,
    SCHEDULES_TABLE,
)
from loop_actors.store.sql import Cursor, PlaceholderCursor
from projections.dialect import Dialect, marks

T = TypeVar("T")

_QUEUE_COLUMNS = (
    "invocation_id, agent_name, agent_ref, status, holder, epoch, due_at, submitted_at, "
    "updated_at, note"
)
_HOLDER_COLUMNS = (
    "holder, kind, host, machine, pid, pid_start, started_at, heartbeat_at, lease_s, agents, "
    "concurrency"
)
CANDIDATES_PER_CLAIM = 4
"""A claim of n rows locks at most this many times n candidates (PostgreSQL)."""

CLAIM_AT_MOST = 1024
"""Rows one claim takes at most: a worker with more room claims again at once.

It bounds the claim's transaction (which holds SQLite's write lock) and its lists of
ids, which SQLite (32,766 values a statement) and PostgreSQL (65,535) would refuse.
"""

ROWS_PER_STATEMENT = 128
"""Rows one statement of a batch writes at most.

A batch (the releases, renewals or new rows that waited for one transaction) is
written with a few multi-row statements rather than one statement per row: the
sqlite3 module gives the GIL back around every statement, and a busy trio thread
keeps a waiting writer out for up to a switch interval each time.
"""

GoneCheck = Callable[[HolderRow | None, float], bool]
"""Whether a registered holder is gone (``aggregates.lease.holder_gone``, as seen from here)."""


class Claimed(Take):
    """A row this holder just claimed, with the lease it took."""

    invocation_id: str
    agent_name: str
    agent_ref: str | None = None


class NewRow(NamedTuple):
    """A row to add: runnable (or resting as ``status``), or claimed from the start.

    Written by :meth:`WorkQueue.enqueue_many`, or in the transaction of the events that
    start its invocation (``EventStore.append``): whoever finds the invocation finds
    its row, even if the process that started it dies at once.
    """

    invocation_id: str
    agent_name: str
    agent_ref: str | None = None
    status: QueueStatus = QueueStatus.RUNNABLE
    holder: str | None = None
    """The holder that drives it from the start (its status is then ``claimed``, epoch 0)."""
    lease_s: float = 0.0
    """How long that holder's lease runs from the write."""
    registration: HolderRow | None = None
    """The holder's registration, written with the row unless the holder has one already
    (so that a worker sees the holder gone as soon as its process is)."""

    @classmethod
    def held(
        cls,
        invocation_id: str,
        agent_name: str,
        *,
        holder: str,
        lease_s: float,
        registration: HolderRow | None = None,
    ) -> NewRow:
        """The row of an invocation ``holder`` starts and drives, leased for ``lease_s``."""
        return cls(
            invocation_id, agent_name, None, QueueStatus.CLAIMED, holder, lease_s, registration
        )

    def values(self, now: float) -> tuple[Any, ...]:
        """Its values for :func:`new_row_statement`, written at ``now`` (the queue's clock)."""
        due = now + self.lease_s if self.holder is not None else now
        return (
            self.invocation_id,
            self.agent_name,
            self.agent_ref,
            self.status.value,
            self.holder,
            due,
            now,
            now,
        )


def new_row_statement(table: str = QUEUE_TABLE) -> tuple[str, str, str]:
    """The insert of new rows into ``table`` (as a statement names it), for :func:`write_rows`.

    A row whose invocation has one already is left as it is.
    """
    return (
        f"INSERT INTO {table} ({_QUEUE_COLUMNS}) VALUES ",  # noqa: S608 - our table
        "(?, ?, ?, ?, ?, 0, ?, ?, ?, NULL)",
        " ON CONFLICT DO NOTHING",
    )


def holder_values(row: HolderRow, now: float) -> tuple[Any, ...]:
    """A registration's values in ``_HOLDER_COLUMNS`` order, registered (and beating) at ``now``."""
    return (
        row.holder,
        row.kind.value,
        row.host,
        row.machine,
        row.pid,
        row.pid_start,
        now,
        now,
        row.lease_s,
        json.dumps(row.agents),
        row.concurrency,
    )


def write_start_rows(
    cursor: Cursor,
    rows: Sequence[NewRow],
    now: float,
    *,
    name: Callable[[str], str] = str,
    can_return: bool,
) -> None:
    """Write new invocations' rows, and their holders' registrations, in the caller's transaction.

    For the store's recorders, in the transaction of the events that start the
    invocations. A row (or a registration) that exists already is left as it is.
    ``name`` turns a table's name into what a statement writes.
    """
    write_rows(
        cursor,
        new_row_statement(name(QUEUE_TABLE)),
        (),
        [row.values(now) for row in rows],
        None,
        can_return=can_return,
    )
    registrations = {row.registration.holder: row.registration for row in rows if row.registration}
    if registrations:
        write_rows(
            cursor,
            (
                f"INSERT INTO {name(HOLDERS_TABLE)} ({_HOLDER_COLUMNS}) VALUES ",  # noqa: S608
                "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                # A runtime kept open between calls registers again with its next start
                # when its registration is stale (no heartbeat runs between calls): the
                # row it left is renewed, not kept as it was (else it looks gone).
                " ON CONFLICT (holder) DO UPDATE SET heartbeat_at = excluded.heartbeat_at",
            ),
            (),
            [holder_values(row, now) for row in registrations.values()],
            None,
            can_return=can_return,
        )


def write_rows(
    cursor: Cursor,
    statement: tuple[str, str, str],
    fixed: Sequence[Any],
    rows: Sequence[Sequence[Any]],
    returning: str | None,
    *,
    can_return: bool,
) -> set[tuple[Any, ...]]:
    """Run ``head + row, row, ... + tail`` over ``rows``; the keys of the rows it wrote.

    ``returning`` names the key columns, which are the first values of each row (None:
    nothing is read back, and the answer is empty). Without ``RETURNING``
    (``can_return`` false: SQLite before 3.35) each row is one statement.
    """
    head, each, tail = statement
    written: set[tuple[Any, ...]] = set()
    if returning is not None and not can_return:
        width = len(returning.split(","))
        for row in rows:
            cursor.execute(head + each + tail, (*fixed, *row))
            if cursor.rowcount == 1:
                written.add(tuple(row[:width]))
        return written
    back = "" if returning is None else " RETURNING " + returning
    for chunk in _chunks(rows):
        cursor.execute(
            head + ",".join([each] * len(chunk)) + tail + back,
            (*fixed, *[value for row in chunk for value in row]),
        )
        if returning is not None:
            written.update(tuple(found) for found in cursor.fetchall())
    return written


def _chunks(items: Sequence[Any], size: int = ROWS_PER_STATEMENT) -> Iterator[Sequence[Any]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def _first_only(keys: Sequence[tuple[Any, ...]], done: set[tuple[Any, ...]]) -> list[bool]:
    """Which requests took effect: the first of each key that did (a repeated key did not)."""
    answered: list[bool] = []
    for key in keys:
        answered.append(key in done)
        done.discard(key)
    return answered


def _queue_row(row: Sequence[Any]) -> QueueRow:
    return QueueRow(
        invocation_id=row[0],
        agent_name=row[1],
        agent_ref=row[2],
        status=QueueStatus(row[3]),
        holder=row[4],
        epoch=int(row[5]),
        due_at=float(row[6]),
        submitted_at=float(row[7]),
        updated_at=float(row[8]),
        note=row[9],
    )


def _holder_row(row: Sequence[Any]) -> HolderRow:
    return HolderRow(
        holder=row[0],
        kind=HolderKind(row[1]),
        host=row[2],
        machine=row[3],
        pid=int(row[4]),
        pid_start=row[5],
        started_at=float(row[6]),
        heartbeat_at=float(row[7]),
        lease_s=float(row[8]),
        agents=json.loads(row[9]),
        concurrency=int(row[10]),
    )


class WorkQueue:
    """The queue's operations, written once over a small SQL dialect (``?`` placeholders).

    Subclasses give a connection, transactions, the clock, and the locking of claims.
    """

    dialect: ClassVar[Dialect] = Dialect.sqlite
    """The engine: what a transaction appends to a SELECT of rows it is about to change
    (``for_update``), and a claim to its SELECT of candidates (``skip_locked``)."""
    returning = True
    """Whether the database knows ``RETURNING`` (a batch is then a few statements)."""

    def __init__(self) -> None:
        """Prepare the queue (subclasses connect)."""
        self._lock = threading.RLock()
        """Held around each transaction (re-entrant: :meth:`at_once` holds it around one)."""
        self._ready = False
        self._waitless = False
        """A transaction must not wait for the database's lock (set by :meth:`at_once`)."""

    @property
    def writes_at_once(self) -> bool:
        """Whether :meth:`at_once` may write on the caller's thread (a SQLite file's queue)."""
        return False

    def at_once(self, write: Callable[[], T]) -> T:
        """Run ``write`` (one of this queue's writes) now, on this thread, if it need not wait.

        For a quick write that nothing would wait for on the caller's thread (a release,
        not flushed: ``LeaseKeeper``): the queue's own thread is not using it and the
        database's lock is free. Otherwise nothing is written and it raises.

        Raises:
            QueueBusyError: the queue is in use, or the database is locked; nothing was
                written.
        """
        raise QueueBusyError("this queue writes in its own thread")

    # ----------------------------------------------------------------- plumbing

    @contextlib.contextmanager
    def _transaction(self, *, write: bool, durable: bool = True) -> Iterator[Cursor]:
        """A transaction; ``durable=False``: its commit need not survive an OS crash.

        Such a commit is not flushed to disk (SQLite's ``synchronous=NORMAL`` in WAL
        mode, PostgreSQL's ``synchronous_commit = off``): a crash of the process keeps
        it, a crash of the machine may lose it, and the database stays consistent.
        """
        raise NotImplementedError

    def _now(self, cursor: Cursor) -> float:
        raise NotImplementedError

    def close(self) -> None:
        """Close the connection."""
        raise NotImplementedError

    def _ensure(self) -> None:
        if self._ready:
            return
        with self._transaction(write=True) as cursor:
            self._lock_schema(cursor)
            for statement in QUEUE_DEFINITIONS:
                cursor.execute(statement)
        self._ready = True

    def _lock_schema(self, cursor: Cursor) -> None:
        """Make processes that create the tables at once take turns (SQLite: its write lock)."""

    @contextlib.contextmanager
    def _tx(self, *, write: bool = True, durable: bool = True) -> Iterator[tuple[Cursor, float]]:
        with self._lock:
            self._ensure()
            with self._transaction(write=write, durable=durable) as cursor:
                yield cursor, self._now(cursor)

    def _write_rows(
        self,
        cursor: Cursor,
        statement: tuple[str, str, str],
        fixed: Sequence[Any],
        rows: Sequence[Sequence[Any]],
        returning: str,
    ) -> set[tuple[Any, ...]]:
        """:func:`write_rows` on this queue's engine."""
        return write_rows(cursor, statement, fixed, rows, returning, can_return=self.returning)

    def _get(self, cursor: Cursor, invocation_id: str, *, lock: bool) -> QueueRow | None:
        cursor.execute(
            f"SELECT {_QUEUE_COLUMNS} FROM {QUEUE_TABLE} WHERE invocation_id = ?"  # noqa: S608
            + (self.dialect.for_update if lock else ""),
            (invocation_id,),
        )
        found = cursor.fetchone()
        return None if found is None else _queue_row(found)

    def _holder(self, cursor: Cursor, holder: str) -> HolderRow | None:
        cursor.execute(
            f"SELECT {_HOLDER_COLUMNS} FROM {HOLDERS_TABLE} WHERE holder = ?",  # noqa: S608
            (holder,),
        )
        found = cursor.fetchone()
        return None if found is None else _holder_row(found)

    # ----------------------------------------------------------------- rows

    def now(self) -> float:
        """The queue's clock (seconds since the epoch)."""
        with self._tx(write=False) as (_, now):
            return now

    def enqueue(
        self,
        invocation_id: str,
        agent_name: str,
        *,
        agent_ref: str | None = None,
        status: QueueStatus = QueueStatus.RUNNABLE,
    ) -> bool:
        """Add a row (runnable from now); False when the invocation already has one."""
        return self.enqueue_many([NewRow(invocation_id, agent_name, agent_ref, status)])[0]

    def enqueue_many(self, rows: Sequence[NewRow]) -> list[bool]:
        """Add rows in one transaction; for each, False when its invocation already had one."""
        with self._tx() as (cursor, now):
            made = self._write_rows(
                cursor, new_row_statement(), (), [row.values(now) for row in rows], "invocation_id"
            )
        return _first_only([(row.invocation_id,) for row in rows], made)

    def acquire(
        self,
        invocation_id: str,
        agent_name: str,
        *,
        holder: str,
        lease_s: float,
        take_over: bool,
        gone: GoneCheck,
    ) -> Take | Refuse:
        """Take the lease of one invocation (``resume``), or say who holds it."""
        with self._tx() as (cursor, now):
            row = self._get(cursor, invocation_id, lock=True)
            previous = (
                None if row is None or row.holder is None else self._holder(cursor, row.holder)
            )
            verdict = decide_acquire(
                row,
                holder=holder,
                now=now,
                take_over=take_over,
                previous_gone=row is not None and row.holder is not None and gone(previous, now),
            )
            if isinstance(verdict, Refuse):
                return verdict
            if row is None:
                cursor.execute(
                    f"INSERT INTO {QUEUE_TABLE} ({_QUEUE_COLUMNS}) "  # noqa: S608
                    "VALUES (?, ?, NULL, ?, ?, ?, ?, ?, ?, NULL)",
                    (
                        invocation_id,
                        agent_name,
                        QueueStatus.CLAIMED.value,
                        holder,
                        verdict.epoch,
                        now + lease_s,
                        now,
                        now,
                    ),
                )
            else:
                self._set_claimed(cursor, invocation_id, holder, verdict.epoch, now + lease_s, now)
            return verdict

    def _set_claimed(  # noqa: PLR0917 - one row's new lease, in the columns' order
        self, cursor: Cursor, invocation_id: str, holder: str, epoch: int, due: float, now: float
    ) -> None:
        cursor.execute(
            f"UPDATE {QUEUE_TABLE} SET status = ?, holder = ?, epoch = ?, due_at = ?, "  # noqa: S608
            "updated_at = ?, note = NULL WHERE invocation_id = ?",
            (QueueStatus.CLAIMED.value, holder, epoch, due, now, invocation_id),
        )

    def claim(
        self, *, holder: str, agent_names: Sequence[str], limit: int, lease_s: float
    ) -> list[Claimed]:
        """Claim up to ``limit`` claimable rows (``CLAIM_AT_MOST`` a call).

        The runs of holders that are gone first (their leases ran out), then new runs;
        each oldest first.
        """
        if limit < 1 or not agent_names:
            return []
        limit = min(limit, CLAIM_AT_MOST)
        names = list(agent_names)
        claimable_where = (
            f"agent_name IN ({marks(len(names))}) AND status IN (?, ?) AND due_at <= ?"
        )
        # An idle worker polls often: look first without taking the write lock.
        with self._tx(write=False) as (cursor, now):
            cursor.execute(
                f"SELECT 1 FROM {QUEUE_TABLE} WHERE {claimable_where} LIMIT 1",  # noqa: S608
                (*names, QueueStatus.RUNNABLE.value, QueueStatus.CLAIMED.value, now),
            )
            if cursor.fetchone() is None:
                return []
        with self._tx() as (cursor, now):
            params = [*names, QueueStatus.RUNNABLE.value, QueueStatus.CLAIMED.value, now]
            # First a fixed candidate set, without locks; then lock what is left of it
            # (skipping rows another claim holds). A LIMIT under SKIP LOCKED could slide
            # past a locked head; this never admits a younger row before an older one
            # that is free.
            # Runs whose holder died (a claimed row whose lease ran out, or was expired
            # when its holder was found gone) come before the backlog of new ones: each
            # kind is read oldest first on the (status, due_at) index.
            candidates: list[str] = []
            for status in (QueueStatus.CLAIMED, QueueStatus.RUNNABLE):
                cursor.execute(
                    f"SELECT invocation_id FROM {QUEUE_TABLE} "  # noqa: S608
                    f"WHERE agent_name IN ({marks(len(names))}) AND status = ? AND due_at <= ? "
                    "ORDER BY due_at, invocation_id LIMIT ?",
                    (*names, status.value, now, limit * CANDIDATES_PER_CLAIM - len(candidates)),
                )
                candidates += [str(found[0]) for found in cursor.fetchall()]
                if len(candidates) >= limit * CANDIDATES_PER_CLAIM:
                    break
            if not candidates:
                return []
            cursor.execute(
                f"SELECT {_QUEUE_COLUMNS} FROM {QUEUE_TABLE} "  # noqa: S608
                f"WHERE invocation_id IN ({marks(len(candidates))}) AND {claimable_where} "
                "ORDER BY due_at, invocation_id" + self.dialect.skip_locked,
                (*candidates, *params),
            )
            taken_over_first = {invocation_id: n for n, invocation_id in enumerate(candidates)}
            rows = sorted(
                (_queue_row(found) for found in cursor.fetchall()),
                key=lambda row: taken_over_first[row.invocation_id],
            )
            # The rows are locked (SQLite's write lock; FOR UPDATE on PostgreSQL): one
            # statement moves them all to the next epoch, as decided from what was read.
            taken = [row for row in rows if claimable(row, now)][:limit]
            for chunk in _chunks(taken):
                cursor.execute(
                    f"UPDATE {QUEUE_TABLE} SET status = ?, holder = ?, epoch = epoch + 1, "  # noqa: S608
                    "due_at = ?, updated_at = ?, note = NULL "
                    f"WHERE invocation_id IN ({marks(len(chunk))})",
                    (
                        QueueStatus.CLAIMED.value,
                        holder,
                        now + lease_s,
                        now,
                        *[row.invocation_id for row in chunk],
                    ),
                )
            return [
                Claimed(
                    invocation_id=row.invocation_id,
                    agent_name=row.agent_name,
                    agent_ref=row.agent_ref,
                    epoch=row.epoch + 1,
                    record=row.holder is not None,
                    taken_from=row.holder,
                )
                for row in taken
            ]

    def renew(self, *, holder: str, leases: Sequence[tuple[str, int]], lease_s: float) -> set[str]:
        """Extend this holder's leases (and its heartbeat); return the ids still held."""
        with self._tx() as (cursor, now):
            cursor.execute(
                f"UPDATE {HOLDERS_TABLE} SET heartbeat_at = ? WHERE holder = ?",  # noqa: S608
                (now, holder),
            )
            kept = self._write_rows(
                cursor,
                (
                    f"UPDATE {QUEUE_TABLE} SET due_at = ?, updated_at = ? WHERE holder = ? "  # noqa: S608
                    "AND status = ? AND (invocation_id, epoch) IN (VALUES ",
                    "(?, ?)",
                    ")",
                ),
                (now + lease_s, now, holder, QueueStatus.CLAIMED.value),
                leases,
                "invocation_id",
            )
        return {str(found[0]) for found in kept}

    def release(
        self,
        invocation_id: str,
        *,
        holder: str,
        epoch: int,
        release: Release,
        note: str | None = None,
    ) -> bool:
        """Give a lease back, leaving the row as ``release`` says; False if it was not held."""
        return invocation_id in self.release_many(
            [(invocation_id, epoch, release, note)], holder=holder
        )

    def release_many(
        self, leases: Sequence[tuple[str, int, Release, str | None]], *, holder: str
    ) -> set[str]:
        """:meth:`release` for many ``(invocation_id, epoch, release, note)`` in one transaction.

        Returns the ids whose lease was given back (not those no longer held).

        Not flushed to disk (``durable=False``): a release lost to a crash of the
        machine leaves the row as a crash just before the release leaves it, held by a
        holder that is gone, which runs out within its lease (and is then claimed
        again, and set as its invocation stands); a crash of the process loses nothing.
        The run that gives it back does not wait for a flush.
        """
        alike: dict[tuple[Release, str | None], list[tuple[str, int]]] = {}
        # A sleep's row is claimable from its wake time; any other from ``delay_s`` on.
        for invocation_id, epoch, release, note in leases:
            alike.setdefault((release, note), []).append((invocation_id, epoch))
        released: set[tuple[Any, ...]] = set()
        with self._tx(durable=False) as (cursor, now):
            for (release, note), group in alike.items():
                released |= self._write_rows(
                    cursor,
                    (
                        f"UPDATE {QUEUE_TABLE} SET status = ?, holder = NULL, due_at = ?, "  # noqa: S608
                        "updated_at = ?, note = ? WHERE holder = ? AND (invocation_id, epoch) "
                        "IN (VALUES ",
                        "(?, ?)",
                        ")",
                    ),
                    (
                        release.status.value,
                        now + release.delay_s if release.due_at is None else release.due_at,
                        now,
                        note,
                        holder,
                    ),
                    group,
                    "invocation_id",
                )
        return {str(found[0]) for found in released}

    def set_status(
        self, invocation_id: str, status: QueueStatus, *, only_from: Sequence[QueueStatus]
    ) -> bool:
        """Move an unheld row to ``status`` (runnable from now) if it is in ``only_from``.

        For what others record between runs: an approval makes a paused row runnable,
        a cancel of a paused invocation ends it.
        """
        with self._tx() as (cursor, now):
            cursor.execute(
                f"UPDATE {QUEUE_TABLE} SET status = ?, due_at = ?, updated_at = ?, "  # noqa: S608
                "note = NULL WHERE invocation_id = ? AND holder IS NULL "
                f"AND status IN ({marks(len(only_from))})",
                (status.value, now, now, invocation_id, *[s.value for s in only_from]),
            )
            return bool(cursor.rowcount == 1)

    def row(self, invocation_id: str) -> QueueRow | None:
        """The row of one invocation (None: it has none)."""
        with self._tx(write=False) as (cursor, _):
            return self._get(cursor, invocation_id, lock=False)

    def rows(
        self, *, holder: str | None = None, limit: int | None = 10_000
    ) -> tuple[list[QueueRow], float]:
        """Rows (of one holder, or all), newest first, and the queue's time of reading.

        ``limit=None``: every row.
        """
        where = "" if holder is None else "WHERE holder = ? "
        bound = "" if limit is None else " LIMIT ?"
        with self._tx(write=False) as (cursor, now):
            cursor.execute(
                f"SELECT {_QUEUE_COLUMNS} FROM {QUEUE_TABLE} {where}"  # noqa: S608
                f"ORDER BY submitted_at DESC, invocation_id{bound}",
                ((holder,) if holder is not None else ()) + (() if limit is None else (limit,)),
            )
            return [_queue_row(found) for found in cursor.fetchall()], now

    # ----------------------------------------------------------------- rate limits

    def take_quota(
        self, limit: RateLimit, *, tokens: int, correction: int = 0
    ) -> Granted | TooLong | None:
        """Schedule one model request under ``limit``: when it may start (None: try again).

        One short transaction on the limit's row, locked (SQLite's write lock; on
        PostgreSQL ``FOR UPDATE NOWAIT``: a row another process holds this instant is
        not waited for, the caller tries again a few milliseconds later, so no worker
        queues up on a database lock). ``correction``: tokens that earlier requests used
        beyond (or, negative, short of) what they reserved, applied first.
        """
        try:
            with self._tx() as (cursor, now):
                row = self._quota_row(cursor, limit)
                if correction:
                    row = correct(row, limit, correction)
                verdict = take(row, limit, now=now, tokens=tokens, max_wait_s=limit.max_wait_s)
                if isinstance(verdict, Granted):
                    self._put_quota(cursor, limit, verdict.row)
                return verdict
        except StoreUnavailableError as error:
            if type(error.__cause__).__name__ == "LockNotAvailable":
                return None
            raise

    def throttle_quota(self, limit: RateLimit, *, retry_after_s: float | None) -> float:
        """The provider refused a request as over its limit: block the limit for everyone.

        Returns until when (the queue's clock).
        """
        with self._tx() as (cursor, now):
            row = self._quota_row(cursor, limit, wait=True)
            after = throttle(row, limit, now=now, retry_after_s=retry_after_s)
            self._put_quota(cursor, limit, after)
            return after.blocked_until

    def _quota_row(self, cursor: Cursor, limit: RateLimit, *, wait: bool = False) -> QuotaRow:
        # The row is made first (a no-op once it exists), so that the lock below always
        # has a row to take: two first requests never both read "no row".
        cursor.execute(
            f"INSERT INTO {RATE_LIMITS_TABLE} (provider, model, request_due, token_due, "  # noqa: S608
            "blocked_until) VALUES (?, ?, 0, 0, 0) ON CONFLICT (provider, model) DO NOTHING",
            limit.key,
        )
        lock = ""
        if self.dialect is Dialect.postgresql:
            lock = " FOR UPDATE" if wait else " FOR UPDATE NOWAIT"
        cursor.execute(
            f"SELECT request_due, token_due, blocked_until FROM {RATE_LIMITS_TABLE} "  # noqa: S608
            "WHERE provider = ? AND model = ?" + lock,
            limit.key,
        )
        found = cursor.fetchone()
        return QuotaRow(
            request_due=float(found[0]), token_due=float(found[1]), blocked_until=float(found[2])
        )

    def _put_quota(self, cursor: Cursor, limit: RateLimit, row: QuotaRow) -> None:
        cursor.execute(
            f"UPDATE {RATE_LIMITS_TABLE} SET request_due = ?, token_due = ?, "  # noqa: S608
            "blocked_until = ? WHERE provider = ? AND model = ?",
            (row.request_due, row.token_due, row.blocked_until, *limit.key),
        )

    def quota_rows(self) -> tuple[list[tuple[str, str, QuotaRow]], float]:
        """Every limit's shared state (provider, model, row), and the queue's time of reading."""
        with self._tx(write=False) as (cursor, now):
            cursor.execute(
                f"SELECT provider, model, request_due, token_due, blocked_until "  # noqa: S608
                f"FROM {RATE_LIMITS_TABLE} ORDER BY provider, model"
            )
            return [
                (str(found[0]), str(found[1]), QuotaRow(request_due=float(found[2]),
                 token_due=float(found[3]), blocked_until=float(found[4])))
                for found in cursor.fetchall()
            ], now  # fmt: skip

    # ----------------------------------------------------------------- schedules

    def add_schedule(self, make: Callable[[float], Schedule]) -> Schedule | None:
        """Add the schedule ``make(now)`` builds at the queue's time; None if its name is taken."""
        with self._tx() as (cursor, now):
            row = make(now)
            cursor.execute(
                f"INSERT INTO {SCHEDULES_TABLE} ({SCHEDULE_COLUMNS}) VALUES "  # noqa: S608
                f"({marks(len(SCHEDULE_COLUMNS.split(',')))}) ON CONFLICT (name) DO NOTHING",
                schedule_values(row),
            )
            return row if cursor.rowcount == 1 else None

    def schedules(self) -> tuple[list[Schedule], float]:
        """Every schedule, by name, and the queue's time of reading."""
        with self._tx(write=False) as (cursor, now):
            cursor.execute(f"SELECT {SCHEDULE_COLUMNS} FROM {SCHEDULES_TABLE} ORDER BY name")  # noqa: S608
            return [schedule_row(found) for found in cursor.fetchall()], now

    def change_schedule(
        self, name: str, change: Callable[[Schedule, float], Schedule]
    ) -> Schedule | None:
        """Write ``change(row, now)`` of the schedule ``name`` (None: there is no such schedule)."""
        with self._tx() as (cursor, now):
            row = self._schedule(cursor, name, lock=True)
            if row is None:
                return None
            after = change(row, now)
            if after != row:
                self._put_schedule(cursor, after)
            return after

    def remove_schedule(self, name: str) -> bool:
        """Remove the schedule ``name``; False when there is none (its runs stay as they are)."""
        with self._tx() as (cursor, _):
            cursor.execute(f"DELETE FROM {SCHEDULES_TABLE} WHERE name = ?", (name,))  # noqa: S608
            return bool(cursor.rowcount == 1)

    def check_schedules(
        self, agent_names: Sequence[str], *, limit: int = CLAIM_AT_MOST
    ) -> SchedulesChecked:
        """Check the schedules of these agents that may have runs to submit (``check_schedule``).

        Returns the runs decided (the caller submits them, then calls
        :meth:`schedule_submitted`), the next due schedules of these agents, and in how
        many seconds the next check is due. Looked at first without the write lock (a
        worker checks often, and mostly nothing is due); then, if a check changes a row,
        the rows are checked again and written in one short transaction that locks them
        (``FOR UPDATE SKIP LOCKED`` on PostgreSQL: a row another worker checks this
        instant is left to it). A run is decided once: the row that decides it is
        written in that transaction, and its id names its due time.
        """
        if not agent_names:
            return SchedulesChecked([], [], None)
        names = list(agent_names)
        where = (
            f"agent_name IN ({marks(len(names))}) AND ((state = ? AND (next_due <= ? "
            "OR waiting <> '[]')) OR retry_at <= ?)"
        )
        with self._tx(write=False) as (cursor, now):
            if not any(check.changed for check in self._check_rows(cursor, where, names, now)):
                return SchedulesChecked([], *self._upcoming(cursor, names, now))
        with self._tx() as (cursor, now):
            checks = self._check_rows(cursor, where, names, now, limit=limit, lock=True)
            for check in checks:
                if check.changed:
                    self._put_schedule(cursor, check.row)
            due = [DueRuns(check.row, check.submit, check.skipped) for check in checks]
            return SchedulesChecked(
                [runs for runs in due if runs.dues or runs.skipped],
                *self._upcoming(cursor, names, now),
            )

    def _check_rows(
        self,
        cursor: Cursor,
        where: str,
        names: list[str],
        now: float,
        *,
        limit: int = CLAIM_AT_MOST,
        lock: bool = False,
    ) -> list[ScheduleCheck]:
        cursor.execute(
            f"SELECT {SCHEDULE_COLUMNS} FROM {SCHEDULES_TABLE} WHERE {where} "  # noqa: S608
            "ORDER BY next_due, name LIMIT ?" + (self.dialect.skip_locked if lock else ""),
            (*names, ScheduleState.ACTIVE.value, now, now, limit),
        )
        rows = [schedule_row(found) for found in cursor.fetchall()]
        wanted = sorted({invocation_id for row in rows for invocation_id in row.looked_up()})
        found: dict[str, QueueStatus | None] = {}
        for chunk in _chunks(wanted):
            cursor.execute(
                f"SELECT {_QUEUE_COLUMNS} FROM {QUEUE_TABLE} "  # noqa: S608
                f"WHERE invocation_id IN ({marks(len(chunk))})",
                tuple(chunk),
            )
            for queued in map(_queue_row, cursor.fetchall()):
                found[queued.invocation_id] = effective_status(queued, now)
        return [check_schedule(row, now=now, found=found) for row in rows]

    def _upcoming(
        self, cursor: Cursor, names: list[str], now: float
    ) -> tuple[list[tuple[str, int]], float | None]:
        """The next due active schedules (name, due time), and the seconds to the next check."""
        cursor.execute(
            f"SELECT name, next_due FROM {SCHEDULES_TABLE} "  # noqa: S608
            f"WHERE agent_name IN ({marks(len(names))}) AND state = ? "
            "ORDER BY next_due, name LIMIT ?",
            (*names, ScheduleState.ACTIVE.value, UPCOMING_SCHEDULES),
        )
        upcoming = [(str(name), int(due)) for name, due in cursor.fetchall()]
        cursor.execute(
            f"SELECT MIN(retry_at) FROM {SCHEDULES_TABLE} "  # noqa: S608
            f"WHERE agent_name IN ({marks(len(names))})",
            tuple(names),
        )
        retry_at = cursor.fetchone()[0]
        times = [float(due) for _, due in upcoming[:1]]
        if retry_at is not None:
            times.append(float(retry_at))
        return upcoming, max(0.0, min(times) - now) if times else None

    def schedule_submitted(self, name: str, dues: Sequence[int]) -> None:
        """The runs of schedule ``name`` due at ``dues`` are in the store: no longer decided."""
        with self._tx() as (cursor, now):
            row = self._schedule(cursor, name, lock=True)
            if row is None:
                return  # removed meanwhile
            after = submitted(row, dues, now=now)
            if after is not row:
                self._put_schedule(cursor, after)

    def _schedule(self, cursor: Cursor, name: str, *, lock: bool) -> Schedule | None:
        cursor.execute(
            f"SELECT {SCHEDULE_COLUMNS} FROM {SCHEDULES_TABLE} WHERE name = ?"  # noqa: S608
            + (self.dialect.for_update if lock else ""),
            (name,),
        )
        found = cursor.fetchone()
        return None if found is None else schedule_row(found)

    def _put_schedule(self, cursor: Cursor, row: Schedule) -> None:
        cursor.execute(
            f"UPDATE {SCHEDULES_TABLE} SET {SCHEDULE_PROGRESS} WHERE name = ?",  # noqa: S608
            (*schedule_progress(row), row.name),
        )

    # ----------------------------------------------------------------- holders

    def register(self, row: HolderRow) -> float:
        """Register (or re-register) a holder; returns the queue's time."""
        with self._tx() as (cursor, now):
            cursor.execute(
                f"DELETE FROM {HOLDERS_TABLE} WHERE holder = ?",  # noqa: S608
                (row.holder,),
            )
            cursor.execute(
                f"INSERT INTO {HOLDERS_TABLE} ({_HOLDER_COLUMNS}) "  # noqa: S608
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                holder_values(row, now),
            )
            return now

    def holder(self, holder: str) -> HolderRow | None:
        """A holder's registration (None: it never registered, or deregistered)."""
        with self._tx(write=False) as (cursor, _):
            return self._holder(cursor, holder)

    def deregister(self, holder: str) -> None:
        """Remove a holder's registration (its leases are released by their runs)."""
        with self._tx() as (cursor, _):
            cursor.execute(
                f"DELETE FROM {HOLDERS_TABLE} WHERE holder = ?",  # noqa: S608
                (holder,),
            )

    def holders(self) -> tuple[list[HolderRow], float]:
        """Every registered holder, oldest first, and the queue's time of reading."""
        with self._tx(write=False) as (cursor, now):
            cursor.execute(
                f"SELECT {_HOLDER_COLUMNS} FROM {HOLDERS_TABLE} ORDER BY started_at, holder"  # noqa: S608
            )
            return [_holder_row(found) for found in cursor.fetchall()], now

    def reap(self, gone: GoneCheck) -> list[str]:
        """Expire the leases of holders that are gone and forget them; return their ids.

        Looked at first without the write lock (every heartbeat of every process reaps,
        and almost always nobody is gone); written, after looking again under the lock,
        only when somebody is.
        """
        with self._tx(write=False) as (cursor, now):
            cursor.execute(f"SELECT {_HOLDER_COLUMNS} FROM {HOLDERS_TABLE}")  # noqa: S608
            if not any(gone(row, now) for row in map(_holder_row, cursor.fetchall())):
                return []
        with self._tx() as (cursor, now):
            cursor.execute(f"SELECT {_HOLDER_COLUMNS} FROM {HOLDERS_TABLE}")  # noqa: S608
            dead = [row for row in map(_holder_row, cursor.fetchall()) if gone(row, now)]
            for row in dead:
                cursor.execute(
                    f"UPDATE {QUEUE_TABLE} SET due_at = ?, updated_at = ? "  # noqa: S608
                    "WHERE holder = ? AND status = ? AND due_at > ?",
                    (now, now, row.holder, QueueStatus.CLAIMED.value, now),
                )
                cursor.execute(
                    f"DELETE FROM {HOLDERS_TABLE} WHERE holder = ?",  # noqa: S608
                    (row.holder,),
                )
            return [row.holder for row in dead]


Slot = Callable[[], contextlib.AbstractContextManager[object]]
"""What a queue on a shared connection holds around each transaction (``SQLiteQueue.sharing``)."""


class QueueBusyError(Exception):
    """Raised when a write asked for at once would have to wait (``WorkQueue.at_once``)."""


def _locked(error: BaseException | None) -> bool:
    """Whether SQLite refused a statement because another connection holds the lock."""
    if not isinstance(error, sqlite3.OperationalError):
        return False
    code = getattr(error, "sqlite_errorcode", None)
    if isinstance(code, int):
        return code & 0xFF in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)
    message = str(error).lower()
    return "locked" in message or "busy" in message


SQLITE_SYNCHRONOUS_NORMAL = 1
"""SQLite's ``synchronous=NORMAL``: in WAL mode, a commit is not flushed (a checkpoint is)."""


class SQLiteQueue(WorkQueue):
    """The queue in a SQLite file (the store's own), or in an in-memory store's database.

    Writes take SQLite's write lock first (``BEGIN IMMEDIATE``): two claims never
    read the same free rows, whichever process they come from.
    """

    returning = sqlite3.sqlite_version_info >= (3, 35, 0)

    def __init__(self, path: str, *, timeout_s: float = 5.0, read_only: bool = False) -> None:
        """Open ``path`` (``:memory:``: a private in-memory database).

        Raises:
            StoreUnavailableError: the database cannot be opened.
        """
        super().__init__()
        self._read_only = read_only
        self._slot: Slot = contextlib.nullcontext
        self._owns_connection = True
        try:
            if read_only:
                self._connection = sqlite3.connect(
                    f"file:{path}?mode=ro", uri=True, isolation_level=None,
                    check_same_thread=False, timeout=timeout_s,
                )  # fmt: skip
            else:
                self._connection = sqlite3.connect(
                    path, isolation_level=None, check_same_thread=False, timeout=timeout_s
                )
        except sqlite3.Error as error:
            raise StoreUnavailableError(f"cannot open the queue in {path}: {error}") from error
        if read_only:
            self._ready = True  # nothing is created: a missing table reads as empty
        self._synchronous = int(self._connection.execute("PRAGMA synchronous").fetchone()[0])
        """The connection's own ``synchronous`` (FULL by default): what durable commits use."""
        self._busy_timeout_ms = int(timeout_s * 1000)
        """How long a transaction waits for the database's lock (0 in :meth:`at_once`)."""

    @classmethod
    def sharing(cls, connection: sqlite3.Connection, slot: Slot) -> SQLiteQueue:
        """The queue in a database another owner has open, on that owner's connection.

        For an in-memory store (``memory://``): its queue is in its own database, so that
        a start's row is written with its events. Each transaction runs inside
        ``slot()``, which keeps the owner's other readers and writers out meanwhile (in
        a shared in-memory database, a table another connection is writing cannot be
        read at all). The connection stays the owner's: :meth:`close` leaves it open.
        """
        queue = cls.__new__(cls)
        WorkQueue.__init__(queue)
        queue._read_only = False
        queue._slot = slot
        queue._owns_connection = False
        queue._connection = connection
        queue._synchronous = SQLITE_SYNCHRONOUS_NORMAL  # in memory: nothing to flush
        return queue

    @property
    def writes_at_once(self) -> bool:
        """A file's own connection, not read-only (a shared one waits for its owner's slot)."""
        return self._owns_connection and not self._read_only

    def at_once(self, write: Callable[[], T]) -> T:
        """As :meth:`WorkQueue.at_once`: SQLite's busy timeout is 0 meanwhile."""
        if not self.writes_at_once or not self._lock.acquire(blocking=False):
            raise QueueBusyError("the queue is in use")
        try:
            self._waitless = True
            try:
                return write()
            except StoreUnavailableError as error:
                if _locked(error.__cause__):
                    raise QueueBusyError("the database is locked") from error
                raise
        finally:
            self._waitless = False
            self._lock.release()

    @contextlib.contextmanager
    def _transaction(self, *, write: bool, durable: bool = True) -> Iterator[Cursor]:
        with self._slot():
            yield from self._transaction_in_slot(write=write, durable=durable)

    def _transaction_in_slot(self, *, write: bool, durable: bool) -> Iterator[Cursor]:
        cursor = self._connection.cursor()
        lax = write and not durable and self._synchronous > SQLITE_SYNCHRONOUS_NORMAL
        waitless = self._waitless
        try:
            if lax:  # set between transactions: SQLite refuses it inside one
                cursor.execute(f"PRAGMA synchronous = {SQLITE_SYNCHRONOUS_NORMAL}")
            if waitless:
                cursor.execute("PRAGMA busy_timeout = 0")
            cursor.execute("BEGIN IMMEDIATE" if write else "BEGIN")
            try:
                yield cursor
            except BaseException:
                self._connection.rollback()
                raise
            cursor.execute("COMMIT")
        except sqlite3.OperationalError as error:
            if self._connection.in_transaction:
                self._connection.rollback()
            if "no such table" in str(error) and self._read_only:
                raise _NoQueue from error
            raise StoreUnavailableError(f"the work queue cannot be used: {error}") from error
        finally:
            try:
                if lax:
                    cursor.execute(f"PRAGMA synchronous = {self._synchronous}")
                if waitless:
                    cursor.execute(f"PRAGMA busy_timeout = {self._busy_timeout_ms}")
            finally:
                cursor.close()

    def _now(self, cursor: Cursor) -> float:
        return time.time()

    def rows(
        self, *, holder: str | None = None, limit: int | None = 10_000
    ) -> tuple[list[QueueRow], float]:
        """As :meth:`WorkQueue.rows`; a store without a queue has no rows."""
        try:
            return super().rows(holder=holder, limit=limit)
        except _NoQueue:
            return [], time.time()

    def holders(self) -> tuple[list[HolderRow], float]:
        """As :meth:`WorkQueue.holders`; a store without a queue has no holders."""
        try:
            return super().holders()
        except _NoQueue:
            return [], time.time()

    def schedules(self) -> tuple[list[Schedule], float]:
        """As :meth:`WorkQueue.schedules`; a store without the table has no schedules."""
        try:
            return super().schedules()
        except _NoQueue:
            return [], time.time()

    def quota_rows(self) -> tuple[list[tuple[str, str, QuotaRow]], float]:
        """As :meth:`WorkQueue.quota_rows`; a store without the table has no limits."""
        try:
            return super().quota_rows()
        except _NoQueue:
            return [], time.time()

    def close(self) -> None:
        """Close the connection (unless it is another owner's)."""
        if self._owns_connection:
            self._connection.close()


class _NoQueue(Exception):
    """Raised when a store opened read-only has no queue tables (it never had a queue)."""


class PostgresQueue(WorkQueue):
    """The queue in a PostgreSQL database, for many workers on many machines.

    psycopg 3's sync API on one connection (its async layer is asyncio-only). A
    claim locks a fixed candidate set with ``FOR UPDATE SKIP LOCKED``: two claims
    never take one row, and neither waits for the other. The clock is the server's.
    A broken connection is opened again at the next call.
    """

    dialect = Dialect.postgresql

    def __init__(self, url: str, *, connect_timeout_s: int = 5) -> None:
        """Connect to ``url`` (a ``postgresql://`` URL).

        Raises:
            StoreUnavailableError: the server cannot be reached or refuses the login.
        """
        super().__init__()
        self._url = libpq_url(url)
        self._timeout = url_connect_timeout(url, connect_timeout_s)
        self._connection: Any = None
        self._connect()

    def _connect(self) -> Any:
        import psycopg  # noqa: PLC0415 - the postgres extra, needed only here

        if self._connection is not None and not self._connection.closed:
            return self._connection
        try:
            self._connection = psycopg.connect(
                self._url, autocommit=True, connect_timeout=self._timeout
            )
        except psycopg.Error as error:
            raise StoreUnavailableError(
                f"cannot reach the work queue's database: {str(error).strip()}"
            ) from error
        return self._connection

    @contextlib.contextmanager
    def _transaction(self, *, write: bool, durable: bool = True) -> Iterator[Cursor]:
        import psycopg  # noqa: PLC0415 - the postgres extra

        try:
            connection = self._connect()
            with connection.transaction(), connection.cursor() as cursor:
                if write and not durable:
                    cursor.execute("SET LOCAL synchronous_commit TO OFF")
                yield PlaceholderCursor(cursor, self.dialect)
        except psycopg.Error as error:
            if self._connection is not None and self._connection.broken:
                self._connection = None
            raise StoreUnavailableError(
                f"the work queue cannot be used: {str(error).strip()}"
            ) from error

    def _lock_schema(self, cursor: Cursor) -> None:
        # Two CREATE TABLE IF NOT EXISTS at once can both miss the table and one then fails
        # on the catalogue's unique index: a transaction-scoped advisory lock orders them.
        cursor.execute(f"SELECT pg_advisory_xact_lock(hashtext('{QUEUE_TABLE}'))")

    def _now(self, cursor: Cursor) -> float:
        cursor.execute("SELECT extract(epoch FROM clock_timestamp())::float8")
        return float(cursor.fetchone()[0])

    def close(self) -> None:
        """Close the connection."""
        if self._connection is not None:
            self._connection.close()


LOOP_ACTORS_URL_OPTIONS = frozenset(
    {"lock_timeout", "lock_retry", "mode", "connect_timeout", "pool_size"}
)
"""Options of a store URL that are this runtime's, not PostgreSQL's (``StoreUrl``'s for
PostgreSQL; libpq refuses a URL with ``pool_size``). ``connect_timeout`` is given to
psycopg as its argument instead (:func:`url_connect_timeout`)."""


def url_connect_timeout(url: str, default: int) -> int:
    """The URL's ``connect_timeout`` (whole seconds, checked by ``StoreUrl``), else ``default``."""
    values = [v for k, v in parse_qsl(urlsplit(url).query) if k == "connect_timeout"]
    return int(values[-1]) if values and values[-1].isdigit() else default


def libpq_url(url: str) -> str:
    """A store URL without the runtime's own options, as psycopg (libpq) takes it."""
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    kept = [(key, value) for key, value in query if key not in LOOP_ACTORS_URL_OPTIONS]
    return urlunsplit(parts._replace(query=urlencode(kept)))
