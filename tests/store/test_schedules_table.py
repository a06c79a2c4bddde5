"""The schedules' table on SQLite and on a real PostgreSQL server: rows, checks, one decision.

Bad inputs tried: a second schedule of one name, a change and a removal of a schedule
that does not exist, a check for no agent.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from aggregates.lease import QueueStatus
from aggregates.schedules import (
    RESUBMIT_AFTER_S,
    CatchUp,
    Every,
    Overlap,
    Schedule,
    ScheduleState,
    new_schedule,
    parse_cron,
    paused,
    resumed,
)
from loop_actors.store.queue import NewRow, PostgresQueue, SQLiteQueue, WorkQueue
from loop_actors.store.schedule_rows import DueRuns

MakeQueue = Callable[[], WorkQueue]


@pytest.fixture(params=["sqlite", "postgresql"])
def make_queue(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[MakeQueue]:
    """A factory of queue connections to one fresh database (each call: a new connection)."""
    opened: list[WorkQueue] = []
    if request.param == "sqlite":
        path = str(tmp_path / "queue.db")

        def make() -> WorkQueue:
            opened.append(SQLiteQueue(path))
            return opened[-1]
    else:
        url = request.getfixturevalue("postgres_url")

        def make() -> WorkQueue:
            opened.append(PostgresQueue(url))
            return opened[-1]

    yield make
    for queue in opened:
        queue.close()


def due_since(
    seconds_ago: float,
    *,
    name: str = "tick",
    overlap: Overlap = Overlap.SKIP,
    catch_up: CatchUp = CatchUp.ONE,
    agent_name: str = "looker",
) -> Callable[[float], Schedule]:
    """A schedule of every hour whose next due time was ``seconds_ago`` before the add."""

    def make(now: float) -> Schedule:
        row = new_schedule(
            name,
            agent_name=agent_name,
            agent_ref="app:agent",
            goal="tick",
            timing=Every(seconds=3600),
            now=now,
            overlap=overlap,
            catch_up=catch_up,
        )
        return row.model_copy(update={"next_due": int(now - seconds_ago)})

    return make


def test_a_schedule_is_added_listed_and_read_back_as_written(make_queue: MakeQueue) -> None:
    queue = make_queue()
    cron = parse_cron("0 9 * * 1-5", "Europe/Paris")

    added = queue.add_schedule(
        lambda now: new_schedule(
            "daily", agent_name="looker", goal="report", timing=cron, now=now, agent_ref="a:b"
        )
    )

    assert added is not None
    rows, _ = make_queue().schedules()
    assert rows == [added]
    assert added.timing == cron


def test_a_second_schedule_of_one_name_is_refused(make_queue: MakeQueue) -> None:
    queue = make_queue()
    assert queue.add_schedule(due_since(-60)) is not None

    assert queue.add_schedule(due_since(-60)) is None
    assert len(queue.schedules()[0]) == 1


def test_a_schedule_is_paused_resumed_and_removed(make_queue: MakeQueue) -> None:
    queue = make_queue()
    queue.add_schedule(due_since(-60))

    stopped = queue.change_schedule("tick", lambda row, now: paused(row, now=now))
    assert stopped is not None
    assert stopped.state is ScheduleState.PAUSED
    assert queue.schedules()[0] == [stopped]
    again = queue.change_schedule("tick", lambda row, now: resumed(row, now=now))
    assert again is not None
    assert again.state is ScheduleState.ACTIVE

    assert queue.remove_schedule("tick")
    assert not queue.remove_schedule("tick")
    assert queue.change_schedule("tick", lambda row, now: paused(row, now=now)) is None
    assert queue.schedules()[0] == []


def test_a_check_before_the_due_time_decides_nothing_and_says_when_to_look(
    make_queue: MakeQueue,
) -> None:
    queue = make_queue()
    row = queue.add_schedule(due_since(-60))
    assert row is not None

    checked = queue.check_schedules(["looker"])

    assert (checked.due, checked.upcoming) == ([], [("tick", row.next_due)])
    assert checked.wait_s is not None
    assert 55 < checked.wait_s <= 60
    assert queue.check_schedules(["other"]) == ([], [], None)
    assert queue.check_schedules([]) == ([], [], None)


def test_a_due_check_decides_the_run_once_until_it_is_submitted(make_queue: MakeQueue) -> None:
    queue = make_queue()
    added = queue.add_schedule(due_since(5))
    assert added is not None

    due, _, wait_s = queue.check_schedules(["looker"])

    assert [(d.schedule.name, d.dues) for d in due] == [("tick", (added.next_due,))]
    assert wait_s is not None
    assert wait_s <= RESUBMIT_AFTER_S  # when a decided run still missing is looked for
    assert queue.check_schedules(["looker"]).due == []  # decided: not again so soon
    queue.schedule_submitted("tick", due[0].dues)
    [row], _ = queue.schedules()
    assert (row.submitting, row.last_due, row.runs) == ((), added.next_due, 1)


def test_workers_checking_at_once_decide_a_due_time_once(make_queue: MakeQueue) -> None:
    queues = [make_queue() for _ in range(4)]
    queues[0].add_schedule(due_since(5))
    decided: list[DueRuns] = []
    start = threading.Barrier(len(queues))

    def check(queue: WorkQueue) -> None:
        start.wait()
        decided.extend(queue.check_schedules(["looker"]).due)

    threads = [threading.Thread(target=check, args=(queue,)) for queue in queues]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)

    assert [d.dues for d in decided] == [decided[0].dues]
    assert len(decided[0].dues) == 1


def test_skip_leaves_a_due_time_unrun_while_the_previous_run_is_in_the_queue(
    make_queue: MakeQueue,
) -> None:
    queue = make_queue()
    queue.add_schedule(due_since(5))
    [first] = queue.check_schedules(["looker"]).due
    previous = first.schedule.invocation_id(first.dues[0])
    queue.enqueue(previous, "looker")
    queue.schedule_submitted("tick", first.dues)
    queue.change_schedule(
        "tick", lambda row, now: row.model_copy(update={"next_due": int(now - 1)})
    )

    [skipped] = queue.check_schedules(["looker"]).due
    assert (skipped.dues, len(skipped.skipped)) == ((), 1)
    [row], _ = queue.schedules()
    assert row.skipped == 1

    queue.change_schedule(
        "tick", lambda row, now: row.model_copy(update={"next_due": int(now - 1)})
    )
    assert queue.set_status(previous, QueueStatus.ENDED, only_from=[QueueStatus.RUNNABLE])
    [again] = queue.check_schedules(["looker"]).due
    assert len(again.dues) == 1
    assert again.schedule.skipped == 1


def test_a_paused_schedule_is_not_checked(make_queue: MakeQueue) -> None:
    queue = make_queue()
    queue.add_schedule(due_since(5))
    queue.change_schedule("tick", lambda row, now: paused(row, now=now))

    assert queue.check_schedules(["looker"]) == ([], [], None)


def test_a_decided_run_found_in_the_queue_is_forgotten_by_the_next_check(
    make_queue: MakeQueue,
) -> None:
    queue = make_queue()
    queue.add_schedule(due_since(5, overlap=Overlap.ALLOW))
    [first] = queue.check_schedules(["looker"]).due
    queue.enqueue_many([NewRow(first.schedule.invocation_id(first.dues[0]), "looker")])
    queue.change_schedule(
        "tick", lambda row, now: row.model_copy(update={"next_due": int(now - 1)})
    )

    [second] = queue.check_schedules(["looker"]).due

    assert second.schedule.submitting[0].due == second.dues[0]
    assert len(second.schedule.submitting) == 1  # the first is in the queue: forgotten
