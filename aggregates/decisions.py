"""The typed vocabulary of an agent loop: decisions, calls, results, budgets and reasons.

Everything here is a frozen pydantic model or a ``StrEnum`` (those of
``aggregates.vocabulary``, re-exported). These types are
persisted inside events, so their field names and enum values are a contract:
change them only with a new ``schema_version`` and an upcaster.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    JsonValue,
    TypeAdapter,
    field_validator,
    model_validator,
)

# Re-exported for the modules that import them from here; their door is aggregates.pydantic_slots.
from aggregates.pydantic_slots import SET_DICT as SET_DICT  # noqa: PLC0414
from aggregates.pydantic_slots import SET_EXTRA as SET_EXTRA  # noqa: PLC0414
from aggregates.pydantic_slots import SET_FIELDS_SET as SET_FIELDS_SET  # noqa: PLC0414
from aggregates.pydantic_slots import SET_PRIVATE as SET_PRIVATE  # noqa: PLC0414
from aggregates.pydantic_slots import built as built  # noqa: PLC0414
from aggregates.values import parse_json_text

# The closed vocabularies live in aggregates.vocabulary (no pydantic); re-exported here.
from aggregates.vocabulary import PAUSING_REASONS as PAUSING_REASONS  # noqa: PLC0414
from aggregates.vocabulary import EffectStatus as EffectStatus  # noqa: PLC0414
from aggregates.vocabulary import ErrorClass as ErrorClass  # noqa: PLC0414
from aggregates.vocabulary import RejectionClass as RejectionClass  # noqa: PLC0414
from aggregates.vocabulary import TerminalReason as TerminalReason  # noqa: PLC0414
from aggregates.vocabulary import ToolEffect as ToolEffect  # noqa: PLC0414

DECISION_SCHEMA_VERSION = 4
"""The newest version of the decision union that this code reads and writes.

Version 2 added ``handoff``, version 3 ``wait``, version 4 ``plan``; each decision carries
the version it came with, and every earlier one is still read."""


class Frozen(BaseModel):
    """A frozen pydantic model that refuses unknown fields."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)


# --------------------------------------------------------------------------- calls


def _parse_json_object(value: Any) -> Any:
    """Accept arguments given as a JSON text (as some providers send them).

    Parsed with the depth guard and the checks of :mod:`aggregates.values`: text that
    nests too deep, or holds NaN, ±Infinity or lone surrogates, is refused.
    """
    if isinstance(value, str | bytes):
        try:
            return parse_json_text(value)
        except ValueError as error:
            msg = f"arguments are not valid JSON: {error}"
            raise ValueError(msg) from error
    return value


class ToolCall(Frozen):
    """One call the model asked for: a unique id, a tool name and a JSON object of arguments."""

    id: Annotated[str, Field(min_length=1, max_length=200)]
    name: Annotated[str, Field(min_length=1, max_length=200)]
    arguments: dict[str, JsonValue] = Field(default_factory=dict)

    _parse_arguments = field_validator("arguments", mode="before")(_parse_json_object)


class ErrorInfo(Frozen):
    """A structured tool error: its class, whether a retry may help, and a message."""

    error_class: ErrorClass
    retryable: bool
    message: str


class ToolResult(Frozen):
    """The result of one call, correlated by ``call_id``: an output or an error, never both."""

    call_id: str
    name: str
    output: JsonValue = None
    error: ErrorInfo | None = None
    duration_ms: float = 0.0
    effect_key: str | None = None
    """For a write: the effect key the tool was given."""
    effect_status: EffectStatus | None = None
    """For a write: what the effect ledger says became of it."""
    child_ids: list[str] | None = None
    """For a write whose body ran child invocations (``ToolContext.run_agent``): their
    ids, in the order the body started (or found) them, so that the parent's history
    names every child it has (``audit verify ID`` walks them). None otherwise, and for
    ``as_tool`` calls, whose child the batch names (``DispatchedCall.child_id``)."""

    @model_validator(mode="after")
    def _output_or_error(self) -> ToolResult:
        if self.error is not None and self.output is not None:
            msg = "a result carries an output or an error, not both"
            raise ValueError(msg)
        return self

    @property
    def ok(self) -> bool:
        """True when the call produced an output."""
        return self.error is None


# --------------------------------------------------------------------------- decisions


class _DecisionBase(Frozen):
    schema_version: Literal[1] = 1


class Final(_DecisionBase):
    """The model's answer; the invocation completes once it is validated and committed."""

    kind: Literal["final"] = "final"
    answer: str


class ToolCalls(_DecisionBase):
    """A batch of tool calls to run before the model is asked again."""

    kind: Literal["tool_calls"] = "tool_calls"
    calls: list[ToolCall]


class RequestApproval(_DecisionBase):
    """The model asks a human to approve a proposal, identified by its digest."""

    kind: Literal["request_approval"] = "request_approval"
    proposal_digest: str
    summary: str = ""


class Clarification(_DecisionBase):
    """The model needs the user to answer a question before it can go on."""

    kind: Literal["clarification"] = "clarification"
    question: str


class CannotContinue(_DecisionBase):
    """The model declares that it cannot complete the goal, and why."""

    kind: Literal["cannot_continue"] = "cannot_continue"
    reason: str


class Handoff(Frozen):
    """The model hands the conversation to another agent of its agent's ``handoffs``.

    New in version 2 of the decision schema (the other decisions are version 1, which
    version 2 still accepts): a store written before it holds none.
    """

    schema_version: Literal[2] = 2
    kind: Literal["handoff"] = "handoff"
    to: str
    """The target agent's name."""
    reason: str
    """Why (recorded, and told to the target)."""
    summary: str | None = None
    """What the target should know (passed on when the handoff's history is ``summary``)."""


class Wait(Frozen):
    """The model asks to wait until a time before it goes on (a durable sleep).

    New in version 3 of the decision schema (versions 1 and 2 are still accepted): a
    store written before it holds none. The invocation pauses ``sleeping`` with
    ``wake_at`` set to ``until``; when it wakes, the model is asked again, told when it
    woke. ``until`` must carry a time zone (a naive time is refused).
    """

    schema_version: Literal[3] = 3
    kind: Literal["wait"] = "wait"
    reason: str
    """Why it waits (recorded as the pause's question)."""
    until: AwareDatetime
    """When it may go on (not before)."""


class PlanStep(Frozen):
    """One step of a plan: the write it will make (a tool and its arguments), and why."""

    tool: Annotated[str, Field(min_length=1, max_length=200)]
    arguments: dict[str, JsonValue] = Field(default_factory=dict)
    description: str = ""
    """What the step is for (shown to the person who approves the plan)."""

    _parse_arguments = field_validator("arguments", mode="before")(_parse_json_object)


class Plan(Frozen):
    """The model proposes the writes it will make, for a person (or a policy) to approve.

    New in version 4 of the decision schema (versions 1 to 3 are still accepted): a
    store written before it holds none. Only an agent given ``planning=Planning(...)``
    may propose one (``aggregates.planning``): the invocation pauses
    ``plan_approval_required``; once approved, exactly these writes run without
    another approval (matched by tool and arguments), any other write waits for one.
    A new plan supersedes the last.
    """

    schema_version: Literal[4] = 4
    kind: Literal["plan"] = "plan"
    steps: list[PlanStep]
    """Each write the plan will make, in order (at least one)."""
    summary: str = ""
    """What the plan does, in a sentence (shown with it)."""


Decision = Annotated[
    Final | ToolCalls | RequestApproval | Clarification | CannotContinue | Handoff | Wait | Plan,
    Field(discriminator="kind"),
]
"""The closed decision union a model may return."""

DECISION_ADAPTER: TypeAdapter[Decision] = TypeAdapter(Decision, config=ConfigDict(defer_build=True))


_DECISION_CLASSES: tuple[type[BaseModel], ...] = (
    Final,
    ToolCalls,
    RequestApproval,
    Clarification,
    CannotContinue,
    Handoff,
    Wait,
    Plan,
)
_DECISION_FIELDS = {cls: set(cls.model_fields) for cls in _DECISION_CLASSES}


def decision_fields(model: BaseModel) -> dict[str, Any]:
    """What a model given as a proposal holds, as plain data to validate as a decision.

    An instance of a decision class is never trusted for its class: one built with
    ``model_construct`` (or ``model_copy(update=...)``) was not validated and may hold
    anything. Its fields (the decision class's: a subclass's own are left out) are
    dumped as they are, without pydantic's warnings, nested calls as dicts, so that
    validating them checks everything again. Any other model is dumped whole.

    Raises:
        Exception: the model cannot be dumped (a cycle, a serialiser that raises).
    """
    for cls in _DECISION_CLASSES:
        if isinstance(model, cls):
            # A wait's time is dumped as its ISO text, the JSON a model would send.
            mode = "json" if cls is Wait else "python"
            return model.model_dump(include=_DECISION_FIELDS[cls], mode=mode, warnings=False)
    return model.model_dump(warnings=False)


def parse_decision(raw: object) -> Decision:
    """Validate an untrusted model output (a decision model or its JSON shape).

    A decision model is validated again (see :func:`decision_fields`): a valid one
    gives an equal decision, a constructed one is checked like any dict.

    Raises:
        pydantic.ValidationError: when ``raw`` is not a decision of this schema.
        Exception: ``raw`` is a model that cannot be dumped (see :func:`decision_fields`).
    """
    if isinstance(raw, BaseModel):
        raw = decision_fields(raw)
    if isinstance(raw, str | bytes):
        return DECISION_ADAPTER.validate_json(raw)
    return DECISION_ADAPTER.validate_python(raw)


class Rejection(Frozen):
    """A proposal that trusted code refused: what the model said and what was wrong with it."""

    rejection_class: RejectionClass
    problems: list[str]
    raw: JsonValue = None
    """What the model sent, as JSON (or its stand-in); ``None`` when it sent ``None``.

    Optional with a null default, as every field that may be null: a null is left out
    of the stored event (``exclude_none``), and reads back as ``None``.
    """


class Usage(Frozen):
    """What one model call cost."""

    input_tokens: int = 0
    output_tokens: int = 0
    cost: float = 0.0
    latency_ms: float = 0.0
    attempts: int | None = None
    """Provider attempts this decision took (retries included), when an adapter reports it."""
    provider: str | None = None
    """The provider that answered (``openai``, ``anthropic``), when an adapter reports it."""
    model: str | None = None
    """The model asked for, when an adapter reports it."""
    response_model: str | None = None
    """The model that answered, as the provider names it, when it says."""
    finish_reason: str | None = None
    """Why the provider stopped generating (``stop``, ``tool_calls``, ``end_turn``...)."""
    cache_read_input_tokens: int | None = None
    """Input tokens read from the provider's prompt cache (part of ``input_tokens``)."""
    cache_write_input_tokens: int | None = None
    """Input tokens written to the provider's prompt cache (part of ``input_tokens``)."""


class Price(Frozen):
    """What a model's tokens cost, to turn usage into cost when the model does not say."""

    input_per_million: Annotated[float, Field(ge=0, allow_inf_nan=False)] = 0.0
    output_per_million: Annotated[float, Field(ge=0, allow_inf_nan=False)] = 0.0

    def cost(self, usage: Usage) -> float:
        """The cost of a usage at this price."""
        return (
            usage.input_tokens * self.input_per_million
            + usage.output_tokens * self.output_per_million
        ) / 1_000_000


class Budget(Frozen):
    """Limits that trusted code enforces on one invocation.

    ``max_repeated_plan`` is how many times in a row the same plan (tool names and
    normalised arguments, ignoring call ids) may be executed; the next identical
    plan ends the invocation with ``no_progress`` before it runs.

    ``max_tokens`` and ``max_cost`` bound the model's usage: before each model
    call, ``reserve_tokens`` / ``reserve_cost`` are reserved, and the call is not
    made if the reservation would pass the limit (``token_budget_exhausted`` /
    ``cost_budget_exhausted``); after it, the real usage is settled. When
    ``wind_down_steps`` (or fewer) steps are left, the model's request carries a
    notice saying so.
    """

    max_steps: Annotated[int, Field(ge=1)] = 20
    max_tool_calls: Annotated[int, Field(ge=0)] = 50
    max_repeated_plan: Annotated[int, Field(ge=1)] = 1
    deadline_s: Annotated[float, Field(gt=0, allow_inf_nan=False)] | None = None
    # Fields added later are optional with a null default: the audit's rule.
    max_tokens: Annotated[int, Field(ge=0)] | None = None
    max_cost: Annotated[float, Field(ge=0, allow_inf_nan=False)] | None = None
    reserve_tokens: Annotated[int, Field(ge=0)] | None = None
    reserve_cost: Annotated[float, Field(ge=0, allow_inf_nan=False)] | None = None
    wind_down_steps: Annotated[int, Field(ge=1)] | None = None

    def __init__(
        self,
        max_steps: int = 20,
        max_tool_calls: int = 50,
        max_repeated_plan: int = 1,
        deadline_s: float | None = None,
        *,
        max_tokens: int | None = None,
        max_cost: float | None = None,
        reserve_tokens: int | None = None,
        reserve_cost: float | None = None,
        wind_down_steps: int | None = None,
    ) -> None:
        """Set the limits, positionally or by name.

        Raises:
            pydantic.ValidationError: a limit is out of range.
        """
        # The pydantic plugin types the base __init__ as field-less Frozen's.
        super().__init__(  # type: ignore[call-arg]
            max_steps=max_steps,
            max_tool_calls=max_tool_calls,
            max_repeated_plan=max_repeated_plan,
            deadline_s=deadline_s,
            max_tokens=max_tokens,
            max_cost=max_cost,
            reserve_tokens=reserve_tokens,
            reserve_cost=reserve_cost,
            wind_down_steps=wind_down_steps,
        )


Effect = ToolEffect
"""The former name of :class:`ToolEffect` (kept for code written against 0.1)."""
