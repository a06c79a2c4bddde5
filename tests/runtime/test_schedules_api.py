"""Schedules from Python: ``Runtime.add_schedule``, ``schedules``, pause, resume, remove.

Bad inputs tried (typed errors, nothing written): ``every="0m"``, ``every="5x"``, a cron
of six fields, an unknown zone, a zone with ``every``, neither ``every`` nor ``cron``,
both, an unknown overlap, a bad name, an empty goal, something that is not an Agent, a
second schedule of one name, a pause, resume and removal of a schedule that is not there.
"""

from __future__ import annotations

from typing import Any

import pytest
import trio

from loop_actors import (
    CatchUp,
    Overlap,
    Runtime,
    ScheduleError,
    ScheduleExistsError,
    ScheduleNotFoundError,
    ScheduleProblem,
    ScheduleState,
    SubmissionError,
    UsageError,
)
from tests.support.workers import AGENT


async def test_a_schedule_is_added_listed_paused_resumed_and_removed(db_url: str) -> None:
    async with Runtime(db_url) as runtime:
        added = await runtime.add_schedule(
            "daily", AGENT, "report", cron="0 9 * * 1-5", tz="Europe/Paris",
            overlap="queue", catch_up=CatchUp.ALL, agent_ref="app:agent",
        )  # fmt: skip
        listed = await runtime.schedules()
        stopped = await runtime.pause_schedule("daily")
        again = await runtime.resume_schedule("daily")
        await runtime.remove_schedule("daily")
        left = await runtime.schedules()

    assert listed == [added]
    assert (added.agent_name, added.agent_ref, added.goal) == ("looker", "app:agent", "report")
    assert (added.overlap, added.catch_up) == (Overlap.QUEUE, CatchUp.ALL)
    assert stopped.state is ScheduleState.PAUSED
    assert again.state is ScheduleState.ACTIVE
    assert left == []


@pytest.mark.parametrize(
    ("timing", "problem"),
    [
        ({"every": "0m"}, ScheduleProblem.BAD_INTERVAL),
        ({"every": "5x"}, ScheduleProblem.BAD_INTERVAL),
        ({"cron": "0 9 * * * *"}, ScheduleProblem.MALFORMED_CRON),
        ({"cron": "0 9 * * *", "tz": "Nowhere/City"}, ScheduleProblem.UNKNOWN_TIME_ZONE),
        ({"every": "1h", "tz": "Europe/Paris"}, ScheduleProblem.TIME_ZONE_WITHOUT_CRON),
        ({"cron": "0 0 31 2 *"}, ScheduleProblem.NEVER_DUE),
    ],
)
async def test_a_bad_timing_raises_a_schedule_error_saying_which(
    db_url: str, timing: dict[str, Any], problem: ScheduleProblem
) -> None:
    async with Runtime(db_url) as runtime:
        with pytest.raises(ScheduleError) as refused:
            await runtime.add_schedule("tick", AGENT, "tick", **timing)
        assert await runtime.schedules() == []

    assert refused.value.problem is problem
    assert isinstance(refused.value, UsageError)


async def test_a_bad_name_is_a_schedule_error(db_url: str) -> None:
    async with Runtime(db_url) as runtime:
        with pytest.raises(ScheduleError) as refused:
            await runtime.add_schedule("no spaces", AGENT, "tick", every="1h")

    assert refused.value.problem is ScheduleProblem.BAD_NAME


@pytest.mark.parametrize(
    "arguments",
    [{}, {"every": "1h", "cron": "0 9 * * *"}, {"every": "1h", "overlap": "wait"}],
)
async def test_no_timing_two_timings_or_an_unknown_policy_is_a_usage_error(
    db_url: str, arguments: dict[str, Any]
) -> None:
    async with Runtime(db_url) as runtime:
        with pytest.raises(UsageError):
            await runtime.add_schedule("tick", AGENT, "tick", **arguments)


async def test_an_empty_goal_or_something_not_an_agent_is_refused(db_url: str) -> None:
    async with Runtime(db_url) as runtime:
        with pytest.raises(SubmissionError, match="the goal is empty"):
            await runtime.add_schedule("tick", AGENT, " ", every="1h")
        with pytest.raises(UsageError, match="needs an Agent"):
            await runtime.add_schedule("tick", "agent", "tick", every="1h")  # type: ignore[arg-type]


async def test_a_second_schedule_of_one_name_is_refused(db_url: str) -> None:
    async with Runtime(db_url) as runtime:
        await runtime.add_schedule("tick", AGENT, "first", every="1h")
        with pytest.raises(ScheduleExistsError):
            await runtime.add_schedule("tick", AGENT, "second", every="2h")
        [kept] = await runtime.schedules()

    assert kept.goal == "first"


async def test_a_schedule_that_is_not_there_is_refused(db_url: str) -> None:
    async with Runtime(db_url) as runtime:
        for change in (runtime.pause_schedule, runtime.resume_schedule, runtime.remove_schedule):
            with pytest.raises(ScheduleNotFoundError, match="no schedule named 'tock'"):
                await change("tock")


def test_a_runtime_not_entered_adds_a_schedule_for_the_one_call(db_url: str) -> None:
    runtime = Runtime(db_url)
    try:
        added = trio.run(lambda: runtime.add_schedule("tick", AGENT, "tick", every="30s"))
    finally:
        runtime.close()

    assert added.timing.kind == "every"
