"""A worker reads what a claimed batch needs before it drives in one trip to a thread.

Instead of three reads a run (its invocation, the check of its history, its cancel
request), a worker reads them for every fresh claim of a batch at once
(``StoreReader.before_drive``). These tests hold the batch read to what the three reads
would have found, and the runs to what they did before.

Bad inputs tried: a batch with an id the store does not hold; a claimed run whose
history was cut by hand (its later rows deleted, its queue row made runnable again);
a cancel request recorded after the batch was read but before its run was registered,
with the runtime's watcher already past it; a store that fails the batch read; one byte
of one stored row changed (only its invocation fails the batch read).
"""

from __future__ import annotations

import logging
import sqlite3
from pathlib import Path
from typing import Any

import pytest
import trio

from aggregates.events import fold
from aggregates.lease import QueueStatus
from loop_actors import (
    Agent,
    InvocationNotFoundError,
    ModelReply,
    ModelRequest,
    Runtime,
    StoreUnavailableError,
    TerminalReason,
    Worker,
)
from loop_actors.store.reader import DriveReads, StoreReader
from loop_actors.store.store import EventStore
from tests.support.cut_history import CHARGES, charge, cut_from, first_position, run_once, scripted
from tests.support.snapshots import SNAPSHOT_EVERY, _write
from tests.support.workers import AGENT, look, queue_row


def _same_state(a: Any, b: Any) -> bool:
    return (a.id, a.version, a.phase, a.step, a.tool_calls, a.last_hash) == (
        b.id,
        b.version,
        b.phase,
        b.step,
        b.tool_calls,
        b.last_hash,
    )


async def test_the_batch_read_finds_what_the_three_reads_of_each_run_find(db_url: str) -> None:
    with trio.fail_after(30):
        async with Runtime(db_url) as runtime:
            await runtime.run(AGENT, "ended", invocation_id="b-ended")
            await runtime.submit(AGENT, "waiting", invocation_id="b-new")
            await runtime.submit(AGENT, "cancelled", invocation_id="b-asked")
            await runtime.request_cancel("b-asked", by="ops", reason="not needed")
            reads: StoreReader = runtime._reads()
            found = await reads.before_drive(["b-ended", "b-new", "b-asked", "b-missing"])
            assert isinstance(found["b-missing"], InvocationNotFoundError)
            for invocation_id in ("b-ended", "b-new", "b-asked"):
                read = found[invocation_id]
                assert isinstance(read, DriveReads)
                assert _same_state(read.invocation, await reads.invocation(invocation_id))
                assert read.history_problem == await reads.history_problem(invocation_id)
                assert read.cancel_request == await reads.cancel_request(invocation_id)
                assert read.position == await reads.head()
            asked = found["b-asked"]
            assert isinstance(asked, DriveReads)
            assert asked.cancel_request is not None
            assert asked.cancel_request.reason == "not needed"


async def test_a_worker_reads_each_claimed_batch_once_and_no_run_reads_for_itself(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    batches: list[list[str]] = []
    single: list[str] = []
    original = StoreReader.before_drive

    async def counted(self: StoreReader, ids: Any) -> Any:
        batches.append(list(ids))
        return await original(self, ids)

    async def refused(self: StoreReader, invocation_id: str) -> Any:
        single.append(invocation_id)
        raise AssertionError("a fresh claim read on its own")

    monkeypatch.setattr(StoreReader, "before_drive", counted)
    for name in ("invocation", "history_problem", "cancel_request"):
        monkeypatch.setattr(StoreReader, name, refused)
    with trio.fail_after(30):
        async with Runtime(db_url) as runtime:
            for n in range(12):
                await runtime.submit(AGENT, f"goal {n}", invocation_id=f"w-{n}")
        report = await Worker(AGENT, db_url, concurrency=12, poll_s=0.05).run(until_idle=True)
    assert report.outcomes == {"completed": 12}
    assert single == []
    assert sorted(i for batch in batches for i in batch) == sorted(f"w-{n}" for n in range(12))
    assert len(batches) < 12  # read together, not one by one


def test_a_claimed_run_whose_history_was_cut_is_left_paused_and_charges_nothing(
    tmp_path: Path,
) -> None:
    db = tmp_path / "events.db"
    CHARGES.clear()
    run_once(db)  # "p" charges twice and completes
    cut_from(db, "p", first_position(db, "p", "DecisionProposed", 2))
    connection = sqlite3.connect(db)
    with connection:  # its row made runnable again, as if its run had never ended
        connection.execute(
            "UPDATE loop_actors_queue SET status = 'runnable', holder = NULL WHERE invocation_id = 'p'"
        )
    connection.close()
    payer = Agent("payer", scripted("other-"), [charge])

    async def work() -> Any:
        with trio.fail_after(30):
            report = await Worker(payer, f"sqlite:///{db}", concurrency=2, poll_s=0.05).run(
                until_idle=True
            )
            return report, await queue_row(f"sqlite:///{db}", "p")

    report, row = trio.run(work)
    assert report.claimed == 1
    assert report.failed == 1
    assert len(CHARGES) == 2  # no third charge
    assert row.status is QueueStatus.PAUSED
    assert "history was cut" in (row.note or "")


class HeldModel:
    """Answers at once, but the goal ``hold`` waits until ``released`` is set."""

    def __init__(self) -> None:
        self.released = trio.Event()
        self.holding = trio.Event()

    async def decide(self, request: ModelRequest) -> ModelReply:
        if request.goal == "hold":
            self.holding.set()
            await self.released.wait()
        return ModelReply(proposal={"kind": "final", "answer": f"done {request.goal}"})


async def test_a_cancel_request_recorded_while_its_batch_was_read_still_cancels_the_run(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The request comes after the batch read and before the run is registered, and the
    watcher has already looked past it (it skipped it: the run was not running yet).
    Without the second look when the run is registered, the run would complete."""
    model = HeldModel()
    agent = Agent("looker", model, [look])
    worker = Worker(agent, db_url, concurrency=4, poll_s=0.05)
    original = StoreReader.before_drive

    async def late(self: StoreReader, ids: Any) -> Any:
        read = await original(self, ids)
        if "late" in read:
            stale = read["late"]
            assert isinstance(stale, DriveReads)
            assert stale.cancel_request is None
            async with Runtime(db_url) as other:
                await other.request_cancel("late", by="ops", reason="too late")
            with trio.fail_after(10):  # the worker's watcher polls while "hold" runs
                while worker.runtime._cancels_seen_to <= stale.position:  # noqa: ASYNC110 - another task's poll
                    await trio.sleep(0.05)
        return read

    monkeypatch.setattr(StoreReader, "before_drive", late)
    with trio.fail_after(30):
        async with Runtime(db_url) as runtime:
            await runtime.submit(agent, "hold", invocation_id="hold")
        async with trio.open_nursery() as nursery:
            nursery.start_soon(worker.run)
            await model.holding.wait()
            async with Runtime(db_url) as runtime:
                await runtime.submit(agent, "late", invocation_id="late")
            while (await queue_row(db_url, "late")).status is not QueueStatus.ENDED:  # noqa: ASYNC110 - polls a database
                await trio.sleep(0.05)
            model.released.set()
            while (await queue_row(db_url, "hold")).status is not QueueStatus.ENDED:  # noqa: ASYNC110 - polls a database
                await trio.sleep(0.05)
            worker.stop()
        async with Runtime(db_url) as runtime:
            late_outcome = await runtime.resume("late", agent)
            held_outcome = await runtime.resume("hold", agent)
    assert late_outcome.reason is TerminalReason.CANCELLED
    assert "too late" in (late_outcome.detail or "")
    assert held_outcome.reason is TerminalReason.COMPLETED


async def test_a_batch_read_that_fails_leaves_each_run_to_read_its_own(
    db_url: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    async def down(self: StoreReader, ids: Any) -> Any:
        raise StoreUnavailableError("the store is locked")

    monkeypatch.setattr(StoreReader, "before_drive", down)
    with trio.fail_after(30):
        async with Runtime(db_url) as runtime:
            for n in range(3):
                await runtime.submit(AGENT, f"goal {n}", invocation_id=f"f-{n}")
        with caplog.at_level(logging.WARNING, logger="loop_actors.workers"):
            report = await Worker(AGENT, db_url, concurrency=3, poll_s=0.05).run(until_idle=True)
    assert report.outcomes == {"completed": 3}
    assert any("each reads its own" in record.getMessage() for record in caplog.records)


def test_the_store_reads_of_many_invocations_are_what_it_reads_of_each(store_url: str) -> None:
    """On SQLite and PostgreSQL: events, newest snapshot, ledger entries and cancel request
    of a paused and a completed run with snapshots and a write, a runnable one with a cancel
    request, and an id the store does not hold, read at once and one by one."""
    trio.run(_write, store_url)

    async def more() -> None:
        async with Runtime(store_url) as runtime:
            await runtime.submit(AGENT, "asked", invocation_id="snap-asked")
            await runtime.request_cancel("snap-asked", by="ops", reason="stop")

    trio.run(more)
    store = EventStore(store_url)
    try:
        for invocation_id in ("snap-paused", "snap-done"):
            events = store.events(invocation_id)
            for version in range(SNAPSHOT_EVERY, len(events) + 1, SNAPSHOT_EVERY):
                store.app.take_snapshot(invocation_id, version=version, projector_func=fold)
        ids = ["snap-paused", "snap-done", "snap-asked", "snap-missing"]
        events_of = store.events_of(ids)
        snapshots_of = store.newest_snapshots(ids)
        effects_of = store.effects_of_many(ids)
        requests_of = store.cancel_requests_of(ids)
        assert isinstance(events_of["snap-missing"], InvocationNotFoundError)
        assert snapshots_of["snap-missing"] == []
        assert requests_of["snap-missing"] is None
        assert len(effects_of["snap-done"]) == 1  # the refund
        for invocation_id in ids[:3]:
            assert events_of[invocation_id] == store.events(invocation_id)
            assert [(v, s) for v, s in snapshots_of[invocation_id]] == store.newest_snapshot(
                invocation_id
            )
            assert [e.key for e in effects_of[invocation_id]] == [
                e.key for e in store.effects_of(invocation_id)
            ]
            assert requests_of[invocation_id] == store.cancel_request(invocation_id)
        assert snapshots_of["snap-done"][0][0] > 0
        asked = requests_of["snap-asked"]
        assert asked is not None
        assert not isinstance(asked, Exception)
        assert asked.reason == "stop"
    finally:
        store.close()


def test_a_damaged_row_fails_its_own_invocation_in_a_batch_read_not_the_others(
    tmp_path: Path,
) -> None:
    db = tmp_path / "events.db"
    trio.run(_write, f"sqlite:///{db}")
    connection = sqlite3.connect(db)
    with connection:  # one byte of one of snap-done's rows changed, as a disk or a person might
        rowid, state = connection.execute(
            "SELECT rowid, state FROM stored_events WHERE originator_id = 'snap-done' "
            "ORDER BY originator_version LIMIT 1 OFFSET 2"
        ).fetchone()
        damaged = bytes(state[:40]) + bytes([state[40] ^ 0xFF]) + bytes(state[41:])
        connection.execute("UPDATE stored_events SET state = ? WHERE rowid = ?", (damaged, rowid))
    connection.close()

    async def read() -> dict[str, Any]:
        async with Runtime(f"sqlite:///{db}") as runtime:
            return await runtime._reads().before_drive(["snap-done", "snap-paused"])

    found = trio.run(read)
    assert isinstance(found["snap-done"], Exception)
    paused = found["snap-paused"]
    assert isinstance(paused, DriveReads)
    assert paused.invocation.phase.paused
    assert paused.history_problem is None
