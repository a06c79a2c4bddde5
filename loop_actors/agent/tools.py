"""Tools: the ``@tool`` decorator, the Toolbox that validates calls, and the ToolActor.

A tool is a plain or async function. Its argument schema is derived from its
type hints with pydantic; arguments are validated before a call runs, and the
same model produces the JSON Schema a model provider sees.
"""

from __future__ import annotations

import contextvars
import inspect
import math
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Literal, cast, overload

import trio
from pydantic import BaseModel, ConfigDict, ValidationError, create_model
from pydantic_core import to_jsonable_python

from aggregates.decisions import (
    EffectStatus,
    ErrorClass,
    ErrorInfo,
    Frozen,
    ToolCall,
    ToolEffect,
    ToolResult,
    built,
)
from aggregates.digest import digest_of, sha256_hex
from aggregates.effect import Resolution
from aggregates.invocation import DispatchedCall, ToolSpec
from aggregates.redaction import REDACTED
from aggregates.results import Interruption, interrupted_result, unreported_result
from aggregates.values import check_json, describe_error, safe_text
from loop_actors._errors import ToolDefinitionError, ToolError
from loop_actors._faults import CrashPoint, fault_point
from loop_actors._guard import is_cancellation
from loop_actors._messages import BatchExecuted, ToolSchema

DEFAULT_TOOL_TIMEOUT_S = 30.0


def _paths(tool_name: str, names: Iterable[str]) -> tuple[tuple[str, ...], ...]:
    if isinstance(names, str):
        raise ToolDefinitionError(f"tool {tool_name}: give sensitive fields as a list of names")
    paths = tuple(tuple(name.split(".")) for name in names)
    if any(not all(paths) for paths in paths):
        raise ToolDefinitionError(f"tool {tool_name}: empty sensitive field name")
    return paths


def redact(value: Any, paths: Iterable[tuple[str, ...]]) -> Any:
    """A copy of a JSON value with the values at ``paths`` replaced by ``REDACTED``.

    A path that does not exist is ignored; a path through a list applies to
    each of its items.
    """
    result = value
    for path in paths:
        result = _redact_path(result, path)
    return result


def _redact_path(value: Any, path: tuple[str, ...]) -> Any:
    if isinstance(value, list):
        return [_redact_path(item, path) for item in value]
    if not isinstance(value, dict) or path[0] not in value:
        return value
    head, rest = path[0], path[1:]
    copy = dict(value)
    copy[head] = REDACTED if not rest else _redact_path(value[head], rest)
    return copy


class ToolContext(Frozen):
    """What the runtime hands to a tool that declares a parameter annotated ``ToolContext``.

    The parameter is left out of the schema the model sees. A write tool passes
    ``effect_key`` to the owning service as its idempotency key: it is the same
    on every attempt, after every restart, on every worker.
    """

    invocation_id: str
    call_id: str
    effect_key: str | None
    """The effect key of a write (None for a read)."""
    attempt: int
    """1 for the first dispatch; higher when the service said "not found" and it runs again."""


class Reconciled(Frozen):
    """What a write tool's ``reconcile(effect_key)`` found out from the owning service."""

    status: Resolution
    """``committed``, ``rejected`` or ``not_found`` (a string is accepted)."""
    receipt: Any = None
    """For ``committed``: the service's receipt (becomes the call's output)."""
    reason: str | None = None
    """For ``rejected``: why the service refused."""


ReconcileFunction = Callable[[str], "Reconciled | Any"]


def schema_digest(name: str, effect: ToolEffect, schema: dict[str, Any]) -> str:
    """What a tool's schema digest covers: its name, effect and argument schema."""
    return digest_of({"name": name, "effect": effect.value, "schema": schema})


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
        effect: ToolEffect | Literal["read", "write"] = ToolEffect.READ,
        timeout_s: float | None = None,
        inline: bool = False,
        reconcile: ReconcileFunction | None = None,
        commutes: bool = False,
        sensitive_arguments: Iterable[str] = (),
        sensitive_output: Iterable[str] = (),
        requires_approval: bool | Callable[[dict[str, Any]], bool] = False,
        max_repeated_failures: int | None = None,
        operation: str | None = None,
        object_from: str | None = None,
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
            self.effect = ToolEffect(effect)
        except ValueError:
            raise ToolDefinitionError(
                f"tool {self.name}: effect must be 'read' or 'write', got {effect!r}"
            ) from None
        if timeout_s is not None and not (timeout_s > 0 and math.isfinite(timeout_s)):
            raise ToolDefinitionError(f"tool {self.name}: timeout_s must be a positive number")
        self.timeout_s = timeout_s
        if reconcile is not None and not callable(reconcile):
            raise ToolDefinitionError(f"tool {self.name}: reconcile must be callable")
        if reconcile is not None and self.effect is ToolEffect.READ:
            raise ToolDefinitionError(f"tool {self.name}: only a write tool is reconciled")
        self.reconcile = reconcile
        self.commutes = commutes
        self.sensitive_arguments = _paths(self.name, sensitive_arguments)
        if not (isinstance(requires_approval, bool) or callable(requires_approval)):
            raise ToolDefinitionError(
                f"tool {self.name}: requires_approval must be a bool or a function of the arguments"
            )
        self.requires_approval = requires_approval
        if max_repeated_failures is not None and max_repeated_failures < 1:
            raise ToolDefinitionError(f"tool {self.name}: max_repeated_failures must be >= 1")
        self.max_repeated_failures = max_repeated_failures
        self.operation = operation or self.name
        self.object_from = object_from
        self.sensitive_output = _paths(self.name, sensitive_output)
        self.is_async = inspect.iscoroutinefunction(fn)
        if inline and self.is_async:
            raise ToolDefinitionError(f"tool {self.name}: inline is for plain functions only")
        self.inline = inline
        self.arguments_model, self.context_parameter = _arguments_model(self.name, fn)
        self._fields = tuple(self.arguments_model.model_fields)
        self.schema: dict[str, Any] = self.arguments_model.model_json_schema()
        self.schema_digest = schema_digest(self.name, self.effect, self.schema)

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

    def keyword_arguments(
        self, arguments: dict[str, Any], context: ToolContext | None = None
    ) -> dict[str, Any]:
        """The function's keyword arguments: ``arguments`` validated, the context added.

        Raises:
            pydantic.ValidationError: when they do not match the schema.
            ToolDefinitionError: the tool takes a ToolContext and none was given.
        """
        validated = self.validate(arguments)
        kwargs = {field: getattr(validated, field) for field in self._fields}
        if self.context_parameter is not None:
            if context is None:
                raise ToolDefinitionError(f"tool {self.name} needs a ToolContext to run")
            kwargs[self.context_parameter] = context
        return kwargs

    async def invoke(
        self,
        arguments: dict[str, Any],
        context: ToolContext | None = None,
        *,
        running: threading.Event | None = None,
    ) -> Any:
        """Validate the arguments and run the function (with its context, if it takes one).

        ``running``, when given, is set once the function has really stopped: for a
        plain function in a worker thread, when the thread finishes, even after the
        call was abandoned.

        Cancellation: a checkpoint. A plain function runs in a worker thread that
        is abandoned on cancellation (it may finish in the background: ``running``
        says when); an async function is cancelled at its next checkpoint.
        """
        try:
            kwargs = self.keyword_arguments(arguments, context)
        except BaseException:
            if running is not None:
                running.set()  # refused before the function started: nothing runs
            raise
        if self.is_async or self.inline or running is None:
            try:
                if self.is_async:
                    return await self.fn(**kwargs)
                if self.inline:
                    return self.fn(**kwargs)
                return await trio.to_thread.run_sync(
                    lambda: self.fn(**kwargs), abandon_on_cancel=True
                )
            finally:
                if running is not None:
                    running.set()

        def in_thread() -> Any:
            try:
                return self.fn(**kwargs)
            finally:
                running.set()  # the thread is done, whether or not anyone still waits

        return await trio.to_thread.run_sync(in_thread, abandon_on_cancel=True)


async def ask_service(tool_: Tool, key: str) -> Reconciled:
    """Call a write tool's ``reconcile(effect_key)`` (plain or async) and check its answer.

    Raises:
        Exception: whatever ``reconcile`` raised (the service could not be reached).
        ToolDefinitionError: the tool has no ``reconcile`` or it answered something else.

    Cancellation: a checkpoint; a plain function's worker thread is abandoned.
    """
    reconcile = tool_.reconcile
    if reconcile is None:
        raise ToolDefinitionError(f"tool {tool_.name} has no reconcile function")
    if inspect.iscoroutinefunction(reconcile):
        answer = await reconcile(key)
    else:
        answer = await trio.to_thread.run_sync(reconcile, key, abandon_on_cancel=True)
    if not isinstance(answer, Reconciled):
        raise ToolDefinitionError(
            f"tool {tool_.name}: reconcile() must return Reconciled, got {type(answer).__name__}"
        )
    return answer


def _arguments_model(name: str, fn: Callable[..., Any]) -> tuple[type[BaseModel], str | None]:
    try:
        signature = inspect.signature(fn)
        hints = _type_hints(fn)
    except (TypeError, ValueError, NameError) as error:
        raise ToolDefinitionError(f"tool {name}: cannot read its signature: {error}") from error
    fields: dict[str, Any] = {}
    context_parameter: str | None = None
    for parameter in signature.parameters.values():
        if hints.get(parameter.name) is ToolContext:
            context_parameter = parameter.name
            continue
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
        model = create_model(
            f"{name}_arguments",
            __config__=ConfigDict(extra="forbid"),
            **fields,
        )
    except Exception as error:  # pydantic raises several kinds for unusable annotations
        raise ToolDefinitionError(f"tool {name}: unusable type hints: {error}") from error
    return model, context_parameter


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
    effect: ToolEffect | Literal["read", "write"] = ToolEffect.READ,
    timeout_s: float | None = None,
    inline: bool = False,
    reconcile: ReconcileFunction | None = None,
    commutes: bool = False,
    sensitive_arguments: Iterable[str] = (),
    sensitive_output: Iterable[str] = (),
    requires_approval: bool | Callable[[dict[str, Any]], bool] = False,
    max_repeated_failures: int | None = None,
    operation: str | None = None,
    object_from: str | None = None,
) -> Callable[[Callable[..., Any]], Tool]: ...


def tool(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    effect: ToolEffect | Literal["read", "write"] = ToolEffect.READ,
    timeout_s: float | None = None,
    inline: bool = False,
    reconcile: ReconcileFunction | None = None,
    commutes: bool = False,
    sensitive_arguments: Iterable[str] = (),
    sensitive_output: Iterable[str] = (),
    requires_approval: bool | Callable[[dict[str, Any]], bool] = False,
    max_repeated_failures: int | None = None,
    operation: str | None = None,
    object_from: str | None = None,
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
        reconcile: for a write, ``reconcile(effect_key) -> Reconciled``: asks the
            owning service what became of a key; raises when it cannot be reached.
        commutes: for a write that neither reads nor changes what other calls of
            a batch touch: it may then run concurrently with them.
        sensitive_arguments: argument names (``"card"``, or dotted paths such as
            ``"payer.card"``) whose values are replaced by ``"[redacted]"`` before
            anything is stored; the tool and, in this process, the model still
            see the real values.
        sensitive_output: the same for fields of the tool's output.
        requires_approval: ``True``, or a function of the proposed arguments (a
            dict) that says whether this call needs a person's approval, e.g.
            ``lambda args: args["amount"] > 100``. The invocation then pauses.
        max_repeated_failures: how many failures in a row of this tool with the
            same arguments and error class end the invocation (``repeated_failure``);
            defaults to the agent's.
        operation: what the agent's policy sees this call do (default: the name).
        object_from: the argument that names the object the call acts on, for
            the agent's policy (e.g. ``"order_id"``).

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
            reconcile=reconcile,
            commutes=commutes,
            sensitive_arguments=sensitive_arguments,
            sensitive_output=sensitive_output,
            requires_approval=requires_approval,
            max_repeated_failures=max_repeated_failures,
            operation=operation,
            object_from=object_from,
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
        self.catalogue_digest = sha256_hex("".join(digests))
        self.specs: list[ToolSpec] = [self.tools[name].spec for name in sorted(self.tools)]
        """Each tool's spec, sorted by name (recorded with every invocation)."""
        self.schemas = [
            ToolSchema(name=t.name, description=t.description, parameters=t.schema)
            for t in self.tools.values()
        ]
        """Each tool as the model is told of it, in the agent's order."""
        self._attempts: dict[str, threading.Event] = {}
        """Writes whose function may still run, by effect key (set when it stopped)."""

    def attempt_started(self, effect_key: str) -> threading.Event:
        """Note that an attempt of a write starts; the event is set when it has stopped."""
        running = threading.Event()
        self._attempts[effect_key] = running
        return running

    def attempt_ended(self, effect_key: str, running: threading.Event) -> None:
        """Forget an attempt whose function has stopped (one still running is kept)."""
        if running.is_set() and self._attempts.get(effect_key) is running:
            del self._attempts[effect_key]

    def attempt_running(self, effect_key: str) -> bool:
        """True while an earlier attempt of this write may still be running in this process."""
        running = self._attempts.get(effect_key)
        if running is None:
            return False
        if running.is_set():
            del self._attempts[effect_key]
            return False
        return True

    async def wait_for_attempt(self, effect_key: str, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for an earlier attempt to stop; True when it has.

        Cancellation: a checkpoint; the waiting thread is abandoned.
        """
        running = self._attempts.get(effect_key)
        if running is None:
            return True
        stopped = await trio.to_thread.run_sync(running.wait, timeout_s, abandon_on_cancel=True)
        return bool(stopped) or not self.attempt_running(effect_key)

    def effect_of(self, name: str) -> ToolEffect | None:
        """The tool's effect, or None when the agent has no such tool."""
        tool_ = self.tools.get(name)
        return tool_.effect if tool_ is not None else None

    def timeout_for(self, name: str) -> float:
        """The per-call timeout of a tool."""
        tool_ = self.tools.get(name)
        configured = tool_.timeout_s if tool_ is not None else None
        return self.default_timeout_s if configured is None else configured

    def needs_approval(self, name: str, arguments: dict[str, Any]) -> bool:
        """Whether this call must wait for a person's approval.

        A policy function that raises counts as "needs approval" (the safe side).
        """
        rule = self.tools[name].requires_approval
        if isinstance(rule, bool):
            return rule
        try:
            return bool(rule(dict(arguments)))
        except BaseException:  # a rule is plain code (no checkpoint): anything it raises
            return True

    def redact_arguments(self, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        """Arguments as they may be stored: the tool's sensitive fields replaced."""
        tool_ = self.tools.get(name)
        if tool_ is None or not tool_.sensitive_arguments:
            return arguments
        return cast("dict[str, Any]", redact(arguments, tool_.sensitive_arguments))

    def redact_output(self, name: str, output: Any) -> Any:
        """An output as it may be stored: the tool's sensitive fields replaced."""
        tool_ = self.tools.get(name)
        if tool_ is None or not tool_.sensitive_output:
            return output
        return redact(output, tool_.sensitive_output)

    @property
    def redacts(self) -> bool:
        """True when some tool declares sensitive fields."""
        return any(t.sensitive_arguments or t.sensitive_output for t in self.tools.values())

    def check_arguments(self, call: ToolCall) -> dict[str, Any]:
        """Validate a call's arguments; return them normalised as JSON.

        Raises:
            KeyError: the tool is unknown.
            pydantic.ValidationError: the arguments do not match its schema.
        """
        validated = self.tools[call.name].validate(call.arguments)
        return validated.model_dump(mode="json")

    def plan(self, calls: Sequence[DispatchedCall]) -> list[list[str]]:
        """Execution groups, run one after another.

        Consecutive reads (and writes declared ``commutes=True``) form one group
        whose calls run concurrently; every other write is a group of its own, in
        the order the model gave.
        """
        groups: list[list[str]] = []
        reads: list[str] = []
        for call in calls:
            tool_ = self.tools.get(call.name)
            if call.effect is ToolEffect.READ or (tool_ is not None and tool_.commutes):
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


class _Ending(Frozen):
    """How a call ended, before it becomes a result."""

    error_class: ErrorClass
    message: str
    retryable: bool
    deliberate: bool = False
    """The tool raised ``ToolError``: it says what happened on purpose."""
    ran: bool = True
    """The function was called (false: refused before it started)."""


_UNKNOWN_CLASSES = frozenset(
    {ErrorClass.TIMEOUT, ErrorClass.OUTCOME_UNKNOWN, ErrorClass.UNAVAILABLE}
)


def jsonable(returned: Any) -> tuple[Any, str | None]:
    """What a tool (or a service) returned, as a JSON value, and why it cannot be converted.

    ``to_jsonable_python`` makes JSON of models, dataclasses, sets, tuples and the
    like; whatever it cannot convert is a problem. Whether the value it makes can
    be stored faithfully is not checked here: see :func:`json_value`.
    """
    try:
        return to_jsonable_python(returned), None
    except BaseException as error:  # user objects: a broken __str__, __iter__, __eq__...
        if is_cancellation(error):
            raise
        return None, f"it is not JSON-serialisable: {describe_error(error)}"


def json_value(returned: Any) -> tuple[Any, str | None]:
    """What a tool (or a service) returned, as a JSON value, and why it cannot be stored.

    :func:`jsonable`, then the storability check: a value that is not storable
    (NaN, a lone surrogate, nesting past ``MAX_JSON_DEPTH``...) is a problem.
    """
    output, problem = jsonable(returned)
    if problem is None:
        problem = check_json(output)
    return (output, None) if problem is None else (None, problem)


def validation_problems(error: ValidationError) -> str:
    """A validation error as text, without the input values (they may be secrets)."""
    return "; ".join(
        f"{'.'.join(str(part) for part in item['loc']) or 'arguments'}: {item['msg']}"
        for item in error.errors()
    )


def _classify_write(ending: _Ending | None) -> tuple[EffectStatus, _Ending | None]:
    """What a write's ending says about its external effect.

    Returned: committed. Never started: rejected (it certainly did not happen).
    Timed out, lost its connection, or said ``outcome_unknown``/``unavailable``:
    outcome unknown. Any other ``ToolError``: rejected (the tool says the service
    refused). An unexpected exception mid-write: outcome unknown. An output that
    cannot be stored: committed (the service did it), with an error result.
    """
    if ending is None:
        return EffectStatus.COMMITTED, None
    if not ending.ran:
        return EffectStatus.REJECTED, ending
    if ending.error_class is ErrorClass.OUTPUT_INVALID:
        return EffectStatus.COMMITTED, ending
    unknown = ending.error_class in _UNKNOWN_CLASSES or not ending.deliberate
    if unknown:
        return EffectStatus.OUTCOME_UNKNOWN, ending.model_copy(
            update={"error_class": ErrorClass.OUTCOME_UNKNOWN, "retryable": False}
        )
    return EffectStatus.REJECTED, ending


def _failure(error: BaseException) -> _Ending:
    """How a call ended that raised (anything but trio's cancellation)."""
    if isinstance(error, ValidationError):
        return _Ending(
            error_class=ErrorClass.INVALID_ARGUMENTS,
            message=validation_problems(error),
            retryable=False,
            ran=False,
        )
    if isinstance(error, ToolError):
        return _Ending(
            error_class=error.error_class,
            message=safe_text(error.message),
            retryable=error.retryable,
            deliberate=True,
        )
    # A tool's own failure becomes its result, never a crash: KeyboardInterrupt,
    # SystemExit and the like included.
    return _Ending(
        error_class=ErrorClass.TOOL_FAILED, message=describe_error(error), retryable=False
    )


def _output(returned: Any) -> tuple[Any, _Ending | None]:
    """A call's return value as JSON, or why it cannot be converted.

    Converted only: the turn core checks every output it is given with the same
    rule (TurnCore._admit_result, the same output_invalid error, the same message),
    before anything is stored; checking it here too walked every output twice.
    """
    output, problem = jsonable(returned)
    if problem is None:
        return output, None
    return None, _Ending(
        error_class=ErrorClass.OUTPUT_INVALID,
        message=f"the output cannot be stored faithfully: {problem}",
        retryable=False,
        deliberate=True,
    )


def _result(
    call: DispatchedCall, output: Any, ending: _Ending | None, duration_ms: float
) -> ToolResult:
    effect_status: EffectStatus | None = None
    if call.effect_key is not None:
        effect_status, ending = _classify_write(ending)
        if ending is None:
            fault_point(CrashPoint.AFTER_WRITE_RETURNED)
    # Built without validation: every value is ours, the output is what
    # to_jsonable_python made of the tool's return value (checked storable by the
    # core before it is stored), and output and error exclude each other by construction.
    # Validating the output again walks it with a Python callback per JSON value.
    return built(
        ToolResult,
        {
            "call_id": call.call_id,
            "name": call.name,
            "output": output if ending is None else None,
            "error": None
            if ending is None
            else ErrorInfo(
                error_class=ending.error_class, retryable=ending.retryable, message=ending.message
            ),
            "duration_ms": duration_ms,
            "effect_key": call.effect_key,
            "effect_status": effect_status,
        },
    )


class BatchRun:
    """One dispatched batch of one invocation, run by its plan in the run's nursery.

    Groups run one after another; the calls of a group run concurrently, each in a
    task of its own under one cancel scope that carries its timeout, the
    invocation's deadline and a cancel request, except the calls that nothing can
    interrupt (inline ones: ``_needs_no_task``), which the batch's task runs first.
    :meth:`run` answers one result per call, in call order; :meth:`cancel` stops
    the batch: no new call starts, the calls in flight are cancelled, and
    :meth:`run` returns once they have stopped (at most ``grace_s`` later),
    unfinished calls answered ``cancelled``.
    """

    def __init__(
        self,
        toolbox: Toolbox,
        *,
        invocation_id: str,
        step: int,
        calls: Sequence[DispatchedCall],
        plan: Sequence[Sequence[str]],
        deadline: float | None,
        attempts: dict[str, int],
        grace_s: float,
    ) -> None:
        """Prepare the batch (nothing runs before :meth:`run`).

        ``deadline`` is on the trio clock (None: none); ``attempts`` the attempt
        number of each write by call id (1 when absent).
        """
        self.toolbox = toolbox
        self.invocation_id = invocation_id
        self.step = step
        self.calls = calls
        self.plan = plan
        self.deadline = math.inf if deadline is None else deadline
        self.attempts = attempts
        self.grace_s = grace_s
        self.cancelled = False
        self.results: dict[str, ToolResult] = {}
        self._started: set[str] = set()
        self._stopped: set[str] = set()
        """Calls that started and ended without a result (cut short)."""
        self._scopes: dict[str, trio.CancelScope] = {}
        """The scope of each call in flight."""
        self._pending = 0
        self._parked: trio.lowlevel.Task | None = None
        """The runner's task while it waits for the calls of a group."""
        self._now = trio.lowlevel.current_clock().current_time
        """The trio clock's time (what ``trio.current_time`` reads, without its two hops)."""

    def cancel(self) -> None:
        """Stop the batch: start no new call, cancel the calls in flight (not a checkpoint)."""
        if self.cancelled:
            return
        self.cancelled = True
        for scope in self._scopes.values():
            scope.cancel()
        self._wake()  # the runner waits for the calls in flight with a bound

    async def run(self, nursery: trio.Nursery) -> BatchExecuted:
        """Run the plan's groups in ``nursery``; one result per call, in call order.

        Cancellation: a checkpoint in each group (before its inline calls, if it has
        any). Cancelled from outside, the calls in flight (in ``nursery``, which the
        caller's cancellation reaches too) are abandoned.
        """
        by_id = {call.call_id: call for call in self.calls}
        interruption = Interruption.NONE
        for group in self.plan:
            if (stop := self._stop()) is not None:
                interruption = stop
                break
            if not group:
                continue
            in_place: list[DispatchedCall] = []
            spawned: list[DispatchedCall] = []
            for call_id in group:
                call = by_id[call_id]
                (in_place if self._needs_no_task(call) else spawned).append(call)
            if in_place:
                # The inline calls have no checkpoint: this is where a cancellation from
                # outside (a cancelled scope, Ctrl-C) lands, before any of them runs.
                await trio.lowlevel.checkpoint()
                if (stop := self._stop()) is not None:
                    interruption = stop
                    break
                for call in in_place:
                    self._run_in_place(call)
                if not spawned:
                    continue
                if (stop := self._stop()) is not None:  # the others never start
                    interruption = stop
                    break
            self._pending = len(spawned)  # the tasks start once this one waits
            for call in spawned:
                nursery.start_soon(self._run_one, call)
            await self._wait()
            if self.cancelled:
                interruption = Interruption.CANCELLED
                if self._pending:
                    # Woken by the cancel request: wait a bounded time for the calls
                    # in flight to stop, keeping the results of those that finish.
                    with trio.move_on_after(self.grace_s):
                        await self._wait()
                break
            if self._stopped:  # cut short by the deadline
                interruption = Interruption.DEADLINE
                break
        ordered: list[ToolResult] = []
        for call in self.calls:
            result = self.results.get(call.call_id)
            if result is not None:
                ordered.append(result)
            elif call.call_id in self._started and call.call_id not in self._stopped:
                ordered.append(unreported_result(call))  # still running after the grace
            else:
                ordered.append(
                    interrupted_result(call, interruption, started=call.call_id in self._started)
                )
        return BatchExecuted(step=self.step, results=ordered, interruption=interruption)

    def _stop(self) -> Interruption | None:
        """Why no further call may start (a cancel request, the deadline), or None."""
        if self.cancelled:
            return Interruption.CANCELLED
        if self._now() >= self.deadline:
            return Interruption.DEADLINE
        return None

    def _needs_no_task(self, call: DispatchedCall) -> bool:
        """Whether ``call`` runs in the batch's own task, to its end, before any other.

        An inline plain function called through ``Tool.invoke`` never reaches a
        checkpoint, and neither does a call of a tool no longer in the catalogue:
        no timeout or cancel request can stop either while it runs, so neither needs
        a task or a cancel scope of its own (one of each costs about as much as the
        rest of the call). The group's other calls start when the batch waits, as
        they could have in any order of their tasks.
        """
        tool_ = self.toolbox.tools.get(call.name)
        return tool_ is None or (tool_.inline and type(tool_).invoke is Tool.invoke)

    def _begin(self, call: DispatchedCall) -> tuple[Tool, ToolContext | None, float] | None:
        """Start ``call``: its tool, context and start time; None when it ends here.

        It ends here when the batch was cancelled before it started (no result: the
        batch answers for it), or when its tool is no longer in the catalogue.
        """
        if self.cancelled:
            return None  # cancelled before it ran: the call never starts
        call_id = call.call_id
        self._started.add(call_id)
        started = self._now()
        tool_ = self.toolbox.tools.get(call.name)
        if tool_ is None:
            ending = _Ending(
                error_class=ErrorClass.UNAVAILABLE,
                message=f"tool {call.name!r} is no longer in the agent's catalogue",
                retryable=False,
                ran=False,
            )
            self.results[call_id] = _result(call, None, ending, 0.0)
            return None
        context = None
        if tool_.context_parameter is not None:
            context = ToolContext(
                invocation_id=self.invocation_id,
                call_id=call_id,
                effect_key=call.effect_key,
                attempt=self.attempts.get(call_id, 1),
            )
        return tool_, context, started

    def _run_in_place(self, call: DispatchedCall) -> None:
        """Run a call that ``_needs_no_task`` in this task: what ``Tool.invoke`` does inline.

        The function runs in a copy of this task's context (as a task of its own would).
        Whatever it raises is its result, trio's ``Cancelled`` too: with no checkpoint
        in it, no cancellation of trio's can reach it, so a ``Cancelled`` is its own.
        """
        begun = self._begin(call)
        if begun is None:
            return
        tool_, context, started = begun
        key = call.effect_key
        running = self.toolbox.attempt_started(key) if key is not None else None
        try:
            kwargs = tool_.keyword_arguments(call.arguments, context)
            # In a copy of this task's context, as a task of its own would be: what the
            # function sets in context variables does not reach the batch's task.
            returned = contextvars.copy_context().run(tool_.fn, **kwargs)
        except BaseException as error:  # a tool's failure is its result, whatever it is
            ending: _Ending | None = _failure(error)
            output: Any = None
        else:
            output, ending = _output(returned)
        finally:
            if running is not None:
                running.set()
        if running is not None and key is not None:
            self.toolbox.attempt_ended(key, running)
        duration_ms = (self._now() - started) * 1000.0
        self.results[call.call_id] = _result(call, output, ending, duration_ms)

    async def _run_one(self, call: DispatchedCall) -> None:
        call_id = call.call_id
        ending: _Ending | None = None
        output: Any = None
        try:
            begun = self._begin(call)
            if begun is None:
                return
            tool_, context, started = begun
            toolbox = self.toolbox
            timeout_s = toolbox.timeout_for(call.name)
            # One scope: the call's timeout, the invocation's deadline, a cancel request.
            scope = trio.CancelScope(deadline=min(started + timeout_s, self.deadline))
            self._scopes[call_id] = scope
            with scope:
                running = (
                    toolbox.attempt_started(call.effect_key)
                    if call.effect_key is not None
                    else None
                )
                try:
                    if tool_.is_async and type(tool_).invoke is Tool.invoke:
                        # Awaited here (what Tool.invoke does): one coroutine less a call.
                        try:
                            kwargs = tool_.keyword_arguments(call.arguments, context)
                            returned = await tool_.fn(**kwargs)
                        finally:
                            if running is not None:
                                running.set()
                    else:
                        returned = await tool_.invoke(call.arguments, context, running=running)
                except BaseException as error:
                    if is_cancellation(error):
                        raise
                    ending = _failure(error)
                else:
                    output, ending = _output(returned)
            if running is not None and call.effect_key is not None:
                toolbox.attempt_ended(call.effect_key, running)  # kept only if still running
            if scope.cancelled_caught:
                if self.cancelled or self._now() >= self.deadline:
                    self._stopped.add(call_id)  # cut short: the batch answers for it
                    return
                ending = _Ending(
                    error_class=ErrorClass.TIMEOUT,
                    message=f"no result within {timeout_s:g} s",
                    retryable=True,
                )
                output = None
            duration_ms = (self._now() - started) * 1000.0
            self.results[call_id] = _result(call, output, ending, duration_ms)
        finally:
            self._scopes.pop(call_id, None)
            self._pending -= 1
            if not self._pending:
                self._wake()

    async def _wait(self) -> None:
        """Park until the group's calls have all ended, or a cancel request came.

        Cancellation: a checkpoint (nothing changes when cancelled).
        """
        self._parked = trio.lowlevel.current_task()
        await trio.lowlevel.wait_task_rescheduled(self._abort)

    def _abort(self, _: object) -> trio.lowlevel.Abort:
        self._parked = None
        return trio.lowlevel.Abort.SUCCEEDED

    def _wake(self) -> None:
        task, self._parked = self._parked, None
        if task is not None:
            trio.lowlevel.reschedule(task)


__all__ = ["BatchRun", "Reconciled", "Tool", "ToolContext", "Toolbox", "ask_service", "tool"]
