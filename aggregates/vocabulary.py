"""The closed vocabularies of an agent loop: terminal reasons, error and rejection classes.

Each is an ``enum.StrEnum`` whose values are persisted inside events: a contract, changed
only with a new ``schema_version`` and an upcaster. They are here, apart from the pydantic
models of ``aggregates.decisions`` (which re-exports them), so that code that only names
a reason or a class (an error, the command line) builds no model.
"""

from __future__ import annotations

from enum import StrEnum


class TerminalReason(StrEnum):
    """Why an invocation stopped: the closed vocabulary of DESIGN.md."""

    COMPLETED = "completed"
    APPROVAL_REQUIRED = "approval_required"
    CLARIFICATION_REQUIRED = "clarification_required"
    CANNOT_CONTINUE = "cannot_continue"
    CANCELLED = "cancelled"
    DEADLINE_EXCEEDED = "deadline_exceeded"
    MAX_STEPS = "max_steps"
    TOOL_BUDGET_EXHAUSTED = "tool_budget_exhausted"
    TOKEN_BUDGET_EXHAUSTED = "token_budget_exhausted"  # noqa: S105 - a reason, not a secret
    COST_BUDGET_EXHAUSTED = "cost_budget_exhausted"
    NO_PROGRESS = "no_progress"
    REPEATED_FAILURE = "repeated_failure"
    INVALID_DECISION = "invalid_decision"
    MODEL_ERROR = "model_error"
    TOOL_UNAVAILABLE = "tool_unavailable"
    VERIFICATION_FAILED = "verification_failed"
    CHECKPOINT_FAILED = "checkpoint_failed"
    LEASE_LOST = "lease_lost"
    RECONCILIATION_REQUIRED = "reconciliation_required"
    HANDED_OFF = "handed_off"
    """The model handed the conversation to another agent, which goes on as a new invocation."""
    SLEEPING = "sleeping"
    """Paused until a time (``Paused.wake_at``): a ``wait`` decision, or a tool that called
    ``ctx.sleep_until``; a worker (or ``wake``) drives it on once it is due."""
    RATE_LIMITED = "rate_limited"
    """Paused before a model call: the provider's shared rate limit had no quota for it
    within the limit's ``max_wait_s``; it sleeps until the quota is there (``wake_at``)."""
    PLAN_APPROVAL_REQUIRED = "plan_approval_required"
    """Paused: the model of an agent with ``planning`` proposed a plan (``PlanProposed``);
    a person approves it (by its digest) or denies it, and the run goes on."""

    @property
    def pauses(self) -> bool:
        """True for the reasons that pause an invocation instead of ending it."""
        return self in PAUSING_REASONS


PAUSING_REASONS = frozenset(
    {
        TerminalReason.APPROVAL_REQUIRED,
        TerminalReason.CLARIFICATION_REQUIRED,
        TerminalReason.RECONCILIATION_REQUIRED,
        TerminalReason.SLEEPING,
        TerminalReason.RATE_LIMITED,
        TerminalReason.PLAN_APPROVAL_REQUIRED,
    }
)


class ErrorClass(StrEnum):
    """The class of a failed tool call, as the model and the operator see it."""

    INVALID_ARGUMENTS = "invalid_arguments"
    TOOL_FAILED = "tool_failed"
    TIMEOUT = "timeout"
    CANCELLED = "cancelled"
    DEADLINE_EXCEEDED = "deadline_exceeded"
    DENIED = "denied"
    UNAVAILABLE = "unavailable"
    OUTCOME_UNKNOWN = "outcome_unknown"
    REJECTED = "rejected"
    OUTPUT_INVALID = "output_invalid"


class RejectionClass(StrEnum):
    """Why a model's proposal was refused before anything ran."""

    SCHEMA_INVALID = "schema_invalid"
    UNKNOWN_TOOL = "unknown_tool"
    DUPLICATE_CALL_ID = "duplicate_call_id"
    INVALID_ARGUMENTS = "invalid_arguments"
    EMPTY_BATCH = "empty_batch"
    EMPTY_ANSWER = "empty_answer"
    UNSUPPORTED_VERSION = "unsupported_version"
    UNKNOWN_HANDOFF = "unknown_handoff"
    """A handoff to an agent that is not one of the agent's ``handoffs`` (or one too many)."""
    VALUE_INVALID = "value_invalid"
    """It holds a value that cannot be stored faithfully (NaN, a lone surrogate, too deep...)."""
    TOO_LARGE = "too_large"
    """It is larger than the run's ``max_proposal_bytes``."""
    INVALID_PLAN = "invalid_plan"
    """A plan that cannot be approved: no steps, a step that is not a write, or a plan
    from an agent that does not plan."""


class EffectStatus(StrEnum):
    """Where an external write stands in the effect ledger."""

    PREPARED = "prepared"
    DISPATCHED = "dispatched"
    COMMITTED = "committed"
    REJECTED = "rejected"
    OUTCOME_UNKNOWN = "outcome_unknown"
    RECONCILED = "reconciled"


class ToolEffect(StrEnum):
    """What a tool does to the world: reads may run concurrently, writes run one at a time."""

    READ = "read"
    WRITE = "write"
