"""Tools: the ``@tool`` decorator, the Toolbox that validates calls, and the ToolActor.

A tool is a plain or async function. Its argument schema is derived from its
type hints with pydantic; arguments are validated before a call runs, and the
same model produces the JSON Schema a model provider sees.
"""

from __future__ import annotations

import inspect
import math
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal, Protocol, cast, overload

from pydantic import BaseModel, ConfigDict, SkipValidation, create_model
from pydantic_core import to_jsonable_python

from aggregates.children import ChildOutcome, ChildSpec
from aggregates.decisions import (
    Budget,
    ErrorClass,
    Frozen,
    ToolCall,
    ToolEffect,
)
from aggregates.digest import digest_of, sha256_hex
from aggregates.effect import Resolution
from aggregates.invocation import DispatchedCall, ToolSpec
from aggregates.redaction import redact_paths
from aggregates.revalidation import MalformedValueError, revalidated
from aggregates.values import check_json, describe_error
from loop_actors._errors import SleepTimeError, ToolDefinitionError, ToolError
from loop_actors._guard import in_thread, is_cancellation
from loop_actors._messages import ToolSchema

if TYPE_CHECKING:
    from aggregates.turn_messages import ChildWaits

DEFAULT_TOOL_TIMEOUT_S = 30.0


def _paths(tool_name: str, names: Iterable[str]) -> tuple[tuple[str, ...], ...]:
    if isinstance(names, str):
        raise ToolDefinitionError(f"tool {tool_name}: give sensitive fields as a list of names")
    paths = tuple(tuple(name.split(".")) for name in names)
    if any(not all(paths) for paths in paths):
        raise ToolDefinitionError(f"tool {tool_name}: empty sensitive field name")
    return paths


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
    slept_until: datetime | None = None
    """When this call slept (``sleep_until``) and now runs again: the time it slept until."""
    woke_at: datetime | None = None
    """When it woke from that sleep (None: it never slept)."""

    async def sleep_until(self, when: datetime) -> None:
        """Sleep durably until ``when`` (a ``datetime`` with a time zone): no process waits.

        The call stops here, the batch's other calls finish, and the invocation pauses
        ``sleeping`` with the batch still dispatched (``Paused.wake_at``). When it wakes
        (a worker claims it once it is due, or ``loop-actors wake ID``), this call runs
        again from its start, with the same arguments, effect key (a write's next
        attempt) and ``slept_until``: this ``sleep_until`` then returns at once, and the
        call's result is what it returns then. So code before the sleep runs twice; keep
        it free of effects (a write passes ``effect_key`` to its service, as always).

        Raises:
            SleepTimeError: ``when`` is not a datetime with a time zone.
            SleepRequested: always, unless the call already slept until ``when`` or
                later. Let it through (it is a ``BaseException``, like trio's
                ``Cancelled``): the runtime catches it.

        Cancellation: not a checkpoint when it raises; a checkpoint when it returns.
        """
        if not isinstance(when, datetime) or when.tzinfo is None or when.utcoffset() is None:
            raise SleepTimeError(
                f"sleep_until needs a datetime with a time zone, got {when!r} "
                "(e.g. datetime.now(UTC) + timedelta(hours=1))"
            )
        if self.slept_until is not None and when <= self.slept_until:
            import trio  # noqa: PLC0415 - tools.py is imported where trio is not (submit)

            await trio.lowlevel.checkpoint()
            return
        raise SleepRequested(when)

    async def run_agent(
        self,
        agent: object,
        goal: str,
        *,
        key: str | None = None,
        budget: Budget | None = None,
    ) -> ChildOutcome:
        """Run ``agent`` on ``goal`` as a child invocation of this call's invocation.

        For orchestration in code: a write tool's body may run several children, one
        after another or at once in a trio nursery. Each child's id derives from this
        call's effect key and ``key`` (give each child of one call its own key), so a
        call dispatched again after a crash finds the children it started: one that
        ended gives its recorded outcome, one that did not is driven on, none is
        started twice.

        Its budget is a share of what the parent has left, set aside in the parent's
        history (``BudgetReserved``) before it starts: it asks for ``budget`` (None: its
        agent's own), capped by what is left once its running siblings' shares are
        counted (the parent keeps one step for its next decision), within what is left
        of the parent's deadline. What it did not use comes back when it settles
        (``BudgetReturned``), so a child run after another gets what the first left.
        Children run at once must fit together: give them budgets that do.

        Raises:
            ToolError: the child cannot start (not a write tool, not an Agent, too
                deep, too many children, no step left for it, the parent was
                cancelled); no child started.
            ChildPausedError: the child paused for a person; the call stays open and
                its invocation pauses until the child is settled.
        """
        return await child_runs().run(agent, goal, self, key=key, spec=None, budget=budget)


class SleepRequested(BaseException):
    """Raised by ``ToolContext.sleep_until`` to stop the call until ``until``; let it through.

    The runtime records the sleep (the invocation pauses ``sleeping``) and calls the tool
    again when it wakes.
    """

    def __init__(self, until: datetime) -> None:
        super().__init__(f"the call sleeps until {until.isoformat()}")
        self.until = until


class ChildPausedError(Exception):
    """A child invocation paused: its call stays open, and its invocation pauses too.

    The call's write is left ``outcome_unknown``. A child that waits for a person pauses
    the parent with the child's reason (``approval_required``, ``clarification_required``),
    its question, digest and waiting calls, and ``path``: the ids from this child down to
    the invocation that waits. A child that waits for a service pauses the parent
    ``reconciliation_required``. A resume of the parent once the child was settled asks
    the store again: the child's outcome becomes the call's result.
    """

    def __init__(self, waits: ChildWaits) -> None:
        self.waits = waits
        self.child_id = waits.path[0]
        self.reason = waits.reason.value
        waiting = waits.path[-1]
        why = (
            f": {waits.question or waits.proposal_digest}"
            if (waits.question or waits.proposal_digest)
            else ""
        )
        super().__init__(
            f"child invocation {waiting} is paused ({self.reason}{why}); settle it "
            f"(loop-actors approve / deny / clarify {waiting}, or the root's id), then "
            "resume this invocation"
        )


class ChildRuns(Protocol):
    """How tools start and find child invocations: the runtime drives them (one per run)."""

    async def run(
        self,
        agent: object,
        goal: str,
        context: ToolContext,
        *,
        key: str | None,
        spec: ChildSpec | None,
        budget: Budget | None = None,
    ) -> ChildOutcome:
        """Start the child (or find the one started before) and drive it to its end."""

    async def ask(self, agent: object, effect_key: str) -> Reconciled:
        """What became of the child the write ``effect_key`` started (reconciliation)."""


_current_child_runs: ContextVar[ChildRuns | None] = ContextVar("child_runs", default=None)


@contextmanager
def using_child_runs(runs: ChildRuns) -> Iterator[None]:
    """Make ``runs`` the one that tools of this task (and its children) start children with."""
    token = _current_child_runs.set(runs)
    try:
        yield
    finally:
        _current_child_runs.reset(token)


def child_runs() -> ChildRuns:
    """The child runs of the invocation whose tool calls this.

    Raises:
        ToolError: called outside a run of the runtime (a tool called as a function).
    """
    runs = _current_child_runs.get()
    if runs is None:
        raise ToolError(
            "a child invocation starts only inside a run of the runtime (Runtime.run, "
            "loop-actors run), not from a tool called directly",
            error_class=ErrorClass.INVALID_ARGUMENTS,
        )
    return runs


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


class ToolOptions(BaseModel):
    """The options of :func:`tool`, declared once: what it makes of a function.

    The keywords of :func:`tool` (and of ``Tool(fn, ...)``) are these fields, with
    these defaults (a test checks); their meaning is in :func:`tool`'s docstring.
    The values are kept as given: :class:`Tool` checks them, with the tool's name
    in each message, and resolves them (a name from the function, an effect from a
    string, dotted paths from sensitive field names).
    """

    # Kept as given (SkipValidation): Tool checks each value and says what is wrong in
    # ToolDefinitionError's terms; pydantic would coerce (1 -> 1.0) or consume iterables.
    model_config = ConfigDict(frozen=True, extra="forbid", arbitrary_types_allowed=True)

    name: SkipValidation[str | None] = None
    description: SkipValidation[str | None] = None
    effect: SkipValidation[ToolEffect | Literal["read", "write"]] = ToolEffect.READ
    timeout_s: SkipValidation[float | None] = None
    inline: SkipValidation[bool] = False
    reconcile: SkipValidation[ReconcileFunction | None] = None
    commutes: SkipValidation[bool] = False
    sensitive_arguments: SkipValidation[Iterable[str]] = ()
    sensitive_output: SkipValidation[Iterable[str]] = ()
    requires_approval: SkipValidation[bool | Callable[[dict[str, Any]], bool]] = False
    max_repeated_failures: SkipValidation[int | None] = None
    operation: SkipValidation[str | None] = None
    object_from: SkipValidation[str | None] = None


class Tool:
    """A function the model may call, with its validated argument schema.

    Build one with :func:`tool`; call :meth:`validate` to check arguments and
    :meth:`invoke` to run it.
    """

    def __init__(
        self, fn: Callable[..., Any], *, options: ToolOptions | None = None, **keywords: Any
    ) -> None:
        """Wrap ``fn`` as a tool, with ``options`` or the keywords of :func:`tool`.

        Raises:
            ToolDefinitionError: the function cannot be described to a model, or an
                option is malformed.
            TypeError: an unknown keyword, or both ``options`` and keywords.
        """
        if options is None:
            unknown = sorted(keywords.keys() - ToolOptions.model_fields.keys())
            if unknown:
                raise TypeError(f"Tool() got an unexpected keyword argument {unknown[0]!r}")
            options = ToolOptions(**keywords)
        elif keywords:
            raise TypeError("Tool() takes options or keywords, not both")
        if not callable(fn):
            raise ToolDefinitionError(f"{fn!r} is not callable")
        self.fn = fn
        self.options = options
        """The options as given (the attributes below are what they resolve to)."""
        self.name: str = options.name or getattr(fn, "__name__", None) or ""
        if not self.name.isidentifier():
            raise ToolDefinitionError(f"tool name {self.name!r} must be an identifier")
        self.description = options.description or inspect.getdoc(fn) or ""
        try:
            self.effect = ToolEffect(options.effect)
        except ValueError:
            raise ToolDefinitionError(
                f"tool {self.name}: effect must be 'read' or 'write', got {options.effect!r}"
            ) from None
        timeout_s = options.timeout_s
        if timeout_s is not None and not (timeout_s > 0 and math.isfinite(timeout_s)):
            raise ToolDefinitionError(f"tool {self.name}: timeout_s must be a positive number")
        self.timeout_s = timeout_s
        reconcile = options.reconcile
        if reconcile is not None and not callable(reconcile):
            raise ToolDefinitionError(f"tool {self.name}: reconcile must be callable")
        if reconcile is not None and self.effect is ToolEffect.READ:
            raise ToolDefinitionError(f"tool {self.name}: only a write tool is reconciled")
        self.reconcile = reconcile
        self.commutes = options.commutes
        self.sensitive_arguments = _paths(self.name, options.sensitive_arguments)
        requires_approval = options.requires_approval
        if not (isinstance(requires_approval, bool) or callable(requires_approval)):
            raise ToolDefinitionError(
                f"tool {self.name}: requires_approval must be a bool or a function of the arguments"
            )
        self.requires_approval = requires_approval
        max_repeated_failures = options.max_repeated_failures
        if max_repeated_failures is not None and max_repeated_failures < 1:
            raise ToolDefinitionError(f"tool {self.name}: max_repeated_failures must be >= 1")
        self.max_repeated_failures = max_repeated_failures
        self.operation = options.operation or self.name
        self.object_from = options.object_from
        self.sensitive_output = _paths(self.name, options.sensitive_output)
        self.is_async = inspect.iscoroutinefunction(fn)
        if options.inline and self.is_async:
            raise ToolDefinitionError(f"tool {self.name}: inline is for plain functions only")
        self.inline = options.inline
        self.arguments_model, self.context_parameter = _arguments_model(self.name, fn)
        self._fields = tuple(self.arguments_model.model_fields)
        self.schema: dict[str, Any] = self.arguments_model.model_json_schema()
        self.schema_digest = schema_digest(self.name, self.effect, self.schema)
        self.child: ChildSpec | None = None
        """For a tool that starts a child invocation (``Agent.as_tool``): its budget and policy."""
        self.child_agent: object | None = None
        """For a tool made by ``Agent.as_tool``: the agent its children run (replay finds it)."""

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
                return await in_thread(lambda: self.fn(**kwargs))
            finally:
                if running is not None:
                    running.set()

        def run_and_say_done() -> Any:
            try:
                return self.fn(**kwargs)
            finally:
                running.set()  # the thread is done, whether or not anyone still waits

        return await in_thread(run_and_say_done)


async def ask_service(tool_: Tool, key: str) -> Reconciled:
    """Call a write tool's ``reconcile(effect_key)`` (plain or async) and check its answer.

    Raises:
        Exception: whatever ``reconcile`` raised (the service could not be reached).
        ToolDefinitionError: the tool has no ``reconcile``, or it answered something else
            or a malformed ``Reconciled`` (one built with ``model_construct`` is
            validated again: a status that is not a ``Resolution``, a reason that is
            not text).

    Cancellation: a checkpoint; a plain function's worker thread is abandoned.
    """
    reconcile = tool_.reconcile
    if reconcile is None:
        raise ToolDefinitionError(f"tool {tool_.name} has no reconcile function")
    if inspect.iscoroutinefunction(reconcile):
        answer = await reconcile(key)
    else:
        answer = await in_thread(reconcile, key)
    if not isinstance(answer, Reconciled):
        raise ToolDefinitionError(
            f"tool {tool_.name}: reconcile() must return Reconciled, got {type(answer).__name__}"
        )
    try:
        # Validated again: one built with model_construct may hold any status.
        return revalidated(Reconciled, answer)
    except MalformedValueError as error:
        raise ToolDefinitionError(f"tool {tool_.name}: reconcile() returned {error}") from None


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
    given = dict(locals())  # exactly the keywords above: one per field of ToolOptions
    del given["fn"]
    options = ToolOptions(**given)

    def wrap(function: Callable[..., Any]) -> Tool:
        return Tool(function, options=options)

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
        stopped = await in_thread(running.wait, timeout_s)
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
        return cast("dict[str, Any]", redact_paths(arguments, tool_.sensitive_arguments))

    def sensitive_arguments(self, name: str) -> tuple[tuple[str, ...], ...]:
        """The tool's sensitive argument paths (none for a tool the agent does not have)."""
        tool_ = self.tools.get(name)
        return () if tool_ is None else tool_.sensitive_arguments

    def redact_output(self, name: str, output: Any) -> Any:
        """An output as it may be stored: the tool's sensitive fields replaced."""
        tool_ = self.tools.get(name)
        if tool_ is None or not tool_.sensitive_output:
            return output
        return redact_paths(output, tool_.sensitive_output)

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

    def child_spec(self, name: str) -> ChildSpec | None:
        """The child spec of a tool that starts a child invocation (None for any other)."""
        tool_ = self.tools.get(name)
        return None if tool_ is None else tool_.child

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


__all__ = [
    "Reconciled",
    "Tool",
    "ToolContext",
    "ToolOptions",
    "Toolbox",
    "ask_service",
    "json_value",
    "jsonable",
    "tool",
]
