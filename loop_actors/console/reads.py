"""What the console reads: the read models (caught up first) and the store, off the trio thread."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, TypeVar

import trio

from aggregates.decisions import TerminalReason
from aggregates.handoffs import handoff_id_of
from aggregates.invocation import (
    ApprovalDenied,
    ApprovalGranted,
    BatchDispatched,
    ClarificationProvided,
    ContextCompacted,
    Invocation,
    InvocationEvent,
    Phase,
)
from loop_actors._errors import InvocationNotFoundError
from loop_actors.audit.verify import ChainReport, verify_invocation
from loop_actors.runtime.runtime import Runtime
from loop_actors.store.history_records import history_records
from projections import (
    MetricsRow,
    ProjectionRunner,
    invocation_summary,
    list_invocations,
    list_open_effects,
    load_trajectory,
    metrics,
)
from projections.metrics import GroupBy
from projections.trajectory import InvocationStatus

T = TypeVar("T")

MAX_PAGE = 500
"""At most this many invocations a page (``limit``)."""
INBOX_LIMIT = 500
"""The approvals inbox looks at this many paused invocations at most."""
MAX_DEPTH = 64
"""A requesting path is followed up this many parents at most."""


@dataclass(frozen=True)
class InvocationFilter:
    """The filters of the invocation list (``GET /api/invocations`` and the list page)."""

    agent: str | None = None
    status: InvocationStatus | None = None
    reason: TerminalReason | None = None
    roots_only: bool = False
    id_prefix: str | None = None
    started_from: str | None = None
    started_before: str | None = None
    limit: int = 50
    offset: int = 0


class ConsoleReads:
    """The console's reads over an open :class:`Runtime` that follows its read models."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime

    async def _read_models(self, read: Callable[[ProjectionRunner], T]) -> T:
        """Catch the read models up (another process may have committed), then read them."""
        runner = self.runtime.projections
        assert runner is not None, "the console's runtime follows its read models"

        def work() -> T:
            runner.catch_up()
            return read(runner)

        return await trio.to_thread.run_sync(work)

    async def invocations(self, where: InvocationFilter) -> list[dict[str, Any]]:
        """One page of invocations, newest first.

        Cancellation: a checkpoint; the read's thread is abandoned (nothing changes).
        """
        return await self._read_models(
            partial(
                list_invocations,
                agent=where.agent,
                status=where.status,
                reason=where.reason.value if where.reason is not None else None,
                roots_only=where.roots_only,
                id_prefix=where.id_prefix,
                started_from=where.started_from,
                started_before=where.started_before,
                limit=where.limit,
                offset=where.offset,
            )
        )

    async def metrics(self, by: GroupBy) -> list[MetricsRow]:
        """The metrics grouped by ``by`` (``loop-actors metrics --by``).

        Cancellation: a checkpoint; the read's thread is abandoned (nothing changes).
        """
        return await self._read_models(partial(metrics, by=by))

    async def summary(self) -> list[dict[str, Any]]:
        """How many invocations each agent has in each status.

        Cancellation: a checkpoint; the read's thread is abandoned (nothing changes).
        """
        return await self._read_models(invocation_summary)

    async def invocation(self, invocation_id: str) -> dict[str, Any] | None:
        """What the invocation page shows (:func:`invocation_view`); None if unknown to the views.

        Raises:
            InvocationNotFoundError: the read models know it, the store does not.

        Cancellation: a checkpoint; the reads' threads are abandoned (nothing changes).
        """
        events = await self.runtime.history(invocation_id)
        invocation = await self.runtime.load(invocation_id)
        driver = self.runtime.driver
        reports = await driver.reads.call(partial(verify_invocation, driver.store, invocation_id))
        view = await self._read_models(
            partial(
                invocation_view, invocation_id=invocation_id, events=events, invocation=invocation
            )
        )
        if view is not None:
            view["audit"] = audit_verdict(invocation_id, reports)
        return view

    async def approvals(self) -> list[dict[str, Any]]:
        """Every invocation that waits for an approval, oldest pause first, with its batch.

        Cancellation: a checkpoint; the reads' threads are abandoned (nothing changes).
        """
        rows = []
        for reason in (TerminalReason.APPROVAL_REQUIRED, TerminalReason.PLAN_APPROVAL_REQUIRED):
            rows += await self._read_models(
                partial(
                    list_invocations,
                    status=InvocationStatus.PAUSED,
                    reason=reason.value,
                    limit=INBOX_LIMIT,
                )
            )
        inbox = []
        for row in rows:
            invocation = await self.runtime.load(row["invocation_id"])
            waiting = waiting_of(invocation)
            if waiting is not None:  # decided since the read models looked
                inbox.append({**row, **waiting, "path": await self.path_to(invocation)})
        inbox.sort(key=lambda item: str(item["paused_at"]))
        return inbox

    async def path_to(self, invocation: Invocation) -> list[str]:
        """The ids from the root of ``invocation``'s tree down to it (just its own for a root).

        Cancellation: a checkpoint; the reads' threads are abandoned (nothing changes).
        """
        path = [invocation.id]
        while invocation.parent is not None and len(path) <= MAX_DEPTH:
            try:
                invocation = await self.runtime.load(invocation.parent.parent_id)
            except InvocationNotFoundError:  # its parent's rows were deleted: stop there
                break
            path.insert(0, invocation.id)
        return path

    async def open_effects(self) -> list[dict[str, Any]]:
        """The effects dispatched or of unknown outcome, oldest first (``loop-actors effects``).

        Cancellation: a checkpoint; the read's thread is abandoned (nothing changes).
        """
        return await self._read_models(list_open_effects)

    async def history(self, invocation_id: str, *, after: int = 0) -> list[dict[str, Any]]:
        """The ``history --json`` records after position ``after`` (``InvocationNotFoundError``).

        Cancellation: a checkpoint; the read's thread is abandoned (nothing changes).
        """
        return await read_history(self.runtime, invocation_id, after=after)


async def read_history(
    runtime: Runtime, invocation_id: str, *, after: int = 0
) -> list[dict[str, Any]]:
    """The ``history --json`` records after ``after``, read through the runtime's reader.

    Raises:
        InvocationNotFoundError: no such invocation.

    Cancellation: a checkpoint; the read's thread is abandoned (nothing changes).
    """
    driver = runtime.driver
    return await driver.reads.call(
        partial(history_records, driver.store, invocation_id, after=after)
    )


def invocation_view(
    runner: ProjectionRunner,
    *,
    invocation_id: str,
    events: Sequence[InvocationEvent],
    invocation: Invocation,
) -> dict[str, Any] | None:
    """An invocation's page (blocking): its trajectory, children and forks, decisions, waiting.

    None when the read models do not know it. ``events`` and ``invocation`` are its
    history and its state, read from the store.
    """
    trajectory = load_trajectory(runner, invocation_id)
    if trajectory is None:
        return None
    many = 2**62
    shown = trajectory.model_dump(mode="json")
    plans = {event.step: event.plan for event in events if isinstance(event, BatchDispatched)}
    return {
        **shown,
        "batches": [
            batch_lanes(step["step"], step["calls"], plans[step["step"]])
            for step in shown["steps"]
            if len(step["calls"]) > 1 and step["step"] in plans
        ],
        "compactions": [
            {
                "step": event.step,
                "dropped_steps": event.dropped_steps,
                "kept_steps": event.kept_steps,
                "size_before": event.size_before,
                "size_after": event.size_after,
                "position": event.originator_version,
            }
            for event in events
            if isinstance(event, ContextCompacted)
        ],
        "children": list_invocations(runner, parent_id=invocation_id, limit=many),
        "forks": list_invocations(runner, forked_from=invocation_id, limit=many),
        "handed_off_to": (
            handoff_id_of(invocation_id)
            if invocation.terminated is not None
            and invocation.terminated.reason is TerminalReason.HANDED_OFF
            else None
        ),
        "decisions": [_decision(event) for event in events if _is_decision(event)],
        "waiting": waiting_of(invocation),
        "waits_for_child": child_path_of(invocation),
    }


def child_path_of(invocation: Invocation) -> list[str] | None:
    """While it waits for a child's person: the ids from it down to the one that waits."""
    paused = invocation.paused
    if invocation.phase is not Phase.AWAITING_CHILD or paused is None:
        return None
    return [invocation.id, *(paused.child_path or [])]


def batch_lanes(
    step: int, calls: Sequence[dict[str, Any]], plan: list[list[str]]
) -> dict[str, Any]:
    """A batch's calls as lanes on one time axis: its groups in turn, a group's side by side.

    The dispatch runs the plan's groups in order and the calls of a group together, so
    a group starts when the slowest call of the one before ended; each call's lane
    starts there and lasts its duration (a call without a result yet lasts to the
    end). ``left`` and ``width`` are fractions of the batch's time (for the bars).
    """
    by_id = {call["call_id"]: call for call in calls}
    group_of = {call_id: index for index, group in enumerate(plan) for call_id in group}
    starts: list[float] = []
    start = 0.0
    for group in plan:
        starts.append(start)
        start += max((by_id[c]["duration_ms"] or 0.0 for c in group if c in by_id), default=0.0)
    total = start
    lanes = []
    for call in calls:
        index = group_of.get(call["call_id"], 0)
        begins = starts[index] if starts else 0.0
        duration = call["duration_ms"]
        ends = total if duration is None else begins + duration
        lanes.append(
            {
                "call_id": call["call_id"],
                "name": call["name"],
                "status": call["status"],
                "group": index,
                "start_ms": begins,
                "duration_ms": duration,
                "left": begins / total if total else 0.0,
                "width": (ends - begins) / total if total else 1.0,
            }
        )
    return {"step": step, "plan": plan, "total_ms": total, "lanes": lanes}


def waiting_of(invocation: Invocation) -> dict[str, Any] | None:
    """The batch (or plan) an invocation waits to have approved; None if it waits for none.

    A plan shows its planned writes as calls (``step N``: approving the plan authorises
    exactly those), with ``kind`` ``plan`` and the plan's digest.
    """
    paused = invocation.paused
    if invocation.phase is not Phase.AWAITING_APPROVAL or paused is None:
        return None
    plan = invocation.planning
    if paused.reason is TerminalReason.PLAN_APPROVAL_REQUIRED and plan is not None:
        steps = [f"step {n}" for n in range(1, len(plan.writes) + 1)]
        return {
            "kind": "plan",
            "step": paused.step,
            "digest": plan.digest,
            "calls": [
                {"call_id": n, "name": w.tool, "effect": "write", "arguments": w.arguments}
                for n, w in zip(steps, plan.writes, strict=True)
            ],
            "needs_approval": steps,
            "paused_at": paused.timestamp.isoformat(),
        }
    return {
        "kind": "approval",
        "step": paused.step,
        "digest": paused.proposal_digest,
        "calls": [call.model_dump(mode="json") for call in paused.calls or []],
        "needs_approval": paused.needs_approval or [],
        "paused_at": paused.timestamp.isoformat(),
    }


def audit_verdict(invocation_id: str, reports: Sequence[ChainReport]) -> dict[str, Any]:
    """What ``audit verify ID`` says of the invocation's chains, as the pages show it."""
    broken = [report for report in reports if not report.intact]
    return {
        "intact": not broken,
        "summary": (
            f"{len(reports)} chain{'' if len(reports) == 1 else 's'} intact "
            f"(audit verify {invocation_id})"
            if not broken
            else f"{len(broken)} of {len(reports)} chains broken: the store was changed"
        ),
        "reports": [report.model_dump(mode="json") for report in reports],
    }


_DECISIONS = (ApprovalGranted, ApprovalDenied, ClarificationProvided)


def _is_decision(event: object) -> bool:
    return isinstance(event, _DECISIONS)


def _decision(event: Any) -> dict[str, Any]:
    """A person's decision as the invocation page shows it: what, who, why, when."""
    match event:
        case ApprovalGranted():
            kind, why = "approved", event.note
        case ApprovalDenied():
            kind, why = "denied", event.reason
        case _:
            kind, why = "clarified", event.answer
    return {
        "kind": kind,
        "step": getattr(event, "step", None),
        "by": event.by,
        "why": why,
        "at": event.timestamp.isoformat(),
        "position": event.originator_version,
    }
