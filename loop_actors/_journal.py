"""The Journal: the one writer to the event store, with group commit."""

from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any, TypeVar

import outcome
import trio
from eventsourcing.persistence import IntegrityError

from aggregates.events import DomainEvent
from loop_actors._messages import Commit, CommitFailed, CommitOutcome, Committed
from loop_actors._store import EventStore

MAX_GROUP = 512
"""The most commits put into one transaction."""


def _commit_one(store: EventStore, events: Sequence[DomainEvent]) -> CommitOutcome:
    try:
        position = store.append(events)
    except IntegrityError as error:
        return CommitFailed(error_type=type(error).__name__, message=str(error), conflict=True)
    except Exception as error:  # any store failure is reported to the controller that asked
        return CommitFailed(error_type=type(error).__name__, message=str(error), conflict=False)
    return Committed(position=position)


def commit_group(store: EventStore, group: list[Commit]) -> list[CommitOutcome]:
    """Commit a group in one transaction; on failure, commit each alone to isolate the culprit.

    Blocking: runs in a worker thread.
    """
    if len(group) == 1:
        return [_commit_one(store, group[0].events)]
    everything = [event for commit in group for event in commit.events]
    outcome = _commit_one(store, everything)
    if isinstance(outcome, Committed):
        return [outcome] * len(group)
    # Nothing of the group was written (one transaction): retry one by one.
    return [_commit_one(store, commit.events) for commit in group]


T = TypeVar("T")


async def commit_events(
    journal: trio.MemorySendChannel[Commit],
    events: Sequence[DomainEvent],
    reply: trio.MemorySendChannel[CommitOutcome],
    replies: trio.MemoryReceiveChannel[CommitOutcome],
) -> CommitOutcome:
    """Send events to the Journal and wait until they are durable (or refused).

    Cancellation: shielded: a commit that was sent is always waited for, so the
    caller never loses track of what is durable.
    """
    result: CommitOutcome
    with trio.CancelScope(shield=True):
        try:
            await journal.send(Commit(events=tuple(events), reply=reply))
        except (trio.BrokenResourceError, trio.ClosedResourceError) as error:
            result = CommitFailed(
                error_type=type(error).__name__, message="the journal is closed", conflict=False
            )
        else:
            result = await replies.receive()
    return result


class WriterThread:
    """One long-lived OS thread that runs the Journal's blocking commits.

    A dedicated thread (instead of ``trio.to_thread``) keeps the hand-off to one
    queue put and one ``run_sync_soon`` per transaction.
    """

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[tuple[Callable[[], Any], Callable[[Any], None]] | None]
        self._jobs = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._work, name="loop-actors-journal", daemon=True)
        self._thread.start()

    def _work(self) -> None:
        while (job := self._jobs.get()) is not None:
            fn, done = job
            done(outcome.capture(fn))

    async def run(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` in the writer thread and return its result.

        Cancellation: not a cancellation point while ``fn`` runs: a commit that
        started always finishes and its result is returned.
        """
        task = trio.lowlevel.current_task()
        token = trio.lowlevel.current_trio_token()

        def done(result: Any) -> None:
            token.run_sync_soon(trio.lowlevel.reschedule, task, result)

        self._jobs.put((fn, done))
        return await trio.lowlevel.wait_task_rescheduled(  # type: ignore[no-any-return]
            lambda _: trio.lowlevel.Abort.FAILED
        )

    def stop(self) -> None:
        """Let the thread finish its queue and exit."""
        self._jobs.put(None)
        self._thread.join()


async def run_journal(
    inbox: trio.MemoryReceiveChannel[Commit],
    *,
    store: EventStore,
    committed: trio.MemorySendChannel[None] | None = None,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Commit what controllers send, many invocations per transaction, off the trio thread.

    The inbox has no buffer: while a transaction is in flight, other controllers
    wait in ``send``; the next round takes all of them at once (group commit).
    Each ``Commit`` is answered on its own reply channel.

    Cancellation: a transaction in flight always finishes (the worker thread is
    not abandoned) and its commits are answered before the journal returns.
    """
    writer = WriterThread()
    try:
        await _serve(
            inbox, store=store, writer=writer, committed=committed, task_status=task_status
        )
    finally:
        writer.stop()
        if committed is not None:
            committed.close()


async def _serve(
    inbox: trio.MemoryReceiveChannel[Commit],
    *,
    store: EventStore,
    writer: WriterThread,
    committed: trio.MemorySendChannel[None] | None,
    task_status: trio.TaskStatus[None],
) -> None:
    async with inbox:
        task_status.started()
        async for first in inbox:
            group = [first]
            while len(group) < MAX_GROUP:
                try:
                    group.append(inbox.receive_nowait())
                except (trio.WouldBlock, trio.EndOfChannel):
                    break
            outcomes = await writer.run(partial(commit_group, store, group))
            for commit, outcome in zip(group, outcomes, strict=True):
                # Reply channels have a buffer of one and one commit in flight per
                # controller, so this never blocks; a controller that is gone is skipped.
                with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                    commit.reply.send_nowait(outcome)
            if committed is not None:
                # A wake-up flag (buffer of one): if one is already pending, that is enough.
                with contextlib.suppress(trio.WouldBlock, trio.BrokenResourceError):
                    committed.send_nowait(None)
