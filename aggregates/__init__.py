"""The pure domain of loop-actors: decisions, budgets, reasons and the Invocation aggregate.

Nothing here does I/O, reads a clock or imports trio.
"""

from aggregates.decisions import (
    DECISION_SCHEMA_VERSION as DECISION_SCHEMA_VERSION,
)
from aggregates.decisions import (
    Budget as Budget,
)
from aggregates.decisions import (
    CannotContinue as CannotContinue,
)
from aggregates.decisions import (
    Clarification as Clarification,
)
from aggregates.decisions import (
    Decision as Decision,
)
from aggregates.decisions import (
    ErrorClass as ErrorClass,
)
from aggregates.decisions import (
    ErrorInfo as ErrorInfo,
)
from aggregates.decisions import (
    Final as Final,
)
from aggregates.decisions import (
    Rejection as Rejection,
)
from aggregates.decisions import (
    RejectionClass as RejectionClass,
)
from aggregates.decisions import (
    RequestApproval as RequestApproval,
)
from aggregates.decisions import (
    TerminalReason as TerminalReason,
)
from aggregates.decisions import (
    ToolCall as ToolCall,
)
from aggregates.decisions import (
    ToolCalls as ToolCalls,
)
from aggregates.decisions import (
    ToolEffect as ToolEffect,
)
from aggregates.decisions import (
    ToolResult as ToolResult,
)
from aggregates.decisions import (
    Usage as Usage,
)
from aggregates.decisions import (
    parse_decision as parse_decision,
)
from aggregates.errors import AggregateError as AggregateError
from aggregates.errors import IllegalTransitionError as IllegalTransitionError
from aggregates.invocation import (
    BatchDispatched as BatchDispatched,
)
from aggregates.invocation import (
    DecisionProposed as DecisionProposed,
)
from aggregates.invocation import (
    DispatchedCall as DispatchedCall,
)
from aggregates.invocation import (
    Invocation as Invocation,
)
from aggregates.invocation import (
    InvocationEvent as InvocationEvent,
)
from aggregates.invocation import (
    InvocationStarted as InvocationStarted,
)
from aggregates.invocation import (
    Paused as Paused,
)
from aggregates.invocation import (
    Phase as Phase,
)
from aggregates.invocation import (
    ResultsCommitted as ResultsCommitted,
)
from aggregates.invocation import (
    Terminated as Terminated,
)
from aggregates.invocation import (
    ToolSpec as ToolSpec,
)
from aggregates.invocation import (
    Turn as Turn,
)
from aggregates.invocation import (
    plan_fingerprint as plan_fingerprint,
)
from aggregates.topics import PERSISTED_TOPICS as PERSISTED_TOPICS
