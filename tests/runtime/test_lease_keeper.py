"""The lease keeper's queue writes: what comes together shares one transaction.

(Releases and new runs' rows given back or written together: tests/runtime/test_lease_batches.py.)

Bad input tried: a batch whose transaction fails (each of its releases is given
back at the next heartbeat).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from aggregates.lease import HolderKind, QueueStatus, Release
from loop_actors._errors import StoreUnavailableError
from loop_actors.runtime.leases import LeaseKeeper
from loop_actors.store.queue import NewRow, SQLiteQueue

ENDED = Release(status=QueueStatus.ENDED)


class CountingQueue(SQLiteQueue):
    """A SQLite queue that notes the size of each grouped write (and can fail the first)."""

    def __init__(self, path: str, *, fail_first_release: bool = False) -> None:
        super().__init__(path)
        self.release_batches: list[int] = []
        self.enqueue_batches: list[int] = []
        self.fail_first_release = fail_first_release

    def release_many(
        self, leases: Sequence[tuple[str, int, Release, str | None]], *, holder: str
    ) -> set[str]:
        self.release_batches.append(len(leases))
        if self.fail_first_release:
            self.fail_first_release = False
            raise StoreUnavailableError("the work queue cannot be used: database is locked")
        return super().release_many(leases, holder=holder)

    def enqueue_many(self, rows: Sequence[NewRow]) -> list[bool]:
        self.enqueue_batches.append(len(rows))
        return super().enqueue_many(rows)


def keeper_on(queue: SQLiteQueue, nursery: trio.Nursery) -> LeaseKeeper:
    return LeaseKeeper(queue, holder="w1", kind=HolderKind.WORKER, lease_s=30, nursery=nursery)


async def test_rows_added_together_share_one_transaction(tmp_path: Path) -> None:
    queue = CountingQueue(str(tmp_path / "queue.db"))
    answers: list[bool] = []

    async def add(keeper: LeaseKeeper, invocation_id: str) -> None:
        answers.append(await keeper.enqueue(invocation_id, "payments"))

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            keeper = keeper_on(queue, nursery)
            async with trio.open_nursery() as adds:
                for number in range(30):
                    adds.start_soon(add, keeper, f"inv-{number:02}")
                adds.start_soon(add, keeper, "inv-00")  # named twice: added once
            assert not await keeper.enqueue("inv-01", "payments")  # alone: a batch of one
    assert queue.enqueue_batches == [31, 1]
    assert sorted(answers) == [False] + [True] * 30
    assert len(queue.rows()[0]) == 30
    queue.close()


async def test_releases_of_a_failed_batch_are_given_back_at_the_next_heartbeat(
    tmp_path: Path,
) -> None:
    queue = CountingQueue(str(tmp_path / "queue.db"), fail_first_release=True)
    queue.enqueue_many([NewRow(f"inv-{number:02}", "payments") for number in range(5)])
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            keeper = keeper_on(queue, nursery)
            claimed = await keeper.claim(["payments"], 5)
            for lease, _ in claimed:
                keeper.release_soon(lease, ENDED)
            await trio.testing.wait_all_tasks_blocked()
            rows, _ = queue.rows()
            assert {row.status for row in rows} == {QueueStatus.CLAIMED}
            while {row.status for row in queue.rows()[0]} != {QueueStatus.ENDED}:
                await keeper.beat()  # the failed batch's leases are given back here
                await trio.sleep(0.01)
    assert queue.release_batches[0] == 5
    rows, _ = queue.rows()
    assert {(row.status, row.holder) for row in rows} == {(QueueStatus.ENDED, None)}
    queue.close()


PAUSED = Release(status=QueueStatus.PAUSED)


async def test_waiting_for_a_background_release_returns_once_the_row_is_given_back(
    tmp_path: Path,
) -> None:
    """And at once for an invocation with no release pending (bad input: one never held)."""
    queue = CountingQueue(str(tmp_path / "queue.db"))
    queue.enqueue_many([NewRow("inv-0", "payments")])
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            keeper = keeper_on(queue, nursery)
            ((lease, _),) = await keeper.claim(["payments"], 1)
            keeper.release_soon(lease, PAUSED)
            await keeper.wait_released("inv-0")
            row = queue.row("inv-0")
            assert row is not None
            assert (row.status, row.holder) == (QueueStatus.PAUSED, None)
            await keeper.wait_released("never-held")
    queue.close()


async def test_a_failed_release_retried_at_the_heartbeat_leaves_the_row_as_it_stands_now(
    tmp_path: Path,
) -> None:
    """A run paused, its release failed, then a cancel ended it: the retry writes ``ended``.

    Bad inputs tried: a status the failed release would not have left (``claimed`` only) is
    not replaced; an invocation with no failed release.
    """
    queue = CountingQueue(str(tmp_path / "queue.db"), fail_first_release=True)
    queue.enqueue_many([NewRow("inv-0", "payments")])
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            keeper = keeper_on(queue, nursery)
            ((lease, _),) = await keeper.claim(["payments"], 1)
            keeper.release_soon(lease, PAUSED)
            await keeper.wait_released("inv-0")  # written: it failed
            row = queue.row("inv-0")
            assert row is not None
            assert row.status is QueueStatus.CLAIMED
            ended = QueueStatus.ENDED
            assert not keeper.rest_unreleased_as("inv-0", ended, only_from=[QueueStatus.CLAIMED])
            assert not keeper.rest_unreleased_as("other", ended, only_from=[QueueStatus.PAUSED])
            assert keeper.rest_unreleased_as(
                "inv-0", ended, only_from=[QueueStatus.PAUSED, QueueStatus.RUNNABLE]
            )
            await keeper.beat()  # the failed release is given back here
    row = queue.row("inv-0")
    assert row is not None
    assert (row.status, row.holder) == (QueueStatus.ENDED, None)
    queue.close()


async def test_a_release_on_an_idle_loop_is_written_at_once_and_a_locked_one_in_the_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Bad input: the database locked by another connection when the release comes: it is
    written by the queue's thread once the lock is free, as before."""
    path = tmp_path / "queue.db"
    queue = CountingQueue(str(path))
    queue.enqueue_many([NewRow(f"inv-{number}", "payments") for number in range(2)])
    handed_over: list[object] = []
    to_thread = trio.to_thread.run_sync

    async def counted(fn: Any, *args: Any, **kwargs: Any) -> Any:
        handed_over.append(fn)
        return await to_thread(fn, *args, **kwargs)

    monkeypatch.setattr(trio.to_thread, "run_sync", counted)
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            keeper = keeper_on(queue, nursery)
            (first, _), (second, _) = await keeper.claim(["payments"], 2)
            handed_over.clear()
            await keeper.release(first, ENDED)
            assert handed_over == []  # written on the trio thread, at once
            other = sqlite3.connect(path, isolation_level=None)
            other.execute("BEGIN IMMEDIATE")
            releasing = trio.Event()

            async def release_second() -> None:
                await keeper.release(second, ENDED)
                releasing.set()

            nursery.start_soon(release_second)
            await trio.testing.wait_all_tasks_blocked()
            assert len(handed_over) == 1  # locked: handed to the queue's thread, which waits
            other.execute("COMMIT")
            other.close()
            await releasing.wait()
    rows, _ = queue.rows()
    assert {(row.status, row.holder) for row in rows} == {(QueueStatus.ENDED, None)}
    queue.close()
