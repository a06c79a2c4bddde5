"""What the core records outside a turn, and the records every turn shares.

A failed commit's terminal reason, a cancellation that came from outside, a
paused invocation cancelled, a service's answer about an ended invocation's
write; the digest of a batch, a write's outcome in its ledger entry, and the one
admission of a service's receipt. Importable from :mod:`aggregates.turn` as before.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from aggregates.decisions import (
    EffectStatus,
    TerminalReason,
    ToolCalls,
    ToolResult,
)
from aggregates.digest import digest_of
from aggregates.effect import Effect, receipt_problem
from aggregates.errors import AggregateError
from aggregates.invocation import DispatchedCall, Invocation, Phase
from aggregates.redaction import (
    holds_redacted,
    redacted_values,
    scrub,
    withheld,
)
from aggregates.results import (
    unreported_result,
)
from aggregates.standing import stopped
from aggregates.turn_messages import WITHHELD_WHY, Catalogue, EffectAnswered
from aggregates.values import (
    limit_size,
    safe_text,
)


def stop_after_failed_commit(*, conflict: bool, error: str) -> tuple[TerminalReason, str]:
    """Why a run stops when the store refused a commit, and the detail to report.

    Nothing is recorded either way. A conflict means another worker appended to
    this invocation first: ``lease_lost`` (the invocation is the other worker's).
    Any other failure is ``checkpoint_failed``: the store stays at the last commit,
    a consistent point of the turn protocol, and ``resume`` continues from there
    once the store works again (DESIGN.md, Resume).
    """
    if conflict:
        return (
            TerminalReason.LEASE_LOST,
            f"another worker appended to this invocation first ({error})",
        )
    return (
        TerminalReason.CHECKPOINT_FAILED,
        f"{error}; nothing of this step was recorded: resume continues from the last commit",
    )


def record_outside_cancellation(
    invocation: Invocation, *, at: datetime, detail: str | None = None
) -> bool:
    """The caller's scope was cancelled: record ``cancelled`` in the reloaded invocation.

    A running batch gets results first (writes among them stay open in the ledger:
    nobody knows whether they reached their service). Returns whether anything
    was recorded.
    """
    if invocation.phase is Phase.DISPATCHED and invocation.pending_batch is not None:
        invocation.commit_results(
            [unreported_result(call) for call in invocation.pending_batch.calls], at=at
        )
    if stopped(invocation.phase) is not None:
        return bool(invocation.pending_events)
    invocation.terminate(TerminalReason.CANCELLED, detail=detail or "the caller cancelled", at=at)
    return True


def cancel_paused(invocation: Invocation, detail: str, *, at: datetime) -> None:
    """End a paused invocation ``cancelled`` (a batch waiting for its service gets results)."""
    waits_for_batch = invocation.phase in (
        Phase.AWAITING_RECONCILIATION,
        Phase.AWAITING_CHILD,
        Phase.SLEEPING,
    )
    if waits_for_batch and invocation.pending_batch is not None:
        invocation.commit_results(
            [unreported_result(call) for call in invocation.pending_batch.calls], at=at
        )
    invocation.terminate(TerminalReason.CANCELLED, detail=detail, at=at)


def settle_ended_effect(
    invocation: Invocation,
    effect: Effect,
    answer: EffectAnswered,
    catalogue: Catalogue,
    *,
    max_bytes: int,
    at: datetime,
) -> str | None:
    """Record a service's answer about an open write of an invocation that has ended.

    The receipt is stored as the tool redacts its output, within ``max_bytes``; the
    service's reason is scrubbed of the receipt's sensitive values, and withheld when
    the call's stored arguments hold a redacted value (its real value was deleted
    with the invocation's secrets when it ended, so the reason cannot be scrubbed of
    it). A receipt that cannot be stored faithfully is not recorded: the effect stays
    open, and the problem is returned (None when the answer was recorded).
    """
    admitted = admit_receipt(catalogue, effect.tool, answer, max_bytes=max_bytes)
    if isinstance(admitted, str):
        return admitted
    _, receipt = admitted
    reason = answer.reason
    if reason is not None:
        if holds_redacted(_proposed_arguments(invocation, effect.step, effect.call_id)):
            reason = withheld(reason, WITHHELD_WHY)
        else:
            reason = safe_text(scrub(reason, redacted_values(answer.receipt, receipt)))
    effect.reconcile(answer.status, receipt=receipt, reason=reason, at=at)
    return None


def admit_receipt(
    catalogue: Catalogue, tool: str, answer: EffectAnswered, *, max_bytes: int
) -> tuple[Any, Any] | str:
    """A service's receipt as the ledger stores it, or why it cannot be (the one admission).

    The receipt is checked by :func:`aggregates.effect.receipt_problem` (the rules of
    every stored JSON value, as for a receipt given by hand), then redacted as the
    tool redacts its output (a receipt is an output of the write), then cut to
    ``max_bytes``. Returns ``(redacted, stored)``: the receipt as redacted (the same
    object when the tool redacts nothing) and as stored; or the problem, as text.
    """
    problem = receipt_problem(answer.receipt)
    if problem is not None:
        return f"its receipt cannot be stored faithfully: {problem}"
    redacted = catalogue.redact_output(tool, answer.receipt)
    stored, _ = limit_size(redacted, max_bytes=max_bytes)
    return redacted, stored


def _proposed_arguments(invocation: Invocation, step: int, call_id: str) -> Any:
    """A call's arguments as they were stored with its decision (None if not found)."""
    for turn in invocation.turns:
        if turn.step == step and isinstance(turn.decision, ToolCalls):
            for call in turn.decision.calls:
                if call.id == call_id:
                    return call.arguments
    return None


# --------------------------------------------------------------------------- helpers


def batch_digest(invocation_id: str, step: int, calls: list[DispatchedCall]) -> str:
    """The digest of an exact proposed batch: what an approver approves."""
    return digest_of(
        {
            "invocation_id": invocation_id,
            "step": step,
            "calls": [call.model_dump(mode="json", exclude_none=True) for call in calls],
        }
    )


def record_outcome(effect: Effect, result: ToolResult, *, at: datetime) -> None:
    """Put what the tool run saw of a write into its ledger entry."""
    message = result.error.message if result.error is not None else ""
    match result.effect_status:
        case EffectStatus.COMMITTED:
            effect.commit(result.output, at=at)
        case EffectStatus.REJECTED:
            effect.reject(message, at=at)
        case EffectStatus.OUTCOME_UNKNOWN:
            effect.mark_unknown(message, at=at)
        case _:
            raise AggregateError(f"a write ended without an effect status: {result}")
