"""The pure domain of loop-actors: decisions, budgets, reasons and the Invocation aggregate.

Nothing here does I/O, reads a clock or imports trio.

Every name below is imported when first used (PEP 562), so that importing one module
of the package (``aggregates.values``, ``aggregates.lease``) does not build every
pydantic model of the domain. The persisted topics are registered by
``aggregates.topics``, which the store's mapper imports before it reads a row.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from aggregates.lazy_names import lazy_names

if TYPE_CHECKING:
    from aggregates.decisions import DECISION_SCHEMA_VERSION as DECISION_SCHEMA_VERSION
    from aggregates.decisions import Budget as Budget
    from aggregates.decisions import CannotContinue as CannotContinue
    from aggregates.decisions import Clarification as Clarification
    from aggregates.decisions import Decision as Decision
    from aggregates.decisions import ErrorClass as ErrorClass
    from aggregates.decisions import ErrorInfo as ErrorInfo
    from aggregates.decisions import Final as Final
    from aggregates.decisions import Plan as Plan
    from aggregates.decisions import PlanStep as PlanStep
    from aggregates.decisions import Rejection as Rejection
    from aggregates.decisions import RejectionClass as RejectionClass
    from aggregates.decisions import RequestApproval as RequestApproval
    from aggregates.decisions import TerminalReason as TerminalReason
    from aggregates.decisions import ToolCall as ToolCall
    from aggregates.decisions import ToolCalls as ToolCalls
    from aggregates.decisions import ToolEffect as ToolEffect
    from aggregates.decisions import ToolResult as ToolResult
    from aggregates.decisions import Usage as Usage
    from aggregates.decisions import Wait as Wait
    from aggregates.decisions import parse_decision as parse_decision
    from aggregates.errors import AggregateError as AggregateError
    from aggregates.errors import IllegalTransitionError as IllegalTransitionError
    from aggregates.invocation import BatchDispatched as BatchDispatched
    from aggregates.invocation import DecisionProposed as DecisionProposed
    from aggregates.invocation import DispatchedCall as DispatchedCall
    from aggregates.invocation import Invocation as Invocation
    from aggregates.invocation import InvocationEvent as InvocationEvent
    from aggregates.invocation import InvocationStarted as InvocationStarted
    from aggregates.invocation import Paused as Paused
    from aggregates.invocation import Phase as Phase
    from aggregates.invocation import ResultsCommitted as ResultsCommitted
    from aggregates.invocation import Terminated as Terminated
    from aggregates.invocation import ToolSpec as ToolSpec
    from aggregates.invocation import Turn as Turn
    from aggregates.invocation import plan_fingerprint as plan_fingerprint
    from aggregates.topics import PERSISTED_TOPICS as PERSISTED_TOPICS

_EXPORTS: dict[str, str] = {
    "DECISION_SCHEMA_VERSION": "aggregates.decisions",
    "Budget": "aggregates.decisions",
    "CannotContinue": "aggregates.decisions",
    "Clarification": "aggregates.decisions",
    "Wait": "aggregates.decisions",
    "Decision": "aggregates.decisions",
    "ErrorClass": "aggregates.decisions",
    "ErrorInfo": "aggregates.decisions",
    "Final": "aggregates.decisions",
    "Plan": "aggregates.decisions",
    "PlanStep": "aggregates.decisions",
    "Rejection": "aggregates.decisions",
    "RejectionClass": "aggregates.decisions",
    "RequestApproval": "aggregates.decisions",
    "TerminalReason": "aggregates.decisions",
    "ToolCall": "aggregates.decisions",
    "ToolCalls": "aggregates.decisions",
    "ToolEffect": "aggregates.decisions",
    "ToolResult": "aggregates.decisions",
    "Usage": "aggregates.decisions",
    "parse_decision": "aggregates.decisions",
    "AggregateError": "aggregates.errors",
    "IllegalTransitionError": "aggregates.errors",
    "BatchDispatched": "aggregates.invocation",
    "DecisionProposed": "aggregates.invocation",
    "DispatchedCall": "aggregates.invocation",
    "Invocation": "aggregates.invocation",
    "InvocationEvent": "aggregates.invocation",
    "InvocationStarted": "aggregates.invocation",
    "Paused": "aggregates.invocation",
    "Phase": "aggregates.invocation",
    "ResultsCommitted": "aggregates.invocation",
    "Terminated": "aggregates.invocation",
    "ToolSpec": "aggregates.invocation",
    "Turn": "aggregates.invocation",
    "plan_fingerprint": "aggregates.invocation",
    "PERSISTED_TOPICS": "aggregates.topics",
}
"""Each public name and the module it is defined in (under the same name)."""

__all__ = [
    "DECISION_SCHEMA_VERSION",
    "PERSISTED_TOPICS",
    "AggregateError",
    "BatchDispatched",
    "Budget",
    "CannotContinue",
    "Clarification",
    "Decision",
    "DecisionProposed",
    "DispatchedCall",
    "ErrorClass",
    "ErrorInfo",
    "Final",
    "IllegalTransitionError",
    "Invocation",
    "InvocationEvent",
    "InvocationStarted",
    "Paused",
    "Phase",
    "Plan",
    "PlanStep",
    "Rejection",
    "RejectionClass",
    "RequestApproval",
    "ResultsCommitted",
    "TerminalReason",
    "Terminated",
    "ToolCall",
    "ToolCalls",
    "ToolEffect",
    "ToolResult",
    "ToolSpec",
    "Turn",
    "Usage",
    "Wait",
    "parse_decision",
    "plan_fingerprint",
]


__getattr__, __dir__ = lazy_names(globals(), _EXPORTS)
