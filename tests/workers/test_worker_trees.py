"""A worker drives a tree of invocations: a submitted parent's children run in the worker.

On SQLite and on a real PostgreSQL: the parent is claimed, its two children start once
each in the worker that drives it, every charge is made once, and no queue row of the
tree is left runnable or claimed once it ended.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from aggregates.invocation import BudgetReserved
from aggregates.lease import QueueStatus
from loop_actors import Runtime, TerminalReason, Worker
from tests.support.children_app import BOSS, PAYER, charges
from tests.support.workers import queue_row


async def test_a_worker_drives_a_submitted_parent_and_its_children_once(
    store_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CHARGES_FILE", str(tmp_path / "charges.txt"))
    with trio.fail_after(60):
        async with Runtime(store_url) as runtime:
            await runtime.submit(BOSS, "pay them", invocation_id="root")
        report = await Worker([BOSS, PAYER], store_url, concurrency=4, poll_s=0.05).run(
            until_idle=True
        )
        async with Runtime(store_url) as runtime:
            outcome = await runtime.resume("root", BOSS)  # nothing runs: it has ended
            events = await runtime.history("root")
            child_ids = [e.child_id for e in events if isinstance(e, BudgetReserved)]
            children = [await runtime.load(child_id) for child_id in child_ids]
    assert report.claimed == 1
    assert report.outcomes == {"completed": 1}
    assert (outcome.reason, outcome.answer) == (TerminalReason.COMPLETED, "both paid")
    assert sorted(amount for _, amount in charges()) == [10, 20]
    assert len(children) == 2
    assert all(c.terminated and c.terminated.reason is TerminalReason.COMPLETED for c in children)
    for invocation_id in ["root", *child_ids]:
        row = await queue_row(store_url, invocation_id)
        assert (row.status, row.holder) == (QueueStatus.ENDED, None), invocation_id
