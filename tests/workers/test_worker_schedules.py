"""A worker runs the schedules of the agents it serves, in one process (real time, short).

The subprocess story (several workers, one SIGKILLed) is
``tests/scenarios/test_schedules_across_workers.py``. Bad inputs tried: a run whose id
an invocation of another goal already has.
"""

from __future__ import annotations

from collections.abc import Callable

import trio

from aggregates.decisions import TerminalReason
from aggregates.schedules import (
    RESUBMIT_AFTER_S,
    CatchUp,
    Decided,
    Every,
    Overlap,
    Schedule,
    new_schedule,
)
from loop_actors import EventStore, Runtime, Worker
from tests.support.workers import AGENT


def add_schedule(db_url: str, make: Callable[[float], Schedule]) -> Schedule:
    store = EventStore(db_url)
    try:
        queue = store.open_queue()
        try:
            row = queue.add_schedule(make)
            assert row is not None
            return row
        finally:
            queue.close()
    finally:
        store.close()


def schedules(db_url: str) -> list[Schedule]:
    store = EventStore(db_url)
    try:
        queue = store.open_queue()
        try:
            return queue.schedules()[0]
        finally:
            queue.close()
    finally:
        store.close()


def every_second(
    now: float, *, overlap: Overlap = Overlap.SKIP, catch_up: CatchUp = CatchUp.ONE
) -> Schedule:
    return new_schedule(
        "tick",
        agent_name=AGENT.name,
        goal="tick",
        timing=Every(seconds=1),
        now=now,
        agent_ref="tests.support.workers:AGENT",
        overlap=overlap,
        catch_up=catch_up,
    )


async def run_worker_for(db_url: str, seconds: float) -> Worker:
    worker = Worker(AGENT, db_url, poll_s=0.05)
    with trio.fail_after(seconds + 30):
        async with trio.open_nursery() as nursery:
            await nursery.start(worker.run)
            await trio.sleep(seconds)
            worker.stop()
    return worker


def ended(db_url: str) -> dict[str, TerminalReason | None]:
    store = EventStore(db_url, read_only=True)
    try:
        found = {}
        for invocation_id in store.invocation_ids():
            last = store.events(invocation_id)[-1]
            found[invocation_id] = getattr(last, "reason", None)
        return found
    finally:
        store.close()


async def test_a_worker_submits_each_due_time_once_and_drives_the_runs(db_url: str) -> None:
    added = add_schedule(db_url, lambda now: every_second(now, catch_up=CatchUp.ALL))

    worker = await run_worker_for(db_url, 3.2)

    [row] = schedules(db_url)
    dues = range(added.next_due, row.next_due)
    assert len(dues) >= 2
    runs = ended(db_url)
    assert sorted(runs) == [added.invocation_id(due) for due in dues]
    assert set(runs.values()) <= {TerminalReason.COMPLETED, None}  # the last may not have run
    assert row.submitting == ()
    stats = worker.statistics().schedules
    assert (stats.submitted, stats.already_submitted) == (len(dues), 0)
    assert [due.name for due in stats.next_due] == ["tick"]


async def test_a_run_decided_by_a_worker_that_died_is_submitted_by_another(db_url: str) -> None:
    def decided_long_ago(now: float) -> Schedule:
        row = every_second(now, overlap=Overlap.ALLOW).model_copy(
            update={"next_due": int(now) + 3600}
        )
        lost = Decided(due=int(now) - 60, decided_at=now - RESUBMIT_AFTER_S - 1)
        return row.model_copy(update={"submitting": (lost,), "last_due": lost.due})

    added = add_schedule(db_url, decided_long_ago)

    worker = await run_worker_for(db_url, 0.8)

    lost = added.invocation_id(added.submitting[0].due)
    assert ended(db_url) == {lost: TerminalReason.COMPLETED}
    assert schedules(db_url)[0].submitting == ()
    assert worker.statistics().schedules.submitted == 1


async def test_a_run_whose_id_is_taken_by_another_goal_is_given_up(db_url: str) -> None:
    added = add_schedule(db_url, every_second)
    taken = added.invocation_id(added.next_due)
    async with Runtime(db_url) as runtime:
        await runtime.submit(AGENT, "another goal", invocation_id=taken)

    worker = await run_worker_for(db_url, 2.5)

    assert schedules(db_url)[0].submitting == ()
    async with Runtime(db_url) as runtime:
        assert (await runtime.load(taken)).goal == "another goal"
    others = set(ended(db_url)) - {taken}
    assert worker.statistics().schedules.submitted == len(others) >= 1
