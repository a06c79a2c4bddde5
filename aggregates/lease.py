"""The rules of leases: who may drive an invocation, when a lease is live, what an epoch is.

Pure: the queue (``loop_actors.store.queue``) reads and writes rows and hands them here
with the time; nothing in this module reads a clock or a database.

An invocation has one row in the queue. Its ``status`` says whether a worker may
claim it (``runnable``), one holds it (``claimed``: ``holder`` and ``epoch``, with
the lease running until ``due_at``), it waits for a person or a service
(``paused``) or it is over (``ended``). A claimed row whose lease has run out is
runnable again: any worker may take it over, with the next epoch.

The lease is advisory; the fence is the invocation's aggregate version. A holder
that takes over an invocation whose previous holder did not release it records
``LeaseAcquired`` in the invocation's stream, which moves its version: the
previous holder's next append is refused, so it dispatches nothing more.
"""

from __future__ import annotations

import math
from enum import StrEnum

from aggregates.decisions import Frozen, TerminalReason

DEFAULT_LEASE_S = 30.0
"""How long a lease lasts without a heartbeat."""

CHECKPOINT_RETRY_S = 5.0
"""How long an invocation whose commit failed waits before a worker tries it again."""

CLAIM_RETRY_MAX_S = 5.0
"""The longest a worker waits between two claims while its store cannot be used."""


class QueueStatus(StrEnum):
    """Where an invocation stands in the work queue."""

    RUNNABLE = "runnable"
    """A worker may claim it (new, released, or its lease ran out)."""
    CLAIMED = "claimed"
    """A holder drives it under a live lease."""
    PAUSED = "paused"
    """It waits for a person (approval, clarification) or a service (reconciliation)."""
    ENDED = "ended"
    """It terminated: nothing more runs."""


class HolderKind(StrEnum):
    """What kind of process holds leases."""

    WORKER = "worker"
    """``loop-actors worker`` or :class:`loop_actors.Worker`: claims work from the queue."""
    RUN = "run"
    """A plain ``run`` / ``resume`` (or a Runtime): holds the leases of what it drives."""


class QueueRow(Frozen):
    """The queue's row of one invocation."""

    invocation_id: str
    agent_name: str
    agent_ref: str | None = None
    """The ``MODULE:ATTR`` it was submitted with, when it was."""
    status: QueueStatus
    holder: str | None = None
    epoch: int = 0
    due_at: float
    """Runnable: from when it may be claimed. Claimed: when the lease runs out (seconds, epoch)."""
    submitted_at: float
    updated_at: float
    note: str | None = None
    """Why it was last left paused or put back (an error a person should read)."""


class HolderRow(Frozen):
    """A registered process that holds leases: a worker, or a plain run."""

    holder: str
    kind: HolderKind
    host: str
    machine: str
    """Host, boot and process namespace: two processes with one machine see each other's pids."""
    pid: int
    pid_start: str | None = None
    """The process's start time as the system counts it, to tell a reused pid apart."""
    started_at: float
    heartbeat_at: float
    lease_s: float
    agents: list[str] = []
    concurrency: int = 1


class Take(Frozen):
    """The lease may be taken, with this epoch."""

    epoch: int
    record: bool
    """Record ``LeaseAcquired``: a previous holder may still be alive and must be fenced off."""
    taken_from: str | None = None


class Refuse(Frozen):
    """Another holder's lease is live: it may not be taken (without a deliberate take-over)."""

    holder: str
    expires_at: float
    seconds_left: float
    """How long the lease still runs, by the queue's clock."""


def check_lease_s(lease_s: object) -> str | None:
    """Why ``lease_s`` cannot be a lease duration (None: it can)."""
    if isinstance(lease_s, bool) or not isinstance(lease_s, int | float):
        return f"a lease lasts a number of seconds, got {type(lease_s).__name__}"
    if not math.isfinite(lease_s) or lease_s < 1:
        return f"a lease lasts at least 1 second, got {lease_s}"
    return None


def heartbeat_every(lease_s: float) -> float:
    """How often a holder renews its leases: three tries before one runs out."""
    return lease_s / 3


def write_margin(lease_s: float) -> float:
    """How much of a lease must be left for a holder to start a tool call."""
    return lease_s / 6


def claim_retry_s(failures: int, *, poll_s: float) -> float:
    """How long a worker waits before its next claim after ``failures`` in a row (at least 1).

    Twice its poll interval after the first, doubled after each further failure, never
    more than :data:`CLAIM_RETRY_MAX_S` (nor less than the poll interval): a worker whose
    store is gone keeps trying without hammering it, and claims within a few seconds of
    its return.
    """
    if failures < 1:
        raise ValueError("a retry follows at least one failure")
    return max(poll_s, min(CLAIM_RETRY_MAX_S, poll_s * 2.0 ** min(failures, 62)))


def may_start_calls(*, now: float, valid_until: float, lease_s: float) -> bool:
    """Whether a holder whose lease was last renewed to ``valid_until`` may start a call now.

    ``valid_until`` is counted from when the last renewal that succeeded was sent,
    so it is never later than the lease the queue holds. A holder whose heartbeat
    could not renew stops before it starts any write.
    """
    return now + write_margin(lease_s) < valid_until


def lease_is_live(row: QueueRow, now: float) -> bool:
    """Whether a holder's lease on this row still runs."""
    return row.status is QueueStatus.CLAIMED and row.holder is not None and row.due_at > now


def effective_status(row: QueueRow, now: float) -> QueueStatus:
    """The status a reader should see: a claimed row whose lease ran out is runnable."""
    if row.status is QueueStatus.CLAIMED and not lease_is_live(row, now):
        return QueueStatus.RUNNABLE
    return row.status


def claimable(row: QueueRow, now: float) -> bool:
    """Whether a worker may claim this row now."""
    return effective_status(row, now) is QueueStatus.RUNNABLE and row.due_at <= now


def holder_gone(
    holder: HolderRow | None, *, now: float, same_machine: bool, process_alive: bool
) -> bool:
    """Whether a registered holder is gone, so that its live-looking leases may be taken at once.

    Gone: its process is not alive on this machine, or it has not sent a heartbeat
    for longer than its lease. A holder that never registered (or deregistered) is
    judged by its leases' times alone: not gone.
    """
    if holder is None:
        return False
    if same_machine and not process_alive:
        return True
    return holder.heartbeat_at + holder.lease_s < now


def decide_acquire(
    row: QueueRow | None, *, holder: str, now: float, take_over: bool, previous_gone: bool
) -> Take | Refuse:
    """Whether ``holder`` may take the lease of an invocation, and with which epoch.

    - no row (an invocation from before the queue, or whose starter died before it
      wrote one): taken, and recorded, since nobody knows who may still drive it;
    - a released row (no holder), or one of ``holder`` itself: taken, not recorded:
      its last holder stopped;
    - a live lease of another holder: refused, unless ``take_over`` (deliberate) or
      its holder is gone (``previous_gone``);
    - otherwise (the lease ran out, or is taken over): taken with the next epoch and
      recorded, to fence the previous holder off.
    """
    if row is None:
        return Take(epoch=1, record=True)
    if row.holder is None or row.holder == holder:
        # Released, or held by this very holder, which drives it no more (its release
        # may still be on its way): nobody to fence off.
        return Take(epoch=row.epoch + 1, record=False)
    if lease_is_live(row, now) and not take_over and not previous_gone:
        return Refuse(holder=row.holder, expires_at=row.due_at, seconds_left=row.due_at - now)
    return Take(epoch=row.epoch + 1, record=True, taken_from=row.holder)


class Release(Frozen):
    """What a holder writes to the row when it stops driving an invocation."""

    status: QueueStatus
    delay_s: float = 0.0
    """The row is claimable this long after the release (runnable rows only)."""
    due_at: float | None = None
    """The row is claimable from this time (seconds since the epoch; a sleep's wake time),
    instead of ``delay_s`` after the release."""


def release_after(reason: TerminalReason, *, wake_at: float | None = None) -> Release | None:
    """How a holder leaves the row after a run stopped with ``reason`` (None: not its row).

    A sleep leaves it runnable from its wake time (``wake_at``, seconds since the epoch),
    so that the claim query (ordered by ``due_at``) hands it to a worker once it is due;
    another pause waits for a person or a service; a failed commit is tried again a
    little later (the store may be back); ``lease_lost`` means another holder owns the
    row now, so it is left alone; every other reason ended the invocation.
    """
    if reason in (TerminalReason.SLEEPING, TerminalReason.RATE_LIMITED):
        return Release(status=QueueStatus.RUNNABLE, due_at=wake_at)
    if reason.pauses:
        return Release(status=QueueStatus.PAUSED)
    if reason is TerminalReason.CHECKPOINT_FAILED:
        return RETRY_LATER
    if reason is TerminalReason.LEASE_LOST:
        return None
    return Release(status=QueueStatus.ENDED)


RECONCILE_RETRY_FIRST_S = 5.0
"""The shortest wait before a service that could not say what became of a write is asked again."""
RECONCILE_RETRY_MAX_S = 900.0
"""The longest: a service down for a day is asked about a hundred times, not thousands."""


def retry_reconciliation(paused_for_s: float) -> Release:
    """How a holder leaves a run paused for a service it can ask again.

    Every open write of the run has a tool with ``reconcile``: the row is runnable after
    as long again as it has been paused, from :data:`RECONCILE_RETRY_FIRST_S` to
    :data:`RECONCILE_RETRY_MAX_S`, so a worker asks the service again, each wait about
    twice the one before.

    A retry that still finds the service unreachable records nothing (the invocation
    stays paused, its history unchanged); one that finds it answering settles the write
    and goes on. A write only a person can settle (its tool has no ``reconcile``) is
    not retried: it waits ``PAUSED`` for ``effects resolve``.
    """
    wait = min(max(paused_for_s, RECONCILE_RETRY_FIRST_S), RECONCILE_RETRY_MAX_S)
    return Release(status=QueueStatus.RUNNABLE, delay_s=wait)


RETRY_LATER = Release(status=QueueStatus.RUNNABLE, delay_s=CHECKPOINT_RETRY_S)
"""A holder whose store failed (a commit, a read): any worker may try again a little later."""

DRAINED = Release(status=QueueStatus.RUNNABLE)
"""A holder that stopped at a commit (shutting down): any worker may take it at once."""


def stop_for_lost_lease(holder: str) -> tuple[TerminalReason, str]:
    """Why a run stops when its holder learned it lost its lease, and the detail to report."""
    return (
        TerminalReason.LEASE_LOST,
        f"the lease of {holder} could not be renewed or was taken over; nothing more was "
        "dispatched or recorded: the invocation is another holder's",
    )
