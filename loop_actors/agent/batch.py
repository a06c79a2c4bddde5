"""One dispatched batch of tool calls, run in the run's nursery: :class:`BatchRun`.

How a call ends (returned, raised, timed out, cut short) becomes its result here;
a write's ending also says what became of its external effect.
"""

from __future__ import annotations

import contextvars
import math
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import trio
from pydantic import ValidationError

from aggregates.decisions import EffectStatus, ErrorClass, ErrorInfo, Frozen, ToolResult
from aggregates.invocation import DispatchedCall
from aggregates.pydantic_slots import built
from aggregates.results import Interruption, interrupted_result, unreported_result
from aggregates.revalidation import tool_error_fields, validation_problems
from aggregates.values import describe_error, safe_text
from loop_actors._errors import ToolError
from loop_actors._faults import CrashPoint, fault_point
from loop_actors._guard import is_cancellation
from loop_actors._messages import BatchExecuted
from loop_actors.agent.tools import SleepRequested, Tool, Toolbox, ToolContext, jsonable


class _Ending(Frozen):
    """How a call ended, before it becomes a result."""

    error_class: ErrorClass
    message: str
    retryable: bool
    deliberate: bool = False
    """The tool raised ``ToolError``: it says what happened on purpose."""
    ran: bool = True
    """The function was called (false: refused before it started)."""


_SLEEPING = _Ending(
    error_class=ErrorClass.OUTCOME_UNKNOWN,
    message="the call sleeps (a placeholder: the turn core records no result for it)",
    retryable=False,
)

_UNKNOWN_CLASSES = frozenset(
    {ErrorClass.TIMEOUT, ErrorClass.OUTCOME_UNKNOWN, ErrorClass.UNAVAILABLE}
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
            message="; ".join(validation_problems(error, whole="arguments")),
            retryable=False,
            ran=False,
        )
    if isinstance(error, ToolError):
        said = _tool_error(error)
        if not isinstance(said, str):
            error_class, retryable, message = said
            return _Ending(
                error_class=error_class, message=message, retryable=retryable, deliberate=True
            )
        # A ToolError that does not say what happened in the runtime's terms is an
        # unexpected failure: not deliberate, so a write's outcome is unknown.
        return _Ending(
            error_class=ErrorClass.TOOL_FAILED,
            message=f"{describe_error(error)} (a malformed ToolError: {said})",
            retryable=False,
        )
    # A tool's own failure becomes its result, never a crash: KeyboardInterrupt,
    # SystemExit and the like included.
    return _Ending(
        error_class=ErrorClass.TOOL_FAILED, message=describe_error(error), retryable=False
    )


def _tool_error(error: ToolError) -> tuple[ErrorClass, bool, str] | str:
    """What a ``ToolError`` says (class, retryable, message), or why it is malformed."""
    try:  # its attributes are the tool's: a subclass may not set them, or compute them
        error_class, retryable = error.error_class, error.retryable
        message = safe_text(error.message)
    except Exception as broken:
        return f"its attributes cannot be read: {describe_error(broken)}"
    fields = tool_error_fields(error_class, retryable)
    return fields if isinstance(fields, str) else (*fields, message)


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
            "child_ids": None,  # named after the batch ran (``Controller._name_children``)
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
        woken: Mapping[str, datetime] | None = None,
        woke_at: datetime | None = None,
    ) -> None:
        """Prepare the batch (nothing runs before :meth:`run`).

        ``deadline`` is on the trio clock (None: none); ``attempts`` the attempt
        number of each write by call id (1 when absent); ``woken`` the calls that slept
        and run again, with the time each slept until (they woke at ``woke_at``).
        """
        self.woken = woken or {}
        self.woke_at = woke_at
        self.slept: dict[str, datetime] = {}
        """The calls that asked to sleep this time, and until when."""
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
        return BatchExecuted(
            step=self.step, results=ordered, interruption=interruption, slept=self.slept
        )

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
                slept_until=self.woken.get(call_id),
                woke_at=self.woke_at if call_id in self.woken else None,
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
        except SleepRequested as sleep:  # replay's stand-in of a call that slept
            self.slept[call.call_id] = sleep.until
            ending: _Ending | None = _SLEEPING
            output: Any = None
        except BaseException as error:  # a tool's failure is its result, whatever it is
            ending = _failure(error)
            output = None
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
                except SleepRequested as sleep:
                    # No result yet: the invocation sleeps, and the call runs again on waking.
                    self.slept[call_id] = sleep.until
                    ending = _SLEEPING
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


__all__ = ["BatchRun"]
