"""The Journal: the one writer to the event store, with group commit in its own thread.

A commit that nothing else would wait for is written on the trio thread instead
(see :class:`Journal`).
"""

from __future__ import annotations

import contextlib
import enum
import logging
import queue
import sqlite3
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Protocol

import outcome
import trio
from eventsourcing.persistence import (
    IntegrityError,
    InterfaceError,
    OperationalError,
    PersistenceError,
)

from aggregates.events import DomainEvent
from loop_actors._logs import BackgroundLoop, Throttle, package_logger
from loop_actors._messages import CommitFailed, CommitOutcome, Committed
from loop_actors._statistics import JournalCounters, JournalStatistics, TransactionWritten
from loop_actors.store.queue import NewRow
from loop_actors.store.store import EventStore
from loop_actors.store.url import DEFAULT_LOCK_RETRY_S, StoreUrl, redacted_url

log = package_logger(__name__)

MAX_GROUP = 512
"""The most commits put into one transaction."""

FIRST_BACKOFF_S = 0.05
"""The pause before the first retry of a commit that failed on a lock; doubled each time."""

MAX_BACKOFF_S = 0.5
"""The longest pause between two retries."""

LOCKED_POLLS_S = (0.0001, 0.0001, 0.0002, 0.0004, 0.0008)
"""The pauses of the quick tries of a commit that found the store locked inline."""

INLINE_IDLE_S = 0.005
"""How far the event loop's next deadline must be for a commit to be written inline."""

INLINE_MAX_RUNNABLE = 2
"""The most other runnable tasks a commit written inline may keep waiting (one commit's time)."""


class _Waiter:
    """A task parked on a commit; ``abandoned`` once it stopped waiting (cancelled).

    ``found_locked``: the commit was tried inline and found the store locked.
    """

    __slots__ = ("abandon_on_cancel", "abandoned", "found_locked", "task")

    def __init__(
        self, task: trio.lowlevel.Task, *, abandon_on_cancel: bool, found_locked: bool = False
    ) -> None:
        self.task = task
        self.abandon_on_cancel = abandon_on_cancel
        self.abandoned = False
        self.found_locked = found_locked

    def abort(self, _: object) -> trio.lowlevel.Abort:
        """Whether the parked task may stop waiting when cancelled (trio's abort hook)."""
        if not self.abandon_on_cancel:
            return trio.lowlevel.Abort.FAILED
        self.abandoned = True
        return trio.lowlevel.Abort.SUCCEEDED


@dataclass(frozen=True, slots=True)
class Commit:
    """What one caller commits: events, and the work queue's rows of the invocations they start.

    The rows are written in the transaction of the events (``EventStore.append``).
    """

    events: Sequence[DomainEvent]
    queue_rows: Sequence[NewRow] = ()


_Pending = tuple[Commit, _Waiter]


class _Refused(enum.Enum):
    """Why a commit was not written inline."""

    BUSY = "the Journal's thread is writing"
    LOCKED = "another connection holds the store's lock"


class _Locked(BaseException):
    """The store is locked: an inline commit gives up (nothing was written).

    A ``BaseException``, so that :func:`commit_group`'s handling of failures lets it through.
    """


class _NoLockWait:
    """An :class:`Appender` that does not wait for a lock: it raises :class:`_Locked`."""

    __slots__ = ("_store",)

    def __init__(self, store: EventStore) -> None:
        self._store = store

    def append(
        self,
        events: Sequence[DomainEvent],
        *,
        lock_wait_s: float | None = None,
        queue_rows: Sequence[NewRow] = (),
    ) -> int:
        try:
            return self._store.append(events, lock_wait_s=0.0, queue_rows=queue_rows)
        except Exception as error:
            if is_lock_failure(error):
                raise _Locked from error
            raise


class _Passes(trio.abc.Instrument):
    """Counts the scheduler's passes (one wait for I/O each)."""

    __slots__ = ("count",)

    def __init__(self) -> None:
        self.count = 0

    def before_io_wait(self, timeout: float) -> None:
        """A pass ends (trio's instrument hook)."""
        self.count += 1


def loop_idle() -> bool:
    """Whether no other task is runnable and no deadline is due within ``INLINE_IDLE_S``.

    Then a quick blocking write on the trio thread keeps nothing waiting (the Journal's
    inline commits; a lease's release: ``LeaseKeeper``).
    """
    statistics = trio.lowlevel.current_statistics()
    return (
        statistics.tasks_runnable <= INLINE_MAX_RUNNABLE
        and statistics.seconds_to_next_deadline > INLINE_IDLE_S
    )


class Appender(Protocol):
    """What group commit needs of a store: :meth:`EventStore.append`."""

    def append(
        self,
        events: Sequence[DomainEvent],
        *,
        lock_wait_s: float | None = None,
        queue_rows: Sequence[NewRow] = (),
    ) -> int:
        """Append atomically, with ``queue_rows``; ``lock_wait_s`` bounds the wait for a lock."""


@dataclass(frozen=True)
class LockRetry:
    """How the Journal waits for a locked store: one bounded wait for a whole group.

    A transaction waits up to ``lock_wait_s`` for the lock (SQLite's busy timeout,
    the URL's ``lock_timeout``). If it still fails on a lock, the group is tried
    again, with backoff, until ``retry_s`` (the URL's ``lock_retry``) have passed
    since that failure, each attempt waiting no longer than what is left. So every
    commit of the group is answered within ``lock_wait_s + retry_s`` of the
    group's first attempt (after the quick tries of a group that found the store
    locked inline: ``LOCKED_POLLS_S``, 1.6 ms in all).
    """

    lock_wait_s: float = 5.0
    retry_s: float = DEFAULT_LOCK_RETRY_S
    first_backoff_s: float = FIRST_BACKOFF_S
    max_backoff_s: float = MAX_BACKOFF_S

    @classmethod
    def of(cls, url: StoreUrl) -> LockRetry:
        """The settings of a store's URL."""
        return cls(lock_wait_s=url.lock_wait_s, retry_s=url.lock_retry_s)


POSTGRES_LOCK_FAILURES = frozenset({"55P03", "40P01", "40001"})
"""PostgreSQL's SQLSTATEs for "wait and try again": lock_not_available (the events
table's lock was not granted within ``lock_timeout``), deadlock_detected,
serialization_failure. The transaction was rolled back: nothing of it was written."""


def is_lock_failure(error: BaseException) -> bool:
    """Whether a store failure means "the database is locked or busy": worth waiting for.

    On SQLite: eventsourcing's ``OperationalError`` (or sqlite3's) with SQLite's
    result code ``SQLITE_BUSY`` or ``SQLITE_LOCKED``, or, where there is no code,
    a message saying the database is locked or busy. On PostgreSQL: psycopg's
    error (the ``__cause__``) with a SQLSTATE of :data:`POSTGRES_LOCK_FAILURES`;
    a lost connection is not one (the commit fails: ``checkpoint_failed``).
    """
    if not isinstance(error, OperationalError | sqlite3.OperationalError):
        return False
    cause = error if isinstance(error, sqlite3.Error) else error.__cause__
    if type(cause).__module__.split(".")[0] in ("psycopg", "psycopg_pool"):
        return getattr(cause, "sqlstate", None) in POSTGRES_LOCK_FAILURES
    code = getattr(cause, "sqlite_errorcode", None)  # set on errors SQLite raised
    if isinstance(code, int):
        return code & 0xFF in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)
    message = str(error).lower()
    return "locked" in message or "busy" in message


def _store_unusable(error: BaseException) -> bool:
    """Whether the store cannot be used now (gone, full, read-only), not a bug of ours."""
    return isinstance(error, OperationalError | InterfaceError | sqlite3.OperationalError)


def _failed(error: BaseException, *, conflict: bool = False, note: str = "") -> CommitFailed:
    return CommitFailed(
        error_type=type(error).__name__, message=str(error) + note, conflict=conflict
    )


def commit_group(
    store: Appender,
    group: list[Commit],
    *,
    retry: LockRetry | None = None,
    take_more: Callable[[], list[Commit]] | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    polls: Sequence[float] = (),
    throttle: Throttle | None = None,
) -> list[CommitOutcome]:
    """Commit a group of commits in one transaction; answer each, within one bounded wait.

    A transaction writes the events of its commits and their queue rows together.

    With ``polls`` (a group that found the store locked a moment ago), the group is
    first tried without waiting for the lock, once after each of these pauses:
    SQLite's own wait for a lock sleeps a millisecond or more at a time, longer than
    most transactions of another connection hold it. A try that fails on anything
    but the lock, and the last one, leave the group to what follows.

    How a failed transaction is handled depends on why it failed (nothing of it
    was written):

    - a conflict (``IntegrityError``: another writer took a position first): each
      commit is tried alone, to answer the culprit ``conflict`` and commit the rest;
    - the database is locked or busy (:func:`is_lock_failure`): the same
      commits are tried again together, with backoff, within ``retry`` (see
      :class:`LockRetry`); commits that ``take_more`` hands over meanwhile (those
      queued behind the group) join them. When the window closes, every one of
      them is answered with the lock failure;
    - any other failure of the database (disk full, read-only, I/O error): every
      commit of the transaction is answered with it at once; trying each alone
      would meet the same failure once per commit;
    - an error raised before the database was reached (an event that cannot be
      encoded): each commit is tried alone, as for a conflict, so that only the
      culprit fails; nothing waits for a lock there.

    Returns one outcome per commit: those of ``group`` in order, then those taken
    with ``take_more``, in order. A lock waited for, and a failure of the database,
    are logged through ``throttle`` (the Journal's: at most once a minute per class).

    Blocking: runs in the Journal's thread.
    """
    retry = retry or LockRetry()
    throttle = throttle or Throttle()
    commits = list(group)
    for pause in polls:
        sleep(pause)
        try:
            position = _append(store, commits, lock_wait_s=0)
        except Exception as error:  # answered below, by the attempts that follow
            if is_lock_failure(error):
                continue
            break
        return [Committed(position=position)] * len(commits)  # frozen: one answers them all
    results: dict[int, CommitOutcome] = {}
    attempts: deque[list[int]] = deque([list(range(len(commits)))])
    locked: list[int] = []
    deadline: float | None = None
    backoff = retry.first_backoff_s
    last_lock_error: BaseException | None = None
    while attempts or locked:
        if attempts:
            batch = attempts.popleft()
        else:
            assert deadline is not None
            assert last_lock_error is not None
            left = deadline - clock()
            if left <= 0:
                note = f" (still locked after waiting {retry.lock_wait_s:g} s" + (
                    f" and retrying for {retry.retry_s:g} s)" if retry.retry_s > 0 else ")"
                )
                throttle.caught(
                    log,
                    BackgroundLoop.JOURNAL,
                    last_lock_error,
                    "the store stayed locked: %d commit(s) not written; %s",
                    len(locked),
                    last_lock_error,
                    exc_info=False,
                )
                for index in locked:
                    results[index] = _failed(last_lock_error, note=note)
                break
            sleep(min(backoff, left))
            backoff = min(backoff * 2, retry.max_backoff_s)
            if take_more is not None:
                more = take_more()
                locked += range(len(commits), len(commits) + len(more))
                commits += more
            batch, locked = locked, []
        wait = None if deadline is None else max(0.0, deadline - clock())
        try:
            position = _append(store, [commits[index] for index in batch], lock_wait_s=wait)
        except IntegrityError as error:
            if len(batch) == 1:
                results[batch[0]] = _failed(error, conflict=True)
            else:
                attempts.extend([index] for index in batch)
        except Exception as error:  # every failure is answered to the commits it concerns
            if is_lock_failure(error):
                if deadline is None:
                    deadline = clock() + retry.retry_s
                if retry.retry_s > 0 and last_lock_error is None:
                    throttle.caught(
                        log,
                        BackgroundLoop.JOURNAL,
                        error,
                        "the store is locked (%s); retrying %d commit(s) for up to %g s",
                        error,
                        len(batch),
                        retry.retry_s,
                        level=logging.INFO,
                        exc_info=False,
                    )
                last_lock_error = error
                locked += batch
            elif isinstance(error, PersistenceError) or len(batch) == 1:
                throttle.caught(
                    log,
                    BackgroundLoop.JOURNAL,
                    error,
                    "a transaction of %d commit(s) failed (%s: %s); each is refused (its run "
                    "stops: checkpoint_failed, resumable from its last commit)",
                    len(batch),
                    type(error).__name__,
                    redacted_url(" ".join(str(error).split())),
                    # An outage is warned about once by the runtime (StoreOutages).
                    level=logging.INFO if _store_unusable(error) else logging.WARNING,
                    exc_info=not isinstance(error, PersistenceError),
                )
                for index in batch:
                    results[index] = _failed(error)
            else:
                attempts.extend([index] for index in batch)
        else:
            done = Committed(position=position)  # frozen: one answers every commit of the batch
            for index in batch:
                results[index] = done
    return [results[index] for index in range(len(commits))]


def _append(store: Appender, commits: Sequence[Commit], *, lock_wait_s: float | None) -> int:
    """Append the events of ``commits``, with their queue rows, in one transaction."""
    return store.append(
        [event for commit in commits for event in commit.events],
        lock_wait_s=lock_wait_s,
        queue_rows=[row for commit in commits for row in commit.queue_rows],
    )


class Journal:
    """The one writer: a dedicated OS thread that commits what controllers hand it.

    ``await journal.commit(events)`` puts the events on the thread's queue and
    parks the calling task until they are durable (or refused). The thread takes
    everything queued while its last transaction ran and writes it in one
    transaction (group commit), then wakes every waiting task with one call into
    trio. No trio task sits in between: a commit costs one queue put, one
    transaction, and one wake-up of the trio thread.

    **Inline when idle.** Handing a commit to the thread and being woken costs
    more than the commit itself on a fast disk (docs/performance.md, section 2).
    So on a SQLite file, a commit is written on the trio thread, at once, when
    nothing would wait for it there: nothing is queued or in flight in the
    thread, at most ``INLINE_MAX_RUNNABLE`` other tasks are runnable, no deadline
    (a timeout, a sleep) is due within ``INLINE_IDLE_S``, no other task of the
    same scheduler pass wrote inline (the tasks that run later in a pass are not
    counted as runnable, so many commits made in one pass still go to the thread
    together), and the commit takes no snapshot (that reads the store). The same
    transaction is written, on the same connection, with the same answers; only a
    locked store is not waited for there: the commit goes to the thread, which
    tries it again a few times without waiting (``LOCKED_POLLS_S``), then waits as
    :class:`LockRetry` says. What waits meanwhile is I/O readiness (a socket that
    becomes readable is seen after the commit).

    Open it with ``async with Journal(store):`` inside ``trio.run``. A Journal that
    outlives one event loop (a runtime kept open between ``run_sync`` calls) is started
    once (:meth:`start`), serves each event loop in turn (``async with
    journal.serving():``), and is stopped once (:meth:`stop`): its thread is not bound
    to an event loop, only the task wake-ups are, and a loop's serving ends once every
    commit handed over in it was answered.
    """

    def __init__(
        self,
        store: EventStore,
        *,
        committed: trio.MemorySendChannel[None] | None = None,
        after_commit: Callable[[Sequence[Sequence[DomainEvent]]], None] | None = None,
        on_transaction: Callable[[TransactionWritten], None] | None = None,
        inline: bool = True,
    ) -> None:
        """Prepare the Journal; ``committed`` (buffer of one) is poked after each transaction.

        ``after_commit`` is called after each transaction, once its commits were
        answered, with the commits that were written, on the thread that wrote them:
        the Journal's, or the trio thread for a commit written inline (so it must be
        thread-safe and quick; what it raises is logged). ``on_transaction`` likewise,
        after every transaction, written or not, with its size and duration (the
        runtime's metrics). ``inline=False`` hands every commit to the thread.
        """
        self._store = store
        self._committed = committed
        self._after_commit = after_commit
        self._on_transaction = on_transaction
        self._queue: queue.SimpleQueue[_Pending | None] = queue.SimpleQueue()
        self._token: trio.lowlevel.TrioToken | None = None
        """The event loop served now (its tasks are woken through it); None between loops."""
        self._thread: threading.Thread | None = None
        self._closed = True
        """No commit is taken (no event loop is served, or its serving is ending)."""
        self._stop_seen = False
        """The thread took the stop mark from the queue (nothing follows it)."""
        self._inline = inline and store.url.kind == "sqlite"
        self._outstanding = 0
        """Commits handed to the thread and not answered yet (kept on the trio thread)."""
        self._answered: trio.Event | None = None
        """Set when ``_outstanding`` comes down to 0 while a serving ends."""
        self._passes = _Passes()
        self._inline_by: tuple[int, trio.lowlevel.Task | None] = (-1, None)
        """The scheduler pass and the task of the last commit made inline."""
        self._writing = threading.Lock()
        """Held while a transaction runs, on either thread."""
        self._counters = JournalCounters()
        self.throttle = Throttle()
        """How the Journal's thread logs what it catches (at most once a minute per class)."""

    def statistics(self) -> JournalStatistics:
        """What it has written since it opened, and how many commits wait for its thread."""
        return self._counters.snapshot(queued=self._outstanding)

    def start(self) -> None:
        """Start the writer thread (once; not bound to an event loop).

        Blocking: no (a thread is started).
        """
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._work, name="loop-actors-journal", daemon=True
            )
            self._thread.start()

    def stop(self) -> None:
        """Stop the writer thread once it wrote everything handed to it (blocking; once).

        Called between event loops (nothing is outstanding then), or by :meth:`aclose`.
        """
        if self._thread is None or self._stop_seen or not self._thread.is_alive():
            return
        self._queue.put(None)
        self._thread.join()

    @contextlib.asynccontextmanager
    async def serving(
        self, committed: trio.MemorySendChannel[None] | None = None
    ) -> AsyncIterator[Journal]:
        """Take commits from this event loop until the block ends (the thread is started).

        ``committed`` is poked after each transaction, and closed at the end.

        Cancellation: not a checkpoint on entry; the end is shielded: it waits until
        every commit handed over in the block was answered.
        """
        self._serve(committed)
        try:
            yield self
        finally:
            await self._end_serving()

    def _serve(self, committed: trio.MemorySendChannel[None] | None) -> None:
        """Serve the running event loop: its tasks are woken through its token."""
        if not self._closed:
            raise RuntimeError("the journal already serves an event loop")
        self._token = trio.lowlevel.current_trio_token()
        self._committed = committed
        self._inline_by = (-1, None)
        if self._inline:
            trio.lowlevel.add_instrument(self._passes)
        self._closed = False
        self.start()

    async def _end_serving(self) -> None:
        """Refuse new commits, wait (shielded) until every one handed over was answered."""
        self._closed = True
        with trio.CancelScope(shield=True):
            while self._outstanding:
                self._answered = trio.Event()
                await self._answered.wait()
        self._answered = None
        if self._inline:
            trio.lowlevel.remove_instrument(self._passes)
        self._token = None
        if self._committed is not None:
            self._committed.close()
            self._committed = None

    async def __aenter__(self) -> Journal:
        """Start the writer thread and serve this event loop.

        Cancellation: not a checkpoint.
        """
        self._serve(self._committed)
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        """Stop the writer thread (see :meth:`aclose`).

        Cancellation: shielded, as :meth:`aclose`.
        """
        await self.aclose()

    async def commit(
        self,
        events: Sequence[DomainEvent],
        *,
        queue_rows: Sequence[NewRow] = (),
        abandon_on_cancel: bool = False,
    ) -> CommitOutcome:
        """Append ``events`` atomically and wait until they are durable (or refused).

        ``queue_rows``: the work queue's rows of the invocations ``events`` start,
        written in the same transaction (refused with them, durable with them).

        Cancellation: by default not a cancellation point once handed over: a
        commit that was handed to the thread is waited for (on a locked store, at
        most about the URL's ``lock_timeout`` twice plus its ``lock_retry``: see
        :class:`LockRetry`), so the caller never loses track of what is durable. With
        ``abandon_on_cancel`` (cleanup under a bound), a cancelled caller stops
        waiting at once; the commit may still become durable, so the caller must
        read the store again to know. A commit written inline (see the class) is
        not a cancellation point either, nor a schedule point: it returns once
        durable, and a cancellation is delivered at the caller's next checkpoint;
        ``abandon_on_cancel`` commits always go to the thread.
        """
        if self._closed or self._thread is None:
            await trio.lowlevel.checkpoint()
            return CommitFailed(
                error_type="ClosedResourceError", message="the journal is closed", conflict=False
            )
        task = trio.lowlevel.current_task()
        found_locked = False
        if (
            self._inline
            and not abandon_on_cancel
            and not self._outstanding
            and not self._store.snapshots_due(events)
            and self._may_inline(task)
        ):
            done = self._commit_inline(Commit(events, queue_rows))
            if not isinstance(done, _Refused):
                return done
            found_locked = done is _Refused.LOCKED
        waiter = _Waiter(task, abandon_on_cancel=abandon_on_cancel, found_locked=found_locked)
        self._outstanding += 1
        self._queue.put((Commit(events, queue_rows), waiter))
        return await trio.lowlevel.wait_task_rescheduled(waiter.abort)  # type: ignore[no-any-return]

    def _may_inline(self, task: trio.lowlevel.Task) -> bool:
        """Whether the loop is idle and no other task committed inline in this pass.

        Tasks that run later in the same pass are not counted as runnable: after one
        task's commit made inline, the others of its pass hand theirs to the thread,
        where they are grouped.
        """
        count = self._passes.count
        last_pass, last_task = self._inline_by
        if last_pass == count and last_task is not task:
            return False
        if not loop_idle():
            return False
        self._inline_by = (count, task)
        return True

    @trio.lowlevel.enable_ki_protection
    def _commit_inline(self, commit: Commit) -> CommitOutcome | _Refused:
        """Commit on the trio thread, if the store can be written at once."""
        if not self._writing.acquire(blocking=False):
            return _Refused.BUSY  # the thread is writing
        began = time.monotonic()
        try:
            try:
                [result] = commit_group(_NoLockWait(self._store), [commit], throttle=self.throttle)
            except _Locked:
                return _Refused.LOCKED
        finally:
            self._writing.release()
        self._poke()
        self._after([commit], [result], time.monotonic() - began, inline=True)
        return result

    async def aclose(self) -> None:
        """Answer every commit already handed over, then stop the thread.

        Cancellation: shielded: the thread is always joined, so nothing handed over
        is left unanswered or half-written.
        """
        if self._closed:
            return
        await self._end_serving()
        if self._thread is not None:
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(self.stop)

    # ----------------------------------------------------------------- the thread

    def _work(self) -> None:
        retry = LockRetry.of(self._store.url)
        while not self._stop_seen:
            first = self._queue.get()
            if first is None:
                return
            group = [first]
            began = time.monotonic()
            with self._writing:
                self._take(group)
                try:
                    found_locked = any(waiter.found_locked for _, waiter in group)
                    results = commit_group(
                        self._store,
                        [commit for commit, _ in group],
                        retry=retry,
                        take_more=partial(self._take, group),
                        polls=LOCKED_POLLS_S if found_locked else (),
                        throttle=self.throttle,
                    )
                except BaseException as error:  # never leave a task waiting for an answer
                    self.throttle.caught(
                        log,
                        BackgroundLoop.JOURNAL,
                        error,
                        "group commit failed unexpectedly; %d commit(s) fail",
                        len(group),
                        level=logging.ERROR,
                    )
                    failed = CommitFailed(
                        error_type=type(error).__name__, message=str(error), conflict=False
                    )
                    results = [failed] * len(group)
            # Released first: the woken tasks may commit inline at once. The loop that
            # handed these over is still served: its serving waits for this answer.
            assert self._token is not None
            self._token.run_sync_soon(self._deliver, group, results)
            self._after([commit for commit, _ in group], results, time.monotonic() - began)

    def _after(
        self,
        commits: list[Commit],
        results: list[CommitOutcome],
        duration_s: float,
        *,
        inline: bool = False,
    ) -> None:
        """Count the transaction; call the hooks (the after-commit one with what was written)."""
        written = [
            commit.events
            for commit, result in zip(commits, results, strict=True)
            if isinstance(result, Committed)
        ]
        refused = [result for result in results if isinstance(result, CommitFailed)]
        errors = [result.error_type for result in refused if not result.conflict]
        events = sum(len(events) for events in written)
        self._counters.note(
            commits=len(commits),
            events=events,
            failed=len(refused),
            error_type=errors[-1] if errors else None,
            inline=inline,
        )
        if self._on_transaction is not None:
            done = TransactionWritten(len(commits), events, len(refused), duration_s, inline)
            try:
                self._on_transaction(done)
            except Exception as error:  # only a report: the commits are answered
                self.throttle.caught(
                    log, BackgroundLoop.AFTER_COMMIT, error, "the transaction hook failed"
                )
        if self._after_commit is None:
            return
        if written:
            try:
                self._after_commit(written)
            except Exception as error:  # the commits are durable and answered: only log it
                self.throttle.caught(
                    log,
                    BackgroundLoop.AFTER_COMMIT,
                    error,
                    "the after-commit hook failed",
                    level=logging.ERROR,
                )

    def _take(self, group: list[_Pending]) -> list[Commit]:
        """Move queued commits into ``group`` (up to ``MAX_GROUP``); return their events.

        Called again while the group waits for a lock: commits queued behind it
        join its wait. Notes the stop mark, after which nothing else is queued.
        """
        taken: list[Commit] = []
        while not self._stop_seen and len(group) < MAX_GROUP:
            try:
                pending = self._queue.get_nowait()
            except queue.Empty:
                break
            if pending is None:
                self._stop_seen = True
                break
            group.append(pending)
            taken.append(pending[0])
        return taken

    def _deliver(self, group: list[_Pending], results: list[CommitOutcome]) -> None:
        """Wake the waiting tasks (on the trio thread)."""
        self._outstanding -= len(group)
        for (_, waiter), result in zip(group, results, strict=True):
            if not waiter.abandoned:
                trio.lowlevel.reschedule(waiter.task, outcome.Value(result))
        self._poke()
        if not self._outstanding and self._answered is not None:
            self._answered.set()

    def _poke(self) -> None:
        """Wake the follower of the store, if any (on the trio thread)."""
        if self._committed is not None:
            # A wake-up flag (buffer of one): if one is already pending, that is enough.
            with contextlib.suppress(trio.WouldBlock, trio.BrokenResourceError):
                self._committed.send_nowait(None)
