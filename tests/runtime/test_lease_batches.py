"""Runs started (and ended) at once write their queue rows together, not one transaction each.

With 10,000 runs at once, a transaction per row queued them on the queue's one thread
and the heartbeat's renewal waited behind them, until every run ended ``lease_lost``
(docs/performance.md, section 4, issue 17 session 2).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trio

from aggregates.lease import HolderKind, QueueStatus
from loop_actors import Agent, Budget, Runtime, ScriptedModel
from loop_actors.runtime.leases import LeaseKeeper
from loop_actors.store.queue import SQLiteQueue, WorkQueue

N = 200

AGENT = Agent(
    "batches", ScriptedModel([{"kind": "final", "answer": "done"}]), [], Budget(max_steps=1)
)


async def test_runs_started_and_ended_at_once_write_their_rows_in_a_few_transactions(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sizes: dict[str, list[int]] = {"hold_new_many": [], "release_many": []}
    for name, seen in sizes.items():
        original = getattr(SQLiteQueue, name)

        def counting(
            self: WorkQueue, rows: Any, _o: Any = original, _s: list[int] = seen, **options: Any
        ) -> set[str]:
            _s.append(len(rows))
            return _o(self, rows, **options)  # type: ignore[no-any-return]

        monkeypatch.setattr(SQLiteQueue, name, counting)
    url = f"sqlite:///{tmp_path / 'batches.db'}"
    outcomes = []
    with trio.fail_after(60):
        async with Runtime(url) as runtime:

            async def one(i: int) -> None:
                outcomes.append(await runtime.run(AGENT, f"goal {i}"))

            async with trio.open_nursery() as nursery:
                for i in range(N):
                    nursery.start_soon(one, i)
    assert [o.reason for o in outcomes] == ["completed"] * N
    assert [sum(seen) for seen in sizes.values()] == [N, N]
    assert all(len(seen) < N / 10 for seen in sizes.values())
    queue = SQLiteQueue(str(tmp_path / "batches.db"))
    try:
        rows, _ = queue.rows()
    finally:
        queue.close()
    assert {row.status for row in rows} == {QueueStatus.ENDED}
    assert len(rows) == N


@contextlib.asynccontextmanager
async def open_keeper(tmp_path: Path) -> AsyncIterator[tuple[LeaseKeeper, SQLiteQueue]]:
    """A run's lease keeper on a fresh queue, with a nursery for its background writes."""
    queue = SQLiteQueue(str(tmp_path / "queue.db"))
    try:
        async with trio.open_nursery() as nursery:
            yield (
                LeaseKeeper(
                    queue, holder="run:test", kind=HolderKind.RUN, lease_s=30, nursery=nursery
                ),
                queue,
            )
    finally:
        queue.close()


async def test_a_heartbeat_before_a_new_runs_row_is_written_does_not_lose_its_lease(
    tmp_path: Path,
) -> None:
    with trio.fail_after(30):
        async with open_keeper(tmp_path) as (keeper, queue):
            lease = keeper.hold_new("inv-0", "batches")
            await keeper.beat()  # its row is written meanwhile, after the renewal
            assert lease.row_written is not None
            await lease.row_written.wait()
            assert not lease.lost
            await keeper.beat()
            assert not lease.lost
            row = queue.row("inv-0")
            assert row is not None
            assert row.holder == "run:test"


async def test_writing_a_new_runs_row_extends_its_lease_from_the_write(tmp_path: Path) -> None:
    """The row holds the lease until its write plus ``lease_s``: a run may start calls till then."""
    with trio.fail_after(30):
        async with open_keeper(tmp_path) as (keeper, _):
            lease = keeper.hold_new("inv-0", "batches")
            lease.valid_until = 0.0  # as if it had been held for long before its row
            assert lease.row_written is not None
            before = time.monotonic()
            await lease.row_written.wait()
            assert lease.valid_until >= before + 30
            assert lease.may_start_calls()
