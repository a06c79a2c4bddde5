"""``statistics()`` of the Runtime, its Journal and the Worker: frozen snapshots of what runs.

Bad inputs tried: a snapshot changed after it was taken (refused: frozen); a runtime
asked while closed (zeros, no Journal), and again after a run (its counts kept); a
commit refused by a store whose events table is gone (the error's class and time, not
its message).
"""

from __future__ import annotations

import sqlite3
from functools import partial
from typing import Any

import pydantic
import pytest
import trio
import trio.testing

from loop_actors import (
    Agent,
    ErrorSeen,
    JournalStatistics,
    Runtime,
    RuntimeStatistics,
    ScriptedModel,
    StoreUnavailableError,
    TerminalReason,
    Worker,
    WorkerStatistics,
    tool,
)


@tool
def lookup(query: str) -> str:
    """Look something up."""
    return query.upper()


@pytest.fixture
def clock(mock_clock: trio.testing.MockClock) -> trio.testing.MockClock:
    """Virtual time that jumps once nothing ran for 0.3 s of real time.

    Longer than the tests' usual 50 ms: on a loaded machine the threads that open
    the store take longer than that, and the clock must not jump meanwhile.
    """
    mock_clock.autojump_threshold = 0.3
    return mock_clock


def slow_agent(name: str = "slow") -> Agent:
    """A call, then an answer; the model takes 2 s (trio time) for each."""
    calls = [{"id": "c1", "name": "lookup", "arguments": {"query": "a"}}]
    answers: list[dict[str, Any]] = [
        {"kind": "tool_calls", "calls": calls},
        {"kind": "final", "answer": "done"},
    ]
    return Agent(name, ScriptedModel(answers, delay_s=2), [lookup])


async def test_a_closed_runtime_reports_zeros_and_no_journal() -> None:
    statistics = Runtime("memory://").statistics()
    assert statistics == RuntimeStatistics(
        open=False,
        runs_in_flight=0,
        runs_started=0,
        runs_resumed=0,
        runs_paused=0,
        runs_ended=0,
        stops_by_reason={},
        leases_held=0,
        store_down=False,
        journal=None,
        last_error=None,
    )


async def test_statistics_show_a_run_in_flight_then_after_it_and_after_close(
    db_url: str, clock: trio.testing.MockClock
) -> None:
    runtime = Runtime(db_url)
    with trio.fail_after(60):
        async with runtime:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(partial(runtime.run, slow_agent(), "go", invocation_id="inv-1"))
                await trio.sleep(3)  # its first answer came (2 s), the second has not
                during = runtime.statistics()
            after = runtime.statistics()
            history = await runtime.history("inv-1")
        closed = runtime.statistics()
    assert (during.open, during.runs_in_flight, during.leases_held) == (True, 1, 1)
    assert (during.runs_started, during.runs_ended, during.stops_by_reason) == (1, 0, {})
    assert during.journal is not None
    # Started, then dispatched with its decision, then its results: three commits.
    assert during.journal.commits_written == 3
    assert during.journal.commits_queued == 0
    assert (after.runs_in_flight, after.runs_ended, after.runs_paused) == (0, 1, 0)
    assert after.stops_by_reason == {TerminalReason.COMPLETED: 1}
    assert after.journal is not None
    journal = after.journal
    assert journal.commits_written == 4
    assert journal.events_written == len(history)
    assert journal.transactions == journal.commits_written + journal.commits_failed
    assert journal.mean_events_per_transaction == len(history) / journal.transactions
    assert journal.last_commits_per_transaction == 1
    assert (journal.commits_failed, journal.last_error, after.last_error) == (0, None, None)
    assert (closed.open, closed.journal, closed.runs_in_flight) == (False, None, 0)
    assert closed.stops_by_reason == {TerminalReason.COMPLETED: 1}  # kept across opens


async def test_the_runtime_shows_its_journals_statistics(
    db_url: str, clock: trio.testing.MockClock
) -> None:
    runtime = Runtime(db_url)
    async with runtime:
        with trio.fail_after(30):
            await runtime.run(slow_agent(), "go", invocation_id="inv-j")
        own = runtime.driver.journal.statistics()
        shown = runtime.statistics().journal
    assert isinstance(own, JournalStatistics)
    assert shown == own


async def test_a_snapshot_cannot_be_changed() -> None:
    statistics = Runtime("memory://").statistics()
    with pytest.raises(pydantic.ValidationError):
        statistics.runs_started = 5  # type: ignore[misc]


async def test_a_refused_commit_is_the_last_error_by_class_and_time_never_its_message(
    db_url: str, clock: trio.testing.MockClock
) -> None:
    runtime = Runtime(db_url)
    async with runtime:
        with trio.fail_after(30):
            await runtime.run(slow_agent(), "go", invocation_id="before")
            with sqlite3.connect(db_url.removeprefix("sqlite:///"), timeout=5) as db:
                db.execute("ALTER TABLE stored_events RENAME TO stored_events_gone")
            with pytest.raises(StoreUnavailableError, match="no such table"):
                await runtime.run(slow_agent(), "go", invocation_id="after")
        statistics = runtime.statistics()
    assert statistics.journal is not None
    assert statistics.journal.commits_failed == 1
    error = statistics.last_error
    assert isinstance(error, ErrorSeen)
    assert error.error_type == "OperationalError"
    assert error.loop == "journal"
    assert set(ErrorSeen.model_fields) == {"error_type", "loop", "at"}  # no message text


async def test_a_worker_shows_what_it_drives_and_its_runtime(
    db_url: str, clock: trio.testing.MockClock
) -> None:
    agent = slow_agent("queued")
    with trio.fail_after(60):
        await Runtime(db_url).submit(agent, "go", invocation_id="inv-q")
        worker = Worker(agent, db_url, poll_s=1)
        async with trio.open_nursery() as nursery:
            await nursery.start(partial(worker.run, until_idle=True))
            await trio.sleep(3)
            during = worker.statistics()
        after = worker.statistics()
    assert isinstance(during, WorkerStatistics)
    assert (during.running, during.claimed, during.stopping) == (1, 1, False)
    assert (during.runtime.runs_in_flight, during.runtime.leases_held) == (1, 1)
    assert during.runtime.runs_resumed == 1  # a recorded invocation, driven on
    assert (after.running, after.outcomes) == (0, {TerminalReason.COMPLETED: 1})
    assert after.runtime.stops_by_reason == {TerminalReason.COMPLETED: 1}
    assert after.runtime.open is False
