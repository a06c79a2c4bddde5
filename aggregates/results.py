"""The one place where results are made up by trusted code instead of returned by a tool.

A call that was denied, cut short, never started, or settled through the
effect ledger still gets exactly one result. Every such result is built here.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from aggregates.decisions import EffectStatus, ErrorClass, ErrorInfo, ToolResult
from aggregates.effect import Effect
from aggregates.invocation import DispatchedCall
from aggregates.redaction import holds_redacted


class Interruption(StrEnum):
    """Whether a batch ran to the end or was cut short."""

    NONE = "none"
    DEADLINE = "deadline"
    CANCELLED = "cancelled"


def error_result(
    call: DispatchedCall,
    error_class: ErrorClass,
    message: str,
    *,
    retryable: bool = False,
    duration_ms: float = 0.0,
    effect_status: EffectStatus | None = None,
) -> ToolResult:
    """A call's result that is an error (a write's effect key is kept with its status)."""
    return ToolResult(
        call_id=call.call_id,
        name=call.name,
        error=ErrorInfo(error_class=error_class, retryable=retryable, message=message),
        duration_ms=duration_ms,
        effect_key=call.effect_key if effect_status is not None else None,
        effect_status=effect_status,
    )


def denied_result(call: DispatchedCall, message: str) -> ToolResult:
    """A call that was denied (by a person or the policy): it did not run."""
    return error_result(call, ErrorClass.DENIED, message)


def unreported_result(call: DispatchedCall) -> ToolResult:
    """A call the invocation was cancelled before it reported (a write's outcome is unknown)."""
    if call.effect_key:
        return error_result(
            call,
            ErrorClass.OUTCOME_UNKNOWN,
            "the invocation was cancelled before this call reported",
            effect_status=EffectStatus.OUTCOME_UNKNOWN,
        )
    return error_result(
        call, ErrorClass.CANCELLED, "the invocation was cancelled before this call reported"
    )


def interrupted_result(
    call: DispatchedCall, interruption: Interruption, *, started: bool
) -> ToolResult:
    """A call that a deadline or a cancellation cut short (or that never started)."""
    if call.effect_key is not None and started:
        # A write that was running may or may not have reached its service.
        return error_result(
            call,
            ErrorClass.OUTCOME_UNKNOWN,
            f"interrupted ({interruption.value}) while the write ran",
            effect_status=EffectStatus.OUTCOME_UNKNOWN,
        )
    if interruption is Interruption.DEADLINE:
        error_class, message = ErrorClass.DEADLINE_EXCEEDED, "the invocation's deadline passed"
    else:
        error_class, message = ErrorClass.CANCELLED, "the invocation was cancelled"
    if not started:
        message += "; the call never started"
    # A write that never started certainly did not happen.
    status = EffectStatus.REJECTED if call.effect_key is not None else None
    return error_result(call, error_class, message, effect_status=status)


def write_result(
    call: DispatchedCall,
    status: EffectStatus,
    *,
    receipt: Any = None,
    rejected: str | None = None,
) -> ToolResult:
    """A write's result as the effect ledger knows it: its receipt, or why it was refused."""
    if rejected is not None:
        return error_result(call, ErrorClass.REJECTED, rejected, effect_status=status)
    return ToolResult(
        call_id=call.call_id,
        name=call.name,
        output=receipt,
        effect_key=call.effect_key,
        effect_status=status,
    )


def known_result(call: DispatchedCall, effect: Effect) -> ToolResult | None:
    """The result the ledger already knows for a write, or None if it must still be settled."""
    happened = effect.happened
    if happened is None:
        return None
    if happened:
        return write_result(call, effect.status, receipt=effect.receipt)
    return write_result(call, effect.status, rejected=effect.reason or "rejected")


def split_unrevealed(
    calls: list[DispatchedCall],
) -> tuple[list[DispatchedCall], dict[str, ToolResult]]:
    """The calls that may run, and a result for each call that may not, by call id.

    A call whose arguments still hold redacted values once revealed (no secret store
    holds them) does not run: its result is ``arguments_gone_result``.
    """
    runnable: list[DispatchedCall] = []
    gone: dict[str, ToolResult] = {}
    for call in calls:
        if holds_redacted(call.arguments):
            gone[call.call_id] = arguments_gone_result(call)
        else:
            runnable.append(call)
    return runnable, gone


def arguments_gone_result(call: DispatchedCall) -> ToolResult:
    """A call that cannot run: its sensitive arguments were redacted and are not kept."""
    return error_result(
        call,
        ErrorClass.INVALID_ARGUMENTS,
        "not run: its sensitive arguments were redacted before they were stored, and no "
        "secret store of this runtime holds them (configure a cipher to keep them across "
        "processes); propose the call again",
        retryable=True,
        effect_status=EffectStatus.REJECTED if call.effect_key else None,
    )
