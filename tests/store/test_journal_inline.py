"""The Journal commits on the trio thread when nothing else waits for it, else in its thread.

Where each commit was written is seen from the Journal's after-commit hook, which
runs on the thread that wrote the transaction; how commits were grouped, from
``commit_group`` (one call a transaction). Every test runs on a real SQLite file.

Bad inputs tried: a store another connection has locked (the commit must wait for
it, as in the thread, not fail at once), a deadline due during the commit, a
scope cancelled before the commit starts (with and without ``abandon_on_cancel``),
forty commits made in one scheduler pass, and a commit that conflicts.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import trio
from eventsourcing.persistence import IntegrityError

import loop_actors.store.journal as journal_module
from aggregates.decisions import Usage, parse_decision
from aggregates.events import DomainEvent
from loop_actors._messages import CommitFailed, Committed
from loop_actors.store.journal import Journal, commit_group
from loop_actors.store.store import EventStore
from tests.support.events import started
from tests.support.journal import FakeClock, FakeStore, commits, locked


class Writers:
    """The after-commit hook: the name of the thread each written commit was written on."""

    def __init__(self) -> None:
        self.threads: list[str] = []

    def __call__(self, commits: Sequence[Sequence[DomainEvent]]) -> None:
        self.threads += [threading.current_thread().name] * len(commits)


TRIO_THREAD = threading.main_thread().name
JOURNAL_THREAD = "loop-actors-journal"


@pytest.fixture
def store(tmp_path: Path) -> Iterator[EventStore]:
    opened = EventStore(f"sqlite:///{tmp_path / 'journal.db'}?lock_timeout=2")
    yield opened
    opened.close()


@pytest.fixture
def groups(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The size of each transaction the Journal writes, in order."""
    sizes: list[int] = []
    original = journal_module.commit_group

    def counting(store: Any, group: list[Any], **options: Any) -> list[Any]:
        results = original(store, group, **options)
        sizes.append(len(group))  # once written (a commit refused inline is written later)
        return results

    monkeypatch.setattr(journal_module, "commit_group", counting)
    return sizes


async def test_commits_made_one_after_another_are_written_on_the_trio_thread(
    store: EventStore,
) -> None:
    writers = Writers()
    with trio.fail_after(10):
        async with Journal(store, after_commit=writers) as journal:
            for n in range(5):
                assert isinstance(await journal.commit(started(f"i{n}")), Committed)
    assert writers.threads == [TRIO_THREAD] * 5
    assert store.invocation_ids() == [f"i{n}" for n in range(5)]


async def test_without_inline_every_commit_is_written_in_the_journals_thread(
    store: EventStore,
) -> None:
    writers = Writers()
    with trio.fail_after(10):
        async with Journal(store, after_commit=writers, inline=False) as journal:
            for n in range(3):
                assert isinstance(await journal.commit(started(f"i{n}")), Committed)
    assert writers.threads == [JOURNAL_THREAD] * 3


async def test_commits_made_in_one_scheduler_pass_are_still_grouped_in_the_thread(
    store: EventStore, groups: list[int]
) -> None:
    writers = Writers()
    outcomes: list[object] = []

    async def commit(journal: Journal, n: int) -> None:
        outcomes.append(await journal.commit(started(f"i{n:02d}")))

    with trio.fail_after(10):
        async with Journal(store, after_commit=writers) as journal, trio.open_nursery() as nursery:
            for n in range(40):
                nursery.start_soon(commit, journal, n)
    assert all(isinstance(outcome, Committed) for outcome in outcomes)
    assert len(outcomes) == 40
    # The first of the pass may be written inline; the others go to the thread together.
    assert writers.threads.count(TRIO_THREAD) <= 1
    assert sum(groups) == 40
    assert len(groups) <= 20
    assert max(groups) > 1
    assert len(store.invocation_ids()) == 40


async def test_a_commit_is_handed_to_the_thread_when_other_tasks_are_runnable(
    store: EventStore,
) -> None:
    writers = Writers()

    async def spin(stop: trio.Event) -> None:
        while not stop.is_set():
            await trio.lowlevel.checkpoint()

    with trio.fail_after(10):
        async with Journal(store, after_commit=writers) as journal, trio.open_nursery() as nursery:
            stops = [trio.Event() for _ in range(journal_module.INLINE_MAX_RUNNABLE + 1)]
            for stop in stops:
                nursery.start_soon(spin, stop)  # runnable from now on
            assert isinstance(await journal.commit(started("busy")), Committed)
            for stop in stops:
                stop.set()
    assert writers.threads == [JOURNAL_THREAD]


async def test_a_commit_with_a_deadline_due_is_handed_to_the_thread_and_not_cancelled(
    store: EventStore,
) -> None:
    writers = Writers()
    with trio.fail_after(10):
        async with Journal(store, after_commit=writers) as journal:
            with trio.move_on_after(journal_module.INLINE_IDLE_S / 10) as scope:
                outcome = await journal.commit(started("due"))
                assert isinstance(outcome, Committed)  # the commit is not a cancellation point
                await trio.sleep(1)  # the next checkpoint is
    assert scope.cancelled_caught
    assert writers.threads == [JOURNAL_THREAD]
    assert store.invocation_ids() == ["due"]


@pytest.mark.parametrize(
    ("abandon_on_cancel", "writer"), [(False, TRIO_THREAD), (True, JOURNAL_THREAD)]
)
async def test_a_commit_in_a_cancelled_scope_is_written_and_waited_for_unless_it_may_be_abandoned(
    store: EventStore, abandon_on_cancel: bool, writer: str
) -> None:
    writers = Writers()
    answered: list[object] = []
    with trio.fail_after(10):
        async with Journal(store, after_commit=writers) as journal:
            with trio.CancelScope() as scope:
                scope.cancel()
                commit = journal.commit(started("cancelled"), abandon_on_cancel=abandon_on_cancel)
                answered.append(await commit)
                await trio.lowlevel.checkpoint()
    assert scope.cancelled_caught
    # Not a cancellation point: written inline and answered. A commit that may be
    # abandoned goes to the thread and stops waiting at once; the thread still writes it.
    assert answered == ([] if abandon_on_cancel else [Committed(position=1)])
    assert writers.threads == [writer]
    assert store.invocation_ids() == ["cancelled"]


async def test_a_commit_on_a_locked_store_waits_for_the_lock_in_the_thread(
    store: EventStore, tmp_path: Path
) -> None:
    writers = Writers()
    blocker = sqlite3.connect(
        tmp_path / "journal.db", isolation_level=None, check_same_thread=False
    )
    blocker.execute("BEGIN IMMEDIATE")
    with trio.fail_after(10):
        async with Journal(store, after_commit=writers) as journal, trio.open_nursery() as nursery:

            async def release_later() -> None:
                await trio.to_thread.run_sync(threading.Event().wait, 0.3)
                blocker.rollback()

            nursery.start_soon(release_later)
            await trio.sleep(0.01)  # release_later is parked in its thread
            before = trio.current_time()
            outcome = await journal.commit(started("waited"))
            waited = trio.current_time() - before
    blocker.close()
    assert isinstance(outcome, Committed)
    assert waited > 0.2  # not written inline while the lock was held, and not failed
    assert writers.threads == [JOURNAL_THREAD]
    assert store.invocation_ids() == ["waited"]


async def test_a_conflicting_commit_made_inline_is_answered_as_a_conflict(
    store: EventStore,
) -> None:
    writers = Writers()
    with trio.fail_after(10):
        async with Journal(store, after_commit=writers) as journal:
            assert isinstance(await journal.commit(started("same")), Committed)
            again = await journal.commit(started("same"))
    assert isinstance(again, CommitFailed)
    assert again.conflict
    assert writers.threads == [TRIO_THREAD]
    assert store.invocation_ids() == ["same"]


async def test_a_commit_that_takes_a_snapshot_is_handed_to_the_thread(tmp_path: Path) -> None:
    store = EventStore(f"sqlite:///{tmp_path / 'snapshots.db'}", snapshot_interval=2)
    writers = Writers()
    with trio.fail_after(10):
        async with Journal(store, after_commit=writers) as journal:
            assert isinstance(await journal.commit(started("long")), Committed)
            invocation = store.get("long")
            final = parse_decision({"kind": "final", "answer": "done"})
            invocation.propose(final, usage=Usage(), at=datetime(2026, 12, 1, tzinfo=UTC))
            assert isinstance(await journal.commit(invocation.take_events()), Committed)
    # Version 2 is a multiple of the interval: that append reads the store for a snapshot.
    assert writers.threads == [TRIO_THREAD, JOURNAL_THREAD]
    assert store.get("long").version == 2
    store.close()


# --------------------------------------------------------------------------- quick tries


def test_a_group_that_found_the_store_locked_is_tried_quickly_without_waiting() -> None:
    clock = FakeClock()
    attempts = iter([locked(), locked(), None])
    store = FakeStore(clock, lambda ids: next(attempts), busy=True)

    results = commit_group(
        store, commits("a", "b"), clock=clock, sleep=clock.sleep, polls=(0.0001,) * 5
    )

    assert results == [Committed(position=2)] * 2
    # Three tries that do not wait for the lock, 0.1 ms apart; never SQLite's own wait.
    assert [wait for _, wait in store.attempts] == [0, 0, 0]
    assert clock.sleeps == pytest.approx([0.0001] * 3)


def test_when_a_quick_try_fails_otherwise_the_group_is_answered_as_before() -> None:
    clock = FakeClock()
    tries = iter([locked()])

    def fail(ids: list[str]) -> Exception | None:
        first_try = next(tries, None)
        if first_try is not None:
            return first_try
        return IntegrityError("taken") if "b" in ids else None

    store = FakeStore(clock, fail, busy=True)

    first, second = commit_group(
        store, commits("a", "b"), clock=clock, sleep=clock.sleep, polls=(0.0001,) * 5
    )

    # A try that fails on anything but the lock ends the quick tries; the conflict is
    # then looked for commit by commit, as for any group.
    assert first == Committed(position=1)
    assert isinstance(second, CommitFailed)
    assert second.conflict
    assert [ids for ids, _ in store.attempts] == [["a", "b"]] * 3 + [["a"], ["b"]]
    assert [wait for _, wait in store.attempts] == [0, 0, None, None, None]
