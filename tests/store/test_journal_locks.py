"""A locked store: group commit answers every commit within one bounded wait, and runs resume.

The unit tests drive ``commit_group`` with a fake store and a fake clock (no real
waiting); the others hold SQLite's write lock on a real file from another
connection (``BEGIN EXCLUSIVE``), as another process could, and measure real time
(the Journal waits in its own thread, so an autojump clock cannot stand in).

Bad inputs tried: a store locked on every attempt (with and without a busy wait
of its own), locked for a while and then free, locked while more commits queue
behind the group, a conflict in one commit of a group, a disk I/O error, an event
that cannot be encoded, malformed ``lock_retry`` values; on a real file, an
exclusive lock held longer than the lock timeout while 12 runs commit their
results, while 12 runs start, and held a little less than the retry window.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest
import trio
from eventsourcing.persistence import DatabaseError, IntegrityError, OperationalError

from aggregates.invocation import BatchDispatched, Terminated
from loop_actors import (
    Agent,
    ModelRequest,
    Runtime,
    ScriptedModel,
    StoreUnavailableError,
    StoreUrlError,
    TerminalReason,
    tool,
)
from loop_actors._messages import CommitFailed, Committed
from loop_actors.store.journal import LockRetry, commit_group, is_lock_failure
from tests.support.journal import FakeClock, FakeStore, commits, locked

# --------------------------------------------------------------------------- a fake store


RETRY = LockRetry(lock_wait_s=1.0, retry_s=1.0)


# --------------------------------------------------------------------------- commit_group


def test_a_group_locked_throughout_is_answered_together_within_one_bounded_wait() -> None:
    clock = FakeClock()
    store = FakeStore(clock, lambda ids: locked(), busy=True)

    results = commit_group(
        store, commits("a", "b", "c"), retry=RETRY, clock=clock, sleep=clock.sleep
    )

    assert all(isinstance(r, CommitFailed) and not r.conflict for r in results)
    assert all("database is locked" in r.message for r in results if isinstance(r, CommitFailed))
    # The whole group each time (never once per commit), and the last attempt waits
    # only for what is left of the window: lock timeout + retry window, not 3 x 1 s more.
    assert [ids for ids, _ in store.attempts] == [["a", "b", "c"]] * 2
    assert store.attempts[0][1] is None
    assert store.attempts[1][1] == pytest.approx(RETRY.retry_s - RETRY.first_backoff_s)
    assert clock.now == pytest.approx(RETRY.lock_wait_s + RETRY.retry_s)


def test_a_lock_that_fails_at_once_is_retried_with_growing_pauses_until_the_window_closes() -> None:
    clock = FakeClock()
    store = FakeStore(clock, lambda ids: locked())

    results = commit_group(store, commits("a", "b"), retry=RETRY, clock=clock, sleep=clock.sleep)

    assert all(isinstance(r, CommitFailed) for r in results)
    assert clock.sleeps == pytest.approx([0.05, 0.1, 0.2, 0.4, 0.25])
    assert len(store.attempts) == 1 + len(clock.sleeps)
    assert clock.now == pytest.approx(RETRY.retry_s)


def test_a_lock_that_clears_within_the_window_commits_the_whole_group() -> None:
    clock = FakeClock()
    attempts = iter([locked(), locked(), None])
    store = FakeStore(clock, lambda ids: next(attempts))

    results = commit_group(
        store, commits("a", "b", "c"), retry=RETRY, clock=clock, sleep=clock.sleep
    )

    assert results == [Committed(position=3)] * 3
    assert len(store.attempts) == 3
    assert store.written == ["a", "b", "c"]


def test_commits_queued_behind_a_locked_group_join_its_wait() -> None:
    clock = FakeClock()
    attempts = iter([locked(), None])
    store = FakeStore(clock, lambda ids: next(attempts))
    queued = [commits("d"), []]

    results = commit_group(
        store,
        commits("a", "b"),
        retry=RETRY,
        take_more=lambda: queued.pop(0),
        clock=clock,
        sleep=clock.sleep,
    )

    assert results == [Committed(position=3)] * 3
    assert [ids for ids, _ in store.attempts] == [["a", "b"], ["a", "b", "d"]]


def test_with_no_retry_window_a_locked_group_is_answered_after_one_attempt() -> None:
    clock = FakeClock()
    store = FakeStore(clock, lambda ids: locked(), busy=True)

    results = commit_group(
        store,
        commits("a", "b"),
        retry=LockRetry(lock_wait_s=1.0, retry_s=0.0),
        clock=clock,
        sleep=clock.sleep,
    )

    assert all(isinstance(r, CommitFailed) for r in results)
    assert len(store.attempts) == 1
    assert clock.now == pytest.approx(1.0)


def test_a_conflict_in_one_commit_is_answered_to_it_alone_and_the_others_commit() -> None:
    clock = FakeClock()
    store = FakeStore(clock, lambda ids: IntegrityError("taken") if "b" in ids else None)

    first, second, third = commit_group(
        store, commits("a", "b", "c"), retry=RETRY, clock=clock, sleep=clock.sleep
    )

    assert isinstance(first, Committed)
    assert isinstance(second, CommitFailed)
    assert second.conflict
    assert isinstance(third, Committed)
    assert [ids for ids, _ in store.attempts] == [["a", "b", "c"], ["a"], ["b"], ["c"]]
    assert store.written == ["a", "c"]


def test_a_database_failure_is_answered_to_every_commit_after_one_attempt() -> None:
    clock = FakeClock()
    store = FakeStore(clock, lambda ids: DatabaseError("disk I/O error"))

    results = commit_group(
        store, commits("a", "b", "c"), retry=RETRY, clock=clock, sleep=clock.sleep
    )

    assert [(r.error_type, r.message, r.conflict) for r in results] == [  # type: ignore[union-attr]
        ("DatabaseError", "disk I/O error", False)
    ] * 3
    assert len(store.attempts) == 1
    assert clock.sleeps == []


def test_an_event_that_cannot_be_encoded_fails_its_own_commit_only() -> None:
    clock = FakeClock()
    store = FakeStore(clock, lambda ids: ValueError("not JSON") if "b" in ids else None)

    first, second, third = commit_group(
        store, commits("a", "b", "c"), retry=RETRY, clock=clock, sleep=clock.sleep
    )

    assert isinstance(first, Committed)
    assert isinstance(second, CommitFailed)
    assert (second.error_type, second.conflict) == ("ValueError", False)
    assert isinstance(third, Committed)
    assert len(store.attempts) == 4


@pytest.mark.parametrize(
    ("error", "is_lock"),
    [
        (OperationalError("database is locked"), True),
        (OperationalError("database table is locked"), True),
        (sqlite3.OperationalError("database is locked"), True),
        (OperationalError("disk I/O error"), False),
        (IntegrityError("UNIQUE constraint failed"), False),
        (DatabaseError("database is locked"), False),
    ],
)
def test_only_operational_errors_about_locks_count_as_a_locked_store(
    error: Exception, is_lock: bool
) -> None:
    assert is_lock_failure(error) is is_lock


def test_the_lock_settings_come_from_the_url() -> None:
    from loop_actors.store.url import StoreUrl

    url = StoreUrl.parse("sqlite:///x.db?lock_timeout=3&lock_retry=0.25")
    assert LockRetry.of(url) == LockRetry(lock_wait_s=3.0, retry_s=0.25)
    assert LockRetry.of(StoreUrl.parse("memory://?lock_retry=0")).retry_s == 0.0
    assert LockRetry.of(StoreUrl.parse("sqlite:///x.db")) == LockRetry(lock_wait_s=5.0, retry_s=2.0)


@pytest.mark.parametrize("value", ["-1", "abc", "nan", "inf", ""])
def test_a_malformed_lock_retry_is_refused(tmp_path: Path, value: str) -> None:
    with pytest.raises(StoreUrlError, match="lock_retry"):
        Runtime(f"sqlite:///{tmp_path / 'x.db'}?lock_retry={value}")


# --------------------------------------------------------------------------- a real locked file

LOCK_TIMEOUT_S = 1
LOCK_RETRY_S = 0.5
RUNS = 12
BOUND_S = 2 * LOCK_TIMEOUT_S + LOCK_RETRY_S + 1.0
"""Every commit is answered within lock_timeout + lock_retry of the Journal's first
attempt at its group, and a commit queued behind that attempt joins its retries: at
most about twice the lock timeout plus the retry window, plus a second for
scheduling. Without a bound per group, 12 commits took 13 lock timeouts."""


def exclusive_lock(path: Path) -> sqlite3.Connection:
    """Hold SQLite's write lock from another connection, as another process could."""
    connection = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    connection.execute("BEGIN EXCLUSIVE")
    return connection


class Gate:
    """A read tool that waits until every run is inside it, then until it is opened."""

    def __init__(self, runs: int) -> None:
        self.runs = runs
        self.inside = 0
        self.all_inside = trio.Event()
        self.open = trio.Event()

    def tools(self) -> list[Any]:
        gate = self

        @tool
        async def wait_at_gate(key: str) -> str:
            """Wait for the test to open the gate."""
            gate.inside += 1
            if gate.inside >= gate.runs:
                gate.all_inside.set()
            await gate.open.wait()
            return key

        return [wait_at_gate]


def through_the_gate(request: ModelRequest) -> dict[str, Any]:
    if request.step == 1:
        return {
            "kind": "tool_calls",
            "calls": [{"id": "c1", "name": "wait_at_gate", "arguments": {"key": "k"}}],
        }
    return {"kind": "final", "answer": f"done {request.invocation_id}"}


async def test_runs_whose_results_commit_meets_a_held_lock_answer_in_time_then_resume(
    tmp_path: Path,
) -> None:
    """Bad input: an exclusive lock held past the lock timeout while 12 runs commit results."""
    path = tmp_path / "locked.db"
    url = f"sqlite:///{path}?lock_timeout={LOCK_TIMEOUT_S}&lock_retry={LOCK_RETRY_S}"
    gate = Gate(RUNS)
    agent = Agent("a", ScriptedModel(through_the_gate), gate.tools())
    answered: dict[str, tuple[TerminalReason, float]] = {}
    with trio.fail_after(60):
        async with Runtime(url) as runtime:

            async def run(n: int) -> None:
                outcome = await runtime.run(agent, "g", invocation_id=f"inv-{n}")
                answered[outcome.invocation_id] = (outcome.reason, trio.current_time())

            async with trio.open_nursery() as nursery:
                for n in range(RUNS):
                    nursery.start_soon(run, n)
                await gate.all_inside.wait()
                blocker = exclusive_lock(path)
                opened_at = trio.current_time()
                gate.open.set()
            blocker.rollback()  # the lock goes: every run has answered by now

            assert {reason for reason, _ in answered.values()} == {TerminalReason.CHECKPOINT_FAILED}
            waits = [at - opened_at for _, at in answered.values()]
            assert max(waits) < BOUND_S, waits
            assert max(waits) >= LOCK_TIMEOUT_S  # they did wait for the lock
            # Nothing was recorded after the failed commit: the batch stays dispatched.
            for n in range(RUNS):
                assert isinstance((await runtime.history(f"inv-{n}"))[-1], BatchDispatched)

            resumed = [await runtime.resume(f"inv-{n}", agent) for n in range(RUNS)]

    assert [(o.reason, o.answer) for o in resumed] == [
        (TerminalReason.COMPLETED, f"done inv-{n}") for n in range(RUNS)
    ]


async def test_starts_that_meet_a_held_lock_are_refused_in_time_and_run_once_it_goes(
    tmp_path: Path,
) -> None:
    """Bad input: an exclusive lock held past the lock timeout while 12 runs start."""
    path = tmp_path / "locked.db"
    url = f"sqlite:///{path}?lock_timeout={LOCK_TIMEOUT_S}&lock_retry={LOCK_RETRY_S}"
    agent = Agent("a", ScriptedModel(lambda request: {"kind": "final", "answer": "x"}))
    refused: list[float] = []
    with trio.fail_after(60):
        async with Runtime(url) as runtime:
            blocker = exclusive_lock(path)
            started_at = trio.current_time()

            async def start(n: int) -> None:
                with pytest.raises(StoreUnavailableError, match="locked"):
                    await runtime.run(agent, "g", invocation_id=f"inv-{n}")
                refused.append(trio.current_time() - started_at)

            async with trio.open_nursery() as nursery:
                for n in range(RUNS):
                    nursery.start_soon(start, n)
            blocker.rollback()

            assert len(refused) == RUNS
            assert max(refused) < BOUND_S, refused
            outcomes = [
                await runtime.run(agent, "g", invocation_id=f"inv-{n}") for n in range(RUNS)
            ]
    assert {o.reason for o in outcomes} == {TerminalReason.COMPLETED}


async def test_a_lock_released_within_the_retry_window_does_not_fail_the_run(
    tmp_path: Path,
) -> None:
    """Bad input: an exclusive lock held longer than the lock timeout, shorter than the window."""
    path = tmp_path / "locked.db"
    url = f"sqlite:///{path}?lock_timeout={LOCK_TIMEOUT_S}&lock_retry=5"
    gate = Gate(1)
    agent = Agent("a", ScriptedModel(through_the_gate), gate.tools())
    with trio.fail_after(60):
        async with Runtime(url) as runtime, trio.open_nursery() as nursery:

            async def lock_for_a_while() -> None:
                await gate.all_inside.wait()
                blocker = exclusive_lock(path)
                gate.open.set()
                await trio.sleep(LOCK_TIMEOUT_S + 0.5)
                blocker.rollback()

            nursery.start_soon(lock_for_a_while)
            outcome = await runtime.run(agent, "g", invocation_id="inv")
            events = await runtime.history("inv")
    assert (outcome.reason, outcome.answer) == (TerminalReason.COMPLETED, "done inv")
    assert [e.reason for e in events if isinstance(e, Terminated)] == [TerminalReason.COMPLETED]


async def test_a_run_whose_checkpoint_failed_keeps_its_redacted_arguments_for_the_resume(
    tmp_path: Path,
) -> None:
    """Bad input: a locked store refuses the results of a call with a sensitive argument."""
    path = tmp_path / "locked.db"
    url = f"sqlite:///{path}?lock_timeout={LOCK_TIMEOUT_S}&lock_retry=0"
    seen: list[str] = []
    blocker: list[sqlite3.Connection] = []

    @tool(sensitive_arguments=["password"])
    def login(user: str, password: str) -> str:
        """Log in; the first time, another connection takes the lock meanwhile."""
        seen.append(password)
        if not blocker:
            blocker.append(exclusive_lock(path))
        return user

    def decide(request: ModelRequest) -> dict[str, Any]:
        if request.step == 1:
            return {
                "kind": "tool_calls",
                "calls": [
                    {"id": "c1", "name": "login", "arguments": {"user": "u", "password": "pw"}}
                ],
            }
        return {"kind": "final", "answer": str(request.results[-1].output)}

    agent = Agent("a", ScriptedModel(decide), [login])
    with trio.fail_after(60):
        async with Runtime(url) as runtime:
            failed = await runtime.run(agent, "g", invocation_id="inv")
            blocker[0].rollback()
            resumed = await runtime.resume("inv", agent)
    assert failed.reason is TerminalReason.CHECKPOINT_FAILED
    # The resume ran the call again with its real arguments, not "[redacted]".
    assert seen == ["pw", "pw"]
    assert (resumed.reason, resumed.answer) == (TerminalReason.COMPLETED, "u")
