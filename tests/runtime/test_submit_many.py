"""``Runtime.submit_many`` on a real SQLite file and a real PostgreSQL database.

Bad inputs tried: an empty goal, something that is not a goal, an id in the runtime's
namespace, an id given twice, an id that names an invocation of another goal (and of
another agent), a chunk size of 0, an agent that is not an Agent; a chunk the store
refuses (a trigger) after a chunk it took.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest
import trio

from aggregates.invocation import InvocationStarted
from aggregates.lease import QueueStatus
from loop_actors import (
    Agent,
    InvocationExistsError,
    Runtime,
    ScriptedModel,
    StoreUnavailableError,
    Submission,
    SubmissionError,
    SubmissionProblem,
    UsageError,
)
from loop_actors.store.store import EventStore
from tests.support.store_rows import queue_rows, stored_ids
from tests.support.workers import AGENT


async def test_the_ids_come_back_in_order_each_recorded_once_and_runnable(store_url: str) -> None:
    goals: list[str | Submission] = [
        "plain",
        Submission("with id", invocation_id="m-1", task_class="t", tenant="acme"),
    ]
    with trio.fail_after(60):
        async with Runtime(store_url) as runtime:
            ids = await runtime.submit_many(AGENT, goals, agent_ref="agents:looker")
            [started] = await runtime.history("m-1")
    assert (ids[1], len(ids[0])) == ("m-1", 32)
    assert isinstance(started, InvocationStarted)
    assert (started.goal, started.task_class, started.tenant) == ("with id", "t", "acme")
    rows = queue_rows(store_url)
    assert sorted(rows) == sorted(ids)
    assert {(row.status, row.agent_ref) for row in rows.values()} == {
        (QueueStatus.RUNNABLE, "agents:looker")
    }


async def test_submitting_the_same_goals_again_records_nothing_and_gives_the_same_ids(
    store_url: str,
) -> None:
    goals = [Submission(f"goal {n}", invocation_id=f"again-{n}") for n in range(7)]
    with trio.fail_after(60):
        async with Runtime(store_url) as runtime:
            first = await runtime.submit_many(AGENT, goals, chunk_size=3)
            second = await runtime.submit_many(AGENT, goals, chunk_size=3)
            assert first == second == [f"again-{n}" for n in range(7)]
            assert [len(await runtime.history(i)) for i in first] == [1] * 7
    assert stored_ids(store_url) == sorted(first)


async def test_progress_is_told_after_each_chunk(db_url: str) -> None:
    told: list[tuple[int, int]] = []
    with trio.fail_after(30):
        await Runtime(db_url).submit_many(
            AGENT, [f"g{n}" for n in range(7)], chunk_size=3, on_progress=lambda *a: told.append(a)
        )
    assert told == [(3, 7), (6, 7), (7, 7)]


@pytest.mark.parametrize(
    ("goals", "problem", "index"),
    [
        (["a", " "], SubmissionProblem.MISSING_GOAL, 1),
        (["a", None], SubmissionProblem.INVALID_VALUE, 1),
        ([Submission("a", invocation_id="cancel:x")], SubmissionProblem.INVALID_VALUE, 0),
        (
            [Submission("a", invocation_id="d"), Submission("b", invocation_id="d")],
            SubmissionProblem.DUPLICATE_ID,
            1,
        ),
        (["a", Submission("another goal", invocation_id="taken")], SubmissionProblem.ID_TAKEN, 1),
    ],
)
async def test_a_bad_goal_is_refused_with_its_place_and_nothing_is_written(
    store_url: str, goals: list[Any], problem: SubmissionProblem, index: int
) -> None:
    with trio.fail_after(60):
        async with Runtime(store_url) as runtime:
            await runtime.submit(AGENT, "the goal", invocation_id="taken")
            with pytest.raises(SubmissionError) as refused:
                await runtime.submit_many(AGENT, goals, chunk_size=1)
    assert (refused.value.problem, refused.value.index) == (problem, index)
    assert stored_ids(store_url) == ["taken"]


async def test_an_id_of_another_agent_is_taken_and_submit_still_says_it_exists(
    db_url: str,
) -> None:
    other = Agent("someone-else", ScriptedModel([]))
    with trio.fail_after(30):
        async with Runtime(db_url) as runtime:
            await runtime.submit(other, "the goal", invocation_id="shared")
            with pytest.raises(SubmissionError) as refused:
                await runtime.submit_many(AGENT, [Submission("the goal", invocation_id="shared")])
            assert refused.value.problem is SubmissionProblem.ID_TAKEN
            with pytest.raises(InvocationExistsError, match="another goal or agent"):
                await runtime.submit(AGENT, "the goal", invocation_id="shared")


@pytest.mark.parametrize(("agent", "chunk_size"), [(AGENT, 0), (AGENT, True), ("looker", 10)])
async def test_a_bad_agent_or_chunk_size_is_a_usage_error_before_the_store_is_opened(
    tmp_path: Path, agent: Any, chunk_size: Any
) -> None:
    with pytest.raises(UsageError):
        await Runtime(f"sqlite:///{tmp_path / 'never.db'}").submit_many(
            agent, ["a"], chunk_size=chunk_size
        )
    assert not (tmp_path / "never.db").exists()


async def test_a_chunk_the_store_refuses_is_not_written_at_all_and_the_one_before_is(
    tmp_path: Path,
) -> None:
    """A trigger refuses the third invocation: its chunk (goals 2 and 3) has no row at all."""
    path = tmp_path / "refusing.db"
    db_url = f"sqlite:///{path}"
    EventStore(db_url).close()
    with sqlite3.connect(path) as connection:
        connection.execute(
            "CREATE TRIGGER refuse BEFORE INSERT ON stored_events "
            "WHEN NEW.originator_id = 'r-3' BEGIN SELECT RAISE(ABORT, 'refused'); END"
        )
    goals = [Submission(f"g{n}", invocation_id=f"r-{n}") for n in range(1, 5)]
    with trio.fail_after(30), pytest.raises(StoreUnavailableError) as failed:
        await Runtime(db_url).submit_many(AGENT, goals, chunk_size=2)
    assert "2 of 4 goals were submitted, from goals[2] on none was" in str(failed.value)
    assert stored_ids(db_url) == ["r-1", "r-2"]
    assert sorted(queue_rows(db_url)) == ["r-1", "r-2"]
