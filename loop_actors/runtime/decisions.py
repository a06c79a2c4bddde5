"""What people decide about invocations: approve, deny, clarify, resolve an effect by hand."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from functools import partial
from typing import assert_never

import trio
from pydantic import JsonValue

from aggregates.decisions import Frozen
from aggregates.effect import Resolution, check_hand_resolution, hand_resolution
from aggregates.errors import AggregateError
from aggregates.invocation import Invocation, Phase
from aggregates.lease import QueueStatus
from aggregates.standing import ApprovalRefusal, approval_refusal, waits_for_answer, wake_due
from aggregates.turn import KeptSecret
from loop_actors._errors import (
    ApprovalRefusedError,
    EffectNotFoundError,
    EffectResolutionError,
    NotWaitingError,
    StoreUnavailableError,
    UsageError,
)
from loop_actors._messages import CommitFailed
from loop_actors.agent.agent import Agent
from loop_actors.runtime.arguments import check_texts
from loop_actors.runtime.driver import Driver, DriverSource


class ResolvedEffect(Frozen):
    """What :meth:`Runtime.resolve_effect` recorded."""

    effect_key: str
    invocation_id: str
    tool: str
    resolution: Resolution
    by: str
    receipt: JsonValue = None
    """The receipt as stored (redacted as the tool says when the agent was given)."""
    reason: str | None = None
    redacted: bool | None = None
    """True when the tool's ``sensitive_output`` changed the receipt; None without an agent
    (the receipt is stored as given)."""
    resumable: bool
    """True when its invocation waits for reconciliation: resume it to continue."""


def _check_waiting_for_approval(invocation: Invocation, digest: str | None) -> None:
    """The core's refusal of an approval (``approval_refusal``), in the user's words.

    Raises:
        ApprovalRefusedError: nothing waits for an approval, or for another digest.
    """
    match approval_refusal(invocation, digest):
        case None:
            return
        case ApprovalRefusal.NOT_WAITING:
            raise ApprovalRefusedError(
                f"invocation {invocation.id} does not wait for an approval",
                ApprovalRefusal.NOT_WAITING,
            )
        case ApprovalRefusal.OTHER_DIGEST:
            raise ApprovalRefusedError(
                f"refused: digest {digest} is not the digest of the batch waiting in "
                f"{invocation.id}; look at the waiting calls again",
                ApprovalRefusal.OTHER_DIGEST,
            )
        case unreachable:
            assert_never(unreachable)


class HumanDecisions:
    """What a person decides: ``Runtime.approve``, ``deny``, ``clarify``, ``resolve_effect``.

    Each checks its arguments before anything is opened, then records the decision
    through the runtime's Driver (opening the runtime for the one call if it is closed).
    """

    def __init__(self, source: DriverSource, now: Callable[[], datetime]) -> None:
        """Decisions recorded through ``source``, stamped with ``now()``."""
        self._source = source
        self.now = now

    async def approve(
        self, invocation_id: str, *, digest: str, by: str, note: str | None = None
    ) -> None:
        """Approve the batch an invocation paused for; ``resume`` then runs exactly that batch.

        Raises:
            ApprovalRefusedError: nothing waits for approval, or the digest is not
                the one of the waiting batch (a stale or mismatched approval).
            InvocationNotFoundError: no such invocation.

        Cancellation: a checkpoint until the approval is handed to the Journal, then
        waited for: cancelled, either nothing was recorded or the approval is
        durable; approving again is refused only if it is (retry safely after
        ``load``).
        """
        if not by.strip():
            raise UsageError("an approval needs the approver's name (by)")
        check_texts(by=by, note=note, digest=digest)

        def apply(invocation: Invocation) -> None:
            _check_waiting_for_approval(invocation, digest)
            invocation.grant_approval(digest, by=by, note=note, at=self.now())

        await self._record(invocation_id, apply)

    async def deny(self, invocation_id: str, *, by: str, reason: str) -> None:
        """Deny the batch an invocation paused for; its calls that needed approval will not run.

        The model gets a ``denied`` result for each of them on ``resume``.

        Raises:
            ApprovalRefusedError: nothing waits for approval.
            InvocationNotFoundError: no such invocation.

        Cancellation: as :meth:`approve`.
        """
        if not by.strip() or not reason.strip():
            raise UsageError("a denial needs the approver's name (by) and a reason")
        check_texts(by=by, reason=reason)

        def apply(invocation: Invocation) -> None:
            paused = invocation.paused
            digest = paused.proposal_digest if paused is not None else None
            _check_waiting_for_approval(invocation, digest)
            assert digest is not None
            invocation.deny_approval(digest, by=by, reason=reason, at=self.now())

        await self._record(invocation_id, apply)

    async def clarify(self, invocation_id: str, *, answer: str, by: str | None = None) -> None:
        """Answer the question an invocation paused with; ``resume`` then asks the model again.

        Raises:
            NotWaitingError: the invocation does not wait for an answer.
            InvocationNotFoundError: no such invocation.

        Cancellation: as :meth:`approve`.
        """
        if not answer.strip():
            raise UsageError("the answer must not be empty")
        check_texts(answer=answer, by=by)

        def apply(invocation: Invocation) -> None:
            if not waits_for_answer(invocation):
                raise NotWaitingError(f"invocation {invocation.id} does not wait for an answer")
            invocation.provide_clarification(answer, by=by, at=self.now())

        await self._record(invocation_id, apply)

    async def wake(self, invocation_id: str, *, by: str | None = None) -> bool:
        """Wake a sleeping invocation now; a worker (or ``resume``) then drives it on.

        Records ``SleepEnded`` (``early`` when its time has not come) and makes its queue
        row claimable at once. Returns True when it was early.

        Raises:
            NotWaitingError: the invocation does not sleep (it never did, or it woke).
            InvocationNotFoundError: no such invocation.

        Cancellation: as :meth:`approve`; waking again is refused only if the first
        wake is durable.
        """
        check_texts(by=by)
        early: list[bool] = []

        def apply(invocation: Invocation) -> None:
            at = self.now()
            if invocation.phase is not Phase.SLEEPING:
                raise NotWaitingError(f"invocation {invocation.id} does not sleep")
            early.append(not wake_due(invocation, at))
            invocation.wake(at=at, early=early[0], by=by)

        await self._record(invocation_id, apply, top_only=True)
        return early[0]

    async def resolve_effect(
        self,
        effect_key: str,
        *,
        committed: bool = False,
        rejected: bool = False,
        receipt: JsonValue = None,
        reason: str | None = None,
        by: str,
        agent: Agent | None = None,
    ) -> ResolvedEffect:
        """Settle an open effect by hand: the write happened (``committed``) or not (``rejected``).

        For an effect that no service can settle (a write tool without
        ``reconcile`` whose outcome is unknown). Records ``EffectResolvedByHand``
        in the effect ledger with ``by`` and ``reason``. An invocation paused
        ``reconciliation_required`` can then be resumed: the call's result is
        ``receipt`` (committed) or a ``rejected`` error with ``reason``. An
        effect of an invocation that ended (cancelled, say) is only recorded.

        With ``agent`` (the agent that started the invocation) the receipt is
        stored as its tool redacts outputs (``sensitive_output``), and the real
        value is kept for the resumed run like every redacted output; without
        it the receipt is stored as given.

        Raises:
            EffectNotFoundError: no effect has this key.
            EffectResolutionError: both or neither of ``committed`` and
                ``rejected``; no ``by``; ``rejected`` without a ``reason`` or with a
                ``receipt``; a receipt that is not JSON or not stored faithfully
                (NaN, Infinity); the effect is not open; its invocation may still
                be running; ``agent`` is not its agent or has no such tool; it
                changed meanwhile. Nothing is recorded.
            StoreUnavailableError: the store cannot be written.

        Cancellation: as :meth:`approve`.
        """
        try:
            resolution = hand_resolution(committed=committed, rejected=rejected)
            # Checked again by the aggregate; here before anything is opened or read.
            check_hand_resolution(resolution, by=by, receipt=receipt, reason=reason)
        except AggregateError as error:
            raise EffectResolutionError(str(error)) from None
        if agent is not None and not isinstance(agent, Agent):
            raise UsageError(f"resolve_effect() needs an Agent, got {type(agent).__name__}")
        return await self._source.with_driver(
            partial(
                self._resolve_effect,
                effect_key,
                resolution,
                receipt=receipt,
                reason=reason,
                by=by,
                agent=agent,
            )
        )

    async def _resolve_effect(
        self,
        effect_key: str,
        resolution: Resolution,
        driver: Driver,
        *,
        receipt: JsonValue,
        reason: str | None,
        by: str,
        agent: Agent | None,
    ) -> ResolvedEffect:
        effect = (await driver.reads.effects([effect_key])).get(effect_key)
        if effect is None:
            raise EffectNotFoundError(effect_key)
        invocation = await driver.reads.invocation(effect.invocation_id)
        stored, redacted = receipt, None
        if agent is not None:
            if agent.name != invocation.agent_name:
                raise EffectResolutionError(
                    f"effect {effect_key} belongs to invocation {invocation.id} of agent "
                    f"{invocation.agent_name!r}, not {agent.name!r}"
                )
            if effect.tool not in agent.toolbox.tools:
                raise EffectResolutionError(
                    f"agent {agent.name!r} has no tool {effect.tool!r} now, so its receipt "
                    "cannot be redacted as the tool says; resolve without the agent to store "
                    "it as given"
                )
            # A receipt is an output of the write: stored as the tool redacts it.
            stored = agent.toolbox.redact_output(effect.tool, receipt)
            redacted = stored is not receipt
        try:
            effect.resolve_by_hand(
                resolution,
                by=by,
                invocation_phase=invocation.phase,
                receipt=stored,
                reason=reason,
                at=self.now(),
            )
        except AggregateError as error:
            raise EffectResolutionError(str(error)) from None
        if redacted and invocation.phase is not Phase.TERMINATED:
            # The resumed run shows the model the real receipt (sealed when a cipher is set).
            secret = KeptSecret(effect.step, effect.call_id, "output", receipt)
            await trio.to_thread.run_sync(driver.secrets.load, invocation.id)
            driver.secrets.keep(invocation.id, [secret])
            await trio.to_thread.run_sync(driver.secrets.save, invocation.id)
        outcome = await driver.journal.commit(effect.take_events())
        if isinstance(outcome, CommitFailed):
            if outcome.conflict:
                raise EffectResolutionError(
                    f"effect {effect_key} changed meanwhile; look at it again "
                    f"(loop-actors history {effect_key})"
                )
            raise StoreUnavailableError(f"{outcome.error_type}: {outcome.message}")
        return ResolvedEffect(
            effect_key=effect_key,
            invocation_id=invocation.id,
            tool=effect.tool,
            resolution=resolution,
            by=by,
            receipt=stored,
            reason=reason,
            redacted=redacted,
            resumable=invocation.paused_for_reconciliation,
        )

    async def _record(
        self, invocation_id: str, apply: Callable[[Invocation], None], *, top_only: bool = False
    ) -> None:
        await self._source.with_driver(
            partial(self._record_open, invocation_id, apply, top_only=top_only)
        )

    async def _record_open(
        self,
        invocation_id: str,
        apply: Callable[[Invocation], None],
        driver: Driver,
        *,
        top_only: bool = False,
    ) -> None:
        top = await driver.reads.invocation(invocation_id)
        invocation = top
        paused = top.paused
        if (
            not top_only
            and top.phase is Phase.AWAITING_CHILD
            and paused is not None
            and paused.child_path
        ):
            # It waits for a child (or one below it): the decision is that one's.
            invocation = await driver.reads.invocation(paused.child_path[-1])
        apply(invocation)
        outcome = await driver.journal.commit(invocation.take_events())
        if isinstance(outcome, CommitFailed):
            if outcome.conflict:
                raise ApprovalRefusedError(
                    f"invocation {invocation.id} changed meanwhile; look at it again"
                )
            raise StoreUnavailableError(f"{outcome.error_type}: {outcome.message}")
        # A worker may take it now (and the tree from the top, which drives it on).
        for ready in {invocation.id: invocation, top.id: top}.values():
            await driver.queue_status(
                ready.id,
                QueueStatus.RUNNABLE,
                [QueueStatus.PAUSED, QueueStatus.RUNNABLE],
                ready.agent_name,
            )
