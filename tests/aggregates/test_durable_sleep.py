"""Durable sleep in the pure core: the ``wait`` decision, tools that sleep, and waking.

Driven without trio through the test :class:`Shell`; times are passed in (``Moment``).

Bad inputs tried: a wait with a naive time, with an empty reason, past the deadline,
in the past; a wake before its time that does not say it is early, one that says it is
early when it is not, a wake of an invocation that does not sleep, a pause ``sleeping``
without a wake time or of calls the batch does not hold, a bare stop of a sleeping
batch, and a cancel while it sleeps.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from aggregates.decisions import Budget, EffectStatus, RejectionClass, TerminalReason
from aggregates.effect import EffectReconciled, Resolution
from aggregates.errors import IllegalTransitionError
from aggregates.invocation import (
    DecisionProposed,
    Invocation,
    InvocationEvent,
    Paused,
    Phase,
    ResultsCommitted,
    SleepEnded,
    replay,
)
from aggregates.lease import QueueStatus, release_after
from aggregates.standing import Standing, resting_status, standing, wake_due
from aggregates.turn import AskModel, Finished, LoadEffects, Moment, RunCalls
from aggregates.turn_records import cancel_paused
from tests.support.replies import calls
from tests.support.turn_core import AT, Loaded, Ran, Shell, ok, replayed_effect, unknown

LATER = AT + timedelta(hours=1)


def wait(until: datetime | str, reason: str = "the shop opens at nine") -> dict[str, Any]:
    return {
        "kind": "wait",
        "reason": reason,
        "until": until.isoformat() if isinstance(until, datetime) else until,
    }


def phase_of(invocation: Invocation) -> Phase:
    return invocation.phase


def at(moment: datetime) -> Moment:
    return Moment(at=moment, elapsed_s=(moment - AT).total_seconds())


def asleep_after_wait() -> Shell:
    shell = Shell.over()
    shell.begin()
    shell.answer(wait(LATER))
    return shell


def asleep_in_tools() -> tuple[Shell, RunCalls]:
    """A read and a write dispatched; the write slept until LATER, the read answered."""
    shell = Shell.over()
    shell.begin()
    run = shell.answer(calls(("c1", "search", {"q": "x"}), ("c2", "send", {"to": "bob"})))
    assert isinstance(run, RunCalls)
    search, send = run.calls
    shell.feed(Ran([ok(search), unknown(send)], slept={"c2": LATER}))
    return shell, run


# --------------------------------------------------------------------------- the wait decision


def test_a_wait_decision_pauses_sleeping_until_its_time() -> None:
    shell = asleep_after_wait()

    assert shell.action == Finished()
    assert shell.invocation.phase is Phase.SLEEPING
    assert shell.paused.reason is TerminalReason.SLEEPING
    assert shell.paused.wake_at == LATER
    assert shell.paused.question == "the shop opens at nine"


def test_a_wait_with_a_naive_time_is_refused_as_schema_invalid() -> None:
    shell = Shell.over()
    shell.begin()

    shell.answer(wait("2026-01-01T09:00:00"))

    [decided] = shell.of_type(DecisionProposed)
    assert decided.rejection is not None
    assert decided.rejection.rejection_class is RejectionClass.SCHEMA_INVALID
    assert shell.invocation.phase is Phase.READY


def test_a_wait_without_a_reason_is_refused() -> None:
    shell = Shell.over()
    shell.begin()

    shell.answer(wait(LATER, reason="  "))

    [decided] = shell.of_type(DecisionProposed)
    assert decided.rejection is not None
    assert "a wait needs a reason" in decided.rejection.problems


def test_a_wait_in_the_past_wakes_at_once_and_asks_the_model_again() -> None:
    shell = Shell.over()
    shell.begin()

    action = shell.answer(wait(AT - timedelta(minutes=5)))

    assert isinstance(action, AskModel)
    [woke] = shell.of_type(SleepEnded)
    assert not woke.early
    assert shell.invocation.phase is Phase.READY


def test_a_wait_past_the_deadline_ends_the_run_deadline_exceeded() -> None:
    shell = Shell.over(budget=Budget(deadline_s=60))
    shell.begin()

    shell.answer(wait(LATER))

    assert shell.terminated.reason is TerminalReason.DEADLINE_EXCEEDED
    assert "past the deadline" in (shell.terminated.detail or "")


def test_a_due_wake_makes_it_ready_and_tells_the_model_when_it_woke() -> None:
    shell = asleep_after_wait()
    invocation = shell.invocation

    invocation.wake(at=LATER)

    assert invocation.phase is Phase.READY
    assert invocation.turns[-1].reply == f"woke at {LATER.isoformat()}"
    assert isinstance(shell.resume(), AskModel)


def test_a_wake_before_its_time_is_refused_unless_early() -> None:
    invocation = asleep_after_wait().invocation

    with pytest.raises(IllegalTransitionError, match="not due before"):
        invocation.wake(at=LATER - timedelta(seconds=1))
    assert phase_of(invocation) is Phase.SLEEPING

    invocation.wake(at=LATER - timedelta(seconds=1), early=True, by="ops")
    assert phase_of(invocation) is Phase.READY
    assert "early, by ops" in (invocation.turns[-1].reply or "")


def test_a_wake_that_says_early_when_it_is_due_is_refused() -> None:
    invocation = asleep_after_wait().invocation

    with pytest.raises(IllegalTransitionError, match="early"):
        invocation.wake(at=LATER, early=True, by="ops")


def test_a_second_wake_is_refused() -> None:
    invocation = asleep_after_wait().invocation
    invocation.wake(at=LATER)

    with pytest.raises(IllegalTransitionError, match="does not sleep"):
        invocation.wake(at=LATER)


def test_a_sleeping_invocation_is_not_driven_on_before_its_wake() -> None:
    shell = asleep_after_wait()

    assert shell.resume() == Finished()


def test_the_history_of_a_sleep_and_its_wake_replays_to_the_same_state() -> None:
    shell = asleep_after_wait()
    shell.invocation.wake(at=LATER)
    events = [
        e
        for e in [*shell.committed, *shell.invocation.take_events()]
        if isinstance(e, InvocationEvent)
    ]

    replayed = replay(None, events)

    assert replayed is not None
    assert replayed.phase is Phase.READY
    assert replayed.turns[-1].reply == f"woke at {LATER.isoformat()}"


def test_a_sleeping_row_rests_runnable_from_its_wake_time() -> None:
    shell = asleep_after_wait()

    assert standing(shell.invocation) is Standing.SLEEPING
    assert resting_status(Phase.SLEEPING) is QueueStatus.RUNNABLE
    assert not wake_due(shell.invocation, LATER - timedelta(microseconds=1))
    assert wake_due(shell.invocation, LATER)
    release = release_after(TerminalReason.SLEEPING, wake_at=LATER.timestamp())
    assert release is not None
    assert release.status is QueueStatus.RUNNABLE
    assert release.due_at == LATER.timestamp()


# --------------------------------------------------------------------------- tools that sleep


def test_a_tool_that_sleeps_pauses_with_its_batch_still_dispatched() -> None:
    shell, _ = asleep_in_tools()

    paused = shell.paused
    assert shell.action == Finished()
    assert shell.invocation.phase is Phase.SLEEPING
    assert shell.invocation.pending_batch is not None
    assert paused.wake_at == LATER
    assert paused.sleeping_calls == ["c2"]
    assert not shell.of_type(ResultsCommitted)


def test_a_write_that_slept_goes_back_to_prepared_with_its_key() -> None:
    shell, run = asleep_in_tools()
    key = run.calls[1].effect_key
    assert key is not None

    [reconciled] = [e for e in shell.effect_events(key) if isinstance(e, EffectReconciled)]

    assert reconciled.resolution is Resolution.NOT_FOUND
    assert "slept until" in (reconciled.reason or "")


def test_on_waking_the_slept_call_runs_again_with_the_same_key_told_it_slept() -> None:
    shell, first = asleep_in_tools()
    key = first.calls[1].effect_key
    shell.invocation.wake(at=LATER)
    shell.now = at(LATER)
    shell.committed.extend(shell.invocation.take_events())

    load = shell.resume()
    assert isinstance(load, LoadEffects)
    assert key is not None
    reads = shell.feed(Loaded({key: replayed_effect(shell.committed, key)}))
    assert isinstance(reads, RunCalls)
    assert [c.call_id for c in reads.calls] == ["c1"]  # the read runs again
    writes = shell.feed(Ran([ok(reads.calls[0])]))

    assert isinstance(writes, RunCalls)
    [send] = writes.calls
    assert send.call_id == "c2"
    assert send.effect_key == key
    assert writes.woken == {"c2": LATER}
    assert writes.woke_at == LATER
    assert writes.attempts == {"c2": 2}
    action = shell.feed(Ran([ok(send)]))
    assert isinstance(action, AskModel)
    [committed] = shell.of_type(ResultsCommitted)
    assert [r.effect_status for r in committed.results] == [None, EffectStatus.COMMITTED]


def test_a_tool_sleep_whose_time_has_come_wakes_at_once() -> None:
    shell = Shell.over()
    shell.begin()
    run = shell.answer(calls(("c1", "search", {"q": "x"})))
    assert isinstance(run, RunCalls)

    again = shell.feed(Ran([unknown(run.calls[0])], slept={"c1": AT - timedelta(seconds=1)}))

    assert isinstance(again, LoadEffects | RunCalls)
    assert shell.of_type(SleepEnded)
    assert shell.invocation.phase is Phase.DISPATCHED


def test_a_cancel_of_a_sleeping_batch_commits_its_results_then_ends() -> None:
    shell, _ = asleep_in_tools()
    invocation = shell.invocation

    cancel_paused(invocation, "cancelled while asleep", at=AT)

    assert invocation.phase is Phase.TERMINATED
    assert invocation.terminated is not None
    assert invocation.terminated.reason is TerminalReason.CANCELLED


def test_a_sleeping_batch_cannot_end_without_its_results() -> None:
    shell, _ = asleep_in_tools()

    with pytest.raises(IllegalTransitionError, match="results first"):
        shell.invocation.terminate(TerminalReason.CANCELLED, at=AT)


# --------------------------------------------------------------------------- the pause's fields


def started() -> Invocation:
    shell = Shell.over()
    shell.begin()
    shell.answer(calls(("c1", "search", {"q": "x"})))
    return shell.invocation


def test_a_sleep_without_a_wake_time_is_refused() -> None:
    invocation = started()

    with pytest.raises(IllegalTransitionError, match="wake time"):
        invocation.pause(TerminalReason.SLEEPING, sleeping_calls=["c1"], at=AT)


def test_a_sleep_of_calls_the_batch_does_not_hold_is_refused() -> None:
    invocation = started()

    with pytest.raises(IllegalTransitionError, match="calls of the dispatched batch"):
        invocation.pause(TerminalReason.SLEEPING, wake_at=LATER, sleeping_calls=["zz"], at=AT)


def test_a_naive_wake_time_is_refused_by_the_aggregate() -> None:
    invocation = started()

    with pytest.raises(IllegalTransitionError, match="time zone"):
        invocation.pause(
            TerminalReason.SLEEPING,
            wake_at=datetime(2026, 1, 1, 9),
            sleeping_calls=["c1"],
            at=AT,
        )


def test_another_pause_with_a_wake_time_is_refused() -> None:
    invocation = started()

    with pytest.raises(IllegalTransitionError, match="only a sleep"):
        invocation.pause(TerminalReason.RECONCILIATION_REQUIRED, wake_at=LATER, question="?", at=AT)


def test_a_wake_of_an_invocation_that_never_slept_is_refused() -> None:
    invocation = started()

    with pytest.raises(IllegalTransitionError, match="does not sleep"):
        invocation.wake(at=datetime.now(UTC))


def test_the_pause_event_of_a_sleep_carries_its_wake_time() -> None:
    shell = asleep_after_wait()

    [paused] = shell.of_type(Paused)

    assert paused.wake_at == LATER
    assert paused.sleeping_calls is None
