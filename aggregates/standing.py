"""Where an invocation stands for whoever would act on it next: answers of the core.

The shell asks these instead of spelling the phases out itself: whether anything
can drive the invocation on, and whether it waits for the decision a person gives.
"""

from __future__ import annotations

from enum import StrEnum

from aggregates.invocation import Invocation, Phase


class Standing(StrEnum):
    """What can happen next to an invocation."""

    ENDED = "ended"
    """It terminated: nothing runs again."""
    WAITS_FOR_PERSON = "waits_for_person"
    """It paused for an approval or an answer: only a person's decision moves it."""
    DRIVABLE = "drivable"
    """A run can drive it on (it is running, crashed mid-turn, or waits for reconciliation)."""


def standing(invocation: Invocation) -> Standing:
    """Whether an invocation ended, waits for a person, or can be driven on."""
    if invocation.phase is Phase.TERMINATED:
        return Standing.ENDED
    if invocation.phase.paused and not invocation.paused_for_reconciliation:
        return Standing.WAITS_FOR_PERSON
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


def waits_for_answer(invocation: Invocation) -> bool:
    """True when the invocation paused with a question only a person can answer."""
    return invocation.phase is Phase.AWAITING_CLARIFICATION
