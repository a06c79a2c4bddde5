"""The Journal: the one writer to the event store, with group commit, off the trio thread."""

from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Sequence

import outcome
import trio
from eventsourcing.persistence import IntegrityError

from aggregates.events import DomainEvent
from loop_actors._messages import CommitFailed, CommitOutcome, Committed
from loop_actors._store import EventStore

MAX_GROUP = 512
"""The most commits put into one transaction."""


class _Waiter:
    """A task parked on a commit; ``abandoned`` once it stopped waiting (cancelled)."""

    __slots__ = ("abandoned", "task")

    def __init__(self, task: trio.lowlevel.Task) -> None:
        self.task = task
        self.abandoned = False


_Pending = tuple[Sequence[DomainEvent], _Waiter]


def _commit_one(store: EventStore, events: Sequence[DomainEvent]) -> CommitOutcome:
    try:
        position = store.append(events)
    except IntegrityError as error:
        return CommitFailed(error_type=type(error).__name__, message=str(error), conflict=True)
    except Exception as error:  # any store failure is reported to the controller that asked
        return CommitFailed(error_type=type(error).__name__, message=str(error), conflict=False)
    return Committed(position=position)


def commit_group(store: EventStore, group: list[Sequence[DomainEvent]]) -> list[CommitOutcome]:
    """Commit a group of commits in one transaction; on failure, each alone to isolate the culprit.

    Blocking: runs in the Journal's thread.
    """
    if len(group) == 1:
        return [_commit_one(store, group[0])]
    everything = [event for events in group for event in events]
    result = _commit_one(store, everything)
    if isinstance(result, Committed):
        return [result] * len(group)
    # Nothing of the group was written (one transaction): retry one by one.
    return [_commit_one(store, events) for events in group]


class Journal:
    """The one writer: a dedicated OS thread that commits what controllers hand it.

    ``await journal.commit(events)`` puts the events on the thread's queue and
    parks the calling task until they are durable (or refused). The thread takes
    everything queued while its last transaction ran and writes it in one
    transaction (group commit), then wakes every waiting task with one call into
    trio. No trio task sits in between: a commit costs one queue put, one
    transaction, and one wake-up of the trio thread.

    Open it with ``async with Journal(store):`` inside ``trio.run``.
    """

    def __init__(
        self, store: EventStore, *, committed: trio.MemorySendChannel[None] | None = None
    ) -> None:
        """Prepare the Journal; ``committed`` (buffer of one) is poked after each transaction."""
        self._store = store
        self._committed = committed
        self._queue: queue.SimpleQueue[_Pending | None] = queue.SimpleQueue()
        self._token: trio.lowlevel.TrioToken | None = None
        self._thread: threading.Thread | None = None
        self._closed = False

    async def __aenter__(self) -> Journal:
        """Start the writer thread.

        Cancellation: not a checkpoint.
        """
        self._token = trio.lowlevel.current_trio_token()
        self._thread = threading.Thread(target=self._work, name="loop-actors-journal", daemon=True)
        self._thread.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        """Stop the writer thread (see :meth:`aclose`).

        Cancellation: shielded, as :meth:`aclose`.
        """
        await self.aclose()

    async def commit(
        self, events: Sequence[DomainEvent], *, abandon_on_cancel: bool = False
    ) -> CommitOutcome:
        """Append ``events`` atomically and wait until they are durable (or refused).

        Cancellation: by default not a cancellation point once handed over: a
        commit that was handed to the thread is waited for (at most the store's
        lock timeout), so the caller never loses track of what is durable. With
        ``abandon_on_cancel`` (cleanup under a bound), a cancelled caller stops
        waiting at once; the commit may still become durable, so the caller must
        read the store again to know.
        """
        if self._closed or self._thread is None:
            await trio.lowlevel.checkpoint()
            return CommitFailed(
                error_type="ClosedResourceError", message="the journal is closed", conflict=False
            )
        waiter = _Waiter(trio.lowlevel.current_task())
        self._queue.put((events, waiter))

        def abort(_: object) -> trio.lowlevel.Abort:
            if not abandon_on_cancel:
                return trio.lowlevel.Abort.FAILED
            waiter.abandoned = True
            return trio.lowlevel.Abort.SUCCEEDED

        return await trio.lowlevel.wait_task_rescheduled(abort)  # type: ignore[no-any-return]

    async def aclose(self) -> None:
        """Answer every commit already handed over, then stop the thread.

        Cancellation: shielded: the thread is always joined, so nothing handed over
        is left unanswered or half-written.
        """
        if self._closed:
            return
        self._closed = True
        self._queue.put(None)
        if self._thread is not None:
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(self._thread.join)
        if self._committed is not None:
            self._committed.close()

    # ----------------------------------------------------------------- the thread

    def _work(self) -> None:
        assert self._token is not None
        stopping = False
        while not stopping:
            first = self._queue.get()
            if first is None:
                return
            group = [first]
            while len(group) < MAX_GROUP:
                try:
                    pending = self._queue.get_nowait()
                except queue.Empty:
                    break
                if pending is None:
                    stopping = True
                    break
                group.append(pending)
            try:
                results = commit_group(self._store, [events for events, _ in group])
            except BaseException as error:  # never leave a task waiting for an answer
                failed = CommitFailed(
                    error_type=type(error).__name__, message=str(error), conflict=False
                )
                results = [failed] * len(group)
            self._token.run_sync_soon(self._deliver, group, results)

    def _deliver(self, group: list[_Pending], results: list[CommitOutcome]) -> None:
        """Wake the waiting tasks (on the trio thread)."""
        for (_, waiter), result in zip(group, results, strict=True):
            if not waiter.abandoned:
                trio.lowlevel.reschedule(waiter.task, outcome.Value(result))
        if self._committed is not None:
            # A wake-up flag (buffer of one): if one is already pending, that is enough.
            with contextlib.suppress(trio.WouldBlock, trio.BrokenResourceError):
                self._committed.send_nowait(None)
