"""Cancellation, store failures and invocation ids, through the public API on real SQLite files."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from aggregates.invocation import BatchDispatched, ResultsCommitted, Terminated
from loop_actors import (
    Agent,
    ErrorClass,
    InvocationExistsError,
    LeaseHeldError,
    ModelRequest,
    Runtime,
    ScriptedModel,
    StoreUnavailableError,
    StoreUrlError,
    TerminalReason,
    UsageError,
    tool,
)
from tests.support.replies import calls


@pytest.fixture
def db_url(store_url: str) -> str:
    """This module's stores: each test runs on a SQLite file and on PostgreSQL."""
    return store_url


class SlowWrites:
    """A read that blocks until released, and a write that counts whether it ever started."""

    def __init__(self) -> None:
        self.read_started = trio.Event()
        self.writes_started = 0

    def tools(self) -> list[Any]:
        state = self

        @tool
        async def slow_read(key: str) -> str:
            """Block until cancelled."""
            state.read_started.set()
            await trio.sleep_forever()
            return key

        @tool
        async def quick_read(key: str) -> str:
            """Answer at once."""
            return key

        @tool(effect="write")
        async def write(key: str) -> str:
            """Count a write."""
            state.writes_started += 1
            return key

        return [slow_read, quick_read, write]


async def test_cancel_while_tools_run_ends_cancelled_and_starts_no_new_call(db_url: str) -> None:
    slow = SlowWrites()
    model = ScriptedModel(
        [
            calls(
                ("r1", "slow_read", {"key": "a"}),
                ("r2", "quick_read", {"key": "b"}),
                ("w1", "write", {"key": "c"}),
            )
        ]
    )
    agent = Agent("a", model, slow.tools())
    async with Runtime(db_url) as runtime:
        async with trio.open_nursery() as nursery:
            outcomes: list[Any] = []

            async def go() -> None:
                outcomes.append(await runtime.run(agent, "g", invocation_id="inv-1"))

            nursery.start_soon(go)
            with trio.fail_after(10):
                await slow.read_started.wait()
            assert runtime.cancel("inv-1") is True
        (outcome,) = outcomes
        events = await runtime.history("inv-1")
    assert outcome.reason is TerminalReason.CANCELLED
    assert slow.writes_started == 0
    (committed,) = [e for e in events if isinstance(e, ResultsCommitted)]
    by_id = {r.call_id: r for r in committed.results}
    assert by_id["r2"].ok  # the finished call keeps its result
    assert by_id["r1"].error is not None
    assert by_id["r1"].error.error_class is ErrorClass.CANCELLED
    assert by_id["w1"].error is not None
    assert by_id["w1"].error.error_class is ErrorClass.CANCELLED
    assert isinstance(events[-1], Terminated)
    assert events[-1].reason is TerminalReason.CANCELLED


async def test_cancelling_the_callers_scope_records_cancelled_and_reraises(db_url: str) -> None:
    slow = SlowWrites()
    model = ScriptedModel([calls(("r1", "slow_read", {"key": "a"}))])
    agent = Agent("a", model, slow.tools())
    async with Runtime(db_url) as runtime:
        with trio.move_on_after(30) as scope:
            async with trio.open_nursery() as nursery:

                async def cancel_when_running() -> None:
                    await slow.read_started.wait()
                    scope.cancel()

                nursery.start_soon(cancel_when_running)
                await runtime.run(agent, "g", invocation_id="inv-2")
        assert scope.cancelled_caught
        invocation = await runtime.load("inv-2")
    assert invocation.terminated is not None
    assert invocation.terminated.reason is TerminalReason.CANCELLED
    assert invocation.turns[-1].results[0].error is not None


async def test_cancel_of_an_unknown_id_returns_false() -> None:
    assert Runtime("memory://").cancel("nobody") is False


async def test_a_store_that_fails_to_append_ends_in_checkpoint_failed_without_asking_again(
    tmp_path: Path,
) -> None:
    path = tmp_path / "locked.db"
    url = f"sqlite:///{path}?lock_timeout=1"
    asked: list[int] = []
    blocker: list[sqlite3.Connection] = []

    @tool
    def lock_the_database(key: str) -> str:
        """Take the SQLite write lock from another connection, as another process could."""
        connection = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        connection.execute("BEGIN IMMEDIATE")
        blocker.append(connection)
        return key

    def decide(request: ModelRequest) -> dict[str, Any]:
        asked.append(request.step)
        if request.step == 1:
            return calls(("c1", "lock_the_database", {"key": "x"}))
        return {"kind": "final", "answer": "never reached"}

    agent = Agent("a", ScriptedModel(decide), [lock_the_database])
    async with Runtime(url) as runtime:
        outcome = await runtime.run(agent, "g", invocation_id="inv-3")
    assert outcome.reason is TerminalReason.CHECKPOINT_FAILED
    assert outcome.detail is not None
    assert "locked" in outcome.detail
    assert asked == [1]
    blocker[0].rollback()
    # What was committed is intact: the dispatched batch, no results.
    async with Runtime(url) as runtime:
        events = await runtime.history("inv-3")
    assert isinstance(events[-1], BatchDispatched)


async def test_an_unwritable_database_path_is_refused_before_anything_runs(tmp_path: Path) -> None:
    agent = Agent("a", ScriptedModel([{"kind": "final", "answer": "x"}]))
    with pytest.raises(StoreUnavailableError):
        await Runtime(f"sqlite:///{tmp_path}/missing-folder/x.db").run(agent, "g")
    assert not (tmp_path / "missing-folder").exists()


@pytest.mark.parametrize(
    "url",
    ["postgres://x", "sqlite://host/x.db", "sqlite:///", "sqlite:///x.db?lock_timeout=0", "x"],
)
def test_malformed_database_urls_are_refused(url: str) -> None:
    with pytest.raises(StoreUrlError):
        Runtime(url)


async def test_starting_an_existing_finished_id_returns_its_outcome_and_runs_nothing(
    db_url: str,
) -> None:
    asked: list[int] = []

    def decide(request: ModelRequest) -> dict[str, Any]:
        asked.append(request.step)
        return {"kind": "final", "answer": "once"}

    agent = Agent("a", ScriptedModel(decide))
    first = await Runtime(db_url).run(agent, "g", invocation_id="same")
    second = await Runtime(db_url).run(agent, "g", invocation_id="same")
    assert first == second
    assert asked == [1]
    assert len(await Runtime(db_url).history("same")) == 3


async def test_starting_an_existing_id_with_another_goal_is_refused(db_url: str) -> None:
    agent = Agent("a", ScriptedModel([{"kind": "final", "answer": "x"}]))
    await Runtime(db_url).run(agent, "g", invocation_id="same")
    with pytest.raises(InvocationExistsError):
        await Runtime(db_url).run(agent, "another goal", invocation_id="same")


async def test_two_concurrent_starts_of_one_id_make_one_invocation(db_url: str) -> None:
    asked: list[int] = []

    def decide(request: ModelRequest) -> dict[str, Any]:
        asked.append(request.step)
        return {"kind": "final", "answer": "x"}

    agent = Agent("a", ScriptedModel(decide))
    results: list[Any] = []

    async def start(runtime: Runtime) -> None:
        try:
            results.append(await runtime.run(agent, "g", invocation_id="race"))
        except InvocationExistsError as error:
            results.append(error)

    async with Runtime(db_url) as one, Runtime(db_url) as two, trio.open_nursery() as nursery:
        nursery.start_soon(start, one)
        nursery.start_soon(start, two)
    assert asked == [1]  # the model was asked once: one invocation ran
    assert len(results) == 2
    outcomes = [r for r in results if not isinstance(r, InvocationExistsError)]
    assert outcomes
    assert all(o.reason is TerminalReason.COMPLETED for o in outcomes)
    assert len(await Runtime(db_url).history("race")) == 3


async def test_the_slower_of_two_workers_on_one_invocation_ends_lease_lost_and_records_nothing(
    db_url: str,
) -> None:
    # Two runtimes (two Journals, two connections) on one file, as two processes would be:
    # A starts the invocation and waits for its model; B resumes it and finishes it first.
    a_is_asking = trio.Event()
    release_a = trio.Event()

    async def slow(request: ModelRequest) -> dict[str, Any]:
        a_is_asking.set()
        await release_a.wait()
        return {"kind": "final", "answer": "from A"}

    def fast(request: ModelRequest) -> dict[str, Any]:
        return {"kind": "final", "answer": "from B"}

    outcomes: dict[str, Any] = {}
    async with Runtime(db_url) as a, Runtime(db_url) as b, trio.open_nursery() as nursery:

        async def run_a() -> None:
            outcomes["a"] = await a.run(Agent("w", ScriptedModel(slow)), "g", invocation_id="one")

        nursery.start_soon(run_a)
        await a_is_asking.wait()  # A's queue row was committed with its start
        # A holds a live lease: a plain resume is refused, naming the holder.
        with pytest.raises(LeaseHeldError) as refused:
            await b.resume("one", Agent("w", ScriptedModel(fast)))
        assert refused.value.holder == a.holder_id
        assert 0 < refused.value.seconds_left <= a.lease_s
        # Taken over deliberately: B fences A off and finishes first.
        outcomes["b"] = await b.resume("one", Agent("w", ScriptedModel(fast)), take_over=True)
        release_a.set()
    assert outcomes["b"].reason is TerminalReason.COMPLETED
    assert outcomes["b"].answer == "from B"
    assert outcomes["a"].reason is TerminalReason.LEASE_LOST
    assert "another worker appended to this invocation first" in (outcomes["a"].detail or "")
    # The history is B's alone: A's decision was refused whole and A wrote nothing after it.
    history = await Runtime(db_url).history("one")
    assert [type(event).__name__ for event in history] == [
        "InvocationStarted",
        "LeaseAcquired",
        "DecisionProposed",
        "Terminated",
    ]
    assert history[1].worker_id == b.holder_id  # type: ignore[attr-defined]
    assert history[1].taken_from == a.holder_id  # type: ignore[attr-defined]
    assert "from A" not in repr(history)


@pytest.mark.parametrize("goal", ["", "   "])
async def test_an_empty_goal_is_refused(goal: str) -> None:
    agent = Agent("a", ScriptedModel([{"kind": "final", "answer": "x"}]))
    with pytest.raises(UsageError):
        await Runtime("memory://").run(agent, goal)


def test_run_sync_runs_an_agent_from_plain_code(db_url: str) -> None:
    agent = Agent("a", ScriptedModel([{"kind": "final", "answer": "sync"}]))
    outcome = Runtime(db_url).run_sync(agent, "g")
    assert (outcome.reason, outcome.answer) == (TerminalReason.COMPLETED, "sync")


async def test_recording_a_cancelled_scope_is_bounded_even_when_the_store_is_locked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Bad input: the database write-locked by another connection for longer than the bound.

    The caller's scope is cancelled while a tool holds the lock; recording the
    cancellation cannot commit, and the run gives up waiting after the cleanup bound
    instead of the store's 30 s lock timeout. The commit lands once the lock is gone.
    """
    monkeypatch.setattr("loop_actors.runtime.controller.CLEANUP_S", 0.5)
    path = tmp_path / "locked.db"
    url = f"sqlite:///{path}?lock_timeout=30"
    locked = trio.Event()
    blocker: list[sqlite3.Connection] = []
    cancelled_at: list[float] = []

    @tool
    async def lock_and_wait(key: str) -> str:
        """Take the SQLite write lock from another connection, then wait for ever."""
        connection = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        connection.execute("BEGIN IMMEDIATE")
        blocker.append(connection)
        locked.set()
        await trio.sleep_forever()
        return key

    agent = Agent(
        "a", ScriptedModel([calls(("c1", "lock_and_wait", {"key": "x"}))]), [lock_and_wait]
    )
    async with Runtime(url) as runtime:
        with trio.fail_after(60):
            with trio.move_on_after(30) as scope:
                async with trio.open_nursery() as nursery:

                    async def cancel_when_locked() -> None:
                        await locked.wait()
                        cancelled_at.append(trio.current_time())
                        scope.cancel()

                    nursery.start_soon(cancel_when_locked)
                    await runtime.run(agent, "g", invocation_id="bounded")
            returned_at = trio.current_time()
            assert scope.cancelled_caught
        blocker[0].rollback()  # the lock goes; the abandoned commit lands
    # The run came back within the bound (plus scheduling), not after the lock timeout.
    assert returned_at - cancelled_at[0] < 10
    async with Runtime(url) as runtime:
        invocation = await runtime.load("bounded")
    assert invocation.terminated is not None
    assert invocation.terminated.reason is TerminalReason.CANCELLED
