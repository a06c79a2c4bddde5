"""A read model's failure never ends a run: the follower logs it, backs off, and catches up.

Bad inputs tried: a read model that raises on one event (the store's third), again and
again until it is fixed; a runner whose every catch-up raises; the wake-up channel closed
while the follower backs off; zero and huge failure counts for the backoff.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from functools import partial
from typing import Any, cast

import pytest
import trio

from aggregates.events import DomainEvent
from loop_actors import Agent, ModelRequest, Runtime, ScriptedModel, tool
from loop_actors.runtime import resources as resources_module
from loop_actors.runtime import runtime as runtime_module
from loop_actors.store.read_models import open_runner
from loop_actors.store.views import (
    FOLLOW_LOG_EVERY_S,
    FollowerHealth,
    follow_retry_s,
    run_projection_follower,
)
from projections import CatchUpReport, Projection, ProjectionRunner, ViewCursor, default_projections

VIEWS_LOG = "loop_actors.store"


class SeenEvents(Projection):
    """One row per event; raises on the store's third event while ``broken``."""

    name = "seen_events"

    def __init__(self) -> None:
        """Broken until a test mends it."""
        self.broken = True

    def create(self) -> list[str]:
        """The one table."""
        return ["CREATE TABLE IF NOT EXISTS seen_events (position INTEGER PRIMARY KEY)"]

    def tables(self) -> list[str]:
        """The one table."""
        return ["seen_events"]

    def apply(self, cursor: ViewCursor, event: DomainEvent, position: int) -> None:
        """Record the event, or fail on the third while broken."""
        if self.broken and position == 3:
            raise RuntimeError("seen_events cannot take the third event")
        cursor.execute("INSERT INTO seen_events (position) VALUES (?)", (position,))


async def _wait_until(condition: Any) -> None:
    while not condition():  # noqa: ASYNC110 - polls the follower's state and a database
        await trio.sleep(0.01)


async def test_a_failing_read_model_leaves_runs_to_complete_and_catches_up_once_fixed(
    db_url: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    seen = SeenEvents()
    monkeypatch.setattr(
        resources_module,  # the read models open with the store, kept between calls
        "open_runner",
        lambda store, views: open_runner(store, views, [*default_projections(), seen]),
    )
    monkeypatch.setattr(runtime_module, "FOLLOW_RETRY_FIRST_S", 0.01)
    monkeypatch.setattr(runtime_module, "FOLLOW_RETRY_MAX_S", 0.02)
    gate = trio.Event()

    @tool
    async def wait_for_gate() -> str:
        """Wait until the test opens the gate."""
        await gate.wait()
        return "open"

    def decide(request: ModelRequest) -> dict[str, Any]:
        if request.step == 1:
            return {"kind": "tool_calls", "calls": [{"id": "g", "name": "wait_for_gate"}]}
        return {"kind": "final", "answer": request.goal}

    agent = Agent("gated", ScriptedModel(decide), [wait_for_gate])
    outcomes = []
    caplog.set_level(logging.INFO, logger=VIEWS_LOG)
    with trio.fail_after(30):
        async with Runtime(db_url, follow_projections=True) as runtime:
            assert runtime.projections is not None

            def status() -> Any:
                current = runtime.read_models_status()
                assert current is not None
                return current

            async def run(goal: str) -> None:
                outcomes.append(await runtime.run(agent, goal, invocation_id=goal))

            async with trio.open_nursery() as nursery:
                nursery.start_soon(run, "first")
                nursery.start_soon(run, "second")
                await _wait_until(lambda: status().failures >= 3)  # failed, retried, failed
                gate.set()
            stale = status()
            assert sorted((o.invocation_id, o.reason) for o in outcomes) == [
                ("first", "completed"),
                ("second", "completed"),
            ]
            assert stale.stale
            assert stale.position < 3
            assert stale.last_error == "RuntimeError: seen_events cannot take the third event"
            errors = [
                r for r in caplog.records if r.name == VIEWS_LOG and r.levelno >= logging.ERROR
            ]
            assert len(errors) == 1  # logged once, however often it was retried
            assert "runs go on" in errors[0].getMessage()

            seen.broken = False
            views = runtime.projections
            await _wait_until(lambda: not status().stale and not any(s.lag for s in views.status()))
            mended = status()
            rows = views.query("SELECT COUNT(*) AS n FROM seen_events")
    assert (mended.failures, mended.last_error, mended.retry_in_s) == (0, None, None)
    assert mended.position == rows[0]["n"] > 3
    assert any("caught up again" in r.getMessage() for r in caplog.records)


class AlwaysFailing:
    """A runner whose catch-ups raise until ``mended``."""

    def __init__(self) -> None:
        """Failing from the start."""
        self.mended = False
        self.tries = 0

    def catch_up(self) -> list[CatchUpReport]:
        """Raise, or report every read model at position 7 once mended."""
        self.tries += 1
        if not self.mended:
            raise OSError("database or disk is full")
        return [CatchUpReport(name="a", events=7, seconds=0.0, position=7)]


def _follower(
    runner: AlwaysFailing, wake: trio.MemoryReceiveChannel[None], health: FollowerHealth
) -> Any:
    return partial(run_projection_follower, cast("ProjectionRunner", runner), wake, health=health)


async def test_a_follower_backing_off_stops_at_once_when_cancelled() -> None:
    runner = AlwaysFailing()
    health = FollowerHealth(first_retry_s=3600.0, max_retry_s=3600.0)
    _send, wake = trio.open_memory_channel[None](1)
    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            await nursery.start(_follower(runner, wake, health))
            await _wait_until(lambda: health.status.stale)
            nursery.cancel_scope.cancel()
    assert (runner.tries, health.status.retry_in_s) == (1, 3600.0)


async def test_a_follower_backing_off_tries_once_more_and_returns_when_its_channel_closes() -> None:
    runner = AlwaysFailing()
    health = FollowerHealth(first_retry_s=3600.0, max_retry_s=3600.0)
    send, wake = trio.open_memory_channel[None](1)
    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            await nursery.start(_follower(runner, wake, health))
            await _wait_until(lambda: health.status.stale)
            send.send_nowait(None)  # a commit while backing off does not shorten the wait
            await trio.testing.wait_all_tasks_blocked()
            assert runner.tries == 1
            runner.mended = True
            await send.aclose()  # the runtime closes: one last catch-up, then the end
    assert runner.tries == 2
    assert (health.status.stale, health.status.position) == (False, 7)


def test_the_retry_wait_doubles_from_the_first_and_stays_bounded() -> None:
    waits = [follow_retry_s(n, first_s=1.0, max_s=60.0) for n in (1, 2, 3, 6, 7, 10**6)]
    assert waits == [1.0, 2.0, 4.0, 32.0, 60.0, 60.0]
    with pytest.raises(ValueError, match="at least one failure"):
        follow_retry_s(0, first_s=1.0, max_s=60.0)


def test_a_stale_streak_is_logged_once_then_at_most_every_few_minutes(
    caplog: pytest.LogCaptureFixture,
) -> None:
    health = FollowerHealth(first_retry_s=1.0, max_retry_s=60.0)
    caplog.set_level(logging.INFO, logger=VIEWS_LOG)
    error = OSError("database or disk is full")
    for now in (0.0, 1.0, 3.0, FOLLOW_LOG_EVERY_S - 1, FOLLOW_LOG_EVERY_S + 1):
        health.failed(error, now)
    logged = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(logged) == 2
    assert "still stale after 5 failed catch-ups (OSError: database or disk is full)" in logged[1]
    assert health.status.failures == 5


def _reports(positions: Sequence[int]) -> list[CatchUpReport]:
    return [
        CatchUpReport(name=f"m{i}", events=p, seconds=0.0, position=p)
        for i, p in enumerate(positions)
    ]


def test_the_status_position_is_the_least_every_read_model_reached() -> None:
    health = FollowerHealth(first_retry_s=1.0, max_retry_s=60.0)
    health.caught_up(_reports([9, 4, 12]))
    assert health.status.position == 4
    health.failed(OSError("full"), 0.0)
    assert (health.status.stale, health.status.position) == (True, 4)


async def test_an_unfollowed_runtime_has_no_read_models_status(db_url: str) -> None:
    runtime = Runtime(db_url)
    assert runtime.read_models_status() is None
    async with runtime:
        assert runtime.read_models_status() is None
    async with Runtime(db_url, follow_projections=True) as following:
        status = following.read_models_status()
        assert status is not None
        assert (status.stale, status.failures, status.last_error) == (False, 0, None)
    assert following.read_models_status() is None
