"""The pure rules of leases (aggregates.lease), driven directly.

Bad inputs tried: lease durations of 0, 0.5, NaN, infinity, True and a string; an
acquire of a live lease without a take-over; a claim backoff after no failure, and
with a poll interval above its bound.
"""

from __future__ import annotations

import math

import pytest

from aggregates.decisions import TerminalReason
from aggregates.lease import (
    CHECKPOINT_RETRY_S,
    CLAIM_RETRY_MAX_S,
    HolderKind,
    HolderRow,
    QueueRow,
    QueueStatus,
    Refuse,
    Take,
    check_lease_s,
    claim_retry_s,
    claimable,
    decide_acquire,
    effective_status,
    heartbeat_every,
    holder_gone,
    may_start_calls,
    release_after,
)


def row(status: QueueStatus, holder: str | None = None, due_at: float = 100.0) -> QueueRow:
    return QueueRow(
        invocation_id="inv",
        agent_name="a",
        status=status,
        holder=holder,
        epoch=3,
        due_at=due_at,
        submitted_at=0,
        updated_at=0,
    )


def test_a_live_lease_of_another_holder_is_refused_with_its_expiry() -> None:
    verdict = decide_acquire(
        row(QueueStatus.CLAIMED, "w1", due_at=130), holder="w2", now=100, take_over=False,
        previous_gone=False,
    )  # fmt: skip
    assert verdict == Refuse(holder="w1", expires_at=130, seconds_left=30)


@pytest.mark.parametrize(
    ("take_over", "gone", "due_at"),
    [(True, False, 130), (False, True, 130), (False, False, 90)],
    ids=["taken-over", "holder-gone", "expired"],
)
def test_a_lease_taken_from_a_holder_gets_the_next_epoch_and_is_recorded(
    take_over: bool, gone: bool, due_at: float
) -> None:
    verdict = decide_acquire(
        row(QueueStatus.CLAIMED, "w1", due_at=due_at),
        holder="w2",
        now=100,
        take_over=take_over,
        previous_gone=gone,
    )
    assert verdict == Take(epoch=4, record=True, taken_from="w1")


def test_a_released_row_or_ones_own_is_taken_without_fencing_and_no_row_is_fenced() -> None:
    released = decide_acquire(
        row(QueueStatus.RUNNABLE), holder="w2", now=100, take_over=False, previous_gone=False
    )
    own = decide_acquire(
        row(QueueStatus.CLAIMED, "w2", due_at=130), holder="w2", now=100, take_over=False,
        previous_gone=False,
    )  # fmt: skip
    missing = decide_acquire(None, holder="w2", now=100, take_over=False, previous_gone=False)
    assert released == own == Take(epoch=4, record=False)
    assert missing == Take(epoch=1, record=True)


def test_a_claimed_row_whose_lease_ran_out_reads_as_runnable_and_is_claimable() -> None:
    expired = row(QueueStatus.CLAIMED, "w1", due_at=99)
    live = row(QueueStatus.CLAIMED, "w1", due_at=101)
    assert effective_status(expired, 100) is QueueStatus.RUNNABLE
    assert claimable(expired, 100)
    assert effective_status(live, 100) is QueueStatus.CLAIMED
    assert not claimable(live, 100)
    assert not claimable(row(QueueStatus.RUNNABLE, due_at=105), 100)  # not yet due
    assert not claimable(row(QueueStatus.PAUSED, due_at=0), 100)
    assert not claimable(row(QueueStatus.ENDED, due_at=0), 100)


def test_no_call_starts_on_a_lease_close_to_running_out() -> None:
    lease_s = 30.0
    assert heartbeat_every(lease_s) == 10
    assert may_start_calls(now=0, valid_until=30, lease_s=lease_s)
    assert may_start_calls(now=24.9, valid_until=30, lease_s=lease_s)
    assert not may_start_calls(now=25, valid_until=30, lease_s=lease_s)
    assert not may_start_calls(now=31, valid_until=30, lease_s=lease_s)


def holder(heartbeat_at: float) -> HolderRow:
    return HolderRow(
        holder="w1",
        kind=HolderKind.WORKER,
        host="h",
        machine="m",
        pid=1,
        started_at=0,
        heartbeat_at=heartbeat_at,
        lease_s=30,
    )


def test_a_holder_is_gone_when_its_process_died_here_or_its_heartbeat_stopped() -> None:
    fresh = holder(heartbeat_at=90)
    assert not holder_gone(fresh, now=100, same_machine=True, process_alive=True)
    assert holder_gone(fresh, now=100, same_machine=True, process_alive=False)
    # On another machine its pid says nothing: only its heartbeat counts.
    assert not holder_gone(fresh, now=100, same_machine=False, process_alive=False)
    assert holder_gone(holder(heartbeat_at=60), now=100, same_machine=False, process_alive=True)
    assert not holder_gone(None, now=100, same_machine=True, process_alive=False)


def test_what_a_holder_leaves_in_the_row_after_each_reason() -> None:
    for reason in TerminalReason:
        release = release_after(reason, wake_at=1234.5)
        if reason in (TerminalReason.SLEEPING, TerminalReason.RATE_LIMITED):
            assert release is not None  # claimable once it is due
            assert (release.status, release.due_at) == (QueueStatus.RUNNABLE, 1234.5)
        elif reason.pauses:
            assert release is not None
            assert release.status is QueueStatus.PAUSED
        elif reason is TerminalReason.LEASE_LOST:
            assert release is None  # the row is another holder's now
        elif reason is TerminalReason.CHECKPOINT_FAILED:
            assert release is not None
            assert (release.status, release.delay_s) == (QueueStatus.RUNNABLE, CHECKPOINT_RETRY_S)
        else:
            assert release is not None
            assert release.status is QueueStatus.ENDED


@pytest.mark.parametrize("bad", [0, 0.5, math.nan, math.inf, True, "30"])
def test_a_lease_duration_must_be_a_finite_number_of_seconds_of_at_least_one(bad: object) -> None:
    assert check_lease_s(bad) is not None
    assert check_lease_s(1) is None
    assert check_lease_s(30.5) is None


def test_the_claim_backoff_doubles_from_the_poll_interval_up_to_a_bound() -> None:
    """Bad inputs: no failure yet (refused), a poll interval above the bound."""
    assert [claim_retry_s(n, poll_s=0.1) for n in range(1, 8)] == [
        0.2,
        0.4,
        0.8,
        1.6,
        3.2,
        5.0,
        5.0,
    ]
    assert claim_retry_s(10_000, poll_s=0.1) == CLAIM_RETRY_MAX_S
    assert claim_retry_s(3, poll_s=60) == 60  # never shorter than the worker's own poll
    with pytest.raises(ValueError, match="at least one failure"):
        claim_retry_s(0, poll_s=0.1)
