"""Runs started (and ended) at once write their queue rows together, not one transaction each.

With 10,000 runs at once, a transaction per row queued them on the queue's one thread
and the heartbeat's renewal waited behind them, until every run ended ``lease_lost``
(docs/performance.md, section 4, issue 17 session 2). A start's row is written with its
events, in the Journal's group commit; the ends' releases are batched by the lease keeper.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio

from aggregates.lease import QueueStatus
from loop_actors import Agent, Budget, Runtime, ScriptedModel
from loop_actors.store.queue import SQLiteQueue, WorkQueue

N = 200

AGENT = Agent(
    "batches", ScriptedModel([{"kind": "final", "answer": "done"}]), [], Budget(max_steps=1)
)


async def test_runs_started_and_ended_at_once_write_their_rows_in_a_few_transactions(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sizes: dict[str, list[int]] = {"enqueue_many": [], "release_many": []}
    for name, seen in sizes.items():
        original = getattr(SQLiteQueue, name)

        def counting(
            self: WorkQueue, rows: Any, _o: Any = original, _s: list[int] = seen, **options: Any
        ) -> set[str]:
            written = _o(self, rows, **options)
            # Counted once written: a write tried at once and refused (the database's
            # lock was taken: QueueBusyError) is tried again in the queue's thread.
            _s.append(len(rows))
            return written  # type: ignore[no-any-return]

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
    # No row is written on its own: each is in its start's transaction.
    assert sizes["enqueue_many"] == []
    assert sum(sizes["release_many"]) == N
    assert len(sizes["release_many"]) < N / 10
    queue = SQLiteQueue(str(tmp_path / "batches.db"))
    try:
        rows, _ = queue.rows()
    finally:
        queue.close()
    assert {row.status for row in rows} == {QueueStatus.ENDED}
    assert len(rows) == N
