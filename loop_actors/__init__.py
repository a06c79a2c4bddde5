"""loop-actors: an event-sourced runtime for AI agent loops on trio.

The public API: every name a user needs is imported from here. The code lives in
subpackages by responsibility (``agent``, ``store``, ``audit``, ``runtime``,
``workers``, ``eval``, ``cli``), each importing only those below it
(docs/explanation/architecture.md); their modules are internal.

Every name is imported when first used (PEP 562), so that ``import loop_actors``, and
``loop-actors --version``, import neither trio nor eventsourcing until a name that
needs them is used. The ``TYPE_CHECKING`` block re-exports the same names for type
checkers and editors; a test checks that it and ``_EXPORTS`` agree with ``__all__``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from aggregates.lazy_names import lazy_names

if TYPE_CHECKING:
    from aggregates.children import ChildOutcome as ChildOutcome
    from aggregates.children import ParentEnd as ParentEnd
    from aggregates.children import Spent as Spent
    from aggregates.critic import CriticBudget as CriticBudget
    from aggregates.critic import CriticSpent as CriticSpent
    from aggregates.critic import Verdict as Verdict
    from aggregates.decisions import Budget as Budget
    from aggregates.decisions import CannotContinue as CannotContinue
    from aggregates.decisions import Clarification as Clarification
    from aggregates.decisions import Decision as Decision
    from aggregates.decisions import Effect as Effect  # the former name of ToolEffect
    from aggregates.decisions import EffectStatus as EffectStatus
    from aggregates.decisions import ErrorClass as ErrorClass
    from aggregates.decisions import ErrorInfo as ErrorInfo
    from aggregates.decisions import Final as Final
    from aggregates.decisions import Handoff as Handoff
    from aggregates.decisions import Plan as Plan
    from aggregates.decisions import PlanStep as PlanStep
    from aggregates.decisions import Price as Price
    from aggregates.decisions import RejectionClass as RejectionClass
    from aggregates.decisions import RequestApproval as RequestApproval
    from aggregates.decisions import TerminalReason as TerminalReason
    from aggregates.decisions import ToolCall as ToolCall
    from aggregates.decisions import ToolCalls as ToolCalls
    from aggregates.decisions import ToolEffect as ToolEffect
    from aggregates.decisions import ToolResult as ToolResult
    from aggregates.decisions import Usage as Usage
    from aggregates.decisions import Wait as Wait
    from aggregates.effect import Resolution as Resolution
    from aggregates.fork import ForkRefusal as ForkRefusal
    from aggregates.fork_origin import ForkOrigin as ForkOrigin
    from aggregates.fork_origin import ForkWrites as ForkWrites
    from aggregates.fork_origin import SourceWrite as SourceWrite
    from aggregates.handoffs import HandoffHistory as HandoffHistory
    from aggregates.handoffs import HandoffOrigin as HandoffOrigin
    from aggregates.planning import ApproveBy as ApproveBy
    from aggregates.planning import Planning as Planning
    from aggregates.rate_limits import RateLimit as RateLimit
    from aggregates.replay import Divergence as Divergence
    from aggregates.replay import DivergenceKind as DivergenceKind
    from aggregates.schedules import CatchUp as CatchUp
    from aggregates.schedules import Overlap as Overlap
    from aggregates.schedules import Schedule as Schedule
    from aggregates.schedules import ScheduleProblem as ScheduleProblem
    from aggregates.schedules import ScheduleState as ScheduleState
    from aggregates.settings import RunSettings as RunSettings
    from loop_actors._errors import AgentLoadError as AgentLoadError
    from loop_actors._errors import ApprovalRefusedError as ApprovalRefusedError
    from loop_actors._errors import EffectNotFoundError as EffectNotFoundError
    from loop_actors._errors import EffectResolutionError as EffectResolutionError
    from loop_actors._errors import ForkRefusedError as ForkRefusedError
    from loop_actors._errors import InconsistentHistoryError as InconsistentHistoryError
    from loop_actors._errors import InvocationExistsError as InvocationExistsError
    from loop_actors._errors import InvocationNotFoundError as InvocationNotFoundError
    from loop_actors._errors import LeaseHeldError as LeaseHeldError
    from loop_actors._errors import LoopActorsError as LoopActorsError
    from loop_actors._errors import NotWaitingError as NotWaitingError
    from loop_actors._errors import RuntimeBusyError as RuntimeBusyError
    from loop_actors._errors import ScheduleError as ScheduleError
    from loop_actors._errors import ScheduleExistsError as ScheduleExistsError
    from loop_actors._errors import ScheduleNotFoundError as ScheduleNotFoundError
    from loop_actors._errors import ScriptExhaustedError as ScriptExhaustedError
    from loop_actors._errors import SleepTimeError as SleepTimeError
    from loop_actors._errors import StoreCipherError as StoreCipherError
    from loop_actors._errors import StoreReadOnlyError as StoreReadOnlyError
    from loop_actors._errors import StoreUnavailableError as StoreUnavailableError
    from loop_actors._errors import StoreUrlError as StoreUrlError
    from loop_actors._errors import SubmissionError as SubmissionError
    from loop_actors._errors import SubmissionProblem as SubmissionProblem
    from loop_actors._errors import ToolDefinitionError as ToolDefinitionError
    from loop_actors._errors import ToolError as ToolError
    from loop_actors._errors import UnreadableEventError as UnreadableEventError
    from loop_actors._errors import UsageError as UsageError
    from loop_actors._logs import BackgroundLoop as BackgroundLoop
    from loop_actors._logs import JsonLogFormatter as JsonLogFormatter
    from loop_actors._logs import TextLogFormatter as TextLogFormatter
    from loop_actors._messages import ModelReply as ModelReply
    from loop_actors._messages import ModelRequest as ModelRequest
    from loop_actors._statistics import ErrorSeen as ErrorSeen
    from loop_actors._statistics import JournalStatistics as JournalStatistics
    from loop_actors._statistics import QuotaStatistics as QuotaStatistics
    from loop_actors._statistics import RuntimeStatistics as RuntimeStatistics
    from loop_actors._statistics import ScheduleDue as ScheduleDue
    from loop_actors._statistics import ScheduleStatistics as ScheduleStatistics
    from loop_actors._statistics import WorkerStatistics as WorkerStatistics
    from loop_actors.agent.adapters import AnthropicModel as AnthropicModel
    from loop_actors.agent.adapters import ModelCallError as ModelCallError
    from loop_actors.agent.adapters import OpenAIModel as OpenAIModel
    from loop_actors.agent.adapters import ProviderErrorClass as ProviderErrorClass
    from loop_actors.agent.adapters import RetryPolicy as RetryPolicy
    from loop_actors.agent.adapters import model_from_name as model_from_name
    from loop_actors.agent.agent import Agent as Agent
    from loop_actors.agent.agent import CatalogueChangedError as CatalogueChangedError
    from loop_actors.agent.agent import HandoffTo as HandoffTo
    from loop_actors.agent.agent import SettingsChangedError as SettingsChangedError
    from loop_actors.agent.critic import Critic as Critic
    from loop_actors.agent.mcp import HttpServer as HttpServer
    from loop_actors.agent.mcp import McpServer as McpServer
    from loop_actors.agent.mcp import McpTool as McpTool
    from loop_actors.agent.mcp import StdioServer as StdioServer
    from loop_actors.agent.mcp import mcp_tools as mcp_tools
    from loop_actors.agent.mcp import mcp_tools_async as mcp_tools_async
    from loop_actors.agent.model import Model as Model
    from loop_actors.agent.model import ScriptedModel as ScriptedModel
    from loop_actors.agent.policy import AccessRequest as AccessRequest
    from loop_actors.agent.policy import Deny as Deny
    from loop_actors.agent.tools import ChildPausedError as ChildPausedError
    from loop_actors.agent.tools import Reconciled as Reconciled
    from loop_actors.agent.tools import SleepRequested as SleepRequested
    from loop_actors.agent.tools import Tool as Tool
    from loop_actors.agent.tools import ToolContext as ToolContext
    from loop_actors.agent.tools import tool as tool
    from loop_actors.runtime.asyncio_runtime import AsyncioRuntime as AsyncioRuntime
    from loop_actors.runtime.fork import Forked as Forked
    from loop_actors.runtime.gc_policy import GcPolicy as GcPolicy
    from loop_actors.runtime.outcome import Outcome as Outcome
    from loop_actors.runtime.replay import ReplayFilter as ReplayFilter
    from loop_actors.runtime.replay import ReplayMatch as ReplayMatch
    from loop_actors.runtime.replay import ReplayReport as ReplayReport
    from loop_actors.runtime.replay import ReplayResult as ReplayResult
    from loop_actors.runtime.runtime import CancelResult as CancelResult
    from loop_actors.runtime.runtime import NeedsPerson as NeedsPerson
    from loop_actors.runtime.runtime import ReconcileReport as ReconcileReport
    from loop_actors.runtime.runtime import ResolvedEffect as ResolvedEffect
    from loop_actors.runtime.runtime import Runtime as Runtime
    from loop_actors.runtime.submission import Submission as Submission
    from loop_actors.store.read_models import open_runner as open_runner
    from loop_actors.store.store import EventStore as EventStore
    from loop_actors.store.views import ReadModelsStatus as ReadModelsStatus
    from loop_actors.workers.worker import Worker as Worker
    from loop_actors.workers.worker import WorkerReport as WorkerReport

_EXPORTS: dict[str, str] = {
    "Budget": "aggregates.decisions",
    "Critic": "loop_actors.agent.critic",
    "CriticBudget": "aggregates.critic",
    "CriticSpent": "aggregates.critic",
    "Verdict": "aggregates.critic",
    "CannotContinue": "aggregates.decisions",
    "Clarification": "aggregates.decisions",
    "Wait": "aggregates.decisions",
    "Plan": "aggregates.decisions",
    "PlanStep": "aggregates.decisions",
    "ApproveBy": "aggregates.planning",
    "Planning": "aggregates.planning",
    "RateLimit": "aggregates.rate_limits",
    "QuotaStatistics": "loop_actors._statistics",
    "CatchUp": "aggregates.schedules",
    "Overlap": "aggregates.schedules",
    "Schedule": "aggregates.schedules",
    "ScheduleProblem": "aggregates.schedules",
    "ScheduleState": "aggregates.schedules",
    "ScheduleError": "loop_actors._errors",
    "ScheduleExistsError": "loop_actors._errors",
    "ScheduleNotFoundError": "loop_actors._errors",
    "ScheduleDue": "loop_actors._statistics",
    "ScheduleStatistics": "loop_actors._statistics",
    "Decision": "aggregates.decisions",
    "Effect": "aggregates.decisions",  # the former name of ToolEffect
    "EffectStatus": "aggregates.decisions",
    "ErrorClass": "aggregates.decisions",
    "ErrorInfo": "aggregates.decisions",
    "Final": "aggregates.decisions",
    "Price": "aggregates.decisions",
    "RejectionClass": "aggregates.decisions",
    "RequestApproval": "aggregates.decisions",
    "TerminalReason": "aggregates.decisions",
    "ToolCall": "aggregates.decisions",
    "ToolCalls": "aggregates.decisions",
    "ToolEffect": "aggregates.decisions",
    "ToolResult": "aggregates.decisions",
    "Usage": "aggregates.decisions",
    "Resolution": "aggregates.effect",
    "ChildOutcome": "aggregates.children",
    "ParentEnd": "aggregates.children",
    "Spent": "aggregates.children",
    "ChildPausedError": "loop_actors.agent.tools",
    "SleepRequested": "loop_actors.agent.tools",
    "ForkRefusal": "aggregates.fork",
    "Handoff": "aggregates.decisions",
    "HandoffHistory": "aggregates.handoffs",
    "HandoffOrigin": "aggregates.handoffs",
    "HandoffTo": "loop_actors.agent.agent",
    "ForkOrigin": "aggregates.fork_origin",
    "ForkWrites": "aggregates.fork_origin",
    "SourceWrite": "aggregates.fork_origin",
    "RunSettings": "aggregates.settings",
    "AgentLoadError": "loop_actors._errors",
    "ApprovalRefusedError": "loop_actors._errors",
    "EffectNotFoundError": "loop_actors._errors",
    "EffectResolutionError": "loop_actors._errors",
    "ForkRefusedError": "loop_actors._errors",
    "InconsistentHistoryError": "loop_actors._errors",
    "InvocationExistsError": "loop_actors._errors",
    "InvocationNotFoundError": "loop_actors._errors",
    "LeaseHeldError": "loop_actors._errors",
    "LoopActorsError": "loop_actors._errors",
    "NotWaitingError": "loop_actors._errors",
    "RuntimeBusyError": "loop_actors._errors",
    "SleepTimeError": "loop_actors._errors",
    "ScriptExhaustedError": "loop_actors._errors",
    "StoreCipherError": "loop_actors._errors",
    "StoreReadOnlyError": "loop_actors._errors",
    "StoreUnavailableError": "loop_actors._errors",
    "StoreUrlError": "loop_actors._errors",
    "SubmissionError": "loop_actors._errors",
    "SubmissionProblem": "loop_actors._errors",
    "ToolDefinitionError": "loop_actors._errors",
    "ToolError": "loop_actors._errors",
    "UnreadableEventError": "loop_actors._errors",
    "UsageError": "loop_actors._errors",
    "BackgroundLoop": "loop_actors._logs",
    "JsonLogFormatter": "loop_actors._logs",
    "TextLogFormatter": "loop_actors._logs",
    "ErrorSeen": "loop_actors._statistics",
    "JournalStatistics": "loop_actors._statistics",
    "RuntimeStatistics": "loop_actors._statistics",
    "WorkerStatistics": "loop_actors._statistics",
    "ModelReply": "loop_actors._messages",
    "ModelRequest": "loop_actors._messages",
    "AnthropicModel": "loop_actors.agent.adapters",
    "ModelCallError": "loop_actors.agent.adapters",
    "OpenAIModel": "loop_actors.agent.adapters",
    "ProviderErrorClass": "loop_actors.agent.adapters",
    "RetryPolicy": "loop_actors.agent.adapters",
    "model_from_name": "loop_actors.agent.adapters",
    "Agent": "loop_actors.agent.agent",
    "CatalogueChangedError": "loop_actors.agent.agent",
    "SettingsChangedError": "loop_actors.agent.agent",
    "HttpServer": "loop_actors.agent.mcp",
    "McpServer": "loop_actors.agent.mcp",
    "McpTool": "loop_actors.agent.mcp",
    "StdioServer": "loop_actors.agent.mcp",
    "mcp_tools": "loop_actors.agent.mcp",
    "mcp_tools_async": "loop_actors.agent.mcp",
    "Model": "loop_actors.agent.model",
    "ScriptedModel": "loop_actors.agent.model",
    "AccessRequest": "loop_actors.agent.policy",
    "Deny": "loop_actors.agent.policy",
    "Reconciled": "loop_actors.agent.tools",
    "Tool": "loop_actors.agent.tools",
    "ToolContext": "loop_actors.agent.tools",
    "tool": "loop_actors.agent.tools",
    "AsyncioRuntime": "loop_actors.runtime.asyncio_runtime",
    "GcPolicy": "loop_actors.runtime.gc_policy",
    "Outcome": "loop_actors.runtime.outcome",
    "CancelResult": "loop_actors.runtime.runtime",
    "NeedsPerson": "loop_actors.runtime.runtime",
    "ReconcileReport": "loop_actors.runtime.runtime",
    "ResolvedEffect": "loop_actors.runtime.runtime",
    "Runtime": "loop_actors.runtime.runtime",
    "Submission": "loop_actors.runtime.submission",
    "Divergence": "aggregates.replay",
    "DivergenceKind": "aggregates.replay",
    "Forked": "loop_actors.runtime.fork",
    "ReplayFilter": "loop_actors.runtime.replay",
    "ReplayMatch": "loop_actors.runtime.replay",
    "ReplayReport": "loop_actors.runtime.replay",
    "ReplayResult": "loop_actors.runtime.replay",
    "EventStore": "loop_actors.store.store",
    "ReadModelsStatus": "loop_actors.store.views",
    "open_runner": "loop_actors.store.read_models",
    "Worker": "loop_actors.workers.worker",
    "WorkerReport": "loop_actors.workers.worker",
}
"""Each public name and the module it is defined in (under the same name)."""

__all__ = [
    "AccessRequest",
    "Agent",
    "AgentLoadError",
    "AnthropicModel",
    "ApprovalRefusedError",
    "ApproveBy",
    "AsyncioRuntime",
    "BackgroundLoop",
    "Budget",
    "CancelResult",
    "CannotContinue",
    "CatalogueChangedError",
    "CatchUp",
    "ChildOutcome",
    "ChildPausedError",
    "Clarification",
    "Critic",
    "CriticBudget",
    "CriticSpent",
    "Decision",
    "Deny",
    "Divergence",
    "DivergenceKind",
    "Effect",
    "EffectNotFoundError",
    "EffectResolutionError",
    "EffectStatus",
    "ErrorClass",
    "ErrorInfo",
    "ErrorSeen",
    "EventStore",
    "Final",
    "ForkOrigin",
    "ForkRefusal",
    "ForkRefusedError",
    "ForkWrites",
    "Forked",
    "GcPolicy",
    "Handoff",
    "HandoffHistory",
    "HandoffOrigin",
    "HandoffTo",
    "HttpServer",
    "InconsistentHistoryError",
    "InvocationExistsError",
    "InvocationNotFoundError",
    "JournalStatistics",
    "JsonLogFormatter",
    "LeaseHeldError",
    "LoopActorsError",
    "McpServer",
    "McpTool",
    "Model",
    "ModelCallError",
    "ModelReply",
    "ModelRequest",
    "NeedsPerson",
    "NotWaitingError",
    "OpenAIModel",
    "Outcome",
    "Overlap",
    "ParentEnd",
    "Plan",
    "PlanStep",
    "Planning",
    "Price",
    "ProviderErrorClass",
    "QuotaStatistics",
    "RateLimit",
    "ReadModelsStatus",
    "ReconcileReport",
    "Reconciled",
    "RejectionClass",
    "ReplayFilter",
    "ReplayMatch",
    "ReplayReport",
    "ReplayResult",
    "RequestApproval",
    "Resolution",
    "ResolvedEffect",
    "RetryPolicy",
    "RunSettings",
    "Runtime",
    "RuntimeBusyError",
    "RuntimeStatistics",
    "Schedule",
    "ScheduleDue",
    "ScheduleError",
    "ScheduleExistsError",
    "ScheduleNotFoundError",
    "ScheduleProblem",
    "ScheduleState",
    "ScheduleStatistics",
    "ScriptExhaustedError",
    "ScriptedModel",
    "SettingsChangedError",
    "SleepRequested",
    "SleepTimeError",
    "SourceWrite",
    "Spent",
    "StdioServer",
    "StoreCipherError",
    "StoreReadOnlyError",
    "StoreUnavailableError",
    "StoreUrlError",
    "Submission",
    "SubmissionError",
    "SubmissionProblem",
    "TerminalReason",
    "TextLogFormatter",
    "Tool",
    "ToolCall",
    "ToolCalls",
    "ToolContext",
    "ToolDefinitionError",
    "ToolEffect",
    "ToolError",
    "ToolResult",
    "UnreadableEventError",
    "Usage",
    "UsageError",
    "Verdict",
    "Wait",
    "Worker",
    "WorkerReport",
    "WorkerStatistics",
    "mcp_tools",
    "mcp_tools_async",
    "model_from_name",
    "open_runner",
    "tool",
]


__getattr__, __dir__ = lazy_names(globals(), _EXPORTS)
