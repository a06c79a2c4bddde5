"""Where an invocation stands for whoever would act on it next: answers of the core.

The shell asks these instead of spelling the phases out itself: whether the
invocation has stopped (finished or paused), where its queue row rests then, whether
anything can drive it on, and whether it waits for the decision a person gives.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum

from aggregates.invocation import Invocation, Phase
from aggregates.lease import QueueStatus


class Stop(StrEnum):
    """How an invocation has stopped: no run drives it on until something happens."""

    ENDED = "ended"
    """It terminated: nothing runs again."""
    PAUSED = "paused"
    """It waits: for an approval, an answer, or a service to settle a write."""


def stopped(phase: Phase) -> Stop | None:
    """Whether an invocation in ``phase`` has finished or paused, and which; None if neither.

    The one answer to "finished or paused": a commit that reaches it ends a run (a
    holder that shuts down stops there anyway), a cancel leaves an ended invocation
    alone and ends a paused one at once, the queue row rests as it says
    (:func:`resting_status`), and a write of it is resolved by hand only once it
    has stopped. None: a run drives it on, or would (it is new, was submitted, or
    crashed mid-turn).
    """
    if phase is Phase.TERMINATED:
        return Stop.ENDED
    if phase.paused:
        return Stop.PAUSED
    return None


def resting_status(phase: Phase) -> QueueStatus:
    """The queue status of an invocation in ``phase`` that no holder drives.

    ``ended`` once it terminated, ``paused`` while it waits, else ``runnable`` (a
    worker may claim it). A sleeping invocation is ``runnable``: the worker that claims
    it wakes it when it is due (its row is claimable from ``wake_at`` once a holder has
    released it so).
    """
    if phase is Phase.SLEEPING:
        return QueueStatus.RUNNABLE
    match stopped(phase):
        case Stop.ENDED:
            return QueueStatus.ENDED
        case Stop.PAUSED:
            return QueueStatus.PAUSED
        case None:
            return QueueStatus.RUNNABLE


class Standing(StrEnum):
    """What can happen next to an invocation."""

    ENDED = "ended"
    """It terminated: nothing runs again."""
    WAITS_FOR_PERSON = "waits_for_person"
    """It paused for an approval or an answer: only a person's decision moves it."""
    DRIVABLE = "drivable"
    """A run can drive it on (it is running, crashed mid-turn, or waits for reconciliation)."""
    SLEEPING = "sleeping"
    """It sleeps until ``paused.wake_at``: a wake (due, or early by ``wake``) moves it."""


def standing(invocation: Invocation) -> Standing:
    """Whether an invocation ended, waits for a person, sleeps, or can be driven on."""
    if invocation.phase is Phase.SLEEPING:
        return Standing.SLEEPING
    match stopped(invocation.phase):
        case Stop.ENDED:
            return Standing.ENDED
        case Stop.PAUSED if not invocation.paused_for_reconciliation:
            return Standing.WAITS_FOR_PERSON
        case _:
            return Standing.DRIVABLE


class ApprovalRefusal(StrEnum):
    """Why an approval or a denial of an invocation's batch is refused."""

    NOT_WAITING = "not_waiting"
    """The invocation does not wait for an approval."""
    OTHER_DIGEST = "other_digest"
    """It waits, but for the batch of another digest (a stale or mismatched decision)."""


def approval_refusal(invocation: Invocation, digest: str | None) -> ApprovalRefusal | None:
    """Why approving (or denying) the batch of ``digest`` is refused; None when it is not."""
    if invocation.phase is not Phase.AWAITING_APPROVAL:
        return ApprovalRefusal.NOT_WAITING
    paused = invocation.paused
    if paused is None or digest != paused.proposal_digest:
        return ApprovalRefusal.OTHER_DIGEST
    return None


def waits_for_person(invocation: Invocation) -> bool:
    """True when the invocation itself waits for an approval or an answer."""
    return invocation.phase in (Phase.AWAITING_APPROVAL, Phase.AWAITING_CLARIFICATION)


def waits_for_answer(invocation: Invocation) -> bool:
    """True when the invocation paused with a question only a person can answer."""
    return invocation.phase is Phase.AWAITING_CLARIFICATION


def wake_at(invocation: Invocation) -> datetime | None:
    """When a sleeping invocation may be woken (None: it does not sleep)."""
    paused = invocation.paused
    if invocation.phase is not Phase.SLEEPING or paused is None:
        return None
    return paused.wake_at


def wake_due(invocation: Invocation, at: datetime) -> bool:
    """True when a sleeping invocation's time has come at ``at`` (a wake is not early)."""
    when = wake_at(invocation)
    return when is not None and when <= at


class BulkSkip(StrEnum):
    """Why a bulk resume or reconcile (the console's) leaves an invocation the filter matched."""

    ENDED = "ended"
    """It terminated (since the list was read): nothing runs again."""
    WAITS_FOR_APPROVAL = "waits_for_approval"
    """It waits for a person to approve or deny its batch: a resume drives nothing."""
    WAITS_FOR_ANSWER = "waits_for_answer"
    """It waits for a person to answer its question."""
    WAITS_FOR_CHILD = "waits_for_child"
    """A child it started (or theirs) waits for a person's approval or answer."""
    NOT_DUE = "not_due"
    """It sleeps and its wake time has not come (a ``wake`` goes on early)."""
    LEASE_HELD = "lease_held"
    """A live holder drives it now (a worker, a run, this console)."""
    AGENT_NOT_SERVED = "agent_not_served"
    """Its agent is none of those the console was given (``serve --agent``)."""
    MAY_BE_RUNNING = "may_be_running"
    """Its open writes belong to a batch it may still be running (not paused for them):
    its run settles them, or a resume."""


def resume_skip(
    invocation: Invocation,
    found: Standing,
    *,
    agent_served: bool,
    lease_live: bool,
    at: datetime,
) -> BulkSkip | None:
    """Why a resume of ``invocation`` would drive nothing now; None when it would.

    ``found`` is its standing as the shell sees it (an invocation paused for a child
    waits for a person while the one at the end of its path does); ``lease_live``:
    another holder's lease on it still runs and its holder is not gone.
    """
    match found:
        case Standing.ENDED:
            return BulkSkip.ENDED
        case Standing.WAITS_FOR_PERSON if invocation.phase is Phase.AWAITING_APPROVAL:
            return BulkSkip.WAITS_FOR_APPROVAL
        case Standing.WAITS_FOR_PERSON if invocation.phase is Phase.AWAITING_CLARIFICATION:
            return BulkSkip.WAITS_FOR_ANSWER
        case Standing.WAITS_FOR_PERSON:
            return BulkSkip.WAITS_FOR_CHILD
        case _:
            pass
    if not agent_served:
        return BulkSkip.AGENT_NOT_SERVED
    if found is Standing.SLEEPING and not wake_due(invocation, at):
        return BulkSkip.NOT_DUE
    if lease_live:
        return BulkSkip.LEASE_HELD
    return None


def reconcile_skip(invocation: Invocation, *, agent_served: bool) -> BulkSkip | None:
    """Why a reconcile sweep would leave an invocation with open writes alone; None if not.

    A sweep settles the writes of an invocation that ended, and resumes one paused
    for reconciliation; one that waits for a child's person, or may still be running,
    settles its own (the calls that started its children are open writes of it).
    """
    if invocation.phase is Phase.AWAITING_CHILD:
        return BulkSkip.WAITS_FOR_CHILD
    if not agent_served:
        return BulkSkip.AGENT_NOT_SERVED
    if invocation.phase is Phase.TERMINATED or invocation.paused_for_reconciliation:
        return None
    return BulkSkip.MAY_BE_RUNNING
