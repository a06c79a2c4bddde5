"""Every span name, attribute name and metric name that loop-actors emits, in one place.

The ``gen_ai.*`` names follow the OpenTelemetry GenAI semantic conventions as they
stand in ``open-telemetry/semantic-conventions-genai`` at commit ``002c8a6``
(``docs/gen-ai/gen-ai-agent-spans.md``, ``gen-ai-spans.md``) and its
``model/gen-ai/metrics.yaml`` at commit ``004902b``: the registry has no tagged
release, so a commit is what can be pinned (as opentelemetry-js does). Names are
the current ones, not the deprecated constants of
``opentelemetry-semantic-conventions`` (whose ``GEN_AI_*`` are all marked "moved"):
``gen_ai.provider.name`` (not ``gen_ai.system``), ``gen_ai.usage.input_tokens``
(not ``prompt_tokens``), ``gen_ai.usage.cache_write.input_tokens`` (renamed from
``cache_creation`` in semantic-conventions-genai #440).

The ``loop_actors.*`` names are ours: what the conventions have no name for yet
(drives of a paused or resumed run, effect states, reconciliation, tree totals).

Nothing here imports OpenTelemetry: these are strings.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Final

CONVENTIONS_REPOSITORY: Final = "open-telemetry/semantic-conventions-genai"
CONVENTIONS_SPANS_COMMIT: Final = "002c8a6"
"""The commit of the span and attribute definitions these names follow."""
CONVENTIONS_METRICS_COMMIT: Final = "004902b"
"""The commit of ``model/gen-ai/metrics.yaml`` the metric names follow."""
SCHEMA_URL: Final = "https://opentelemetry.io/schemas/1.37.0"
"""The schema URL the instrumentation scope carries (the last one the GenAI names moved in)."""
INSTRUMENTATION_NAME: Final = "loop_actors"

STABILITY_OPT_IN_ENV: Final = "OTEL_SEMCONV_STABILITY_OPT_IN"
"""The conventions' opt-in variable: a comma-separated list of what to emit the latest of."""
GEN_AI_LATEST_EXPERIMENTAL: Final = "gen_ai_latest_experimental"
"""The value (in ``OTEL_SEMCONV_STABILITY_OPT_IN``) that asks for names still in drafts:
the durable-run span events of semantic-conventions-genai PR #445 (an open draft) and
the per-call usage counters of ``model/gen-ai/token-metrics.yaml`` at commit ``066d4a7``
(their shape is not settled). Without it, only the names above are emitted."""
CONVENTIONS_TOKEN_METRICS_COMMIT: Final = "066d4a7"

# --------------------------------------------------------------------------- operations


class Operation(StrEnum):
    """Values of ``gen_ai.operation.name`` (the first word of each span's name)."""

    INVOKE_AGENT = "invoke_agent"
    CHAT = "chat"
    EXECUTE_TOOL = "execute_tool"
    RECONCILE = "reconcile"
    """Ours: a write whose outcome the owning service told on resume (never an execute_tool)."""


# --------------------------------------------------------------------------- gen_ai attributes

OPERATION_NAME: Final = "gen_ai.operation.name"
PROVIDER_NAME: Final = "gen_ai.provider.name"
AGENT_NAME: Final = "gen_ai.agent.name"
AGENT_VERSION: Final = "gen_ai.agent.version"
CONVERSATION_ID: Final = "gen_ai.conversation.id"
REQUEST_MODEL: Final = "gen_ai.request.model"
RESPONSE_MODEL: Final = "gen_ai.response.model"
RESPONSE_FINISH_REASONS: Final = "gen_ai.response.finish_reasons"
USAGE_INPUT_TOKENS: Final = "gen_ai.usage.input_tokens"
USAGE_OUTPUT_TOKENS: Final = "gen_ai.usage.output_tokens"
USAGE_CACHE_READ_INPUT_TOKENS: Final = "gen_ai.usage.cache_read.input_tokens"
USAGE_CACHE_WRITE_INPUT_TOKENS: Final = "gen_ai.usage.cache_write.input_tokens"
TOOL_NAME: Final = "gen_ai.tool.name"
TOOL_CALL_ID: Final = "gen_ai.tool.call.id"
TOOL_TYPE: Final = "gen_ai.tool.type"
TOKEN_TYPE: Final = "gen_ai.token.type"
ERROR_TYPE: Final = "error.type"

# Content: opt-in only (``LOOP_ACTORS_OTEL_CONTENT=on``), as stored (redacted values stay redacted).
INPUT_MESSAGES: Final = "gen_ai.input.messages"
OUTPUT_MESSAGES: Final = "gen_ai.output.messages"
TOOL_CALL_ARGUMENTS: Final = "gen_ai.tool.call.arguments"
TOOL_CALL_RESULT: Final = "gen_ai.tool.call.result"

TOOL_TYPE_FUNCTION: Final = "function"
TOKEN_TYPE_INPUT: Final = "input"
TOKEN_TYPE_OUTPUT: Final = "output"

# --------------------------------------------------------------------------- ours

INVOCATION_ID: Final = "loop_actors.invocation.id"
PARENT_INVOCATION_ID: Final = "loop_actors.invocation.parent_id"
TASK_CLASS: Final = "loop_actors.task_class"
HANDED_OFF_FROM: Final = "loop_actors.invocation.handed_off_from"
"""On a handoff target's drives: the invocation that handed off to it (in the same trace)."""
FORKED_FROM: Final = "loop_actors.invocation.forked_from"
"""On a fork's first drive: the source invocation (the copied steps are in no span)."""
STEP: Final = "loop_actors.step"
DRIVE: Final = "loop_actors.drive"
"""The drive's number in its invocation, from 0."""
DRIVE_END: Final = "loop_actors.drive.end"
"""How the drive ended: a :class:`loop_actors.telemetry.DriveEnd` value."""
TERMINAL_REASON: Final = "loop_actors.terminal_reason"
RESUMED_FROM: Final = "loop_actors.resumed_from"
"""On a drive after the first: the span id (hex) of the drive it continues."""
PAUSED_DURATION: Final = "loop_actors.invocation.paused.duration"
"""On a resumed drive: the seconds the invocation was paused before it (in no span)."""
REJECTION_CLASS: Final = "loop_actors.rejection_class"
COST: Final = "loop_actors.usage.cost"
TOOL_EFFECT: Final = "loop_actors.tool.effect"
TOOL_OUTCOME: Final = "loop_actors.tool.outcome"
"""``ok`` or the error class of the call's result."""
EFFECT_KEY_HASH: Final = "loop_actors.effect.key_hash"
"""SHA-256 of the effect key, hex, first 16 characters: the raw key never leaves the store."""
EFFECT_STATUS: Final = "loop_actors.effect.status"
CHILD_INVOCATION_ID: Final = "loop_actors.child.invocation_id"
TREE_STEPS: Final = "loop_actors.tree.steps"
TREE_TOOL_CALLS: Final = "loop_actors.tree.tool_calls"
TREE_TOKENS: Final = "loop_actors.tree.tokens"
TREE_COST: Final = "loop_actors.tree.cost"
PAUSE_REASON: Final = "loop_actors.pause.reason"
DB_SYSTEM_NAME: Final = "db.system.name"
"""The database conventions' name of the store's server: ``sqlite`` or ``postgresql``."""
JOURNAL_INLINE: Final = "loop_actors.journal.inline"
"""The transaction was written on the trio thread (an idle SQLite runtime's commit)."""
HOLDER_KIND: Final = "loop_actors.holder.kind"
"""What holds the leases: ``worker`` or ``run`` (a Runtime's own runs)."""

# --------------------------------------------------------------------------- span events

EVENT_PAUSED: Final = "paused"
EVENT_RESUMED: Final = "resumed"
EVENT_AGENT_PAUSED: Final = "gen_ai.agent.paused"
"""``paused`` as PR #445 names it (with the opt-in, ``gen_ai_latest_experimental``)."""
EVENT_AGENT_RESUMED: Final = "gen_ai.agent.resumed"
"""``resumed`` as PR #445 names it (with the opt-in)."""

# --------------------------------------------------------------------------- metrics


class InstrumentKind(StrEnum):
    """How a metric is recorded."""

    COUNTER = "counter"
    HISTOGRAM = "histogram"
    GAUGE = "gauge"
    """Observed when the SDK collects (an observable up-down counter): a level, not a sum."""


TOKEN_USAGE: Final = "gen_ai.client.token.usage"
OPERATION_DURATION: Final = "gen_ai.client.operation.duration"
INVOKE_AGENT_DURATION: Final = "gen_ai.invoke_agent.duration"
EXECUTE_TOOL_DURATION: Final = "gen_ai.execute_tool.duration"
RUNS: Final = "loop_actors.invocation.runs"
TURNS: Final = "loop_actors.invocation.turns"
TOOL_CALLS: Final = "loop_actors.tool.calls"
COST_TOTAL: Final = "loop_actors.cost"
EFFECTS: Final = "loop_actors.effects"
APPROVAL_WAIT: Final = "loop_actors.approval.wait"
PAUSED_DURATION_METRIC: Final = "loop_actors.invocation.paused.duration"
INFERENCE_USAGE_INPUT: Final = "gen_ai.client.inference.usage.input_tokens"
INFERENCE_USAGE_OUTPUT: Final = "gen_ai.client.inference.usage.output_tokens"
INFERENCE_USAGE_CACHE_READ: Final = "gen_ai.client.inference.usage.cache_read.input_tokens"
INFERENCE_USAGE_CACHE_WRITE: Final = "gen_ai.client.inference.usage.cache_write.input_tokens"
TOKEN_MODALITY: Final = "gen_ai.token.modality"
"""Required on the inference usage counters: ``text`` for our calls."""
JOURNAL_TRANSACTION_EVENTS: Final = "loop_actors.journal.transaction.events"
JOURNAL_TRANSACTION_DURATION: Final = "loop_actors.journal.transaction.duration"
LEASES_HELD: Final = "loop_actors.leases.held"

INSTRUMENTS: Final[dict[str, tuple[InstrumentKind, str, str]]] = {
    TOKEN_USAGE: (InstrumentKind.HISTOGRAM, "{token}", "Tokens used per model call"),
    OPERATION_DURATION: (InstrumentKind.HISTOGRAM, "s", "Duration of a model call"),
    INVOKE_AGENT_DURATION: (InstrumentKind.HISTOGRAM, "s", "Duration of one drive of an agent"),
    EXECUTE_TOOL_DURATION: (InstrumentKind.HISTOGRAM, "s", "Duration of one tool call"),
    RUNS: (InstrumentKind.COUNTER, "{run}", "Invocations ended, by terminal reason"),
    TURNS: (InstrumentKind.COUNTER, "{turn}", "Model decisions committed"),
    TOOL_CALLS: (InstrumentKind.COUNTER, "{call}", "Tool calls with a result, by outcome"),
    COST_TOTAL: (InstrumentKind.COUNTER, "1", "Model cost, in the unit of the agent's prices"),
    EFFECTS: (InstrumentKind.COUNTER, "{effect}", "Write results, by effect status"),
    APPROVAL_WAIT: (InstrumentKind.HISTOGRAM, "s", "From an approval pause to its answer"),
    PAUSED_DURATION_METRIC: (InstrumentKind.HISTOGRAM, "s", "From a pause to the next drive"),
    INFERENCE_USAGE_INPUT: (InstrumentKind.COUNTER, "{token}", "Input tokens (opt-in)"),
    INFERENCE_USAGE_OUTPUT: (InstrumentKind.COUNTER, "{token}", "Output tokens (opt-in)"),
    INFERENCE_USAGE_CACHE_READ: (
        InstrumentKind.COUNTER,
        "{token}",
        "Input tokens read from the provider's cache (opt-in)",
    ),
    INFERENCE_USAGE_CACHE_WRITE: (
        InstrumentKind.COUNTER,
        "{token}",
        "Input tokens written to the provider's cache (opt-in)",
    ),
    JOURNAL_TRANSACTION_EVENTS: (
        InstrumentKind.HISTOGRAM,
        "{event}",
        "Events one Journal transaction made durable",
    ),
    JOURNAL_TRANSACTION_DURATION: (
        InstrumentKind.HISTOGRAM,
        "s",
        "Duration of one Journal transaction, lock waits included",
    ),
    LEASES_HELD: (InstrumentKind.GAUGE, "{lease}", "Leases this process holds now"),
}
"""Every metric: its kind, unit and description."""
