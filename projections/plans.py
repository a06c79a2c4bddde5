"""A plan against what was done: each plan of a trajectory, its writes, and the writes made.

Read from a :class:`~projections.trajectory_fold.Trajectory` (the fold, or the read
model's rows): a ``plan`` step holds the plan as recorded (each write's tool and
validated arguments) and who approved or denied it; the writes dispatched while it was
the latest plan say which of its steps each one made (``plan_step``). What is left is
outside the plan: a write refused under the read-only ceiling, or one that ran because a
person approved it on its own.
"""

from __future__ import annotations

from typing import Any

from aggregates.decisions import Effect, Frozen, Plan
from projections.trajectory_fold import CallView, Trajectory


class PlannedWriteView(Frozen):
    """One write of a plan, and the call that made it (if one did)."""

    plan_step: int
    """Its place in the plan (1 for the first)."""
    tool: str
    arguments: dict[str, Any]
    description: str = ""
    made_at: int | None = None
    """The step of the call that made it (None: not made)."""
    call_id: str | None = None
    status: str | None = None
    """That call's status (``ok``, an error class, ``dispatched``)."""


class WriteMade(Frozen):
    """A write proposed while a plan was the latest, that is not one of its steps."""

    step: int
    call_id: str
    tool: str
    arguments: dict[str, Any]
    status: str
    """``denied`` for one refused (under the read-only ceiling, or by a person)."""
    approval: str | None = None
    """Who approved (or denied) its batch."""


class PlanView(Frozen):
    """One plan of an invocation against what was done while it was the latest."""

    step: int
    """The step the plan was proposed at."""
    summary: str
    approval: str | None
    """``approved by NAME``, ``denied by NAME: REASON``, or None while it waits."""
    writes: list[PlannedWriteView]
    outside: list[WriteMade]
    """The writes proposed under it that are none of its steps, in order."""


def plans_against_done(trajectory: Trajectory) -> list[PlanView]:
    """Each plan of the trajectory, oldest first, with what was done under it."""
    views: list[PlanView] = []
    writes: list[PlannedWriteView] = []
    outside: list[WriteMade] = []
    for step in trajectory.steps:
        decision = step.decision
        if isinstance(decision, Plan):
            if views:
                views[-1] = _with(views[-1], writes, outside)
            writes = [
                PlannedWriteView(
                    plan_step=index,
                    tool=planned.tool,
                    arguments=dict(planned.arguments),
                    description=planned.description,
                )
                for index, planned in enumerate(decision.steps, start=1)
            ]
            outside = []
            views.append(
                PlanView(
                    step=step.step,
                    summary=decision.summary,
                    approval=step.approval,
                    writes=writes,
                    outside=outside,
                )
            )
            continue
        if not views:
            continue  # before the first plan: nothing was written
        for call in step.calls:
            if call.effect is not Effect.WRITE:
                continue
            index = call.plan_step
            if index is not None and 1 <= index <= len(writes):
                writes[index - 1] = _made(writes[index - 1], step.step, call)
            else:
                outside.append(
                    WriteMade(
                        step=step.step,
                        call_id=call.call_id,
                        tool=call.name,
                        arguments=call.arguments,
                        status=call.status,
                        approval=step.approval,
                    )
                )
    if views:
        views[-1] = _with(views[-1], writes, outside)
    return views


def _with(view: PlanView, writes: list[PlannedWriteView], outside: list[WriteMade]) -> PlanView:
    return view.model_copy(update={"writes": list(writes), "outside": list(outside)})


def _made(write: PlannedWriteView, step: int, call: CallView) -> PlannedWriteView:
    return write.model_copy(
        update={"made_at": step, "call_id": call.call_id, "status": call.status}
    )
