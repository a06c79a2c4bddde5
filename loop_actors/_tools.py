"""Tools: the ``@tool`` decorator, the Toolbox that validates calls, and the ToolActor.

A tool is a plain or async function. Its argument schema is derived from its
type hints with pydantic; arguments are validated before a call runs, and the
same model produces the JSON Schema a model provider sees.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import math
from collections.abc import Callable, Iterable, Sequence
from functools import partial
from typing import Any, Literal, overload

import trio
from pydantic import BaseModel, ConfigDict, ValidationError, create_model
from pydantic_core import PydanticSerializationError, to_jsonable_python

from aggregates.decisions import (
    Effect,
    ErrorClass,
    ErrorInfo,
    ToolCall,
    ToolResult,
)
from aggregates.invocation import DispatchedCall, ToolSpec
from loop_actors._errors import ToolDefinitionError, ToolError
from loop_actors._messages import BatchExecuted, CancelBatch, ExecuteBatch, Interruption

DEFAULT_TOOL_TIMEOUT_S = 30.0


class Tool:
    """A function the model may call, with its validated argument schema.

    Build one with :func:`tool`; call :meth:`validate` to check arguments and
    :meth:`invoke` to run it.
    """

    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        name: str | None = None,
        description: str | None = None,
        effect: Effect | Literal["read", "write"] = Effect.READ,
        timeout_s: float | None = None,
        inline: bool = False,
    ) -> None:
        """Wrap ``fn`` as a tool (see :func:`tool` for the parameters)."""
        if not callable(fn):
            raise ToolDefinitionError(f"{fn!r} is not callable")
        self.fn = fn
        self.name: str = name or getattr(fn, "__name__", None) or ""
        if not self.name.isidentifier():
            raise ToolDefinitionError(f"tool name {self.name!r} must be an identifier")
        self.description = description or inspect.getdoc(fn) or ""
        try:
            self.effect = Effect(effect)
        except ValueError:
            raise ToolDefinitionError(
                f"tool {self.name}: effect must be 'read' or 'write', got {effect!r}"
            ) from None
        if timeout_s is not None and not (timeout_s > 0 and math.isfinite(timeout_s)):
            raise ToolDefinitionError(f"tool {self.name}: timeout_s must be a positive number")
        self.timeout_s = timeout_s
        self.is_async = inspect.iscoroutinefunction(fn)
        if inline and self.is_async:
            raise ToolDefinitionError(f"tool {self.name}: inline is for plain functions only")
        self.inline = inline
        self.arguments_model = _arguments_model(self.name, fn)
        self._fields = tuple(self.arguments_model.model_fields)
        self.schema: dict[str, Any] = self.arguments_model.model_json_schema()
        canonical = json.dumps(
            {"name": self.name, "effect": self.effect.value, "schema": self.schema},
            sort_keys=True,
            separators=(",", ":"),
        )
        self.schema_digest = hashlib.sha256(canonical.encode()).hexdigest()

    def __repr__(self) -> str:
        return f"Tool({self.name!r}, effect={self.effect.value!r})"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Call the underlying function directly (tools stay usable as functions)."""
        return self.fn(*args, **kwargs)

    @property
    def spec(self) -> ToolSpec:
        """What the invocation records about this tool."""
        return ToolSpec(name=self.name, effect=self.effect, schema_digest=self.schema_digest)

    def validate(self, arguments: dict[str, Any]) -> BaseModel:
        """Validate arguments against the schema.

        Raises:
            pydantic.ValidationError: when they do not match.
        """
        return self.arguments_model.model_validate(arguments)

    async def invoke(self, arguments: dict[str, Any]) -> Any:
        """Validate the arguments and run the function.

        Cancellation: a checkpoint. A plain function runs in a worker thread that
        is abandoned on cancellation (it may finish in the background); an async
        function is cancelled at its next checkpoint.
        """
        validated = self.validate(arguments)
        kwargs = {field: getattr(validated, field) for field in self._fields}
        if self.is_async:
            return await self.fn(**kwargs)
        if self.inline:
            return self.fn(**kwargs)
        return await trio.to_thread.run_sync(
            lambda: self.fn(**kwargs),
            abandon_on_cancel=True,
        )


def _arguments_model(name: str, fn: Callable[..., Any]) -> type[BaseModel]:
    try:
        signature = inspect.signature(fn)
        hints = _type_hints(fn)
    except (TypeError, ValueError, NameError) as error:
        raise ToolDefinitionError(f"tool {name}: cannot read its signature: {error}") from error
    fields: dict[str, Any] = {}
    for parameter in signature.parameters.values():
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            raise ToolDefinitionError(
                f"tool {name}: *args and **kwargs cannot be described to a model"
            )
        if parameter.kind is parameter.POSITIONAL_ONLY:
            raise ToolDefinitionError(f"tool {name}: positional-only parameters are not supported")
        annotation = hints.get(parameter.name, Any)
        default = ... if parameter.default is parameter.empty else parameter.default
        fields[parameter.name] = (annotation, default)
    try:
        return create_model(
            f"{name}_arguments",
            __config__=ConfigDict(extra="forbid"),
            **fields,
        )
    except Exception as error:  # pydantic raises several kinds for unusable annotations
        raise ToolDefinitionError(f"tool {name}: unusable type hints: {error}") from error


def _type_hints(fn: Callable[..., Any]) -> dict[str, Any]:
    import typing  # noqa: PLC0415 - only needed when a tool is defined

    return typing.get_type_hints(fn, include_extras=True)


@overload
def tool(fn: Callable[..., Any], /) -> Tool: ...


@overload
def tool(
    *,
    name: str | None = None,
    description: str | None = None,
    effect: Effect | Literal["read", "write"] = Effect.READ,
    timeout_s: float | None = None,
    inline: bool = False,
) -> Callable[[Callable[..., Any]], Tool]: ...


def tool(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    effect: Effect | Literal["read", "write"] = Effect.READ,
    timeout_s: float | None = None,
    inline: bool = False,
) -> Tool | Callable[[Callable[..., Any]], Tool]:
    """Make a plain or async function a tool named after it.

    Args:
        fn: the function (when used as ``@tool`` without parentheses).
        name: the name the model uses; defaults to the function's name.
        description: what the model is told; defaults to the docstring.
        effect: ``"read"`` (default; may run concurrently with other reads) or
            ``"write"`` (runs alone, in the order the model gave).
        timeout_s: per-call timeout; defaults to the agent's ``tool_timeout_s``.
        inline: run a plain function on the event loop instead of a worker
            thread. Only for instant, non-blocking functions: a timeout cannot
            interrupt it.

    Raises:
        ToolDefinitionError: when the function cannot be described to a model.
    """

    def wrap(function: Callable[..., Any]) -> Tool:
        return Tool(
            function,
            name=name,
            description=description,
            effect=effect,
            timeout_s=timeout_s,
            inline=inline,
        )

    if fn is not None:
        return wrap(fn)
    return wrap


class Toolbox:
    """The tools of one agent, by name."""

    def __init__(self, tools: Iterable[Tool | Callable[..., Any]], *, default_timeout_s: float):
        """Collect tools (plain functions are wrapped with :func:`tool`).

        Raises:
            ToolDefinitionError: two tools share a name, or a function is not a valid tool.
        """
        self.default_timeout_s = default_timeout_s
        self.tools: dict[str, Tool] = {}
        for item in tools:
            wrapped = item if isinstance(item, Tool) else tool(item)
            if wrapped.name in self.tools:
                raise ToolDefinitionError(f"two tools are named {wrapped.name!r}")
            self.tools[wrapped.name] = wrapped
        digests = sorted(t.schema_digest for t in self.tools.values())
        self.catalogue_digest = hashlib.sha256("".join(digests).encode()).hexdigest()

    @property
    def specs(self) -> list[ToolSpec]:
        """Each tool's spec, sorted by name."""
        return [self.tools[name].spec for name in sorted(self.tools)]

    def timeout_for(self, name: str) -> float:
        """The per-call timeout of a tool."""
        configured = self.tools[name].timeout_s
        return self.default_timeout_s if configured is None else configured

    def check_arguments(self, call: ToolCall) -> dict[str, Any]:
        """Validate a call's arguments; return them normalised as JSON.

        Raises:
            KeyError: the tool is unknown.
            pydantic.ValidationError: the arguments do not match its schema.
        """
        validated = self.tools[call.name].validate(call.arguments)
        return validated.model_dump(mode="json")

    def plan(self, calls: Sequence[DispatchedCall]) -> list[list[str]]:
        """Execution groups: consecutive reads run together; each write runs alone, in order."""
        groups: list[list[str]] = []
        reads: list[str] = []
        for call in calls:
            if call.effect is Effect.READ:
                reads.append(call.call_id)
                continue
            if reads:
                groups.append(reads)
                reads = []
            groups.append([call.call_id])
        if reads:
            groups.append(reads)
        return groups


# --------------------------------------------------------------------------- the actor


def _error(
    call: DispatchedCall,
    cls: ErrorClass,
    message: str,
    *,
    retryable: bool,
    duration_ms: float = 0.0,
) -> ToolResult:
    return ToolResult(
        call_id=call.call_id,
        name=call.name,
        error=ErrorInfo(error_class=cls, retryable=retryable, message=message),
        duration_ms=duration_ms,
    )


async def _run_call(toolbox: Toolbox, call: DispatchedCall) -> ToolResult:
    tool_ = toolbox.tools[call.name]
    timeout_s = toolbox.timeout_for(call.name)
    started = trio.current_time()
    failure: tuple[ErrorClass, str, bool] | None = None
    output: Any = None
    with trio.move_on_after(timeout_s) as timeout_scope:
        try:
            output = to_jsonable_python(await tool_.invoke(call.arguments))
        except ValidationError as error:
            failure = (ErrorClass.INVALID_ARGUMENTS, str(error), False)
        except ToolError as error:
            failure = (error.error_class, error.message, error.retryable)
        except PydanticSerializationError as error:
            failure = (
                ErrorClass.OUTPUT_INVALID,
                f"output is not JSON-serialisable: {error}",
                False,
            )
        except Exception as error:  # a tool's own failure becomes its result, never a crash
            failure = (ErrorClass.TOOL_FAILED, f"{type(error).__name__}: {error}", False)
    if timeout_scope.cancelled_caught:
        failure = (ErrorClass.TIMEOUT, f"no result within {timeout_s:g} s", True)
    duration_ms = (trio.current_time() - started) * 1000.0
    if failure is not None:
        error_class, message, retryable = failure
        return _error(call, error_class, message, retryable=retryable, duration_ms=duration_ms)
    return ToolResult(call_id=call.call_id, name=call.name, output=output, duration_ms=duration_ms)


async def _execute_batch(
    request: ExecuteBatch,
    scope: trio.CancelScope,
    *,
    toolbox: Toolbox,
    outbox: trio.MemorySendChannel[BatchExecuted],
) -> None:
    by_id = {call.call_id: call for call in request.calls}
    results: dict[str, ToolResult] = {}

    async def run_one(call: DispatchedCall) -> None:
        results[call.call_id] = await _run_call(toolbox, call)

    with scope:
        for group in request.plan:
            if len(group) == 1:
                await run_one(by_id[group[0]])
                continue
            async with trio.open_nursery() as nursery:
                for call_id in group:
                    nursery.start_soon(run_one, by_id[call_id])
    interruption = Interruption.NONE
    if scope.cancelled_caught:
        deadline_hit = request.deadline is not None and trio.current_time() >= request.deadline
        interruption = Interruption.DEADLINE if deadline_hit else Interruption.CANCELLED
    ordered: list[ToolResult] = []
    for call in request.calls:
        result = results.get(call.call_id)
        if result is None:
            if interruption is Interruption.DEADLINE:
                result = _error(
                    call,
                    ErrorClass.DEADLINE_EXCEEDED,
                    "the invocation's deadline passed",
                    retryable=False,
                )
            else:
                result = _error(
                    call, ErrorClass.CANCELLED, "the invocation was cancelled", retryable=False
                )
        ordered.append(result)
    # The controller is waiting for exactly this reply (buffer 1, so this never blocks).
    outbox.send_nowait(BatchExecuted(step=request.step, results=ordered, interruption=interruption))


async def run_tool_actor(
    inbox: trio.MemoryReceiveChannel[ExecuteBatch | CancelBatch],
    outbox: trio.MemorySendChannel[BatchExecuted],
    *,
    toolbox: Toolbox,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run tool batches for one invocation until the inbox closes.

    Each ``ExecuteBatch`` runs its plan (groups in order, calls of a group
    concurrently, each under its timeout) and answers one ``BatchExecuted`` with
    one result per call, in call order. ``CancelBatch`` stops the running batch:
    no new call starts, unfinished calls are answered ``cancelled``.

    Cancellation: returns when cancelled; a batch in flight is abandoned without a reply.
    """
    async with inbox, outbox, trio.open_nursery() as nursery:
        task_status.started()
        running: trio.CancelScope | None = None
        async for message in inbox:
            match message:
                case ExecuteBatch():
                    running = trio.CancelScope(
                        deadline=message.deadline if message.deadline is not None else math.inf
                    )
                    nursery.start_soon(
                        partial(_execute_batch, message, running, toolbox=toolbox, outbox=outbox)
                    )
                case CancelBatch():
                    if running is not None:
                        running.cancel()


__all__ = ["Tool", "Toolbox", "run_tool_actor", "tool"]
