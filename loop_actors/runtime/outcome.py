"""What a run returns: the typed outcome of an invocation."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from aggregates.children import Spent
from aggregates.critic import CriticSpent
from aggregates.decisions import Frozen, TerminalReason
from aggregates.invocation import Invocation
from aggregates.standing import Stop, stopped


class Outcome(Frozen):
    """How an invocation stopped: its id, a typed reason, the answer and the totals."""

    invocation_id: str
    reason: TerminalReason
    answer: str | None
    steps: int
    tool_calls: int
    detail: str | None = None
    """Why, in words, when the reason alone does not say (the error, the question...)."""
    digest: str | None = None
    """For ``approval_required``: the digest to approve (``loop-actors approve --digest``)."""
    pending_calls: list[dict[str, Any]] | None = None
    """For ``approval_required``: the exact calls that wait, and which need approval."""
    path: list[str] | None = None
    """For a pause of a child's: the ids from this invocation down to the one that waits
    (whose ``digest`` and ``pending_calls`` these are; approve it by either id)."""
    parent_id: str | None = None
    """For a child invocation: its parent's id (None for a root)."""
    chain: list[str] | None = None
    """When ``run`` or ``resume`` followed handoffs: the ids of the chain, first to last
    (this outcome is the last one's); None when there was no handoff."""
    children: Spent | None = None
    """For an invocation that started children: what they used (their own children's
    included), apart from its own ``steps`` and ``tool_calls``; None when it started none."""
    wake_at: datetime | None = None
    """For ``sleeping``: when it may be woken (a worker claims it then; ``wake`` before)."""
    critic: CriticSpent | None = None
    """For an agent with a critic: its rounds, their verdicts and its usage, apart from the
    agent's own (``steps`` and the like); None without a critic."""
    plan: list[dict[str, Any]] | None = None
    """For ``plan_approval_required``: the writes the plan will make, each its ``step`` (1
    for the first), ``tool``, ``arguments`` (as stored: redacted) and ``description``;
    approve them all with ``digest``."""

    @property
    def paused(self) -> bool:
        """True when the invocation waits (approval, clarification, reconciliation, a time)."""
        return self.reason.pauses

    @property
    def exit_code(self) -> int:
        """The CLI exit code: 0 completed, 3 paused, 6 ``lease_lost``, 4 any other reason.

        ``lease_lost`` is 6, as a resume refused for another process's lease: another
        process drives the invocation now (a take-over that lost the race to another,
        say), and this one stopped without recording anything.
        """
        if self.reason is TerminalReason.COMPLETED:
            return 0
        if self.reason is TerminalReason.LEASE_LOST:
            return 6
        return 3 if self.paused else 4

    @classmethod
    def of(cls, invocation: Invocation) -> Outcome:
        """The outcome recorded in a paused or terminated invocation.

        Raises:
            ValueError: the invocation is still running.
        """
        stop = stopped(invocation.phase)
        if stop is Stop.ENDED and invocation.terminated is not None:
            ended = invocation.terminated
            return cls(
                invocation_id=invocation.id,
                reason=ended.reason,
                answer=ended.answer,
                steps=ended.steps,
                tool_calls=ended.tool_calls,
                detail=ended.detail,
                **_tree(invocation),
            )
        if stop is Stop.PAUSED and invocation.paused is not None:
            paused = invocation.paused
            pending = None
            if paused.calls is not None:
                needing = set(paused.needs_approval or [])
                pending = [
                    {
                        "call_id": call.call_id,
                        "name": call.name,
                        "arguments": call.arguments,
                        "effect": call.effect.value,
                        "needs_approval": call.call_id in needing,
                    }
                    for call in paused.calls
                ]
            return cls(
                invocation_id=invocation.id,
                reason=paused.reason,
                answer=None,
                steps=invocation.step,
                tool_calls=invocation.tool_calls,
                detail=paused.question or paused.proposal_digest,
                digest=paused.proposal_digest,
                pending_calls=pending,
                path=[invocation.id, *paused.child_path] if paused.child_path else None,
                wake_at=paused.wake_at,
                plan=_plan(invocation)
                if paused.reason is TerminalReason.PLAN_APPROVAL_REQUIRED
                else None,
                **_tree(invocation),
            )
        raise ValueError(f"invocation {invocation.id} has not stopped (phase {invocation.phase})")


def _plan(invocation: Invocation) -> list[dict[str, Any]] | None:
    """The writes of the plan that waits for approval."""
    state = invocation.planning
    if state is None:
        return None
    return [
        {
            "step": index,
            "tool": write.tool,
            "arguments": write.arguments,
            "description": write.description,
        }
        for index, write in enumerate(state.writes, start=1)
    ]


def _tree(invocation: Invocation) -> dict[str, Any]:
    """Where an invocation is in a tree (its parent, what its children used); its critic's."""
    settings = invocation.settings
    reviewed = invocation.critic_spent.rounds or (settings is not None and settings.critic)
    return {
        "parent_id": invocation.parent.parent_id if invocation.parent is not None else None,
        "children": invocation.children_spent if invocation.children_started else None,
        "critic": invocation.critic_spent if reviewed else None,
    }
